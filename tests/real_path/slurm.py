"""What Slurm itself says about jobs: which GPU indices it gave them and when they ran.

These are the ground truth the test computes its expected figures from, read with Slurm's own
commands (`scontrol show job -d`, `sacct`), never from sing's output.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NamedTuple

from tests.real_path.processes import run
from tests.slurm_harness import SlurmCluster

# `scontrol show job -d`, one line per node (or group of nodes with the same allocation):
#      Nodes=gpu-1 CPU_IDs=0 Mem=0 GRES=gpu:a100:4(IDX:0-3)
_NODE_GRES = re.compile(r"^\s+Nodes=(\S+) .*GRES=\S*?\(IDX:([\d,-]+)\)", re.MULTILINE)

Allocation = dict[str, list[int]]  # node -> GPU indices


class JobTimes(NamedTuple):
    submit: datetime
    start: datetime
    end: datetime


def indices(text: str) -> list[int]:
    """`0-3,6` -> [0, 1, 2, 3, 6]."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def gpu_allocation(job_id: str, env: dict[str, str]) -> Allocation:
    """The GPU indices per node that Slurm allocated to a running job."""
    text = run(["scontrol", "show", "job", "-d", job_id], env=env)
    allocation: Allocation = {}
    for nodes, idx in _NODE_GRES.findall(text):
        for node in run(["scontrol", "show", "hostnames", nodes], env=env).split():
            allocation[node] = indices(idx)
    return allocation


def job_states(env: dict[str, str]) -> dict[str, str]:
    """Job id -> state of the jobs squeue still lists."""
    text = run(["squeue", "-h", "-o", "%i %T"], env=env)
    return dict(line.split() for line in text.splitlines() if line.strip())


def run_times(job_ids: list[str], env: dict[str, str]) -> dict[str, JobTimes]:
    """Job id -> its submit, start and end times as Slurm accounted them (whole seconds)."""
    text = run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobIDRaw,Submit,Start,End"],
        env={**env, "TZ": "UTC"},
    )
    times = {}
    for line in text.splitlines():
        job_id, *stamps = line.split("|")
        times[job_id] = JobTimes(*(datetime.fromisoformat(t).replace(tzinfo=UTC) for t in stamps))
    return times


@contextlib.contextmanager
def slurmctld_stopped(cluster: SlurmCluster) -> Iterator[None]:
    """slurmctld frozen (SIGSTOP) for the block, as a hung controller looks to its clients:
    connections open, nothing answers. SIGCONT on the way out, whatever happened."""
    pid = int((cluster.base / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
