"""Mixed clusters: GPU counts and models per node, model-constrained jobs and fractional shares.

Properties every replay on a mixed cluster must have, on random small traces (hypothesis), under
every policy: no GPU over-committed (the shares on a GPU never add up to more than one GPU), a job
constrained to a model only on nodes of that model, no job started before its submit, every job
that fits started, and the cluster whole again once all jobs have ended.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sing.scheduler.cluster import WHOLE, Cluster, Node
from sing.scheduler.core import Job, Scheduler
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import fitting, make_cluster, replay
from sing.scheduler.workload import Workload
from tests.test_scheduler_properties import VARIANTS as UNIFORM_VARIANTS

NODES = [
    Node("a1", 8, "A100"),
    Node("a2", 4, "A100"),
    Node("t1", 2, "T4"),
    Node("t2", 1, "T4"),
    Node("v10", 4, "V100"),
    Node("v9", 4, "V100"),
]
MODEL_OF = {n.name: n.gpu_model for n in NODES}

jobs = st.lists(
    st.tuples(
        st.integers(0, 60),  # submit
        st.integers(1, 40),  # duration
        st.sampled_from([1, 1, 2, 3, 4, 8, 12, 0, 0]),  # GPUs; 0 = a share
        st.sampled_from([250, 333, 500, 999]),  # the share in thousandths (GPUs 0)
        st.sampled_from(["", "", "A100", "T4", "V100", "H100"]),  # H100: missing
        st.sampled_from(["ana", "bo", "cy"]),
    ),
    min_size=1,
    max_size=30,
)

# The uniform property tests' variants, but a small-job pool (which needs one GPU model)
VARIANTS = [v for v in UNIFORM_VARIANTS if not v.small_pool_nodes]


def to_workload(rows) -> Workload:
    return Workload(
        job_id=[f"j{k}" for k in range(len(rows))],
        user=[r[5] for r in rows],
        submit=[float(r[0]) for r in rows],
        duration=[float(r[1]) for r in rows],
        num_gpus=[r[2] or 1 for r in rows],
        num_nodes=[0] * len(rows),
        time_limit=[None] * len(rows),
        share=[0 if r[2] else r[3] for r in rows],
        model=[r[4] for r in rows],
    )


@settings(max_examples=60, deadline=None)
@given(jobs)
def test_mixed_replays_are_feasible(rows) -> None:
    workload = to_workload(rows)
    for variant in VARIANTS:
        kept, unfit = fitting(workload, make_cluster(NODES, 0, variant), variant)
        assert len(kept) + sum(unfit.values()) == len(workload)
        assert unfit["model H100 missing"] == workload.model.count("H100")
        run = replay(kept, NODES, settings=variant)
        jobs_ = run.workload
        held: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
        for k in range(len(jobs_)):
            start, end = run.start[k], run.start[k] + jobs_.duration[k]
            assert start >= jobs_.submit[k]
            placed = run.placement(k)
            share = jobs_.share[k]
            if share:
                assert [len(g) for g in placed.values()] == [1] and run.gpus[k] == share / WHOLE
            else:
                assert sum(len(g) for g in placed.values()) == run.gpus[k] >= jobs_.num_gpus[k]
            for node, gpus in placed.items():
                if jobs_.model[k]:
                    assert MODEL_OF[node] == jobs_.model[k], (k, node)
                assert len(set(gpus)) == len(gpus)
                for g in gpus:
                    held[node, g] += [(start, share or WHOLE), (end, -(share or WHOLE))]
        for (node, g), events in held.items():  # ends sort before starts at the same instant
            assert 0 <= g < next(n.gpus for n in NODES if n.name == node)
            used = 0
            for _, amount in sorted(events):
                used += amount
                assert used <= WHOLE, (variant, node, g, events)
        # every job ran to its end, so the cluster is whole again
        assert run.cluster.free_count == run.cluster.size and not run.cluster.share_left


def drive(sched: Scheduler, jobs_: Workload) -> list[tuple[float, str, dict]]:
    """Replay through the public API (submit, schedule, finish): (time, job, placement) starts."""
    order = sorted(range(len(jobs_)), key=lambda k: (jobs_.submit[k], k))
    ends: list[tuple[float, str]] = []
    started: list[tuple[float, str, dict]] = []
    while order or ends:
        now = min(([jobs_.submit[order[0]]] if order else []) + [e for e, _ in ends])
        for end, job_id in sorted(e for e in ends if e[0] == now):
            sched.finish(job_id, now)
            ends.remove((end, job_id))
        while order and jobs_.submit[order[0]] == now:
            k = order.pop(0)
            job = Job(jobs_.job_id[k], jobs_.num_gpus[k], jobs_.user[k], 0, jobs_.duration[k],
                      None, jobs_.share[k], jobs_.model[k])  # fmt: skip
            sched.submit(job, now)
        for placement in sched.schedule(now):
            started.append((now, placement.job_id, placement.gpus))
            k = jobs_.job_id.index(placement.job_id)
            ends.append((now + jobs_.duration[k], placement.job_id))
    return started


@settings(max_examples=400, deadline=None)
@given(jobs)
def test_narrowed_passes_start_what_trying_every_class_starts(rows) -> None:
    """On a mixed cluster a pass tries only the classes that releases, arrivals or new backfill
    rules since the last pass can have unlocked; trying every class, as on a uniform cluster,
    starts the same jobs at the same times in the same places."""
    workload = to_workload(rows)
    for variant in VARIANTS:
        kept, _ = fitting(workload, make_cluster(NODES, 0, variant), variant)
        narrowed = Scheduler(make_cluster(NODES, 0, variant), variant)
        every_class = Scheduler(make_cluster(NODES, 0, variant), variant)
        assert narrowed.narrow
        every_class.narrow = False
        assert drive(narrowed, kept) == drive(every_class, kept), variant


def test_shares_pack_best_fit_on_one_gpu_and_never_straddle() -> None:
    cluster = Cluster.mixed([Node("n1", 2, "T4")])
    pools = cluster.pools_for((1, 0, 600))
    first = cluster.place((1, 0, 600), pools)
    second = cluster.place((1, 0, 300), pools)
    assert first == second == [(0, [0])]  # 0.3 fits the 0.4 left on GPU 0
    third = cluster.place((1, 0, 500), pools)
    assert third == [(0, [1])]  # 0.1 left on GPU 0: the next whole GPU, not half on each
    assert cluster.place((1, 1, 1), cluster.pools_for((1, 1, 1))) is None  # no whole GPU free
    cluster.release_share(third, 500)
    assert cluster.free_count == [1] and cluster.place((1, 1, 1), pools) == [(0, [1])]
    cluster.release_share(first, 600)
    cluster.release_share(second, 300)
    assert cluster.free_count == [1] and not cluster.share_left


def test_nodes_are_numbered_by_model_then_name() -> None:
    cluster = Cluster.mixed(NODES)
    assert cluster.names == ("a1", "a2", "t1", "t2", "v9", "v10")
    assert cluster.describe() == "1x8 A100 + 1x4 A100 + 1x2 T4 + 1x1 T4 + 2x4 V100"
    assert cluster.total_gpus == 23 and cluster.gpus_per_node == 8


def test_a_job_larger_than_its_models_nodes_spans_them() -> None:
    sched = Scheduler(Cluster.mixed(NODES), SchedulerSettings(policy="fcfs"))
    sched.submit(Job("big", 8, duration_s=10, gpu_model="V100"), 0)
    sched.submit(Job("t4", 3, duration_s=10, gpu_model="T4"), 0)
    started = {p.job_id: p.gpus for p in sched.schedule(0)}
    assert started == {
        "big": {"v9": [0, 1, 2, 3], "v10": [0, 1, 2, 3]},
        "t4": {"t1": [0, 1], "t2": [0]},
    }


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (Job("x", 1, gpu_model="H100"), "model H100 missing"),
        (Job("y", 5, num_nodes=1, gpu_model="V100"), "can ever give it"),
        (Job("z", 2, share=500), "a share is 1..999 thousandths of one GPU"),
    ],
)
def test_requests_that_can_never_run_are_refused(job: Job, message: str) -> None:
    sched = Scheduler(Cluster.mixed(NODES))
    with pytest.raises(ValueError, match=message):
        sched.submit(job, 0)


def test_small_pool_needs_one_model() -> None:
    with pytest.raises(ValueError, match="one GPU model"):
        Cluster.mixed(NODES, small_pool_nodes=1)
