"""Hand-computed tiny traces: the exact start time of every job under every policy and option."""

from __future__ import annotations

import random

import pytest

from sing.config import ConfigError
from sing.scheduler.cluster import Cluster
from sing.scheduler.core import Job, Placement, Scheduler
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import replay
from sing.scheduler.workload import Workload


def workload(*jobs: tuple[str, float, float, int], user: str = "u") -> Workload:
    """Jobs as (id, submit, duration, gpus)."""
    return Workload(
        job_id=[j[0] for j in jobs],
        user=[user] * len(jobs),
        submit=[float(j[1]) for j in jobs],
        duration=[float(j[2]) for j in jobs],
        num_gpus=[j[3] for j in jobs],
        num_nodes=[0] * len(jobs),
        time_limit=[None] * len(jobs),
    )


def starts(w: Workload, nodes: int, gpus: int, policy: str, **options) -> dict[str, float]:
    run = replay(w, nodes, gpus, SchedulerSettings(**options), policy)
    return dict(zip(run.workload.job_id, run.start, strict=True))


# One node of 4 GPUs. b (4 GPUs) is blocked behind a until t=10; c and d could run meanwhile.
BLOCKED_HEAD = workload(("a", 0, 10, 2), ("b", 1, 10, 4), ("c", 2, 3, 1), ("d", 3, 20, 2))


@pytest.mark.parametrize(
    ("policy", "options", "expected"),
    [
        # Strict order: b waits for a, c and d wait for b.
        ("fcfs", {}, {"a": 0, "b": 10, "c": 20, "d": 20}),
        # Shortest first among what fits: c at 2, d when c ends at 5, b only when d ends at 25.
        ("sjf", {}, {"a": 0, "b": 25, "c": 2, "d": 5}),
        # Backfill while b has been blocked < 100 s: same as sjf here.
        (
            "sing",
            {"backfill_rule": "wait", "max_head_wait_s": 100},
            {"a": 0, "b": 25, "c": 2, "d": 5},
        ),
        # b blocked since 1: c backfills at 2 (1 s), d would at 5 (4 s >= 3 s): drain instead.
        (
            "sing",
            {"backfill_rule": "wait", "max_head_wait_s": 3},
            {"a": 0, "b": 10, "c": 2, "d": 20},
        ),
        # Budget = b's 4 GPUs: c (1) and d (2) both fit in it.
        (
            "sing",
            {"backfill_rule": "budget", "backfill_budget": 1.0},
            {"a": 0, "b": 25, "c": 2, "d": 5},
        ),
        # Budget = 2 GPUs: c uses 1, d (2 more) would exceed it.
        (
            "sing",
            {"backfill_rule": "budget", "backfill_budget": 0.5},
            {"a": 0, "b": 10, "c": 2, "d": 20},
        ),
        # b is reserved the node at 10 (a's end): c ends by 5 and may go, d (until 25) may not.
        ("easy", {}, {"a": 0, "b": 10, "c": 2, "d": 20}),
    ],
)
def test_blocked_head(policy: str, options: dict, expected: dict[str, float]) -> None:
    assert starts(BLOCKED_HEAD, 1, 4, policy, **options) == expected


# 2 nodes x 2 GPUs, all busy with 1-GPU jobs ending at 10, 20 (node0) and 15, 25 (node1). Head h
# needs a whole node; six 1-GPU jobs queue behind it.
STREAM = workload(
    ("j1", 0, 10, 1), ("j2", 0, 20, 1), ("j3", 0, 15, 1), ("j4", 0, 25, 1), ("h", 1, 10, 2),
    *((f"s{k}", 1 + k, 30, 1) for k in range(1, 7)),
)  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "bound", "expected"),
    [
        # Backfill never stops: s1..s6 take every GPU that frees up, h waits until s5 ends at 70.
        ("wait", 1e9, {"h": 70, "s1": 10, "s2": 15, "s3": 20, "s4": 25, "s5": 40, "s6": 45}),
        # h has waited 9 s >= 5 s at t=10: node0 (1 free, the freest) is reserved for it, s1
        # backfills on node1 at 15, h starts when node0 drains at 20.
        ("reserve", 5, {"h": 20, "s1": 15, "s2": 25, "s3": 30, "s4": 30, "s5": 45, "s6": 55}),
        # The drain: nothing backfills after t=10, so s1 waits until h has started, at 20.
        ("wait", 5, {"h": 20, "s1": 20, "s2": 25, "s3": 30, "s4": 30, "s5": 50, "s6": 55}),
    ],
)
def test_sing_reserve_rule_keeps_backfilling_elsewhere(
    rule: str, bound: float, expected: dict[str, float]
) -> None:
    got = starts(STREAM, 2, 2, "sing", backfill_rule=rule, max_head_wait_s=bound)
    assert got == {"j1": 0, "j2": 0, "j3": 0, "j4": 0, **expected}


# 2 nodes x 2 GPUs, busy with 1-GPU jobs ending at 10, 20 (node0) and 15, 25 (node1). Two
# whole-node jobs b1, b2 wait behind them; four 1-GPU jobs come later, each running 30 s.
TWO_LARGE = workload(
    ("j1", 0, 10, 1), ("j2", 0, 20, 1), ("j3", 0, 15, 1), ("j4", 0, 25, 1),
    ("b1", 1, 100, 2), ("b2", 2, 10, 2),
    *((f"s{k}", 9 + k, 30, 1) for k in range(1, 5)),
)  # fmt: skip


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        # Reserve at once, no age window: node0 (the freest, by number) is reserved for b1. At 15
        # s1 takes node1's free GPU, so when b1 starts at 20 both nodes are busy again and b2's
        # reservation (node0, b1's until 120) waits for s1..s4, which keep node1 busy until 85.
        (
            {},
            {"b1": 20, "b2": 85, "s1": 15, "s2": 25, "s3": 45, "s4": 55},
        ),
        # Age window after 5 s, 5 s wide: from 10 on b1 is 9 s old, so only jobs submitted by 6
        # (b2) may backfill. s1 (submitted at 10) no longer takes node1 at 15; when b1 starts at
        # 20, node1 (1 free) is the freest node and is reserved for b2, which starts when j4 ends
        # at 25. s1 and s2 start when b2 ends at 35, s3 and s4 when they end at 65.
        (
            {"age_window_after_s": 5, "age_window_s": 5},
            {"b1": 20, "b2": 25, "s1": 35, "s2": 35, "s3": 65, "s4": 65},
        ),
    ],
)
def test_sing_age_window_keeps_young_jobs_off_an_old_jobs_nodes(
    window: dict, expected: dict[str, float]
) -> None:
    got = starts(TWO_LARGE, 2, 2, "sing", max_head_wait_s=0, **window)
    assert got == {"j1": 0, "j2": 0, "j3": 0, "j4": 0, **expected}


def test_easy_backfills_a_long_job_outside_the_reserved_node() -> None:
    # 2 nodes x 2 GPUs. x, y fill node0, v takes one GPU of node1. Head h (2 GPUs) gets node1 at
    # t=50 (v's end). l (1000 s) may not delay it, so it waits until y frees node0 at t=10; s
    # (ends at 23 < 50) may use node1 at once.
    w = workload(
        ("x", 0, 100, 1), ("y", 0, 10, 1), ("v", 0, 50, 1),
        ("h", 1, 30, 2), ("l", 2, 1000, 1), ("s", 3, 20, 1),
    )  # fmt: skip
    assert starts(w, 2, 2, "easy") == {"x": 0, "y": 0, "v": 0, "h": 50, "l": 10, "s": 3}
    assert starts(w, 2, 2, "fcfs") == {"x": 0, "y": 0, "v": 0, "h": 50, "l": 50, "s": 80}


def test_easy_reserves_with_time_limits_not_runtimes() -> None:
    # a really runs 10 s but declares 100 s: b's reservation is t=100, so c (30 s) may backfill.
    sched = Scheduler(Cluster(1, 4), SchedulerSettings(policy="easy"))
    sched.submit(Job("a", 2, duration_s=10, time_limit_s=100), 0)
    assert [p.job_id for p in sched.schedule(0)] == ["a"]
    sched.submit(Job("b", 4, time_limit_s=10), 1)
    sched.submit(Job("c", 2, time_limit_s=30), 1)
    assert [p.job_id for p in sched.schedule(1)] == ["c"]
    sched.finish("a", 10)
    assert sched.schedule(10) == []
    sched.finish("c", 31)
    assert sched.schedule(31) == [Placement("b", {"node0": [0, 1, 2, 3]})]


def test_pack_placement_tie_rules() -> None:
    # Hand-computed on 4 nodes x 4 GPUs: best fit (fewest free GPUs that suffice), then the
    # lowest-numbered node; a job larger than a node takes whole free nodes, lowest-numbered
    # first, and its remainder on the best-fitting partly free node.
    sched = Scheduler(Cluster(4, 4), SchedulerSettings(policy="fcfs"))
    for job in (Job("a", 1), Job("b", 1), Job("c", 3), Job("d", 6), Job("e", 1), Job("f", 5)):
        sched.submit(job, 0)
    assert {p.job_id: p.gpus for p in sched.schedule(0)} == {
        "a": {"node0": [0]},  # all nodes tie at 4 free: the lowest-numbered
        "b": {"node0": [1]},  # node0 (3 free) fits best
        "c": {"node1": [0, 1, 2]},  # node0 has 2 < 3; nodes 1-3 tie at 4
        "d": {"node0": [2, 3], "node2": [0, 1, 2, 3]},  # whole node2 + 2 on node0 (2 free)
        "e": {"node1": [3]},  # node1 is the only node with a free GPU
    }
    # f needs whole node3 and one more GPU; none is free until a ends.
    sched.finish("a", 5)
    assert sched.schedule(5) == [Placement("f", {"node0": [0], "node3": [0, 1, 2, 3]})]


def test_node_names_order_does_not_change_placement() -> None:
    # Nodes are numbered in the natural order of their names (gpu2 before gpu10), however the
    # list is built, so the same jobs get the same nodes.
    placements = []
    for names in (["gpu1", "gpu2", "gpu10"], ["gpu10", "gpu2", "gpu1"], ["gpu2", "gpu10", "gpu1"]):
        sched = Scheduler(Cluster(3, 2, names=names), SchedulerSettings(policy="fcfs"))
        for job in (Job("a", 1), Job("b", 2), Job("c", 3)):
            sched.submit(job, 0)
        placements.append(sched.schedule(0))
    assert placements[0] == [
        Placement("a", {"gpu1": [0]}),
        Placement("b", {"gpu2": [0, 1]}),
        Placement("c", {"gpu1": [1], "gpu10": [0, 1]}),
    ]
    assert placements[1] == placements[0] and placements[2] == placements[0]


@pytest.mark.parametrize("policy", ["fcfs", "sing", "easy", "sjf"])
def test_replay_does_not_depend_on_node_order(policy: str) -> None:
    # A random mix of 1-GPU to 3-node jobs on 6 x 8 GPUs, long enough to queue: every start and
    # placement is the same whichever order the node list is built in.
    rng = random.Random(7)
    rows = [
        (
            f"j{k}",
            rng.uniform(0, 3000),
            rng.uniform(10, 600),
            rng.choice([1, 1, 1, 2, 4, 8, 12, 20]),
        )
        for k in range(400)
    ]
    w = workload(*rows)
    names = [f"n{i}" for i in range(6)]
    runs = []
    for order in (names, names[::-1], rng.sample(names, 6)):
        run = replay(w, 6, 8, SchedulerSettings(max_head_wait_s=300), policy, names=order)
        assert max(s - t for s, t in zip(run.start, run.workload.submit, strict=True)) > 600
        runs.append((run.start, [run.placement(k) for k in range(len(rows))]))
    assert runs[1] == runs[0] and runs[2] == runs[0]


@pytest.mark.parametrize(("placement", "expected"), [("pack", []), ("any", ["d"])])
def test_any_placement_spreads_across_nodes(placement: str, expected: list[str]) -> None:
    sched = Scheduler(Cluster(2, 2), SchedulerSettings(policy="fcfs", placement=placement))
    for name in "abc":
        sched.submit(Job(name, 1), 0)
    sched.schedule(0)
    sched.finish("b", 1)  # now node0 and node1 have one free GPU each
    sched.submit(Job("d", 2), 1)
    placed = sched.schedule(1)
    assert [p.job_id for p in placed] == expected
    if placed:
        assert placed[0].gpus == {"node0": [1], "node1": [1]}


@pytest.mark.parametrize(
    ("power_of_two", "expected"), [(False, {"a": 0, "b": 0}), (True, {"a": 0, "b": 5})]
)
def test_power_of_two_rounds_requests_up(power_of_two: bool, expected: dict) -> None:
    w = workload(("a", 0, 5, 3), ("b", 0, 5, 1))
    assert starts(w, 1, 4, "fcfs", power_of_two=power_of_two) == expected


def test_small_job_pool() -> None:
    settings = SchedulerSettings(policy="sjf", small_pool_nodes=1, small_job_max_gpus=1)
    sched = Scheduler(Cluster(2, 2, small_pool_nodes=1), settings)
    for job in (
        Job("big1", 2, duration_s=10),
        Job("big2", 2, duration_s=10),
        Job("s", 1, duration_s=10),
    ):
        sched.submit(job, 0)
    # big2 may not use node1 (small jobs only); s goes to the small pool first.
    assert {p.job_id: p.gpus for p in sched.schedule(0)} == {
        "big1": {"node0": [0, 1]},
        "s": {"node1": [0]},
    }
    sched.finish("big1", 10)
    assert [p.job_id for p in sched.schedule(10)] == ["big2"]


def test_per_user_limit() -> None:
    sched = Scheduler(Cluster(1, 4), SchedulerSettings(policy="fcfs", max_jobs_per_user=1))
    for job in (Job("a", 1, user="ana"), Job("b", 1, user="ana"), Job("c", 1, user="bo")):
        sched.submit(job, 0)
    assert [p.job_id for p in sched.schedule(0)] == ["a", "c"]
    assert sched.waiting() == ["b"]
    sched.finish("a", 5)
    assert [p.job_id for p in sched.schedule(5)] == ["b"]


def test_easy_look_ahead_keeps_the_per_user_limit() -> None:
    # a (x) runs; head b waits for the whole node until a ends at 100. c (z) is too long to go
    # before that, so EASY looks behind it: d is short enough but x already runs a job.
    sched = Scheduler(Cluster(1, 4), SchedulerSettings(policy="easy", max_jobs_per_user=1))
    sched.submit(Job("a", 3, user="x", duration_s=100), 0)
    assert [p.job_id for p in sched.schedule(0)] == ["a"]
    sched.submit(Job("b", 4, user="y", duration_s=10), 1)
    sched.submit(Job("c", 1, user="z", duration_s=1000), 2)
    sched.submit(Job("d", 1, user="x", duration_s=10), 3)
    assert sched.schedule(3) == []
    assert sched.running() == ["a"]


def test_cancel_and_api_errors() -> None:
    sched = Scheduler(Cluster(1, 2), SchedulerSettings(policy="sing"))
    sched.submit(Job("a", 2), 0)
    sched.submit(Job("b", 1), 0)
    sched.schedule(0)
    sched.cancel("b")
    assert sched.waiting() == [] and sched.running() == ["a"]
    with pytest.raises(ValueError, match="already submitted"):
        sched.submit(Job("a", 1), 1)
    with pytest.raises(ValueError, match="not running"):
        sched.finish("b", 1)
    with pytest.raises(ValueError, match="unknown job 'zz'"):
        sched.finish("zz", 1)
    with pytest.raises(ValueError, match="more than this 1x2 cluster"):
        sched.submit(Job("huge", 3), 1)
    with pytest.raises(ValueError, match="needs >= 1"):
        sched.submit(Job("none", 0), 1)
    with pytest.raises(ValueError, match="1 GPUs on 2 nodes; needs >= 1 GPU per node"):
        sched.submit(Job("spread", 1, num_nodes=2), 1)


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="policy = 'lifo'; choose one of fcfs, sing, easy, sjf"):
        SchedulerSettings(policy="lifo")
    with pytest.raises(ConfigError, match="max_head_wait_s must be >= 0"):
        SchedulerSettings(max_head_wait_s=-1)
    with pytest.raises(ConfigError, match="age_window_s must be >= 0"):
        SchedulerSettings(age_window_s=-1)
