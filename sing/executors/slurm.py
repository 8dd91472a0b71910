"""The Slurm executor: `sbatch` to submit, `squeue`/`sacct` for records, `sstat` for a running
job's usage, `scancel` to cancel, `scontrol update ... state=drain` to drain a node.

It talks to Slurm only through its client commands (any Slurm with `--json`, no libslurm to
match), run with TZ=UTC so that time arguments and text output are UTC, each killed after
`[executor] command_timeout_s`: a hung slurmctld makes a CommandError, not a stalled caller.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

from sing.digits import ascii_digits
from sing.errors import UserError
from sing.executors.base import FAILED, TIMEOUT, CommandError, NodeState
from sing.executors.profile import JobProfile
from sing.executors.records import JobRecord, JobUsage, NodeRecord
from sing.executors.script import render_script
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm_parse import (
    COMMENT_PREFIX,
    SACCT_TEXT_FIELDS,
    SINFO_FORMAT,
    SSTAT_FIELDS,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
    parse_sstat,
)

# Runs a command (argv, stdin text) and returns its stdout; raises CommandError on failure.
Runner = Callable[[list[str], str | None], str]
# sinfo's reason column is as wide as this (it pads and cuts to the width); sing's reasons are
# at most sing.policy.drain.MAX_REASON (200) characters.
REASON_WIDTH = 300


def run_command(
    argv: list[str], stdin: str | None = None, timeout_s: float = ExecutorSettings.command_timeout_s
) -> str:
    """Run a Slurm client command; any failure to get its output (not found, not executable,
    no answer within `timeout_s`, a non-zero exit) is a CommandError naming the command."""
    command = os.path.basename(argv[0])
    try:
        result = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, "TZ": "UTC"},
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as err:
        raise CommandError(
            command,
            TIMEOUT,
            f"{' '.join(argv[:2])} timed out after {timeout_s:g} s: is slurmctld answering? "
            "([executor] command_timeout_s)",
        ) from err
    except FileNotFoundError as err:
        raise CommandError(
            command,
            FAILED,
            f"{argv[0]} not found: install the Slurm client, or set [executor] kind = 'local'",
        ) from err
    except OSError as err:  # not executable, too many processes, ...
        raise CommandError(command, FAILED, f"{argv[0]} could not run: {err}") from err
    if result.returncode != 0:
        raise CommandError(
            command,
            FAILED,
            f"{' '.join(argv[:2])} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}",
        )
    return result.stdout


class SlurmExecutor:
    def __init__(self, cluster: str, settings: ExecutorSettings, run: Runner | None = None) -> None:
        self.cluster = cluster
        self.settings = settings
        self._run = run or partial(run_command, timeout_s=settings.command_timeout_s)

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
        # --duplicates: every run of a requeued job (24.11 without it gives a requeued job's
        # pending record alone: the ended run is lost).
        start = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
        window = ["-a", "--duplicates", "-S", start, "-E", "now"]
        dump = self._run(["sacct", "--json", *window], None)
        fields = ",".join(SACCT_TEXT_FIELDS)
        text = self._run(["sacct", "-X", "-P", "-n", "-o", fields, *window], None)
        return [
            r for r in parse_sacct(dump, text, self.cluster) if r.end_time and r.end_time >= since
        ]

    def usage(self, job_id: str) -> JobUsage | None:
        """`sstat` of the job's running steps (sstat has no --json in 22.05 or 24.11); None
        when none runs. One job, on demand: sstat asks each step's node, so sync never does."""
        argv = ["sstat", "-a", "-P", "-n", "-j", job_id, "-o", ",".join(SSTAT_FIELDS)]
        return parse_sstat(self._run(argv, None))

    def drain(self, node: str, reason: str) -> None:
        self._run(
            ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], None
        )

    def node_state(self, node: str) -> NodeState | None:
        """`sinfo`'s state and reason of `node` (a node in several partitions has one line per
        partition, all alike); None when Slurm does not list it."""
        argv = ["sinfo", "--all", "--Node", "--noheader", f"--nodes={node}",
                f"--format=%T|%{REASON_WIDTH}E"]  # fmt: skip
        for line in self._run(argv, None).splitlines():
            state, _, reason = line.partition("|")
            if state.strip():
                return NodeState(state.strip(), reason.strip())
        return None

    def inventory(self) -> list[NodeRecord]:
        argv = ["sinfo", "--all", "--Node", "--noheader", f"--format={SINFO_FORMAT}"]
        return parse_sinfo(self._run(argv, None))

    def show_config(self) -> str:
        """`scontrol show config`: slurmctld's running configuration (`sing doctor head`)."""
        return self._run(["scontrol", "show", "config"], None)


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
