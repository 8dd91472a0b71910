"""The simulator starts every job exactly when the reference code did, on 3,000 real Philly jobs.

The fixture holds each job's wait (start - submit, whole seconds: Philly times are integers) under
each policy and option variant, as the straightforward scheduler computed it before the hot path
was optimised (commit 761f05b). Any change to scheduling behaviour shows up here job by job; a
deliberate change re-writes the fixture with `python -m tests.test_scheduler_regression` and says
why in its commit.
"""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import replay
from sing.scheduler.workload import Workload, read_trace
from tests.shared_data import PHILLY, require

FIXTURE = Path(__file__).parent / "fixtures/scheduler/philly_starts.csv"
# A busy stretch: the first 3,000 jobs from 2017-10-23 (50 h) on 32 x 8 GPUs keep a queue of
# 1- to 16-GPU jobs most of the time, and some jobs start on arrival.
SINCE, JOBS, NODES, GPUS_PER_NODE = datetime(2017, 10, 23, tzinfo=UTC).timestamp(), 3000, 32, 8

# sing's variants as the reference computed them: reserve after 72 h (the default then), no age
# window (tests/test_scheduler_properties.py checks the window's bound).
OLD_SING = {"policy": "sing", "max_head_wait_s": 72 * 3600.0, "age_window_after_s": 0.0}
VARIANTS = {
    "fcfs": SchedulerSettings(policy="fcfs"),
    "sing": SchedulerSettings(**OLD_SING),
    "sing_wait_1h": SchedulerSettings(**{**OLD_SING, "max_head_wait_s": 3600}),
    "sing_budget": SchedulerSettings(**OLD_SING, backfill_rule="budget"),
    "easy": SchedulerSettings(policy="easy"),
    "sjf": SchedulerSettings(policy="sjf"),
    "sing_any_pow2": SchedulerSettings(**OLD_SING, placement="any", power_of_two=True),
    "easy_small_pool": SchedulerSettings(policy="easy", small_pool_nodes=4),
    "fcfs_user_limit": SchedulerSettings(policy="fcfs", max_jobs_per_user=40),
    "sjf_user_limit": SchedulerSettings(policy="sjf", max_jobs_per_user=40),
}


def philly_jobs() -> Workload:
    return read_trace(require(PHILLY)).window(SINCE).sorted_by_submit().select(list(range(JOBS)))


def waits(jobs: Workload, settings: SchedulerSettings) -> list[int]:
    run = replay(jobs, NODES, GPUS_PER_NODE, settings)
    assert run.workload.job_id == jobs.job_id
    return [int(start - submit) for start, submit in zip(run.start, jobs.submit, strict=True)]


@pytest.fixture(scope="module")
def reference() -> tuple[Workload, dict[str, list[int]]]:
    with FIXTURE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    jobs = philly_jobs()
    assert [r["job_id"] for r in rows] == jobs.job_id
    return jobs, {name: [int(r[name]) for r in rows] for name in VARIANTS}


@pytest.mark.parametrize("name", VARIANTS)
def test_same_start_times_as_the_reference(name: str, reference) -> None:
    jobs, expected = reference
    got = waits(jobs, VARIANTS[name])
    differ = [jobs.job_id[k] for k in range(JOBS) if got[k] != expected[name][k]]
    assert not differ, f"{len(differ)} jobs start differently, first {differ[:5]}"


def write_fixture() -> None:
    jobs = philly_jobs()
    columns = {name: waits(jobs, settings) for name, settings in VARIANTS.items()}
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    with FIXTURE.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["job_id", *columns])
        for k, job_id in enumerate(jobs.job_id):
            writer.writerow([job_id, *(column[k] for column in columns.values())])
    print(f"wrote {FIXTURE} ({JOBS} jobs x {len(columns)} variants)", file=sys.stderr)


if __name__ == "__main__":
    write_fixture()
