"""The GPUs of a cluster and where a job's GPUs go.

Free GPUs are indexed by each node's free count (`Pool.by_free[c]` holds the nodes with exactly
`c` free GPUs), so placing a job looks at no more than gpus_per_node + 1 buckets instead of every
node. That index is what lets the simulator replay hundreds of thousands of jobs per second.

A job's *shape* is `(nodes, per_node, gpus)`:
- `(1, k, k)`: k GPUs packed on one node (jobs of at most one node's GPUs);
- `(n, G, k)`: n whole idle nodes for a job larger than one node (the last node's unused GPUs
  stay free for others);
- `(n, ceil(k/n), k)`: a job that asked for n nodes explicitly;
- `(0, k, k)`: k GPUs anywhere (placement "any", the GPU-count-only model of simple simulators).

An optional *small-job pool* (the last `small_pool_nodes` nodes) only takes jobs of at most
`small_job_max_gpus` GPUs; those jobs try the small pool first, so the general pool stays free for
larger jobs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

Alloc = list[tuple[int, list[int]]]  # (node index, GPU indices on that node)
Shape = tuple[int, int, int]  # (nodes, per_node, gpus); see the module docstring


class Pool:
    """A set of nodes with a free-count index."""

    __slots__ = ("nodes", "by_free", "max_free")

    def __init__(self, nodes: range, gpus_per_node: int) -> None:
        self.nodes = nodes
        self.by_free: list[set[int]] = [set() for _ in range(gpus_per_node + 1)]
        self.by_free[gpus_per_node].update(nodes)
        # Most free GPUs on any one node: a request for more fails without looking at buckets.
        self.max_free = gpus_per_node if nodes else 0

    def free_gpus(self) -> int:
        return sum(c * len(bucket) for c, bucket in enumerate(self.by_free))


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
        self.names = tuple(names) if names else tuple(f"node{i:0{width}d}" for i in range(nodes))
        if len(self.names) != nodes or len(set(self.names)) != nodes:
            raise ValueError(f"need {nodes} distinct node names, got {list(self.names)}")
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
        """Take GPUs for `shape` best-fit (fewest free GPUs that suffice); None if it cannot fit.

        Nodes in `avoid` are not used (EASY keeps its reservation free this way).
        """
        nodes, per, gpus = shape
        G = self.gpus_per_node
        if nodes == 1:
            for pool in pools:
                if per > pool.max_free:
                    continue
                by_free = pool.by_free
                for c in range(per, pool.max_free + 1):
                    bucket = by_free[c]
                    if bucket:
                        if not avoid:
                            node = next(iter(bucket))
                            return [(node, self._take(node, gpus))]
                        for node in bucket:
                            if node not in avoid:
                                return [(node, self._take(node, gpus))]
            return None
        for pool in pools:
            if nodes and (per > pool.max_free or (per == G and len(pool.by_free[G]) < nodes)):
                continue
            chosen = self._pick(pool, nodes, per, gpus, avoid)
            if chosen:
                alloc: Alloc = []
                remaining = gpus
                for node, take in chosen:
                    alloc.append((node, self._take(node, take)))
                    remaining -= take
                return alloc
        return None

    def _pick(
        self, pool: Pool, nodes: int, per: int, gpus: int, avoid: Collection[int]
    ) -> list[tuple[int, int]] | None:
        """Nodes and GPU counts for a multi-node (or, with nodes=0, anywhere) request."""
        chosen: list[tuple[int, int]] = []
        remaining = gpus
        if nodes == 0:  # GPUs anywhere: fill the fullest nodes first to keep idle nodes whole
            for c in range(1, self.gpus_per_node + 1):
                for node in pool.by_free[c]:
                    if node not in avoid:
                        take = min(c, remaining)
                        chosen.append((node, take))
                        remaining -= take
                        if not remaining:
                            return chosen
            return None
        for c in range(per, self.gpus_per_node + 1):
            for node in pool.by_free[c]:
                if node not in avoid:
                    take = min(per, remaining)
                    chosen.append((node, take))
                    remaining -= take
                    if len(chosen) == nodes:
                        return chosen
        return None

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
        by_free[c].discard(node)
        by_free[c - k].add(node)
        if c == pool.max_free and not by_free[c]:
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
            pool.by_free[c].discard(node)
            pool.by_free[new].add(node)
            if new > pool.max_free:
                pool.max_free = new
