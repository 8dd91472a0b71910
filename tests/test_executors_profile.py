"""Job profiles: validation with line numbers, cluster rules, and the rendered job script."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from sing.errors import UserError
from sing.executors.profile import load_profile, parse_profile
from sing.executors.script import ENV_SETUP_FAILED, render_script
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import sbatch_headers

RULES = ExecutorSettings(max_gpus_per_node=8, interactive_max_gpus=2)


def parse(text: str, settings: ExecutorSettings = RULES):
    return parse_profile(textwrap.dedent(text), "p.yaml", settings)


def test_full_profile_and_declared_dependencies():
    profile = parse(
        """\
        name: train-resnet
        partition: gpu
        nodes: 2
        gpus_per_node: 4
        time_limit: 1-02:00:30
        entry:
          commands: ["python train.py", "echo done"]
        environment:
          python: 3.10
          cuda: "12.1"
          conda: [cudnn=8.9]
          pip: [torch==2.3.0, "numpy>=1.26", rich]
          variables: {OMP_NUM_THREADS: 4}
        """
    )
    assert (profile.nodes, profile.gpus_per_node, profile.num_gpus) == (2, 4, 8)
    assert profile.time_limit_s == 86400 + 2 * 3600 + 30
    assert profile.commands == "python train.py\necho done"
    assert profile.environment.variables == {"OMP_NUM_THREADS": "4"}
    assert profile.dependencies() == {
        "python": "3.10",  # as written, not the float 3.1
        "cuda": "12.1",
        "cudnn": "8.9",
        "torch": "2.3.0",
        "numpy": ">=1.26",
        "rich": None,
    }
    assert sbatch_headers(profile) == [
        "#SBATCH --job-name=train-resnet",
        "#SBATCH --nodes=2",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-02:00:30",
    ]


@pytest.mark.parametrize(("asked", "tidied"), [(0, 0), (1, 1), (3, 4), (5, 8), (8, 8)])
def test_gpu_counts_are_rounded_up_to_powers_of_two(asked, tidied):
    profile = parse(f"name: x\ngpus_per_node: {asked}\nentry: {{commands: true}}\n".replace(
        "true", "'true'"))  # fmt: skip
    assert profile.gpus_per_node == tidied
    assert bool(profile.notes) == (asked != tidied)


def test_unquoted_time_is_not_read_as_base_60():
    assert parse("name: x\ntime_limit: 02:00:00\nentry: {commands: 'true'}\n").time_limit_s == 7200
    assert parse("name: x\ntime_limit: 90\nentry: {commands: 'true'}\n").time_limit_s == 5400


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nentry: {commands: 'true'}\ngpus_per_nod: 2\n",
         r"p\.yaml:3: profile: unknown key 'gpus_per_nod' \(did you mean 'gpus_per_node'\?\)"),
        ("name: x\ngpus_per_node: 2\ninteractive: true\nnodes: 2\nentry: {commands: 'true'}\n",
         r"p\.yaml:3: interactive: interactive jobs may use at most 2 GPUs; this one asks for 4"),
        ("name: x\ngpus_per_node: 9\nentry: {commands: 'true'}\n",
         r"p\.yaml:2: gpus_per_node: 9 GPUs per node exceeds this cluster's 8"),
        ("name: x\nnodes: two\nentry: {commands: 'true'}\n",
         r"p\.yaml:2: nodes: must be a whole number >= 1: 'two'"),
        ("name: x\nentry: {commands: 'true'}\ntime_limit: 2 hours\n",
         r"p\.yaml:3: time_limit: '2 hours' is not \[D-\]HH:MM:SS"),
        ("name: x\nentry:\n  commands: 'true'\n  image: ubuntu\n",
         r"p\.yaml:3: entry: give one of commands, script, image"),
        ("name: x\nentry: {script: missing.sh}\n", r"p\.yaml:2: entry\.script: file .* not exist"),
        ("name: bad name\nentry: {commands: 'true'}\n", r"p\.yaml:1: name: use letters"),
        ("nodes: 1\nentry: {commands: 'true'}\n", r"p\.yaml:1: name: missing"),
        ("name: x\n  nodes: 1\n", r"p\.yaml:2: not valid YAML"),
        ("name: x\n", r"p\.yaml:1: entry: missing"),
    ],
)  # fmt: skip
def test_bad_profiles_name_file_line_and_field(text, message):
    with pytest.raises(UserError, match=message):
        parse(text)


def test_script_entry_is_embedded_and_runs_with_its_own_interpreter(tmp_path):
    (tmp_path / "job.py").write_text("#!/usr/bin/env python3\nimport sys\nsys.exit(7)\n")
    (tmp_path / "p.yaml").write_text("name: py\nentry:\n  script: job.py\n")
    profile = load_profile(tmp_path / "p.yaml")
    script = tmp_path / "rendered.sh"
    script.write_text(render_script(profile, RULES))
    (tmp_path / "job.py").unlink()  # self-contained: the script no longer needs the file
    assert subprocess.run(["bash", str(script)]).returncode == 7


def test_environment_checks_run_before_the_entry(tmp_path):
    env = "environment: {python: '3', variables: {A: 'b c'}}"
    ok = parse(f"name: x\n{env}\nentry: {{commands: 'echo \"$A\"'}}\n")
    out = subprocess.run(["bash", "-c", render_script(ok, RULES)], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "b c\n")
    missing = parse("name: x\nenvironment: {python: '0.1'}\nentry: {commands: 'echo ran'}\n")
    out = subprocess.run(
        ["bash", "-c", render_script(missing, RULES)], capture_output=True, text=True
    )
    assert out.returncode == ENV_SETUP_FAILED and "ran" not in out.stdout
    assert "no python0.1 on PATH" in out.stderr


def test_pip_environment_is_built_once_per_distinct_environment():
    profile = parse(
        "name: x\nenvironment: {python: '3.11', pip: [torch==2.3.0]}\nentry: {commands: 'true'}\n"
    )
    script = render_script(profile, ExecutorSettings(env_root="/envs"))
    assert 'SING_ENV="/envs/' in script
    assert 'python3.11 -m venv "$SING_ENV"' in script
    assert "python -m pip install -q torch==2.3.0" in script
    assert script.index("pip install") < script.index("# --- entry ---")
