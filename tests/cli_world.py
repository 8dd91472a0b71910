"""A small warehouse built by the project's own importer (`sing warehouse import`) from job
records written here, so the tests of tests/test_cli_output.py and tests/test_cli_inputs.py
know every answer from the records, not from the code under test."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.test_analytics import run_sing

# Three jobs of cluster campus: `old` ended, `wide` (2 nodes) and `small` still run. Their
# starts are in this order, so a report listing the newest first lists small, wide, old.
JOBS_CSV = """\
job_id,cluster,user,account,partition,state,submit_time,start_time,end_time,num_nodes,num_gpus,time_limit_s,nodes
old,campus,alice,alice-lab,gpu,COMPLETED,2026-11-01T08:00:00Z,2026-11-01T09:00:00Z,2026-11-01T11:00:00Z,1,2,14400,gpu01
wide,campus,bob,bob-lab,gpu,RUNNING,2026-11-02T08:00:00Z,2026-11-02T09:00:00Z,,2,16,86400,"gpu01,gpu02"
small,campus,alice,alice-lab,gpu,RUNNING,2026-11-03T08:00:00Z,2026-11-03T09:00:00Z,,1,1,3600,gpu02
"""
# Which GPUs of gpu02 the running jobs hold: wide has 0-7 there, small none (it holds gpu01's 3).
JOB_GPUS_CSV = "job_id,cluster,node,gpu_index,start_time\n" + "".join(
    f"wide,campus,gpu02,{i},2026-11-02T09:00:00Z\n" for i in range(8)
)
JOB_GPUS_SMALL_CSV = (
    "job_id,cluster,node,gpu_index,start_time\nsmall,campus,gpu02,3,2026-11-03T09:00:00Z\n"
)
FIRST_START, LAST_END = "2026-11-01 09:00", "2026-11-03 09:00"


def build(tmp: Path, *, job_gpus: bool = False) -> Path:
    """The warehouse of JOBS_CSV (and, with `job_gpus`, its GPU mapping), imported by `sing`."""
    root = tmp / "wh"
    files = [("jobs", "jobs.csv", JOBS_CSV)]
    if job_gpus:
        files.append(("job_gpus", "job_gpus.csv", JOB_GPUS_CSV))
        files.append(("job_gpus", "job_gpus_small.csv", JOB_GPUS_SMALL_CSV))
    for table, name, text in files:
        path = tmp / name
        path.write_text(text)
        done = run_sing("--warehouse", str(root), "warehouse", "import", table, str(path))
        assert done.returncode == 0, done.stderr
    return root


def sing(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`sing --warehouse ROOT ARGS`, the real command in its own process."""
    return run_sing("--warehouse", str(root), *args)
