"""Discrete-event replay of a workload through the same `Scheduler` a live dispatcher uses.

Events are job arrivals (the workload, sorted by submit time) and job ends (a heap). At each event
time all ends are applied first, then all arrivals, then one scheduling pass; a started job ends
exactly `duration` seconds later.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Final

from sing.gcpause import cyclic_gc_paused
from sing.scheduler.cluster import WHOLE, Alloc, Cluster, Node
from sing.scheduler.core import Scheduler
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.workload import Workload

# Final: compiled, read from a C variable, not looked up per call (see sing/scheduler/cluster.py).
heappop: Final = heapq.heappop
heappush: Final = heapq.heappush


@dataclasses.dataclass
class Replay:
    """What one policy did with a workload (which is sorted by submit time)."""

    policy: str
    workload: Workload
    cluster: Cluster
    start: list[float]
    gpus: list[float]  # GPUs each job held (power-of-two rounding included; shares as fractions)
    allocs: list[Alloc]
    wall_s: float  # replay time, for jobs/s
    cpu_s: float  # the same in this process's CPU time (steadier on a shared machine)

    def placement(self, k: int) -> dict[str, list[int]]:
        return {self.cluster.names[node]: gpus for node, gpus in self.allocs[k]}


def make_cluster(
    nodes: int | Sequence[Node],
    gpus_per_node: int,
    settings: SchedulerSettings,
    names: Sequence[str] | None = None,
) -> Cluster:
    """`nodes` x `gpus_per_node` GPUs, or the mixed cluster of the node list `nodes`."""
    pools = {
        "small_pool_nodes": settings.small_pool_nodes,
        "small_job_max_gpus": settings.small_job_max_gpus,
    }
    if isinstance(nodes, int):
        return Cluster(nodes, gpus_per_node, names=names, **pools)
    return Cluster.mixed(nodes, **pools)


def fitting(
    workload: Workload, cluster: Cluster, settings: SchedulerSettings
) -> tuple[Workload, Counter[str]]:
    """The jobs that can ever run on `cluster`, and how many cannot, by reason ("model X missing",
    "too large"): counted, not refused, so one odd job does not stop a replay."""
    sched = Scheduler(cluster, settings)
    keep: list[int] = []
    unfit: Counter[str] = Counter()
    verdicts: dict[tuple, str] = {}
    for k in range(len(workload)):
        request = (
            workload.num_gpus[k],
            workload.num_nodes[k],
            workload.share[k],
            workload.model[k],
        )
        if request not in verdicts:
            try:
                sched.fit(workload.job_id[k], *request)
                verdicts[request] = ""
            except ValueError:
                verdicts[request] = _unfit_reason(cluster, *request)
        if verdicts[request]:
            unfit[verdicts[request]] += 1
        else:
            keep.append(k)
    return workload.select(keep), unfit


def _unfit_reason(cluster: Cluster, gpus: int, nodes: int, share: int, model: str) -> str:
    if model and not cluster.models_for(model):
        return f"model {model} missing"
    return "fewer GPUs than nodes" if nodes > gpus else "too large"


def replay(
    workload: Workload,
    nodes: int | Sequence[Node],
    gpus_per_node: int = 0,
    settings: SchedulerSettings | None = None,
    policy: str | None = None,
    names: Sequence[str] | None = None,
) -> Replay:
    """Replay `workload` on `nodes` x `gpus_per_node` GPUs (or the node list `nodes`) under
    `policy` (default: settings'), on nodes called `names` (default node0, node1, ...)."""
    settings = settings or SchedulerSettings()
    jobs = workload.sorted_by_submit()
    sched = Scheduler(make_cluster(nodes, gpus_per_node, settings, names), settings, policy)
    for k in range(len(jobs)):
        sched.add(
            jobs.job_id[k],
            jobs.user[k],
            jobs.num_gpus[k],
            jobs.num_nodes[k],
            jobs.duration[k],
            jobs.time_limit[k],
            jobs.share[k],
            jobs.model[k],
        )
    # The event loop makes no reference cycles, so the cyclic garbage collector would only rescan
    # the (many, long-lived) job columns over and over: pausing it doubles the replay speed.
    with cyclic_gc_paused():
        began, began_cpu = time.perf_counter(), time.process_time()
        start = _run(sched, jobs.submit, jobs.duration)
        wall, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    held = [s / WHOLE if s else g for g, s in zip(sched.gpus, sched.shares, strict=True)]
    return Replay(sched.policy, jobs, sched.cluster, start, held, sched.allocs, wall, cpu)


def _run(sched: Scheduler, submit: list[float], duration: list[float]) -> list[float]:
    """The event loop; returns each job's start time."""
    n = len(submit)
    start = [0.0] * n
    arrivals = [*submit, math.inf]  # the sentinel ends the arrivals
    # Distinct end times in a heap of plain floats (cheaper to compare than (time, job) pairs),
    # and the jobs ending at each, released in job order.
    ends: list[float] = []
    ending: dict[float, list[int]] = {}
    k = 0
    while k < n or ends:
        now = arrivals[k]
        if ends and ends[0] <= now:
            now = heappop(ends)
            done = ending[now]
            del ending[now]
            if len(done) > 1:
                done.sort()
            for i in done:
                sched.release(i)
        while arrivals[k] <= now:
            sched.enqueue(k, arrivals[k])
            k += 1
        for i in sched.run_pass(now):
            start[i] = now
            end = now + duration[i]
            together = ending.get(end)
            if together is None:
                ending[end] = [i]
                heappush(ends, end)
            else:
                together.append(i)
    return start
