"""The Slurm prolog/epilog scripts, run by a real shell, feeding the exporter's job reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exporters.errors import ErrorCounter
from exporters.jobs import JobSource

DEPLOY = Path(__file__).resolve().parents[1] / "exporters" / "deploy"


def slurm(script: str, job: str, gpus: str, job_dir: Path) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SING_GPU_JOB_DIR": str(job_dir)}
    if gpus:
        env["SLURM_JOB_GPUS"] = gpus
    result = subprocess.run(["sh", str(DEPLOY / script)], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr, result.stderr


def test_prolog_and_epilog_maintain_the_mapping_the_exporter_reads(tmp_path: Path) -> None:
    job_dir = tmp_path / "gpu-jobs"
    jobs = JobSource(tmp_path, job_dir, ErrorCounter())
    assert jobs.allocations() is None  # before any job: no directory, no cross-check
    slurm("slurm-prolog.sh", "11", "0,2", job_dir)
    slurm("slurm-prolog.sh", "12", "2", job_dir)  # a shared GPU holds two jobs
    slurm("slurm-prolog.sh", "12", "2", job_dir)  # a requeued prolog does not duplicate
    slurm("slurm-prolog.sh", "13", "", job_dir)  # a CPU-only job touches nothing
    assert jobs.allocations() == {"0": {"11"}, "2": {"11", "12"}}
    assert (job_dir / "2").read_text() == "11\n12\n"
    slurm("slurm-epilog.sh", "11", "0,2", job_dir)
    assert jobs.allocations() == {"2": {"12"}}
    slurm("slurm-epilog.sh", "12", "2", job_dir)
    assert jobs.allocations() == {}


def test_systemd_unit_runs_the_standalone_exporter() -> None:
    unit = (DEPLOY / "sing-exporter.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert " -m exporters " in exec_start
    # what ExecStart runs exists and parses its options
    result = subprocess.run(
        [sys.executable, "-m", "exporters", "--help"],
        cwd=DEPLOY.parents[1],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "--fake-state" in result.stdout
