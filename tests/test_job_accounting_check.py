"""`sing job`'s cross-check of the node's cgroup figures against Slurm's own accounting (sacct's
TotalCPU, seff's memory), with known values: quiet within the tolerances (CPU 10 %, memory 25 %
apart, as a share of the larger), a plain sentence beyond them saying which figure seff shows,
nothing for a job Slurm has not accounted yet. A running job's Slurm figures come from sstat,
asked through the executor only for a running job of its own cluster; a failed sstat is said, not
raised. tests/test_slurm_cgroups.py checks the same figures on a real Slurm with cgroups (sacct
after the end, sstat while it runs)."""

from __future__ import annotations

import polars as pl
import pytest

from sing.config import Thresholds
from sing.executors.base import FAILED, CommandError, running_accounting
from sing.executors.records import JobUsage
from sing.warehouse.job_report import accounting_check, apart, job_report, load_notes, render
from sing.warehouse.store import Warehouse
from tests.test_analytics import GIB, add_host_samples, at
from tests.test_job_report import EVERY_15_MIN

HOUR = 3600


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """Four 2-hour jobs on one node whose cgroups read 2 cores busy (4.0 core-hours) and an
    8 GiB peak; Slurm's accounting differs by job as the names say."""
    wh = Warehouse(tmp_path_factory.mktemp("check") / "wh")
    slurm = {
        "agree": (4.2 * HOUR, 7 * GIB),  # 5 % and 12.5 % apart: within the tolerances
        "cpu": (4.5 * HOUR, 8 * GIB),  # 11 % apart
        "mem": (4.0 * HOUR, 4 * GIB),  # 50 % apart
        "running": (None, None),  # not accounted yet
    }
    for job_id, (cpu_s, rss) in slurm.items():
        wh.append("jobs", pl.DataFrame([{
            "job_id": job_id, "cluster": "test", "user": "alice", "state": "COMPLETED",
            "submit_time": at(0), "start_time": at(0), "end_time": at(2), "num_nodes": 1,
            "num_gpus": 0, "nodes": [f"{job_id}-0"], "slurm_cpu_s": cpu_s,
            "slurm_max_rss_bytes": rss,
        }]))  # fmt: skip
        add_host_samples(wh, job_id, f"{job_id}-0", at(0), at(2), 2.0, cpus=4,
                         mem_peak=8 * GIB, mem_limit=16 * GIB)  # fmt: skip
    wh.append("jobs", pl.DataFrame([{
        "job_id": "live", "cluster": "test", "user": "alice", "state": "RUNNING",
        "submit_time": at(0), "start_time": at(0), "end_time": None, "num_nodes": 1,
        "num_gpus": 0, "nodes": ["live-0"],
    }]))  # fmt: skip
    add_host_samples(wh, "live", "live-0", at(0), at(2), 2.0, cpus=4, mem_peak=8 * GIB,
                     mem_limit=16 * GIB)  # fmt: skip
    return wh


def report(wh: Warehouse, job_id: str, now=None, running_accounting=None) -> dict:
    return job_report(wh.connect(), job_id, Thresholds(), load_notes(None), now or at(24),
                      needs=EVERY_15_MIN, running_accounting=running_accounting)  # fmt: skip


class Scheduler:
    """What `running_accounting` asks of an executor: its cluster and a job's usage so far
    (Slurm's sstat; tests/test_slurm_cgroups.py asks the real one)."""

    def __init__(self, cluster: str, usage: JobUsage | None = None, fails: bool = False) -> None:
        self.cluster, self._usage, self._fails, self.asked = cluster, usage, fails, []

    def usage(self, job_id: str) -> JobUsage | None:
        self.asked.append(job_id)
        if self._fails:
            raise CommandError("sstat", FAILED, "sstat exited 1: slurmctld not responding")
        return self._usage


def live_report(wh: Warehouse, scheduler: Scheduler) -> dict:
    return report(wh, "live", at(2), lambda cluster: running_accounting(scheduler, cluster, "live"))


def test_figures_within_the_tolerances_say_nothing(wh: Warehouse) -> None:
    job = report(wh, "agree")
    assert (job["cpu_core_s"], job["slurm_cpu_s"]) == (pytest.approx(4 * HOUR), 4.2 * HOUR)
    assert (job["host_mem_peak_bytes"], job["slurm_max_rss_bytes"]) == (8 * GIB, 7 * GIB)
    assert job["accounting_check"] == []


def test_cpu_seconds_apart_are_said_in_core_hours(wh: Warehouse) -> None:
    job = report(wh, "cpu")
    assert job["accounting_check"] == [
        "Slurm's accounting says 4.5 core-hours of CPU, the node's cgroups 4.0 core-hours "
        "(11% apart). seff and sacct (TotalCPU) show Slurm's figure; the figures above are the "
        "cgroups', which miss what ran after the last reading or while the node was not read."
    ]
    assert job["notes"][-1] == job["accounting_check"][0]  # the Job page shows the notes
    assert "Slurm (seff)     CPU 4.5 core-hours, memory 8.0 GiB; the node's cgroups: CPU 4.0 " \
        "core-hours\n" in render(job)  # fmt: skip


def test_peak_memory_apart_says_which_one_seff_shows(wh: Warehouse) -> None:
    assert report(wh, "mem")["accounting_check"] == [
        "Slurm's accounting says the job's peak memory was 4.0 GiB, the node's cgroups 8.0 GiB "
        "(50% apart). seff shows Slurm's figure (its tasks' largest resident memory, sampled); "
        "the cgroups' peak also counts page cache and catches peaks between samples."
    ]


def test_a_job_slurm_has_not_accounted_is_not_compared(wh: Warehouse) -> None:
    job = report(wh, "running")
    assert (job["slurm_cpu_s"], job["slurm_max_rss_bytes"], job["accounting_check"]) == (
        None, None, [],
    )  # fmt: skip
    assert "Slurm (seff)" not in render(job)


def test_short_jobs_in_core_seconds_and_unknowns() -> None:
    job = {"cpu_core_s": 6.2, "slurm_cpu_s": 5.0, "host_mem_peak_bytes": None,
           "slurm_max_rss_bytes": 200 * 2**20}  # fmt: skip
    (said,) = accounting_check(job)
    assert said.startswith("Slurm's accounting says 5.0 core-seconds of CPU, the node's cgroups "
                           "6.2 core-seconds (19% apart).")  # fmt: skip
    assert apart(None, 1.0) is None and apart(0, 0) is None and apart(3.0, 4.0) == 0.25


def test_a_running_job_is_compared_with_sstat_so_far(wh: Warehouse) -> None:
    scheduler = Scheduler("test", JobUsage(cpu_s=5.0 * HOUR, max_rss_bytes=8 * GIB))
    job = live_report(wh, scheduler)
    assert scheduler.asked == ["live"]
    assert (job["slurm_cpu_s"], job["slurm_source"]) == (5.0 * HOUR, "sstat")
    assert job["accounting_check"] == [
        "Slurm's accounting so far (sstat) says 5.0 core-hours of CPU, the node's cgroups 4.0 "
        "core-hours (20% apart). sstat shows Slurm's figure; the figures above are the cgroups', "
        "which lag behind by up to a collector interval and miss what ran while the node was "
        "not read."
    ]
    assert "Slurm (sstat)    CPU 5.0 core-hours, memory 8.0 GiB" in render(job)


def test_a_failed_sstat_is_said_and_the_report_stands(wh: Warehouse) -> None:
    job = live_report(wh, Scheduler("test", fails=True))
    assert job["cpu_core_s"] == pytest.approx(4 * HOUR) and job["slurm_cpu_s"] is None
    assert job["accounting_check"] == [
        "Slurm's figures for this running job could not be read: sstat exited 1: slurmctld not "
        "responding"
    ]


def test_sstat_is_asked_only_for_a_running_job_of_its_own_cluster(wh: Warehouse) -> None:
    other = Scheduler("elsewhere", JobUsage(cpu_s=1.0, max_rss_bytes=1))
    assert live_report(wh, other)["slurm_source"] is None and other.asked == []
    ended = Scheduler("test", JobUsage(cpu_s=1.0, max_rss_bytes=1))
    job = report(wh, "cpu", running_accounting=lambda c: running_accounting(ended, c, "cpu"))
    assert (job["slurm_source"], job["slurm_cpu_s"], ended.asked) == ("sacct", 4.5 * HOUR, [])
    assert live_report(wh, Scheduler("test"))["slurm_source"] is None  # no step running yet
