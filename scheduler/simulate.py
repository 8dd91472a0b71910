"""Discrete-event replay of a workload through the same `Scheduler` a live dispatcher uses.

Events are job arrivals (the workload, sorted by submit time) and job ends (a heap). At each event
time all ends are applied first, then all arrivals, then one scheduling pass; a started job ends
exactly `duration` seconds later.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Sequence
from heapq import heappop, heappush

from scheduler.cluster import Alloc, Cluster
from scheduler.core import Scheduler
from scheduler.settings import SchedulerSettings
from scheduler.workload import Workload


@dataclasses.dataclass
class Replay:
    """What one policy did with a workload (which is sorted by submit time)."""

    policy: str
    workload: Workload
    cluster: Cluster
    start: list[float]
    gpus: list[int]  # GPUs each job held (power-of-two rounding included)
    allocs: list[Alloc]
    wall_s: float  # replay time, for jobs/s
    cpu_s: float  # the same in this process's CPU time (steadier on a shared machine)

    def placement(self, k: int) -> dict[str, list[int]]:
        return {self.cluster.names[node]: gpus for node, gpus in self.allocs[k]}


def make_cluster(
    nodes: int,
    gpus_per_node: int,
    settings: SchedulerSettings,
    names: Sequence[str] | None = None,
) -> Cluster:
    return Cluster(
        nodes,
        gpus_per_node,
        names=names,
        small_pool_nodes=settings.small_pool_nodes,
        small_job_max_gpus=settings.small_job_max_gpus,
    )


def replay(
    workload: Workload,
    nodes: int,
    gpus_per_node: int,
    settings: SchedulerSettings | None = None,
    policy: str | None = None,
    names: Sequence[str] | None = None,
) -> Replay:
    """Replay `workload` on `nodes` x `gpus_per_node` GPUs under `policy` (default: settings'),
    on nodes called `names` (default node0, node1, ...)."""
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
        )
    # The event loop makes no reference cycles, so the cyclic garbage collector would only rescan
    # the (many, long-lived) job columns over and over: pausing it doubles the replay speed.
    collecting = gc.isenabled()
    gc.disable()
    try:
        began, began_cpu = time.perf_counter(), time.process_time()
        start = _run(sched, jobs.submit, jobs.duration)
        wall, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    finally:
        if collecting:
            gc.enable()
    return Replay(sched.policy, jobs, sched.cluster, start, sched.gpus, sched.allocs, wall, cpu)


def _run(sched: Scheduler, submit: list[float], duration: list[float]) -> list[float]:
    """The event loop; returns each job's start time."""
    n = len(submit)
    start = [0.0] * n
    arrivals = [*submit, math.inf]  # the sentinel ends the arrivals
    ends: list[tuple[float, int]] = []
    enqueue, release, run_pass = sched.enqueue, sched.release, sched.run_pass
    k = 0
    while k < n or ends:
        now = arrivals[k]
        if ends and ends[0][0] <= now:
            now = ends[0][0]
            while ends and ends[0][0] <= now:
                release(heappop(ends)[1])
        while arrivals[k] <= now:
            enqueue(k)
            k += 1
        for i in run_pass(now):
            start[i] = now
            heappush(ends, (now + duration[i], i))
    return start
