"""The scheduler: the four policies as one object that a simulator and a live dispatcher both drive.

    sched = Scheduler(Cluster(4, 8), SchedulerSettings(policy="sing"))
    sched.submit(Job("j1", num_gpus=2, user="ana", duration_s=600), now)
    for p in sched.schedule(now):          # [Placement("j1", {"node0": [0, 1]})]
        launch(p.job_id, p.gpus)
    sched.finish("j1", later)

Waiting jobs are indexed by *class*: all jobs of one shape (see scheduler.cluster) sit in one heap
in priority order (submit order; runtime for sjf). Jobs of one class are interchangeable for
placement, so a pass only ever looks at the head of each class: when a class's head does not fit,
nothing behind it in that class does. A pass therefore costs O(classes + jobs started), never
O(queue).

Policies (docs/scheduler.md has the details and measurements):
- fcfs: strict submit order; a head that does not fit blocks everything.
- sjf:  shortest runtime first (oracle), any job that fits starts.
- sing: fcfs, plus backfill of later jobs behind a blocked head, capped by a threshold rule.
- easy: fcfs, plus EASY backfill: the blocked head gets a reservation (time and nodes) from the
        running jobs' time limits; later jobs start only if they cannot delay it.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heapreplace

from scheduler.cluster import Alloc, Cluster, Pool, Shape
from scheduler.settings import SchedulerSettings

WAITING, HELD, RUNNING, DONE = range(4)
INF = math.inf


@dataclass(frozen=True)
class Job:
    """A request for GPUs. `duration_s` (true runtime) is only known to sjf and the simulator."""

    job_id: str
    num_gpus: int
    user: str = ""
    num_nodes: int = 0  # 0: placement decides
    duration_s: float | None = None
    time_limit_s: float | None = None  # easy reserves with this (else duration_s)


@dataclass(frozen=True)
class Placement:
    """Where a started job runs: node name -> GPU indices on that node."""

    job_id: str
    gpus: dict[str, list[int]]


class Scheduler:
    """Queue, policy and GPU allocation of one cluster. Not thread-safe: one caller drives it."""

    def __init__(
        self, cluster: Cluster, settings: SchedulerSettings | None = None, policy: str | None = None
    ) -> None:
        self.cluster = cluster
        self.settings = settings = settings or SchedulerSettings()
        self.policy = policy or settings.policy
        if policy and policy != settings.policy:
            self.settings = SchedulerSettings(**{**settings.__dict__, "policy": policy})
        # Per-job columns, indexed by submit order (lists, not objects: the simulator's hot path).
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self.users: list[str] = []
        self.gpus: list[int] = []
        self.shapes: list[Shape] = []
        self.pools: list[tuple[Pool, ...]] = []
        self.entries: list[tuple[float, int]] = []  # heap entry: (priority, index)
        self.estimates: list[float] = []  # runtime easy assumes: the time limit, else the runtime
        self.end_estimates: list[float] = []
        self.state: list[int] = []
        self.allocs: list[Alloc | None] = []
        # Waiting jobs: all in queue order (fcfs, sing, easy), and by class (sing, easy, sjf).
        self.queue: list[tuple[float, int]] = []
        self.classes: dict[Shape, list[tuple[float, int]]] = {}
        self.class_order: list[tuple[int, Shape]] = []  # by GPUs needed per node
        self.user_limit = settings.max_jobs_per_user
        self.running_by_user: Counter[str] = Counter()
        self.held: defaultdict[str, list[int]] = defaultdict(list)
        # The blocked head job (sing, easy) and what backfill has used up behind it.
        self.head = -1
        self.head_since = 0.0
        self.budget_used = 0
        self.reservation: tuple[float, set[int]] = (INF, set())
        self.ends: list[tuple[float, int]] = []  # easy: running jobs by estimated end
        self.changed = False  # whether anything happened since the last pass

    # ---- public API ------------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        """Queue a job; it starts at a later `schedule` call."""
        if job.job_id in self.index:
            raise ValueError(f"job {job.job_id!r} was already submitted")
        i = self.add(
            job.job_id, job.user, job.num_gpus, job.num_nodes, job.duration_s, job.time_limit_s
        )
        self.enqueue(i)

    def finish(self, job_id: str, now: float) -> None:
        """A running job ended: its GPUs are free for the next `schedule` call."""
        i = self._lookup(job_id)
        if self.state[i] != RUNNING:
            raise ValueError(f"job {job_id!r} is not running")
        self.release(i)

    def cancel(self, job_id: str) -> None:
        """Drop a waiting job from the queue (a running one is ended with `finish`)."""
        i = self._lookup(job_id)
        if self.state[i] not in (WAITING, HELD):
            raise ValueError(f"job {job_id!r} is not waiting")
        if self.state[i] == HELD:
            self.held[self.users[i]].remove(i)
        self.state[i] = DONE  # its heap entry is dropped lazily
        self.changed = True

    def schedule(self, now: float) -> list[Placement]:
        """Start what the policy allows now; returns the new placements."""
        names = self.cluster.names
        return [
            Placement(self.ids[i], {names[node]: gpus for node, gpus in self.allocs[i]})
            for i in self.run_pass(now)
        ]

    def waiting(self) -> list[str]:
        return [self.ids[i] for i, s in enumerate(self.state) if s in (WAITING, HELD)]

    def running(self) -> list[str]:
        return [self.ids[i] for i, s in enumerate(self.state) if s == RUNNING]

    # ---- the simulator drives these directly (no per-job objects) -------------------------

    def add(
        self,
        job_id: str,
        user: str,
        gpus: int,
        nodes: int = 0,
        duration: float | None = None,
        limit: float | None = None,
    ) -> int:
        """Register a job (not yet queued) and return its index."""
        if gpus < 1:
            raise ValueError(f"job {job_id!r} asks for {gpus} GPUs; needs >= 1")
        if self.settings.power_of_two:
            gpus = 1 << (gpus - 1).bit_length()
        shape = self.cluster.shape(gpus, nodes, self.settings.placement == "pack")
        if not self.cluster.capacity(shape):
            raise ValueError(
                f"job {job_id!r} needs {gpus} GPUs on {nodes or 'any'} nodes, more than this "
                f"{self.cluster.nodes}x{self.cluster.gpus_per_node} cluster can ever give it"
            )
        i = len(self.ids)
        self.ids.append(job_id)
        self.index[job_id] = i
        self.users.append(user)
        self.gpus.append(gpus)
        self.shapes.append(shape)
        self.pools.append(self.cluster.pools_for(shape))
        runtime = duration if duration is not None else (limit if limit is not None else INF)
        self.entries.append((runtime if self.policy == "sjf" else i, i))
        self.estimates.append(limit if limit is not None else runtime)
        self.end_estimates.append(INF)
        self.state.append(DONE)
        self.allocs.append(None)
        return i

    def enqueue(self, i: int) -> None:
        self.state[i] = WAITING
        entry = self.entries[i]
        if self.policy != "sjf":
            heappush(self.queue, entry)
        if self.policy != "fcfs":
            key = self.shapes[i]
            heap = self.classes.get(key)
            if heap is None:
                heap = self.classes[key] = []
                # placement "any" (0 nodes) can use a single free GPU on each of several nodes
                bisect.insort(self.class_order, (key[1] if key[0] else 1, key))
            heappush(heap, entry)
        self.changed = True

    def release(self, i: int) -> None:
        self.state[i] = DONE
        self.cluster.release(self.allocs[i])
        user = self.users[i]
        self.running_by_user[user] -= 1
        if self.user_limit and user in self.held:
            for j in self.held.pop(user):
                self.enqueue(j)
        if self.policy == "easy":
            del self.ends[bisect.bisect_left(self.ends, (self.end_estimates[i], i))]
        self.changed = True

    def run_pass(self, now: float) -> list[int]:
        """One scheduling pass; returns the indices of the jobs it started (placed in `allocs`)."""
        if not self.changed:  # no job arrived or ended: whatever could not start still cannot
            return []
        self.changed = False
        started: list[int] = []
        if self.policy != "sjf":
            head = self._start_in_order(now, started)
            if head < 0 or self.policy == "fcfs" or not self._block(head, now):
                return started
        self._backfill_pass(now, started)
        return started

    def _start_in_order(self, now: float, started: list[int]) -> int:
        """Start jobs in queue order until one does not fit; returns that blocked head (or -1)."""
        queue, state, place = self.queue, self.state, self.cluster.place
        while True:
            while queue and state[queue[0][1]] != WAITING:
                heappop(queue)
            if not queue:
                return -1
            i = queue[0][1]
            if self._over_limit(i):
                continue
            alloc = place(self.shapes[i], self.pools[i])
            if alloc is None:
                return i
            heappop(queue)
            self._start(i, alloc, now, started)

    def _backfill_pass(self, now: float, started: list[int]) -> None:
        """Start jobs out of queue order, best priority first, as the policy allows.

        Only classes whose shape can fit in the currently freest node are looked at; within a
        pass free GPUs only shrink, so a class that fails to place is dropped for the pass.
        """
        most_free = max(self.cluster.general.max_free, self.cluster.small.max_free)
        classes, state = self.classes, self.state
        blocked_key = self.shapes[self.head] if self.policy != "sjf" else None
        cands = []
        for per, key in self.class_order:
            if per > most_free:
                break
            if key != blocked_key:
                entry = _head(classes[key], state)
                if entry is not None:
                    cands.append((entry, key))
        heapify(cands)
        backfill = self._may_backfill if self.policy != "sjf" else self._place
        while cands:
            entry, key = cands[0]
            i = entry[1]
            heap = classes[key]
            if self._over_limit(i):
                self._next_in_class(cands, heap, key)
                continue
            j, alloc = backfill(i, heap, now)
            if alloc is None:
                heappop(cands)
                continue
            self._start(j, alloc, now, started)
            self.budget_used += self.gpus[j]
            self._next_in_class(cands, heap, key)

    # ---- internals ---------------------------------------------------------------------------

    def _lookup(self, job_id: str) -> int:
        try:
            return self.index[job_id]
        except KeyError:
            raise ValueError(f"unknown job {job_id!r}") from None

    def _start(self, i: int, alloc: Alloc, now: float, started: list[int]) -> None:
        self.state[i] = RUNNING
        self.allocs[i] = alloc
        self.running_by_user[self.users[i]] += 1
        if self.policy == "easy":
            end = now + self.estimates[i]
            self.end_estimates[i] = end
            bisect.insort(self.ends, (end, i))
        started.append(i)

    def _next_in_class(self, cands: list, heap: list, key: object) -> None:
        entry = _head(heap, self.state)
        if entry is None:
            heappop(cands)
        else:
            heapreplace(cands, (entry, key))

    def _block(self, i: int, now: float) -> bool:
        """Job `i` is the head and does not fit; returns whether anything may backfill past it."""
        if i != self.head:
            self.head, self.head_since, self.budget_used = i, now, 0
            self.reservation = (INF, set())
            if self.policy == "easy":
                self.reservation = self._reserve(i, now)
        if self.policy == "easy":
            if now >= self.reservation[0]:  # a running job overran its limit: reserve again
                self.reservation = self._reserve(i, now)
            return True
        if self.settings.backfill_rule == "wait":
            return now - self.head_since < self.settings.max_head_wait_s
        return self.budget_used < self.settings.backfill_budget * self.gpus[i]

    def _place(self, i: int, heap: list, now: float) -> tuple[int, Alloc | None]:
        return i, self.cluster.place(self.shapes[i], self.pools[i])

    def _over_limit(self, i: int) -> bool:
        """Per-user limit: a job of a user at the limit is held until one of theirs ends."""
        if not self.user_limit or self.running_by_user[self.users[i]] < self.user_limit:
            return False
        self.state[i] = HELD
        self.held[self.users[i]].append(i)
        return True

    def _may_backfill(self, i: int, heap: list, now: float) -> tuple[int, Alloc | None]:
        """May job `i` (head of its class) start past the blocked head? Returns (job, alloc)."""
        place = self.cluster.place
        if self.policy == "sing":
            if self.settings.backfill_rule == "budget":
                cap = self.settings.backfill_budget * self.gpus[self.head]
                if self.budget_used + self.gpus[i] > cap:
                    return i, None
            return i, place(self.shapes[i], self.pools[i])
        until, reserved = self.reservation
        if now + self.estimates[i] <= until:
            return i, place(self.shapes[i], self.pools[i])
        alloc = place(self.shapes[i], self.pools[i], reserved)
        if alloc is not None or not self.settings.easy_depth:
            return i, alloc
        # The oldest job of this class is too long to end before the reservation and there is no
        # room outside it; a shorter job of the same class further back may still fit in time.
        for depth, (_, j) in enumerate(_in_order(heap)):
            if depth > self.settings.easy_depth:
                break
            if self.state[j] == WAITING and now + self.estimates[j] <= until:
                return j, place(self.shapes[j], self.pools[j])
        return i, None

    def _reserve(self, i: int, now: float) -> tuple[float, set[int]]:
        """EASY: when and on which nodes head job `i` can start, from running jobs' estimates.

        Walks running jobs by estimated end, adding their GPUs back to a projection of the free
        counts, until the head's shape fits; those nodes are reserved until then.
        """
        nodes, per, gpus = self.shapes[i]
        pools = self.pools[i]
        cluster = self.cluster
        free = {n: c for p in pools for c in range(1, len(p.by_free)) for n in p.by_free[c]}
        if nodes == 0:
            need = gpus - sum(free.values())
        else:
            ready = {n for n, c in free.items() if c >= per}
        for end, j in self.ends:
            for node, held in self.allocs[j]:
                if cluster.pool_of[node] not in pools:
                    continue
                free[node] = free.get(node, 0) + len(held)
                if nodes == 0:
                    need -= len(held)
                    if need <= 0:
                        return max(end, now), set(free)
                elif free[node] >= per:
                    ready.add(node)
                    if len(ready) >= nodes:
                        return max(end, now), ready if nodes > 1 else {node}
        return INF, set()


def _head(heap: list, state: list[int]) -> tuple[float, int] | None:
    """The class's first waiting entry, dropping entries of jobs that left the queue meanwhile."""
    while heap and state[heap[0][1]] != WAITING:
        heappop(heap)
    return heap[0] if heap else None


def _in_order(heap: list) -> Iterator[tuple[float, int]]:
    """A heap's entries in sorted order, lazily (O(log k) each for the first k), heap untouched."""
    frontier = [(heap[0], 0)] if heap else []
    while frontier:
        entry, pos = heappop(frontier)
        yield entry
        for child in (2 * pos + 1, 2 * pos + 2):
            if child < len(heap):
                heappush(frontier, (heap[child], child))
