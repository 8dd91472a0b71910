"""Properties every replay must have, on random small traces (hypothesis)."""

from __future__ import annotations

import itertools
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from sing.scheduler.cluster import Cluster
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import Replay, replay
from sing.scheduler.workload import Workload

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
    SchedulerSettings(policy="sing", max_head_wait_s=15),
    SchedulerSettings(policy="sing", backfill_rule="wait", max_head_wait_s=15),
    SchedulerSettings(policy="sing", backfill_rule="budget", backfill_budget=1.0),
    SchedulerSettings(policy="sing", max_head_wait_s=0, age_window_after_s=10, age_window_s=5),
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
    settings_ = SchedulerSettings(policy="sing", backfill_rule="wait", max_head_wait_s=bound)
    run = replay(to_workload(rows), NODES, GPUS, settings_)
    since = head_since(run)
    for j, started in enumerate(run.start):
        older_waiting = [h for h in range(j) if run.start[h] > started]
        if older_waiting:  # j was backfilled past head h
            h = older_waiting[0]
            assert started - since[h] < bound, (h, j)


@settings(max_examples=80, deadline=None)
@given(jobs, st.integers(0, 30), st.sampled_from(["pack", "any"]))
def test_sing_reserve_rule_bounds_the_head_wait(rows, bound, placement) -> None:
    # Once the head has waited `bound`, nothing new starts on the nodes reserved for it, so it
    # starts at the latest when the jobs running then have ended.
    settings_ = SchedulerSettings(policy="sing", max_head_wait_s=bound, placement=placement)
    run = replay(to_workload(rows), NODES, GPUS, settings_)
    ends = [s + d for s, d in zip(run.start, run.workload.duration, strict=True)]
    for h, since in enumerate(head_since(run)):
        deadline = since + bound
        if run.start[h] > deadline:
            running = [e for k, e in enumerate(ends) if k != h and run.start[k] <= deadline < e]
            assert running and run.start[h] <= max(running), (h, deadline)


@settings(max_examples=80, deadline=None)
@given(
    jobs,
    st.integers(1, 30),
    st.integers(0, 30),
    st.sampled_from([0, 15]),
    st.sampled_from(["reserve", "wait", "budget"]),
)
def test_sing_age_window_keeps_young_jobs_from_passing_an_old_one(
    rows, after, width, bound, rule
) -> None:
    # Once job h has waited `after` since its submit, no job submitted more than `width` after
    # it starts before it: whatever the rule, a job passes h only while h is younger than that.
    settings_ = SchedulerSettings(
        policy="sing",
        backfill_rule=rule,
        max_head_wait_s=bound,
        age_window_after_s=after,
        age_window_s=width,
    )
    run = replay(to_workload(rows), NODES, GPUS, settings_)
    submit, start = run.workload.submit, run.start
    for h, j in itertools.combinations(range(len(start)), 2):
        if start[j] < start[h] and submit[j] > submit[h] + width:
            assert start[j] < submit[h] + after, (h, j)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 1, 2, 3, 4, 5, 8, 9, 12]), st.booleans())))
def test_placement_is_best_fit_then_lowest_numbered(ops) -> None:
    cluster, held = Cluster(NODES, GPUS), []
    for gpus, release in ops:
        if release and held:
            cluster.release(held.pop(0))
            continue
        expected = reference_place(list(cluster.free_count), gpus)
        shape = cluster.shape(gpus)
        alloc = cluster.place(shape, cluster.pools_for(shape))
        assert (alloc and [(node, len(g)) for node, g in alloc]) == expected, cluster.free_count
        if alloc:
            held.append(alloc)


def reference_place(free: list[int], gpus: int) -> list[tuple[int, int]] | None:
    """The placement rule, by brute force over all nodes."""

    def best(need: int, taken: list[int]) -> int | None:
        fits = [n for n in range(NODES) if free[n] >= need and n not in taken]
        return min(fits, key=lambda n: (free[n], n), default=None)

    if gpus <= GPUS:
        node = best(gpus, [])
        return None if node is None else [(node, gpus)]
    whole = [n for n in range(NODES) if free[n] == GPUS][: gpus // GPUS]
    if len(whole) < gpus // GPUS:
        return None
    chosen = [(n, GPUS) for n in whole]
    if gpus % GPUS:
        node = best(gpus % GPUS, whole)
        if node is None:
            return None
        chosen.append((node, gpus % GPUS))
    return sorted(chosen)


@settings(max_examples=80, deadline=None)
@given(jobs, st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_sing_budget_rule_caps_backfill_per_head(rows, factor) -> None:
    settings_ = SchedulerSettings(policy="sing", backfill_rule="budget", backfill_budget=factor)
    run = replay(to_workload(rows), NODES, GPUS, settings_)
    since = head_since(run)
    for h, head_start in enumerate(run.start):
        passed = [j for j in range(h + 1, len(run.start)) if since[h] <= run.start[j] < head_start]
        assert sum(run.gpus[j] for j in passed) <= factor * run.gpus[h]
