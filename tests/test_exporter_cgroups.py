"""Attribution of a GPU process to its Slurm job under every cgroup layout Slurm 26.05 produces.

The /proc/PID/cgroup lines are tests/executors_data/slurm-26.05/cgroup_*.txt, derived from the
SchedMD/slurm sources (README there); the SLUID mapping is written by the real prolog script.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sing.exporters.errors import ErrorCounter
from sing.exporters.jobs import JobSource
from tests.test_exporter_deploy import slurm

DATA = Path(__file__).parent / "executors_data" / "slurm-26.05"
RUN2 = "s4T9M8MZXRX000"  # job 42's second run, the one in the cgroup fixtures


def process(proc: Path, pid: int, layout: str, environ: dict[str, str]) -> int:
    """A /proc/PID entry with a recorded cgroup file and the given environment."""
    base = proc / str(pid)
    base.mkdir(parents=True)
    (base / "cgroup").write_text((DATA / f"cgroup_{layout}.txt").read_text())
    (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    (base / "status").write_text("Name:\tpython\nUid:\t0\t0\t0\t0\n")
    return pid


def errors_of(counter: ErrorCounter) -> dict[str, float]:
    return {s.labels["kind"]: s.value for s in counter.metric().samples if s.name.endswith("total")}


@pytest.mark.parametrize("layout", ["v1", "v2_jobid"])
def test_job_id_directories_name_the_job_whatever_the_environment_says(tmp_path, layout):
    jobs = JobSource(tmp_path / "proc", tmp_path / "gpu-jobs", ErrorCounter())
    pid = process(tmp_path / "proc", 10, layout, {"SLURM_JOB_ID": "7", "SLURM_JOB_USER": "bob"})
    assert jobs.process_job(pid).job_id == "42"  # a forged SLURM_JOB_ID does not win


@pytest.mark.parametrize("layout", ["v2_sluid", "v2_multiple_slurmd"])
def test_sluid_directory_is_named_by_the_prologs_mapping(tmp_path, layout):
    job_dir = tmp_path / "gpu-jobs"
    slurm("slurm-prolog.sh", "42", "2,3", job_dir, sluid=RUN2)
    jobs = JobSource(tmp_path / "proc", job_dir, ErrorCounter())
    pid = process(tmp_path / "proc", 11, layout, {"SLURM_JOB_ID": "7", "SLURM_JOB_SLUID": RUN2})
    assert jobs.process_job(pid).job_id == "42"  # the root-written mapping beats the environment
    # the dcgm-exporter format directory still holds one job id per line and nothing else
    assert sorted(p.name for p in job_dir.iterdir() if not p.name.startswith(".")) == ["2", "3"]
    assert (job_dir / "2").read_text() == "42\n"
    assert jobs.allocations() == {"2": {"42"}, "3": {"42"}}


def test_sluid_without_mapping_takes_the_environment_only_for_the_same_run(tmp_path):
    errors = ErrorCounter()
    jobs = JobSource(tmp_path / "proc", tmp_path / "gpu-jobs", errors)
    same = process(
        tmp_path / "proc", 12, "v2_sluid", {"SLURM_JOB_ID": "42", "SLURM_JOB_SLUID": RUN2}
    )
    assert jobs.process_job(same).job_id == "42"
    # an environment of another run (run 1's SLUID, inherited or forged) or none names no job
    other = process(
        tmp_path / "proc",
        13,
        "v2_sluid",
        {"SLURM_JOB_ID": "42", "SLURM_JOB_SLUID": "s4T9M8MZMKY000"},
    )
    bare = process(tmp_path / "proc", 14, "v2_sluid", {"SLURM_JOB_ID": "42"})
    assert jobs.process_job(other).job_id is None and jobs.process_job(bare).job_id is None
    assert errors_of(errors) == {"unknown_sluid": 2.0}


def test_a_sluid_shaped_name_outside_slurmstepd_is_not_a_run(tmp_path):
    jobs = JobSource(tmp_path / "proc", tmp_path / "gpu-jobs", ErrorCounter())
    base = tmp_path / "proc" / "15"
    base.mkdir(parents=True)
    (base / "cgroup").write_text(f"0::/user.slice/{RUN2}/app.scope\n")
    (base / "environ").write_bytes(b"SLURM_JOB_ID=9\0")
    assert jobs.process_job(15).job_id == "9"  # the environment, as for any non-Slurm cgroup


def test_epilog_removes_the_runs_mapping_and_rejects_paths(tmp_path):
    job_dir = tmp_path / "gpu-jobs"
    slurm("slurm-prolog.sh", "42", "2", job_dir, sluid=RUN2)
    slurm("slurm-prolog.sh", "43", "3", job_dir, sluid="s/../../evil00")  # not a SLUID
    slurm("slurm-prolog.sh", "44", "1", job_dir)  # before 26.05: no SLUID, no mapping file
    assert [p.name for p in (tmp_path / "gpu-jobs.sluid").iterdir()] == [RUN2]
    assert (tmp_path / "gpu-jobs.sluid" / RUN2).read_text() == "42\n"
    slurm("slurm-epilog.sh", "42", "2", job_dir, sluid=RUN2)
    assert list((tmp_path / "gpu-jobs.sluid").iterdir()) == []
    assert JobSource(tmp_path, job_dir, ErrorCounter()).allocations() == {"3": {"43"}, "1": {"44"}}
