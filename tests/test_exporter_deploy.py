"""The Slurm prolog/epilog scripts, run by a real shell, feeding the exporter's job reader."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sing.exporters.errors import ErrorCounter
from sing.exporters.jobs import JobSource
from sing.exporters.web import MAX_CONNECTIONS
from tests.debian import ensure_packages

DEPLOY = Path(__file__).resolve().parents[1] / "sing" / "exporters" / "deploy"


def slurm(
    script: str, job: str, gpus: str, job_dir: Path, group: str = "", sluid: str = ""
) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SING_GPU_JOB_DIR": str(job_dir)}
    if sluid:
        env["SLURM_JOB_SLUID"] = sluid
    if group:
        env["SING_EXPORTER_GROUP"] = group
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


def test_systemd_unit_runs_the_standalone_exporter_unprivileged(tmp_path: Path) -> None:
    unit = (DEPLOY / "sing-exporter.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert " -m sing.exporters " in exec_start
    assert "\nUser=sing-exporter\n" in unit and "\nCapabilityBoundingSet=\n" in unit
    # one thread per connection, capped by the server; the unit caps tasks with room above it
    tasks_max = int(next(line for line in unit.splitlines() if line.startswith("TasksMax="))[9:])
    assert MAX_CONNECTIONS + 16 <= tasks_max <= 4 * MAX_CONNECTIONS
    # systemd itself checks the unit and rates its sandbox (exposure 0-10; 6.9 as root before)
    ensure_packages("systemd")
    local = tmp_path / "sing-exporter.service"  # with a Python this machine has
    local.write_text(unit.replace(exec_start.split()[0].split("=")[1], sys.executable))
    verify = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True)
    assert verify.returncode == 0, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--threshold=25", str(local)],
        capture_output=True,
        text=True,
    )
    assert security.returncode == 0, security.stdout[-2000:]
    # what ExecStart runs exists and parses its options
    result = subprocess.run(
        [sys.executable, "-m", "sing.exporters", "--help"],
        cwd=DEPLOY.parents[2],  # the checkout
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "--fake-state" in result.stdout


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's own tmp_path is private to root)."""
    if os.geteuid() != 0:
        pytest.skip("the prolog's chgrp and running a reader as another user need root")
    base = Path(tempfile.mkdtemp(prefix="sing-prolog-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def read_as_nobody(path: Path, groups: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["cat", str(path)], user="nobody", group="nogroup", extra_groups=groups,
        capture_output=True, text=True,
    )  # fmt: skip


def test_job_files_are_readable_by_the_exporter_group_and_no_other_user(shared_dir: Path) -> None:
    job_dir, group = shared_dir / "gpu-jobs", "video"  # a group every Debian has
    slurm("slurm-prolog.sh", "11", "0", job_dir, group)
    slurm("slurm-prolog.sh", "12", "0", job_dir, group)
    slurm("slurm-epilog.sh", "11", "0", job_dir)  # rewrites the file: its mode must survive
    for path, mode in [(job_dir, 0o750), (job_dir / "0", 0o640)]:
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == mode and info.st_gid == grp.getgrnam(group).gr_gid
    allowed = read_as_nobody(job_dir / "0", [group])
    assert allowed.returncode == 0 and allowed.stdout == "12\n"
    refused = read_as_nobody(job_dir / "0", [])
    assert refused.returncode != 0 and "Permission denied" in refused.stderr


def test_without_the_exporter_group_job_files_are_world_readable(shared_dir: Path) -> None:
    job_dir = shared_dir / "gpu-jobs"
    slurm("slurm-prolog.sh", "11", "0", job_dir, "no-such-group")
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o755
    assert stat.S_IMODE((job_dir / "0").stat().st_mode) == 0o644
    assert read_as_nobody(job_dir / "0", []).stdout == "11\n"
