"""The GPUs of a cluster and where a job's GPUs go.

Placement is deterministic: among nodes that fit a request equally well, the lowest-numbered node
wins. Nodes are numbered in the natural order of their names (`gpu2` before `gpu10`), whatever
order the caller lists them in, so the same jobs land on the same nodes at the same times.

Free GPUs are indexed by each node's free count (`Pool.by_free[c]` lists, in ascending order, the
nodes with exactly `c` free GPUs), so placing a job looks at no more than gpus_per_node + 1
buckets instead of every node, and the lowest-numbered node of a bucket is its first entry. That
index is what lets the simulator replay hundreds of thousands of jobs per second.

A job's *shape* is `(nodes, per_node, gpus)`:
- `(1, k, k)`: k GPUs packed on one node (jobs of at most one node's GPUs);
- `(n, G, k)`: a job larger than one node: k // G whole free nodes and the remainder k % G on the
  best-fitting other node (the fewest free GPUs that suffice);
- `(n, ceil(k/n), k)`: a job that asked for n nodes explicitly;
- `(0, k, k)`: k GPUs anywhere (placement "any", the GPU-count-only model of simple simulators).
`split` turns a multi-node shape into GPUs per node; each is placed best-fit, largest first.

An optional *small-job pool* (the last `small_pool_nodes` nodes) only takes jobs of at most
`small_job_max_gpus` GPUs; those jobs try the small pool first, so the general pool stays free for
larger jobs.
"""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections.abc import Collection, Sequence

Alloc = list[tuple[int, list[int]]]  # (node index, GPU indices on that node)
Shape = tuple[int, int, int]  # (nodes, per_node, gpus); see the module docstring


class Pool:
    """A range of nodes with a free-count index: `by_free[c]` = nodes with c free, ascending."""

    __slots__ = ("nodes", "by_free", "max_free")

    def __init__(self, nodes: range, gpus_per_node: int) -> None:
        self.nodes = nodes
        self.by_free: list[list[int]] = [[] for _ in range(gpus_per_node + 1)]
        self.by_free[gpus_per_node] = list(nodes)
        # Most free GPUs on any one node: a request for more fails without looking at buckets.
        self.max_free = gpus_per_node if nodes else 0

    def free_gpus(self) -> int:
        return sum(c * len(bucket) for c, bucket in enumerate(self.by_free))

    def best_fit(self, need: int, avoid: Collection[int] = ()) -> int:
        """The node with the fewest free GPUs >= `need` (lowest-numbered of those), not in
        `avoid`; -1 if there is none."""
        by_free = self.by_free
        for c in range(need, self.max_free + 1):
            for node in by_free[c]:
                if node not in avoid:
                    return node
        return -1


class Cluster:
    """`nodes` x `gpus_per_node` GPUs, optionally with a pool reserved for small jobs."""

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        *,
        names: Sequence[str] | None = None,
        small_pool_nodes: int = 0,
        small_job_max_gpus: int = 1,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError(
                f"a cluster needs >= 1 node and >= 1 GPU per node, got {nodes}x{gpus_per_node}"
            )
        if not 0 <= small_pool_nodes < nodes:
            raise ValueError(f"small_pool_nodes={small_pool_nodes} must be in [0, nodes={nodes})")
        width = len(str(nodes - 1))
        given = names or [f"node{i:0{width}d}" for i in range(nodes)]
        self.names = tuple(sorted(given, key=natural_key))
        if len(self.names) != nodes or len(set(self.names)) != nodes:
            raise ValueError(f"need {nodes} distinct node names, got {list(given)}")
        self.gpus_per_node = gpus_per_node
        self.small_job_max_gpus = small_job_max_gpus
        # Free GPU indices per node, as a stack: the lowest index is handed out first.
        self.free = [list(range(gpus_per_node - 1, -1, -1)) for _ in range(nodes)]
        self.free_count = [gpus_per_node] * nodes
        self.general = Pool(range(nodes - small_pool_nodes), gpus_per_node)
        self.small = Pool(range(nodes - small_pool_nodes, nodes), gpus_per_node)
        self.pool_of = [
            self.small if n >= nodes - small_pool_nodes else self.general for n in range(nodes)
        ]

    @property
    def nodes(self) -> int:
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def shape(self, gpus: int, nodes: int = 0, pack: bool = True) -> Shape:
        """The shape a request of `gpus` GPUs (on `nodes` nodes, 0 = any) takes here."""
        G = self.gpus_per_node
        if nodes > 0:
            return (nodes, -(-gpus // nodes), gpus)
        if not pack:
            return (0, gpus, gpus)
        if gpus <= G:
            return (1, gpus, gpus)
        return (-(-gpus // G), G, gpus)

    def pools_for(self, shape: Shape) -> tuple[Pool, ...]:
        """Pools a job of this shape may use, in the order it tries them."""
        if not self.small.nodes:
            return (self.general,)
        if shape[0] <= 1 and shape[2] <= self.small_job_max_gpus:
            return (self.small, self.general)
        return (self.general,)

    def most_free(self) -> int:
        """Most free GPUs on any one node: no job needing more per node can start now."""
        general, small = self.general.max_free, self.small.max_free
        return general if general >= small else small

    def capacity(self, shape: Shape) -> bool:
        """Whether a job of this shape could ever run here (on an empty cluster)."""
        nodes, per, gpus = shape
        pools = self.pools_for(shape)
        if nodes == 0:
            return gpus <= sum(len(p.nodes) for p in pools) * self.gpus_per_node
        return per <= self.gpus_per_node and any(len(p.nodes) >= nodes for p in pools)

    def place(
        self, shape: Shape, pools: tuple[Pool, ...], avoid: Collection[int] = ()
    ) -> Alloc | None:
        """Take GPUs for `shape` best-fit (fewest free GPUs that suffice, then lowest-numbered
        node); None if it cannot fit. Nodes in `avoid` are not used (a reservation)."""
        nodes, per, gpus = shape
        if nodes == 1 and not avoid:  # the hot path, inlined: best fit, lowest-numbered first
            for pool in pools:
                by_free = pool.by_free
                for c in range(per, pool.max_free + 1):
                    if by_free[c]:
                        node = by_free[c][0]
                        return [(node, self._take(node, gpus))]
            return None
        for pool in pools:
            if nodes and per > pool.max_free:
                continue
            if nodes == 1:
                node = pool.best_fit(per, avoid)
                if node >= 0:
                    return [(node, self._take(node, gpus))]
                continue
            chosen = _anywhere(pool, gpus, avoid) if nodes == 0 else _pick(pool, shape, avoid)
            if chosen:
                return [(node, self._take(node, take)) for node, take in sorted(chosen)]
        return None

    def freest(self, count: int, pools: tuple[Pool, ...]) -> set[int]:
        """The `count` nodes with the most free GPUs (lowest-numbered among equals): where a
        blocked job will fit soonest when nothing more is placed there."""
        chosen: list[int] = []
        for c in range(self.gpus_per_node, -1, -1):
            for pool in pools:
                chosen += pool.by_free[c][: count - len(chosen)]
            if len(chosen) == count:
                break
        return set(chosen)

    # _take and release run once per job per replay: the free-count index update is inlined.

    def _take(self, node: int, k: int) -> list[int]:
        """Take the `k` lowest-numbered free GPUs of `node`."""
        stack = self.free[node]
        if k == 1:
            gpus = [stack.pop()]
        else:
            gpus = stack[-k:]
            del stack[-k:]
            gpus.sort()
        c = self.free_count[node]
        self.free_count[node] = c - k
        pool = self.pool_of[node]
        by_free = pool.by_free
        bucket = by_free[c]
        del bucket[bisect_left(bucket, node)]
        insort(by_free[c - k], node)
        if c == pool.max_free and not bucket:
            while c and not by_free[c]:
                c -= 1
            pool.max_free = c
        return gpus

    def release(self, alloc: Alloc) -> None:
        """Give a job's GPUs back."""
        free, free_count, pool_of = self.free, self.free_count, self.pool_of
        for node, gpus in alloc:
            k = len(gpus)
            if k == 1:
                free[node].append(gpus[0])
            else:
                free[node].extend(reversed(gpus))
            c = free_count[node]
            new = free_count[node] = c + k
            pool = pool_of[node]
            bucket = pool.by_free[c]
            del bucket[bisect_left(bucket, node)]
            insort(pool.by_free[new], node)
            if new > pool.max_free:
                pool.max_free = new


def split(shape: Shape) -> list[int]:
    """GPUs per node of a shape on `nodes` >= 1 nodes, largest first: each node takes `per` in
    turn, leaving at least one GPU for each node after it. A job larger than one node thus takes
    whole nodes and the remainder on its last node: (2, 8, 12) -> [8, 4]."""
    nodes, per, gpus = shape
    out = []
    for later in range(nodes - 1, -1, -1):
        take = min(per, gpus - later)
        out.append(take)
        gpus -= take
    return out


def natural_key(name: str) -> tuple:
    """Sort key comparing the digit runs of a node name as numbers: gpu2 < gpu10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _pick(pool: Pool, shape: Shape, avoid: Collection[int]) -> list[tuple[int, int]] | None:
    """Nodes for a multi-node shape: each node's share best-fit, largest share first.

    Largest first never fails where some choice fits: a node free enough for a larger share is
    free enough for every smaller one.
    """
    shares = split(shape)
    if len(pool.by_free[-1]) < shares.count(len(pool.by_free) - 1):
        return None  # not enough whole free nodes
    chosen: list[tuple[int, int]] = []
    taken = set(avoid)
    for share in shares:
        node = pool.best_fit(share, taken)
        if node < 0:
            return None
        chosen.append((node, share))
        taken.add(node)
    return chosen


def _anywhere(pool: Pool, gpus: int, avoid: Collection[int]) -> list[tuple[int, int]] | None:
    """Nodes for `gpus` GPUs anywhere: the fullest nodes first, to keep idle nodes whole."""
    chosen: list[tuple[int, int]] = []
    for c in range(1, len(pool.by_free)):
        for node in pool.by_free[c]:
            if node not in avoid:
                take = min(c, gpus)
                chosen.append((node, take))
                gpus -= take
                if not gpus:
                    return chosen
    return None
