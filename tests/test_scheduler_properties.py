"""Properties every replay must have, on random small traces (hypothesis)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.settings import SchedulerSettings
from scheduler.simulate import Replay, replay
from scheduler.workload import Workload

NODES, GPUS = 4, 4

jobs = st.lists(
    st.tuples(
        st.integers(0, 60),  # submit
        st.integers(1, 40),  # duration
        st.sampled_from([1, 1, 1, 2, 3, 4, 6, 8, 12]),  # GPUs
        st.sampled_from(["ana", "bo", "cy"]),
    ),
    min_size=1,
    max_size=30,
)

VARIANTS = [
    SchedulerSettings(policy="fcfs"),
    SchedulerSettings(policy="sjf"),
    SchedulerSettings(policy="easy"),
    SchedulerSettings(policy="sing", backfill_rule="wait", max_head_wait_s=15),
    SchedulerSettings(policy="sing", backfill_rule="budget", backfill_budget=1.0),
    SchedulerSettings(policy="sing", placement="any", power_of_two=True),
    SchedulerSettings(policy="easy", small_pool_nodes=1, small_job_max_gpus=2),
    SchedulerSettings(policy="sjf", max_jobs_per_user=2),
    SchedulerSettings(policy="easy", max_jobs_per_user=1),
]


def to_workload(rows: list[tuple[int, int, int, str]]) -> Workload:
    return Workload(
        job_id=[f"j{k}" for k in range(len(rows))],
        user=[r[3] for r in rows],
        submit=[float(r[0]) for r in rows],
        duration=[float(r[1]) for r in rows],
        num_gpus=[r[2] for r in rows],
        num_nodes=[0] * len(rows),
        time_limit=[None] * len(rows),
    )


def head_since(run: Replay) -> list[float]:
    """When each job became the oldest waiting job: its submit, or the last older job's start."""
    since, latest = [], float("-inf")
    for k, submit in enumerate(run.workload.submit):
        since.append(max(submit, latest))
        latest = max(latest, run.start[k])
    return since


@settings(max_examples=60, deadline=None)
@given(jobs)
def test_replays_are_feasible(rows) -> None:
    w = to_workload(rows)
    for variant in VARIANTS:
        run = replay(w, NODES, GPUS, variant)
        jobs_ = run.workload
        busy: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        running_by_user: list[tuple[float, int, str]] = []
        for k in range(len(jobs_)):
            start, end = run.start[k], run.start[k] + jobs_.duration[k]
            assert start >= jobs_.submit[k]
            placed = run.placement(k)
            assert sum(len(g) for g in placed.values()) == run.gpus[k] >= jobs_.num_gpus[k]
            for node, gpus in placed.items():
                assert len(set(gpus)) == len(gpus) and all(0 <= g < GPUS for g in gpus)
                for g in gpus:
                    busy[node, g].append((start, end))
            running_by_user += [(start, 1, jobs_.user[k]), (end, -1, jobs_.user[k])]
        for intervals in busy.values():  # no GPU held by two jobs at any instant
            intervals.sort()
            for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
                assert start >= end, (variant, intervals)
        if variant.max_jobs_per_user:
            count: dict[str, int] = defaultdict(int)
            for _, delta, user in sorted(running_by_user):  # ends (-1) sort before starts
                count[user] += delta
                assert count[user] <= variant.max_jobs_per_user


@settings(max_examples=80, deadline=None)
@given(jobs)
def test_fcfs_starts_in_submit_order(rows) -> None:
    run = replay(to_workload(rows), NODES, GPUS, SchedulerSettings(policy="fcfs"))
    assert run.start == sorted(run.start)


@settings(max_examples=80, deadline=None)
@given(jobs, st.integers(0, 30))
def test_sing_wait_rule_bounds_how_long_the_head_is_passed_over(rows, bound) -> None:
    run = replay(
        to_workload(rows), NODES, GPUS, SchedulerSettings(policy="sing", max_head_wait_s=bound)
    )
    since = head_since(run)
    for j, started in enumerate(run.start):
        older_waiting = [h for h in range(j) if run.start[h] > started]
        if older_waiting:  # j was backfilled past head h
            h = older_waiting[0]
            assert started - since[h] < bound, (h, j)


@settings(max_examples=80, deadline=None)
@given(jobs, st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_sing_budget_rule_caps_backfill_per_head(rows, factor) -> None:
    settings_ = SchedulerSettings(policy="sing", backfill_rule="budget", backfill_budget=factor)
    run = replay(to_workload(rows), NODES, GPUS, settings_)
    since = head_since(run)
    for h, head_start in enumerate(run.start):
        passed = [j for j in range(h + 1, len(run.start)) if since[h] <= run.start[j] < head_start]
        assert sum(run.gpus[j] for j in passed) <= factor * run.gpus[h]
