"""Render a job profile into the bash script that sets up its environment and runs its entry.

Both executors run this same script (Slurm as the batch script, the local executor directly), so
a profile behaves the same everywhere. The environment is built once per distinct environment,
under `env_root/<hash>`, and reused: a marker file says the build finished.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from sing.executors.profile import JobProfile
from sing.executors.settings import ExecutorSettings

# Exit code of a job whose environment could not be set up (distinct from the entry's codes).
ENV_SETUP_FAILED = 97


def render_script(profile: JobProfile, settings: ExecutorSettings, headers: list[str] = ()) -> str:
    """The whole job script; `headers` are lines placed right after the shebang (#SBATCH)."""
    lines = ["#!/bin/bash", *headers, f"# SING job profile {profile.name!r} from {profile.source}"]
    lines += _environment_lines(profile, settings)
    lines += ["# --- entry ---", _entry(profile, settings)]
    return "\n".join(lines) + "\n"


def _environment_lines(profile: JobProfile, settings: ExecutorSettings) -> list[str]:
    env = profile.environment
    lines = [
        "# --- environment ---",
        'sing_env_failed() { echo "sing: environment set-up failed: $1" >&2; '
        f"exit {ENV_SETUP_FAILED}; }}",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.variables.items()]
    if env.cuda:
        module = shlex.quote(f"cuda/{env.cuda}")
        lines.append(
            f"if command -v module >/dev/null 2>&1; then module load {module} "
            f"|| sing_env_failed 'module load {module}'; fi"
        )
    if not (env.conda or env.pip):
        if env.python:
            python = shlex.quote(f"python{env.python}")
            lines.append(f"command -v {python} >/dev/null || sing_env_failed 'no {python} on PATH'")
        return lines
    digest = hashlib.sha256(
        json.dumps([env.python, env.cuda, env.conda, env.pip]).encode()
    ).hexdigest()[:16]
    lines.append(f'SING_ENV="{settings.env_root}/{digest}"')
    if env.conda:
        python = [f"python={env.python}"] if env.python else []
        packages = " ".join(shlex.quote(p) for p in (*python, *env.conda))
        lines += [
            'eval "$(conda shell.bash hook)" || sing_env_failed "conda not found"',
            'if [ ! -e "$SING_ENV/.sing-ready" ]; then',
            f'  conda create -y -q -p "$SING_ENV" {packages} || sing_env_failed "conda create"',
            "fi",
            'conda activate "$SING_ENV" || sing_env_failed "conda activate"',
        ]
    else:
        python = shlex.quote(f"python{env.python}" if env.python else "python3")
        lines += [
            'if [ ! -e "$SING_ENV/.sing-ready" ]; then',
            f'  {python} -m venv "$SING_ENV" || sing_env_failed "venv"',
            "fi",
            '. "$SING_ENV/bin/activate" || sing_env_failed "venv activate"',
        ]
    if env.pip:
        packages = " ".join(shlex.quote(p) for p in env.pip)
        lines += [
            'if [ ! -e "$SING_ENV/.sing-ready" ]; then',
            f'  python -m pip install -q {packages} || sing_env_failed "pip install"',
            "fi",
        ]
    lines.append('touch "$SING_ENV/.sing-ready"')
    return lines


def _entry(profile: JobProfile, settings: ExecutorSettings) -> str:
    if profile.image:
        image = (
            profile.image
            if "://" in profile.image or profile.image.endswith(".sif")
            else (f"docker://{profile.image}")
        )
        return (
            f"{settings.container_runtime} exec --nv {shlex.quote(image)} "
            f"bash -c {shlex.quote(profile.commands)}"
        )
    if profile.commands.startswith("#!"):
        # A script with its own interpreter (python, ...): write it out and run it as is.
        return "\n".join(
            [
                'SING_ENTRY="$(mktemp)"',
                "cat > \"$SING_ENTRY\" <<'SING_ENTRY_EOF'",
                profile.commands.rstrip("\n"),
                "SING_ENTRY_EOF",
                'chmod +x "$SING_ENTRY"',
                '"$SING_ENTRY"',
                'SING_RC=$?; rm -f "$SING_ENTRY"; exit $SING_RC',
            ]
        )
    return profile.commands
