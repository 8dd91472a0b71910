"""The scheduler: the four policies as one object that a simulator and a live dispatcher both drive.

    sched = Scheduler(Cluster(4, 8), SchedulerSettings(policy="sing"))
    sched.submit(Job("j1", num_gpus=2, user="ana", duration_s=600), now)
    for p in sched.schedule(now):          # [Placement("j1", {"node0": [0, 1]})]
        launch(p.job_id, p.gpus)
    sched.finish("j1", later)

Waiting jobs are indexed by *class*: all jobs of one shape (see sing.scheduler.cluster) sit in one
lane (sing.scheduler.lane) in priority order (submit order; runtime for sjf). Jobs of one class are
interchangeable for placement, so a pass only ever looks at the head of each class: when a class's
head does not fit, nothing behind it in that class does. A pass therefore costs O(classes + jobs
started), never O(queue).

Most passes are skipped or narrowed: when only arrivals happened since the last pass (no job ended
or left), every class that pass tried still fails (free GPUs only shrank, backfill rules only
tightened), so only the new jobs' classes are tried, and nothing at all under fcfs or while backfill
behind the blocked head is closed. On a mixed cluster (several pools, many more classes) a pass
after jobs ended is narrowed too: a class that failed before can start now only in a pool where a
released node was left with at least its smallest per-node part free (`Pool.freed`), unless the
backfill rules changed (a new head, reservation or budget). Per-user limits hold jobs anywhere in
the queue, so with them every pass is a full one.

Policies (docs/scheduler.md has the details and measurements):
- fcfs: strict submit order; a head that does not fit blocks everything.
- sjf:  shortest runtime first (oracle), any job that fits starts.
- sing: fcfs, plus backfill of later jobs behind a blocked head, bounded by a rule: by default,
        once the head has waited max_head_wait_s (0: at once), the nodes where it fits soonest
        are reserved for it and backfill goes on elsewhere; and with the age window (on by
        default), once the head is old only jobs submitted soon after it may backfill.
- easy: fcfs, plus EASY backfill: the blocked head gets a reservation (time and nodes) from the
        running jobs' time limits; later jobs start only if they cannot delay it.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Final

from sing.scheduler.cluster import WHOLE, Alloc, Cluster, Pool, Shape, split
from sing.scheduler.lane import WAITING, Entry, Lane
from sing.scheduler.settings import SchedulerSettings

# Final: compiled, read from a C variable, not looked up per call (see sing/scheduler/cluster.py).
bisect_left: Final = bisect.bisect_left
insort: Final = bisect.insort
heapify: Final = heapq.heapify
heappop: Final = heapq.heappop
heapreplace: Final = heapq.heapreplace

# Job states after WAITING (0, sing.scheduler.lane). Final: the compiled build inlines them.
HELD: Final = 1
RUNNING: Final = 2
DONE: Final = 3
INF: Final = math.inf


@dataclass(frozen=True)
class Job:
    """A request for GPUs. `duration_s` (true runtime) is only known to sjf and the simulator."""

    job_id: str
    num_gpus: int
    user: str = ""
    num_nodes: int = 0  # 0: placement decides
    duration_s: float | None = None
    time_limit_s: float | None = None  # easy reserves with this (else duration_s)
    share: int = 0  # thousandths of one GPU for a fractional request (num_gpus 1); 0 = whole
    gpu_model: str = ""  # the only GPU model it may run on; "" = any


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
        self.shares: list[int] = []  # thousandths of a GPU; 0 = whole GPUs
        self.shapes: list[Shape] = []
        self.pools: list[tuple[Pool, ...]] = []
        self.entries: list[Entry] = []  # lane entry: (priority, index)
        self.estimates: list[float] = []  # runtime easy assumes: the time limit, else the runtime
        self.end_estimates: list[float] = []
        self.state: list[int] = []
        self.allocs: list[Alloc] = []  # [] until started
        self.submitted: list[float] = []  # when each job was queued (INF until then)
        # Waiting jobs: all in queue order (fcfs, sing, easy), and by class (sing, easy, sjf).
        self.queue = Lane()
        # A class is numbered when its shape is first seen; class_of[i] is job i's.
        self.class_ids: dict[tuple[Shape, str], int] = {}  # (shape, GPU model)
        self.class_of: list[int] = []
        self.fitted: dict[tuple[int, int, int, str], tuple[Shape, tuple[Pool, ...]]] = {}
        self.lanes: list[Lane] = []  # per class
        self.needs: list[int] = []  # per class: free GPUs one node needs for it to start
        self.class_pools: list[tuple[Pool, ...]] = []  # per class: the pools it may use
        self.class_shares: list[int] = []  # per class: thousandths of a share; 0 = whole GPUs
        # Per class: the free GPUs a released node must be left with for the class to start where
        # it could not before (`_unlock`); -1 once a job joined the class since the last pass.
        self.unlocks: list[int] = []
        self.thresholds: list[int] = []
        self.classes_by_need: list[int] = []  # by GPUs needed per node, then class
        self.user_limit = self.settings.max_jobs_per_user
        # The policy and rules as flags and numbers: a pass tests them many times, and comparing
        # strings or reading the (uncompiled) settings object costs more than the test.
        self.is_easy = self.policy == "easy"
        self.is_sjf = self.policy == "sjf"
        self.is_fcfs = self.policy == "fcfs"
        self.in_order = not self.is_sjf  # a queue-order lane and a head
        self.by_class = not self.is_fcfs  # class lanes, for backfill
        # sing's budget rule caps backfill per head (else backfill is bounded by time, or free)
        self.budget_rule = self.policy == "sing" and self.settings.backfill_rule == "budget"
        self.wait_rule = self.policy == "sing" and self.settings.backfill_rule == "wait"
        self.backfill_budget: float = self.settings.backfill_budget
        self.max_head_wait_s: float = self.settings.max_head_wait_s
        # sing's age window: once the head has waited age_window_after_s since its submit (0 =
        # never), only jobs submitted at most age_window_s after it may backfill (`cutoff`).
        self.age_window_after_s: float = (
            self.settings.age_window_after_s if self.policy == "sing" else 0.0
        )
        self.age_window_s: float = self.settings.age_window_s
        self.cutoff = INF  # the latest submit time a job may have to backfill now
        self.running_by_user: Counter[str] = Counter()
        self.held: defaultdict[str, list[int]] = defaultdict(list)
        self.blocked = -1  # the head job the last pass could not start (all but sjf)
        # The blocked head job (sing, easy) and what backfill has used up behind it.
        self.head = -1
        self.head_since = 0.0
        self.budget_used = 0
        # easy: when and on which nodes the head will fit; sing's reserve rule: nodes only (INF)
        self.reservation: tuple[float, set[int]] = (INF, set())
        self.released = False  # a job ended since sing's reserve rule last swapped nodes
        self.all_held = False  # every reserved node is wholly free: no swap can help any more
        self.ends: list[tuple[float, int]] = []  # easy: running jobs by estimated end
        # What happened since the last pass, to skip or narrow the next one (module docstring).
        self.freed = False  # a job ended or left the queue: anything may start
        self.fresh: list[int] = []  # jobs queued since
        self.settled = False  # the last pass left only the fresh jobs' classes able to start
        # The backfill rules changed (a new head, reservation or budget): every class is tried,
        # not only those that released nodes (`Pool.freed`) or arrivals can have unlocked.
        self.rules_changed = True
        # Only on a mixed cluster does narrowing full passes save more than its bookkeeping costs
        # (several pools and twice the classes); elsewhere `Pool.freed` is never reset.
        self.narrow = not cluster.uniform

    # ---- public API ------------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        """Queue a job; it starts at a later `schedule` call."""
        if job.job_id in self.index:
            raise ValueError(f"job {job.job_id!r} was already submitted")
        i = self.add(
            job.job_id,
            job.user,
            job.num_gpus,
            job.num_nodes,
            job.duration_s,
            job.time_limit_s,
            job.share,
            job.gpu_model,
        )
        self.enqueue(i, now)

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
        self.state[i] = DONE  # its lane entries are dropped lazily
        self.freed = self.rules_changed = True

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
        share: int = 0,
        model: str = "",
    ) -> int:
        """Register a job (not yet queued) and return its index. `share`: thousandths of one GPU
        for a fractional request (then `gpus` is 1); `model`: the GPU model it needs ("" = any)."""
        shape, pools = self.fit(job_id, gpus, nodes, share, model)
        i = len(self.ids)
        self.ids.append(job_id)
        self.index[job_id] = i
        self.users.append(user)
        self.gpus.append(shape[2] if shape[1] else 1)
        self.shares.append(share)
        self.shapes.append(shape)
        self.pools.append(pools)
        cls = self.class_ids.get((shape, model))
        if cls is None:
            cls = self.class_ids[shape, model] = len(self.lanes)
            self.lanes.append(Lane())
            self.needs.append(_need(shape))
            self.class_pools.append(pools)
            self.class_shares.append(0 if shape[1] else shape[2])
            self.unlocks.append(_unlock(shape))
            self.thresholds.append(-1)
            insort(self.classes_by_need, cls, key=self.needs.__getitem__)
        self.class_of.append(cls)
        runtime = duration if duration is not None else (limit if limit is not None else INF)
        self.entries.append((runtime if self.is_sjf else i, i))
        self.estimates.append(limit if limit is not None else runtime)
        self.end_estimates.append(INF)
        self.state.append(DONE)
        self.allocs.append([])
        self.submitted.append(INF)
        return i

    def fit(
        self, job_id: str, gpus: int, nodes: int = 0, share: int = 0, model: str = ""
    ) -> tuple[Shape, tuple[Pool, ...]]:
        """The shape and pools of a request; ValueError if it can never run on this cluster."""
        request = (gpus, nodes, share, model)
        known = self.fitted.get(request)
        if known is not None:  # (a trace repeats a few requests many times over)
            return known
        if gpus < 1:
            raise ValueError(f"job {job_id!r} asks for {gpus} GPUs; needs >= 1")
        if nodes > gpus:
            raise ValueError(
                f"job {job_id!r} asks for {gpus} GPUs on {nodes} nodes; needs >= 1 GPU per node"
            )
        if not 0 <= share < WHOLE or (share and gpus != 1):
            raise ValueError(f"job {job_id!r}: a share is 1..999 thousandths of one GPU")
        cluster = self.cluster
        if model and not cluster.models_for(model):
            raise ValueError(f"job {job_id!r} needs GPU model {model!r}: model {model} missing")
        if self.settings.power_of_two:
            gpus = 1 << (gpus - 1).bit_length()
        pack = self.settings.placement == "pack"
        shape = (
            (1, 0, share) if share else cluster.shape(gpus, nodes, pack, cluster.models_for(model))
        )
        pools = cluster.pools_for(shape, model)
        if not cluster.capacity(shape, pools):
            raise ValueError(
                f"job {job_id!r} needs {gpus} GPUs on {nodes or 'any'} nodes, more than this "
                f"{cluster.describe()} cluster can ever give it"
            )
        self.fitted[request] = shape, pools
        return shape, pools

    def enqueue(self, i: int, now: float) -> None:
        self.state[i] = WAITING
        self.submitted[i] = now
        entry = self.entries[i]
        if self.in_order:
            self.queue.push(entry)
        if self.by_class:
            cls = self.class_of[i]
            self.lanes[cls].push(entry)
            self.thresholds[cls] = -1
        self.fresh.append(i)

    def release(self, i: int) -> None:
        self.state[i] = DONE
        if self.shares[i]:
            self.cluster.release_share(self.allocs[i], self.shares[i])
        else:
            self.cluster.release(self.allocs[i])
        if self.user_limit:
            user = self.users[i]
            self.running_by_user[user] -= 1
            if user in self.held:
                for j in self.held.pop(user):
                    self.enqueue(j, self.submitted[j])
        if self.is_easy:
            del self.ends[bisect_left(self.ends, (self.end_estimates[i], i))]
        self.freed = self.released = True

    def run_pass(self, now: float) -> list[int]:
        """One scheduling pass; returns the indices of the jobs it started (placed in `allocs`)."""
        if self.freed or (self.fresh and not self.settled):
            return self._full_pass(now)
        if self.fresh:
            return self._arrivals_pass(now)
        return []  # nothing happened since the last pass: whatever could not start still cannot

    def _full_pass(self, now: float) -> list[int]:
        """Start in queue order, then backfill: each class the releases, arrivals or a change
        of rules since the last pass can have unlocked (every other one failed then, and free
        GPUs only shrank for it since)."""
        self.freed = False
        started: list[int] = []
        if self.is_sjf:
            self.settled = not self.user_limit
        else:
            head = self._start_in_order(now, started)
            self.settled = head >= 0 and not self.user_limit
            if head < 0 or self.is_fcfs or not self._block(head, now):
                self._forget()
                return started
        if self.narrow and (self.rules_changed or self.user_limit):
            self.cluster.all_freed()
        self._backfill_pass(now, started)
        if self.narrow:
            self._forget()
        else:
            self.fresh = []
        return started

    def _forget(self) -> None:
        """A pass tried what had changed: count releases, arrivals and rule changes afresh."""
        fresh, self.fresh = self.fresh, []
        if not self.narrow:
            return
        for pool in self.cluster.all_pools:
            pool.freed = -1
        thresholds, unlocks, class_of = self.thresholds, self.unlocks, self.class_of
        for i in fresh:
            cls = class_of[i]
            thresholds[cls] = unlocks[cls]
        self.rules_changed = False

    def _arrivals_pass(self, now: float) -> list[int]:
        """Only jobs arrived since the last (settled) pass: only their classes may start."""
        if self.is_easy and now >= self.reservation[0]:
            return self._full_pass(now)  # the head's reservation is due again: a new one
        fresh, self.fresh = self.fresh, []
        class_of = self.class_of
        if self.narrow:  # (releases since the last full pass stay counted in `Pool.freed`)
            thresholds, unlocks = self.thresholds, self.unlocks
            for i in fresh:
                thresholds[class_of[i]] = unlocks[class_of[i]]
        if self.is_fcfs:  # the head is still blocked
            return []
        most_free, needs, narrow = self.cluster.most_free(), self.needs, self.narrow
        fitting: list[int] = []  # (a list: a few fresh jobs, cheaper than a set)
        for i in fresh:
            cls = class_of[i]
            if needs[cls] > most_free or cls in fitting:
                continue
            if not narrow or self._fits_now(cls):  # (the freest node may be of another model)
                fitting.append(cls)
        if not fitting or (not self.is_sjf and not self._block(self.head, now)):
            return []
        started: list[int] = []
        self._backfill_pass(now, started, fitting)
        return started

    def _start_in_order(self, now: float, started: list[int]) -> int:
        """Start jobs in queue order until one does not fit; returns that blocked head (or -1)."""
        queue, state, cluster = self.queue, self.state, self.cluster
        shapes, pools, user_limit = self.shapes, self.pools, self.user_limit
        i = self.blocked
        if i >= 0 and state[i] == WAITING and not user_limit and self._still_blocked(i):
            # Still the head: only later jobs joined the queue since (without user limits no job
            # re-enters it ahead).
            return i
        while True:
            entry = queue.head(state)
            if entry is None:
                self.blocked = -1
                return -1
            i = entry[1]
            if user_limit and self._over_limit(i):
                continue
            alloc = cluster.place(shapes[i], pools[i])
            if alloc is None:
                self.blocked = i
                return i
            queue.pop()
            self._start(i, alloc, now, started)

    def _still_blocked(self, i: int) -> bool:
        """Whether blocked head `i` cannot fit yet, known without placing it: it is too big for
        the freest node, or (mixed cluster) no release since it failed left a node of its pools
        with its smallest per-node part free (`Pool.freed`), so no node newly has room for it."""
        cls = self.class_of[i]
        if self.needs[cls] > self.cluster.most_free():
            return True
        if not self.narrow:
            return False
        unlock = self.unlocks[cls]
        for pool in self.class_pools[cls]:  # noqa: SIM110 (a loop: any() is slower here)
            if pool.freed >= unlock:
                return False
        return True

    def _backfill_pass(self, now: float, started: list[int], only: list[int] | None = None) -> None:
        """Start jobs out of queue order, best priority first, as the policy allows.

        Only classes whose shape can fit in the freest node open to backfill (outside sing's
        reservation) are looked at (`only`, if given, holds classes that fit in the freest node:
        the caller checked); within a pass free GPUs only shrink, so a class that fails to place,
        or has no room left (`Pool.room`, kept current as jobs start), is dropped for the pass.
        """
        easy = self.is_easy
        reserved = self.reservation[1]  # sing's reserve rule: backfill keeps off these nodes
        # (easy may use reserved nodes: `_easy_backfill`)
        avoid: set[int] = set() if easy else reserved
        most_free = 0
        for pool in self.cluster.all_pools:
            room = pool.max_free
            if room and avoid:
                room = pool.most_free_outside(avoid)
            pool.room = room
            if room > most_free:
                most_free = room
        lanes, state = self.lanes, self.state
        blocked = self.class_of[self.head] if not self.is_sjf else -1
        cands: list[Entry] = []  # each candidate class's head (its job names the class)
        needs, class_pools, class_shares = self.needs, self.class_pools, self.class_shares
        thresholds, narrow = self.thresholds, self.narrow
        # (a full pass walks classes_by_need itself: building a list of classes first cost ~5%)
        for cls in self.classes_by_need if only is None else only:
            per = needs[cls]
            if per > most_free:
                if only is None:
                    break
                continue
            if narrow:
                # A pool of the class has room for it, and (a full pass) a release or arrival
                # since the last pass may have made that room. (`_has_room` with the release
                # test, inlined: a call per class costs pure Python 4 % of a replay.)
                share = class_shares[cls]
                threshold = thresholds[cls] if only is None else -1
                for pool in class_pools[cls]:
                    if pool.freed >= threshold and (
                        pool.share_room(share) if share else pool.room >= per
                    ):
                        break
                else:
                    continue
            entry = lanes[cls].head(state) if cls != blocked else None
            if entry is not None:
                cands.append(entry)
        heapify(cands)
        # sing's budget rule: GPUs backfilled past this head may total at most `cap`.
        cap = self.backfill_budget * self.gpus[self.head] if self.budget_rule else INF
        cluster, needs = self.cluster, self.needs
        shapes, pools = self.shapes, self.pools
        user_limit, gpus = self.user_limit, self.gpus
        class_of, pool_of, free_count = self.class_of, cluster.pool_of, cluster.free_count
        # sing's age window: the candidates come oldest first, so the first too young ends it.
        cutoff, submitted = self.cutoff, self.submitted
        while cands:
            i: int = cands[0][1]
            if submitted[i] > cutoff:
                break
            cls = class_of[i]
            if not user_limit and not self._has_room(cls):
                heappop(cands)  # the class no longer fits outside the reservation
                continue
            lane = lanes[cls]
            if user_limit and self._over_limit(i):
                alloc = None  # i is held: go on with the next of its class
            else:
                if easy:
                    i, alloc = self._easy_backfill(i, lane, now)
                elif self.budget_used + gpus[i] > cap:
                    alloc = None
                else:
                    alloc = cluster.place(shapes[i], pools[i], reserved)
                if alloc is None:
                    heappop(cands)  # a class that failed stays failed for this pass
                    continue
                self._start(i, alloc, now, started)
                self.budget_used += gpus[i]
                for node, taken in alloc:
                    pool = pool_of[node]
                    if free_count[node] + len(taken) >= pool.room:  # (else the room is as it was)
                        pool.room = pool.most_free_outside(avoid)
            entry = lane.head(state)
            if entry is None:
                heappop(cands)
            else:
                heapreplace(cands, entry)

    # ---- internals ---------------------------------------------------------------------------

    def _lookup(self, job_id: str) -> int:
        try:
            return self.index[job_id]
        except KeyError:
            raise ValueError(f"unknown job {job_id!r}") from None

    def _has_room(self, cls: int) -> bool:
        """Whether a pool of the class has room for one of its jobs outside the reservation
        (`Pool.room`, set by the backfill pass)."""
        per, share = self.needs[cls], self.class_shares[cls]
        for pool in self.class_pools[cls]:
            if pool.share_room(share) if share else pool.room >= per:
                return True
        return False

    def _fits_now(self, cls: int) -> bool:
        """Whether some node of the class's pools has the free GPUs one of its jobs needs there."""
        need = self.needs[cls]
        for pool in self.class_pools[cls]:  # noqa: SIM110 (a loop: any() is slower here)
            if pool.max_free >= need:
                return True
        return False

    def _start(self, i: int, alloc: Alloc, now: float, started: list[int]) -> None:
        self.state[i] = RUNNING
        self.allocs[i] = alloc
        if self.user_limit:
            self.running_by_user[self.users[i]] += 1
        if self.is_easy:
            end = now + self.estimates[i]
            self.end_estimates[i] = end
            insort(self.ends, (end, i))
        started.append(i)

    def _block(self, i: int, now: float) -> bool:
        """Job `i` is the head and does not fit; returns whether anything may backfill past it.

        sing's rules: "reserve" backfills freely until the head has waited max_head_wait_s, then
        reserves the nodes where it fits soonest (the freest now: without time limits nothing
        better is known) and backfills only elsewhere; "wait" stops backfill then; "budget" caps
        the GPUs backfilled past this head.
        """
        if i != self.head:
            self.head, self.head_since, self.budget_used = i, now, 0
            self.reservation = (INF, set())
            self.rules_changed = True
            if self.is_easy:
                self.reservation = self._reserve(i, now)
        if self.is_easy:
            if now >= self.reservation[0]:  # a running job overran its limit: reserve again
                self.reservation = self._reserve(i, now)
                self.rules_changed = True
            return True
        if self.age_window_after_s:
            self.cutoff = self._age_cutoff(i, now)
        if self.budget_rule:
            return self.budget_used < self.backfill_budget * self.gpus[i]
        waited = now - self.head_since >= self.max_head_wait_s
        if self.wait_rule:
            return not waited
        if waited:
            self._hold_nodes(i)
        return True

    def _age_cutoff(self, i: int, now: float) -> float:
        """sing's age window: the latest submit time a job may have to backfill past head `i`.

        Until the head has waited age_window_after_s since its submit, any (INF). Then only jobs
        submitted at most age_window_s after it: the old jobs behind the head still fill gaps
        among themselves, but the young ones no longer take the GPUs that the old ones are
        waiting for, so an old large job is not passed over again and again by a stream of new
        small ones. The cutoff only tightens while one head waits (the skipped passes rely on it).
        """
        submitted = self.submitted[i]
        if now - submitted < self.age_window_after_s:
            return INF
        return submitted + self.age_window_s

    def _hold_nodes(self, i: int) -> None:
        """sing's reserve rule: keep the nodes where head `i` fits soonest free of backfill.

        First the freest nodes; later a reserved node that is not wholly free is swapped for a
        wholly free one outside the reservation. A swap never makes the reserved nodes less free
        than they would have been, so the head still starts no later than when the first nodes
        reserved for it drain.
        """
        reserved = self.reservation[1]
        if not reserved:
            nodes, _, gpus = self.shapes[i]
            count = nodes or -(-gpus // self.cluster.gpus_per_node)
            self.reservation = (INF, self.cluster.freest(count, self.pools[i]))
            self.released = self.all_held = False  # any wholly free node is among the freest
            return
        if self.all_held or not self.released:
            # Backfill keeps off reserved nodes, so they only gain free GPUs; with starts only
            # since the last look no node outside became wholly free.
            return
        self.released = False
        free_count, size = self.cluster.free_count, self.cluster.size
        for pool in self.pools[i]:
            for node in pool.idle():
                if node not in reserved:
                    worst = min(reserved, key=lambda n: (free_count[n] - size[n], -n))
                    if free_count[worst] == size[worst]:
                        self.all_held = True
                        return
                    reserved.remove(worst)
                    reserved.add(node)
                    self.cluster.unreserve(worst)

    def _over_limit(self, i: int) -> bool:
        """Per-user limit: a job of a user at the limit is held until one of theirs ends."""
        if not self.user_limit or self.running_by_user[self.users[i]] < self.user_limit:
            return False
        self.state[i] = HELD
        self.held[self.users[i]].append(i)
        return True

    def _easy_backfill(self, i: int, lane: Lane, now: float) -> tuple[int, Alloc | None]:
        """May job `i` (head of its class) or one behind it start without delaying the blocked
        head's reservation? Returns (job, alloc)."""
        cluster = self.cluster
        until, reserved = self.reservation
        if now + self.estimates[i] <= until:
            return i, cluster.place(self.shapes[i], self.pools[i])
        alloc = cluster.place(self.shapes[i], self.pools[i], reserved)
        if alloc is not None or not self.settings.easy_depth:
            return i, alloc
        # The oldest job of this class is too long to end before the reservation and there is no
        # room outside it; a shorter job of the same class further back may still fit in time.
        limit, running, users = self.user_limit, self.running_by_user, self.users
        for _, j in lane.first(self.settings.easy_depth + 1):
            if (
                self.state[j] == WAITING
                and now + self.estimates[j] <= until
                and not (limit and running[users[j]] >= limit)
            ):
                return j, cluster.place(self.shapes[j], self.pools[j])
        return i, None

    def _reserve(self, i: int, now: float) -> tuple[float, set[int]]:
        """EASY: when and on which nodes head job `i` can start, from running jobs' estimates.

        Walks running jobs by estimated end, adding their GPUs back to a projection of the free
        counts, until the head's shape fits; the nodes it would take then are reserved until then.
        """
        shape = self.shapes[i]
        if not shape[1]:
            shape = (1, 1, 1)  # a share: reserved as one GPU (a share ending counts as its GPU)
        nodes, _, gpus = shape
        pools = self.pools[i]
        cluster = self.cluster
        free = {n: c for p in pools for c, bucket in enumerate(p.by_free) if c for n in bucket}
        if nodes == 0:
            need = gpus - sum(free.values())
        else:
            # The head fits when, for every share size s, at least as many nodes have >= s free
            # GPUs as it has shares >= s (shares only nest, so this suffices); short[s] counts
            # the nodes still missing.
            shares = split(shape)
            short = {s: sum(t >= s for t in shares) for s in set(shares)}
            for s in short:
                short[s] -= sum(c >= s for c in free.values())
        for end, j in self.ends:
            for node, held in self.allocs[j]:
                if cluster.pool_of[node] not in pools:
                    continue
                before = free.get(node, 0)
                after = free[node] = before + len(held)
                if nodes == 0:
                    need -= len(held)
                    if need <= 0:
                        return max(end, now), set(free)
                    continue
                for s in short:
                    if before < s <= after:
                        short[s] -= 1
                if max(short.values()) <= 0:
                    return max(end, now), _best_fit(free, shares)
        return INF, set()


def _need(shape: Shape) -> int:
    """The free GPUs one node needs for a job of this shape to start (the class order's key).

    Placement "any" (0 nodes) can use a single free GPU on each of several nodes.
    """
    return shape[1] if shape[0] else 1


def _unlock(shape: Shape) -> int:
    """The fewest free GPUs a released node must be left with for a job of this shape, which
    did not fit before, to fit now: its smallest per-node part (1 anywhere; 0 for a share, which
    a returned share can make room for)."""
    nodes, per, gpus = shape
    if not per:
        return 0
    if nodes == 0:
        return 1
    return split(shape)[-1]


def _best_fit(free: dict[int, int], shares: list[int]) -> set[int]:
    """The nodes best-fit placement would give `shares` (largest first) if `free` were the free
    counts; they suffice (the caller checked)."""
    candidates = sorted(free, key=lambda n: (free[n], n))
    chosen: set[int] = set()
    for share in shares:
        chosen.add(next(n for n in candidates if free[n] >= share and n not in chosen))
    return chosen
