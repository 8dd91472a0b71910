"""Attribution of a GPU process to its Slurm job under every cgroup layout Slurm 26.05 produces,
and each job's CPU, memory and I/O read from its cgroup in those layouts.

The /proc/PID/cgroup lines are tests/executors_data/slurm-26.05/cgroup_*.txt, derived from the
SchedMD/slurm sources (README there); the SLUID mapping is written by the real prolog script.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sing.exporters.cgroups import CgroupSource
from sing.exporters.errors import ErrorCounter
from sing.exporters.jobs import JobSource
from sing.testing.fake_nvml import JOB_PID_BASE, FakeNvml, StateFile
from sing.testing.fake_world import FakeWorld
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


def test_a_job_without_gpus_gets_its_runs_mapping_for_its_cgroup(tmp_path: Path) -> None:
    """The exporter reads every job's cgroup, so the prolog names a CPU-only job's run too."""
    job_dir = tmp_path / "gpu-jobs"
    slurm("slurm-prolog.sh", "45", "", job_dir, sluid=RUN2)
    assert [p.name for p in job_dir.iterdir() if not p.name.startswith(".")] == []
    assert JobSource(tmp_path, job_dir, ErrorCounter()).recorded_job(RUN2) == "45"
    slurm("slurm-epilog.sh", "45", "", job_dir, sluid=RUN2)
    assert list((tmp_path / "gpu-jobs.sluid").iterdir()) == []


# ---- each job's CPU, memory and I/O from its cgroup (sing/exporters/cgroups.py) --------------

FIXTURES = Path(__file__).parent / "fixtures"


def read_cgroups(sysfs: Path, mapping_dir: Path) -> tuple[dict, dict[str, float]]:
    """{(jobid, sluid): values} read from the tree under `sysfs`, and the errors counted."""
    errors = ErrorCounter()
    source = CgroupSource(str(sysfs), JobSource(sysfs / "proc", mapping_dir, errors), errors)
    return {(j.jobid, j.sluid): j.values for j in source.read()}, errors_of(errors)


def test_cgroup_v1_tree_as_slurm_lays_it_out() -> None:
    """tests/fixtures/cgroup_v1: /sys/fs/cgroup/<controller>/slurm/uid_<uid>/job_<id>/, cpuacct
    mounted with cpu (`cpu,cpuacct` and its links), the steps' and tasks' directories below."""
    jobs, errors = read_cgroups(FIXTURES / "cgroup_v1", FIXTURES / "cgroup_v1" / "gpu-jobs")
    assert jobs == {
        ("1001", ""): {
            "cpu_user_s": 120.0,  # 12000 USER_HZ ticks
            "cpu_system_s": 3.45,
            "cpu_total_s": 123.456789012,  # cpuacct.usage in ns
            "memory_used": 2147483648,
            "memory_peak": 4294967296,
            "memory_limit": 17179869184,
            "cpus": 5,  # 2-5,10
            "io_read": 4096 + 1000,  # the _recursive file, both devices
            "io_written": 8192,
        },
        # jobacct_gather/linux makes no cpuacct cgroup: CPU unknown; no limit: none exported
        ("1002", ""): {"memory_used": 1048576, "memory_peak": 3145728},
    }
    assert errors == {}


def test_cgroup_v2_tree_as_slurm_lays_it_out() -> None:
    """tests/fixtures/exporter/sys (the golden page's tree): job_<id> and SLUID directories
    under slurmstepd.scope beside slurmstepd's own `system`, a kernel without memory.peak, a
    run no mapping names, a file that does not parse."""
    jobs, errors = read_cgroups(FIXTURES / "exporter" / "sys", FIXTURES / "exporter" / "gpu-jobs")
    assert jobs == {
        ("2002", ""): {
            "cpu_user_s": 7000.0,
            "cpu_system_s": 388.123456,
            "cpu_total_s": 7388.123456,
            "memory_used": 6442450944,
            "memory_peak": 8589934592,
            "memory_limit": 274877906944,
            "cpus": 8,  # 0-3,64-67
            "io_read": 1048576 + 2097152,
            "io_written": 4096,
        },
        ("6006", ""): {"cpu_user_s": 3.0, "cpu_system_s": 0.0, "cpu_total_s": 3.0, "cpus": 2},
        ("5005", "s4T9M8MZXRX000"): {  # memory.max "max": no limit
            "cpu_user_s": 1.0,
            "cpu_system_s": 0.5,
            "cpu_total_s": 1.5,
            "memory_used": 1048576,
        },  # fmt: skip
        ("", "s4T9M8MZMKY000"): {"cpu_user_s": 2.0, "cpu_system_s": 0.0, "cpu_total_s": 2.0},
    }
    assert errors == {"unknown_sluid": 1.0, "parse_error": 1.0}  # job 6006's memory.current


def test_multiple_slurmd_scopes_in_another_slice(tmp_path: Path) -> None:
    """CgroupSlice and `<node>_slurmstepd.scope` (multiple slurmd): every scope is read."""
    root = tmp_path / "fs" / "cgroup"
    (root / "cgroup.controllers").parent.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for scope, job in (("sing.slice/gpu-1_slurmstepd.scope", 7), ("system.slice/x.scope", 8)):
        (root / scope / f"job_{job}").mkdir(parents=True)
        (root / scope / f"job_{job}" / "memory.current").write_text(f"{job}\n")
    jobs, _ = read_cgroups(tmp_path, tmp_path / "gpu-jobs")
    assert jobs == {("7", ""): {"memory_used": 7}}  # x.scope is not slurmstepd's


def test_a_runs_job_is_remembered_while_its_directory_lives(tmp_path: Path) -> None:
    scope = tmp_path / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope"
    (scope / RUN2).mkdir(parents=True)
    (scope.parents[1] / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "gpu-jobs.sluid").mkdir()
    (tmp_path / "gpu-jobs.sluid" / RUN2).write_text("42\n")
    errors = ErrorCounter()
    source = CgroupSource(str(tmp_path), JobSource(tmp_path, tmp_path / "gpu-jobs", errors), errors)
    assert [(j.jobid, j.sluid) for j in source.read()] == [("42", RUN2)]
    (tmp_path / "gpu-jobs.sluid" / RUN2).unlink()  # the epilog may run before the cgroup goes
    assert [(j.jobid, j.sluid) for j in source.read()] == [("42", RUN2)]
    (scope / RUN2).rmdir()
    assert source.read() == [] and source._runs == {}
    assert errors_of(errors) == {}


FAKE_NODE = {
    "count": 2,
    "defaults": {"util": 0.5},
    "gpus": {0: {"job_id": "101", "user": "alice"}},
    "cgroup": {
        "defaults": {"cpus": 8, "memory_limit": 64e9},
        "jobs": {
            "101": {"cpus": 32, "cpu_user_s": 100.0, "cpu_busy": 3.0, "memory_used": 6e9},
            102: {
                "cpu_system_s": 5.0,
                "memory_used": 1e9,
                "memory_peak": None,
                "io_read_bytes": 3000,
                "io_write_bytes_per_s": 100.0,
            },  # fmt: skip
        },
    },
}


@pytest.mark.parametrize("layout", ["v1", "v2", "v2_sluid"])
def test_the_fake_nodes_scripted_jobs_read_back_in_si_units(tmp_path: Path, layout: str) -> None:
    """The fake world writes the kernel's units in Slurm's layout; the reader must give back the
    scripted seconds and bytes, with GPU attribution through the same layout's /proc lines."""
    clock = [1000.0]
    nvml = FakeNvml({**FAKE_NODE, "cgroup": {**FAKE_NODE["cgroup"], "layout": layout}},
                    clock=lambda: clock[0])  # fmt: skip
    world = FakeWorld(tmp_path, nvml)
    world.sync()
    errors = ErrorCounter()
    jobs = JobSource(world.proc_root, world.mapping_dir, errors)
    source = CgroupSource(str(world.sysfs_root), jobs, errors)
    clock[0] += 10.0  # 3 cores busy for 10 s; 100 bytes/s written
    world.sync()
    read = {j.jobid: j.values for j in source.read()}
    assert read["101"] == pytest.approx({
        "cpu_user_s": 130.0, "cpu_system_s": 0.0, "cpu_total_s": 130.0, "cpus": 32,
        "memory_used": 6e9, "memory_peak": 6e9, "memory_limit": 64e9,
    })  # fmt: skip
    assert read["102"] == pytest.approx({
        "cpu_user_s": 0.0, "cpu_system_s": 5.0, "cpu_total_s": 5.0, "cpus": 8,
        "memory_used": 1e9, "memory_limit": 64e9, "io_read": 3000, "io_written": 1000,
    })  # fmt: skip
    assert jobs.process_job(JOB_PID_BASE).job_id == "101"
    assert errors_of(errors) == {}


def test_a_state_file_sets_a_jobs_counters_and_ends_its_cgroup(tmp_path: Path) -> None:
    """At runtime a state file sets a counter (lower: a new cgroup, as after a requeue) and
    removes a job's cgroup."""
    state = tmp_path / "state.json"
    state.write_text('{"cgroup": {"jobs": {"102": {"cpu_user_s": 50}}}}')
    nvml = FakeNvml({**FAKE_NODE, "cgroup": {**FAKE_NODE["cgroup"], "layout": "v2"}},
                    StateFile(state))  # fmt: skip
    world = FakeWorld(tmp_path / "node", nvml)
    world.sync()
    source = CgroupSource(str(world.sysfs_root), JobSource(tmp_path, tmp_path, ErrorCounter()),
                          ErrorCounter())  # fmt: skip
    assert {j.jobid: j.values["cpu_user_s"] for j in source.read()}["102"] == 50.0
    state.write_text('{"cgroup": {"jobs": {"102": null}}}')
    os.utime(state, ns=(0, 2 * 10**18))  # the state file is re-read when its mtime changes
    world.sync()
    assert [j.jobid for j in source.read()] == ["101"]
