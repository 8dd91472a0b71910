"""The Slurm executor: `sbatch` to submit, `squeue`/`sacct` for records, `scancel` to cancel,
`scontrol update ... state=drain` to drain a node.

It talks to Slurm only through its client commands (any Slurm with `--json`, no libslurm to
match), run with TZ=UTC so that time arguments and text output are UTC.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime

from executors.profile import JobProfile
from executors.records import JobRecord, NodeRecord
from executors.script import render_script
from executors.settings import ExecutorSettings
from executors.slurm_parse import (
    COMMENT_PREFIX,
    SACCT_TEXT_FIELDS,
    SINFO_FORMAT,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)
from sing.digits import ascii_digits
from sing.errors import UserError

# Runs a command (argv, stdin text) and returns its stdout; raises UserError on failure.
Runner = Callable[[list[str], str | None], str]


def run_command(argv: list[str], stdin: str | None = None) -> str:
    try:
        result = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env={**os.environ, "TZ": "UTC"}
        )
    except FileNotFoundError as err:
        raise UserError(
            f"{argv[0]} not found: install the Slurm client, or set [executor] kind = 'local'"
        ) from err
    if result.returncode != 0:
        raise UserError(f"{' '.join(argv[:2])} failed (exit {result.returncode}): "
                        f"{result.stderr.strip()[-500:]}")  # fmt: skip
    return result.stdout


class SlurmExecutor:
    def __init__(self, cluster: str, settings: ExecutorSettings, run: Runner = run_command) -> None:
        self.cluster = cluster
        self.settings = settings
        self._run = run

    def submit(self, profile: JobProfile) -> str:
        comment = COMMENT_PREFIX + json.dumps(
            {"interactive": profile.interactive, "dependencies": profile.dependencies()},
            separators=(",", ":"),
        )
        script = render_script(profile, self.settings, headers=sbatch_headers(profile))
        out = self._run(["sbatch", "--parsable", f"--comment={comment}"], script)
        job_id = out.strip().split(";")[0]  # "ID" or "ID;CLUSTER"
        if not ascii_digits(job_id):
            raise UserError(f"sbatch answered {out.strip()!r}, not a job id")
        return job_id

    def cancel(self, job_id: str) -> None:
        self._run(["scancel", job_id], None)

    def running(self) -> list[JobRecord]:
        return parse_squeue(self._run(["squeue", "--json"], None), self.cluster)

    def finished(self, since: datetime) -> list[JobRecord]:
        window = ["-a", "-S", since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"), "-E", "now"]
        dump = self._run(["sacct", "--json", *window], None)
        fields = ",".join(SACCT_TEXT_FIELDS)
        text = self._run(["sacct", "-X", "-P", "-n", "-o", fields, *window], None)
        return [
            r for r in parse_sacct(dump, text, self.cluster) if r.end_time and r.end_time >= since
        ]

    def drain(self, node: str, reason: str) -> None:
        self._run(
            ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], None
        )

    def inventory(self) -> list[NodeRecord]:
        argv = ["sinfo", "--all", "--Node", "--noheader", f"--format={SINFO_FORMAT}"]
        return parse_sinfo(self._run(argv, None))


def sbatch_headers(profile: JobProfile) -> list[str]:
    headers = [f"#SBATCH --job-name={profile.name}", f"#SBATCH --nodes={profile.nodes}"]
    if profile.gpus_per_node:
        headers.append(f"#SBATCH --gres=gpu:{profile.gpus_per_node}")
    if profile.partition:
        headers.append(f"#SBATCH --partition={profile.partition}")
    if profile.time_limit_s:
        days, rest = divmod(profile.time_limit_s, 86400)
        hours, rest = divmod(rest, 3600)
        minutes, seconds = divmod(rest, 60)
        headers.append(f"#SBATCH --time={days}-{hours:02}:{minutes:02}:{seconds:02}")
    return headers
