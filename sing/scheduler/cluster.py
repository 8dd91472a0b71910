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

A *mixed* cluster (`Cluster.mixed`) has nodes of different GPU counts and models. Its nodes are
numbered by model, then name, and each model's nodes form one pool: a job constrained to a model
uses that model's pool only, any other job tries the pools in model order (a job never spans two
models). `gpus_per_node` is then the largest node's count.

A *share* is a fractional request (shape `(1, 0, thousandths)`): it goes on the GPU with the least
remaining share that suffices, else on a whole free GPU (best-fit node), which from then on lends
out its share in thousandths until every share on it has ended. A share never straddles two GPUs,
and a GPU lending shares is not free for whole-GPU jobs.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Collection, Sequence
from typing import Final, NamedTuple

# Library functions the hot paths call, as Final names: a compiled build (sing/scheduler/native.py)
# reads a Final name from a C variable instead of looking it up in the module's dict per call.
bisect_left: Final = bisect.bisect_left
insort: Final = bisect.insort

Alloc = list[tuple[int, list[int]]]  # (node index, GPU indices on that node)
Shape = tuple[int, int, int]  # (nodes, per_node, gpus); see the module docstring
WHOLE: Final = 1000  # a GPU in thousandths: the unit of shares


class Node(NamedTuple):
    """One node of a mixed cluster (a row of a node list: node,gpus,gpu_model)."""

    name: str
    gpus: int
    gpu_model: str = ""


class Pool:
    """A range of nodes with a free-count index: `by_free[c]` = nodes with c free, ascending."""

    __slots__ = ("nodes", "by_free", "max_free", "size", "widths", "partial", "freed", "room")

    def __init__(self, nodes: range, size: list[int], top: int) -> None:
        """`size[n]`: GPUs of node n (the cluster's list); `top`: the cluster's largest node."""
        self.nodes = nodes
        self.size = size
        self.by_free: list[list[int]] = [[] for _ in range(top + 1)]
        for node in nodes:
            self.by_free[size[node]].append(node)
        self.widths = sorted({size[n] for n in nodes}, reverse=True)  # node sizes, largest first
        # Most free GPUs on any one node: a request for more fails without looking at buckets.
        self.max_free = self.widths[0] if nodes else 0
        # GPUs lending shares: (thousandths left, node, GPU), ascending (best fit is a bisect).
        self.partial: list[tuple[int, int, int]] = []
        # The most free GPUs a node of this pool was left with by a release since the scheduler
        # last looked (it sets -1 after each pass); 0: only a share came back; -1: nothing.
        self.freed = top
        # Most free GPUs on one node open to backfill (outside a reservation): set by the
        # scheduler at the start of a backfill pass and kept current through it, stale after.
        self.room = 0

    def width(self) -> int:
        """GPUs of this pool's largest node."""
        return self.widths[0] if self.widths else 0

    def idle(self) -> list[int]:
        """Nodes with every GPU free (of one node size: its bucket itself, not a copy)."""
        if len(self.widths) == 1:
            return self.by_free[self.widths[0]]
        return [n for s in self.widths for n in self.by_free[s] if self.size[n] == s]

    def at_least(self, gpus: int) -> int:
        """Nodes of this pool with >= `gpus` GPUs (free or not)."""
        return sum(self.size[n] >= gpus for n in self.nodes)

    def free_gpus(self) -> int:
        return sum(c * len(bucket) for c, bucket in enumerate(self.by_free))

    def most_free_outside(self, avoid: set[int]) -> int:
        """Most free GPUs on one node not in `avoid`."""
        if not avoid:
            return self.max_free
        by_free = self.by_free
        for c in range(self.max_free, 0, -1):
            for node in by_free[c]:
                if node not in avoid:
                    return c
        return 0

    def share_room(self, share: int) -> bool:
        """Whether a share of `share` thousandths can go here now without a reservation in the
        way: some GPU lends enough, or a whole GPU is open (`room`)."""
        partial = self.partial
        return self.room > 0 or (bool(partial) and partial[-1][0] >= share)

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
    """`nodes` x `gpus_per_node` GPUs, optionally with a pool reserved for small jobs; or a mixed
    cluster from a node list (`Cluster.mixed`)."""

    def __init__(
        self,
        nodes: int | Sequence[Node],
        gpus_per_node: int = 0,
        *,
        names: Sequence[str] | None = None,
        small_pool_nodes: int = 0,
        small_job_max_gpus: int = 1,
    ) -> None:
        """`nodes` x `gpus_per_node` GPUs on nodes called `names` (default node0, node1, ...),
        or the nodes of a node list (`Cluster.mixed`)."""
        if isinstance(nodes, int):
            if nodes < 1 or gpus_per_node < 1:
                raise ValueError(
                    f"a cluster needs >= 1 node and >= 1 GPU per node, got {nodes}x{gpus_per_node}"
                )
            width = len(str(nodes - 1))
            given = names or [f"node{i:0{width}d}" for i in range(nodes)]
            if len(given) != nodes:
                raise ValueError(f"need {nodes} distinct node names, got {list(given)}")
            listed = [Node(n, gpus_per_node) for n in given]
        else:
            if not nodes or any(n.gpus < 1 for n in nodes):
                raise ValueError("a cluster needs >= 1 node, each with >= 1 GPU")
            if small_pool_nodes and len({n.gpu_model for n in nodes}) > 1:
                raise ValueError("small_pool_nodes needs a cluster of one GPU model")
            listed = list(nodes)
        self._build(listed, small_pool_nodes, small_job_max_gpus)

    @classmethod
    def mixed(
        cls, nodes: Sequence[Node], *, small_pool_nodes: int = 0, small_job_max_gpus: int = 1
    ) -> Cluster:
        """A cluster of these nodes (GPU counts and models may differ)."""
        return cls(nodes, small_pool_nodes=small_pool_nodes, small_job_max_gpus=small_job_max_gpus)

    def _build(self, given: list[Node], small_pool_nodes: int, small_job_max_gpus: int) -> None:
        count = len(given)
        if not 0 <= small_pool_nodes < count:
            raise ValueError(f"small_pool_nodes={small_pool_nodes} must be in [0, nodes={count})")
        ordered = sorted(given, key=lambda n: (n.gpu_model, natural_key(n.name)))
        self.names = tuple(n.name for n in ordered)
        if len(set(self.names)) != count:
            raise ValueError(f"need {count} distinct node names, got {[n.name for n in given]}")
        self.size = [n.gpus for n in ordered]
        self.model = [n.gpu_model for n in ordered]
        self.gpus_per_node = top = max(self.size)
        self.total_gpus = sum(self.size)
        self.small_job_max_gpus = small_job_max_gpus
        # Free GPU indices per node, as a stack: the lowest index is handed out first.
        self.free = [list(range(g - 1, -1, -1)) for g in self.size]
        self.free_count = list(self.size)
        self.share_left: dict[tuple[int, int], int] = {}  # (node, GPU) lending shares -> left
        self.capacities: dict[tuple[Shape, tuple[Pool, ...]], bool] = {}  # capacity's answers
        # One pool per model (its nodes are consecutive); the small pool needs a single model.
        self.model_pools: dict[str, tuple[Pool, ...]] = {}
        first = 0
        for k in range(1, count + 1):
            if k == count or self.model[k] != self.model[first]:
                end = k - small_pool_nodes if k == count else k
                self.model_pools[self.model[first]] = (Pool(range(first, end), self.size, top),)
                first = k
        self.small = Pool(range(count - small_pool_nodes, count), self.size, top)
        every = tuple(pool for pools in self.model_pools.values() for pool in pools)
        self.model_pools[""] = every
        self.general = every[0]
        self.pool_of = [self.small] * count
        for pool in every:
            for node in pool.nodes:
                self.pool_of[node] = pool
        self.all_pools = (*every, self.small)

    @property
    def nodes(self) -> int:
        return len(self.names)

    @property
    def uniform(self) -> bool:
        return len(set(self.size)) == 1 and len(set(self.model)) == 1

    def describe(self) -> str:
        """`64x8` for a uniform cluster, else `32x8 V100 + 16x4 T4`."""
        if self.uniform:
            return f"{self.nodes}x{self.gpus_per_node}" + (
                f" {self.model[0]}" * bool(self.model[0])
            )
        kinds: dict[tuple[int, str], int] = {}
        for size, model in zip(self.size, self.model, strict=True):
            kinds[size, model] = kinds.get((size, model), 0) + 1
        return " + ".join(f"{n}x{g} {m or '(no model)'}" for (g, m), n in kinds.items())

    def shape(
        self, gpus: int, nodes: int = 0, pack: bool = True, pools: tuple[Pool, ...] = ()
    ) -> Shape:
        """The shape a request of `gpus` GPUs (on `nodes` nodes, 0 = any) takes on `pools`
        (default: all; a job larger than one node takes whole nodes of their largest size)."""
        G = max(p.width() for p in pools) if pools else self.gpus_per_node
        if nodes > 0:
            return (nodes, -(-gpus // nodes), gpus)
        if not pack:
            return (0, gpus, gpus)
        if gpus <= G:
            return (1, gpus, gpus)
        return (-(-gpus // G), G, gpus)

    def models_for(self, model: str) -> tuple[Pool, ...]:
        """Pools of GPU model `model` ("" = any model; `A|B`: either, as pod lists write it);
        () if the cluster has none of it."""
        pools = self.model_pools.get(model)
        if pools is None:
            named = dict.fromkeys([m.strip() for m in model.split("|") if m.strip()])
            pools = tuple(p for m in named for p in self.model_pools.get(m, ()))
            self.model_pools[model] = pools
        return pools

    def pools_for(self, shape: Shape, model: str = "") -> tuple[Pool, ...]:
        """Pools a job of this shape (on `model`, "" = any) may use, in the order it tries them."""
        pools = self.models_for(model)
        if pools and self.small.nodes and shape[0] <= 1 and shape[1] <= self.small_job_max_gpus:
            return (self.small, *pools)
        return pools

    def most_free(self) -> int:
        """Most free GPUs on any one node: no job needing more per node can start now."""
        best = 0  # (a loop: faster than max() here)
        for pool in self.all_pools:
            if pool.max_free > best:
                best = pool.max_free
        return best

    def capacity(self, shape: Shape, pools: tuple[Pool, ...]) -> bool:
        """Whether a job of this shape could ever run on `pools` (of an empty cluster)."""
        known = self.capacities.get((shape, pools))
        if known is None:
            known = self.capacities[shape, pools] = self._capacity(shape, pools)
        return known

    def _capacity(self, shape: Shape, pools: tuple[Pool, ...]) -> bool:
        nodes, per, gpus = shape
        if nodes == 0:
            return any(gpus <= sum(self.size[n] for n in p.nodes) for p in pools)
        shares = split(shape)
        return any(
            all(p.at_least(s) >= sum(t >= s for t in shares) for s in set(shares)) for p in pools
        )

    def place(
        self, shape: Shape, pools: tuple[Pool, ...], avoid: Collection[int] = ()
    ) -> Alloc | None:
        """Take GPUs for `shape` best-fit (fewest free GPUs that suffice, then lowest-numbered
        node); None if it cannot fit. Nodes in `avoid` are not used (a reservation)."""
        nodes, per, gpus = shape
        if not per:
            return self._place_share(gpus, pools, avoid)
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

    def _place_share(
        self, share: int, pools: tuple[Pool, ...], avoid: Collection[int]
    ) -> Alloc | None:
        """A share of `share` thousandths: on the GPU with the least share left that suffices,
        else on a whole free GPU of the best-fit node."""
        for pool in pools:
            partial = pool.partial
            k = bisect_left(partial, (share, -1, -1))
            while k < len(partial) and partial[k][1] in avoid:
                k += 1
            if k < len(partial):
                left, node, gpu = partial.pop(k)
                self._lend(pool, node, gpu, left - share)
                return [(node, [gpu])]
        for pool in pools:
            node = pool.best_fit(1, avoid)
            if node >= 0:
                gpu = self._take(node, 1)[0]
                self._lend(pool, node, gpu, WHOLE - share)
                return [(node, [gpu])]
        return None

    def _lend(self, pool: Pool, node: int, gpu: int, left: int) -> None:
        self.share_left[node, gpu] = left
        if left:
            insort(pool.partial, (left, node, gpu))

    def release_share(self, alloc: Alloc, share: int) -> None:
        """Give a share back; its GPU is whole and free again once its last share has ended."""
        ((node, (gpu,)),) = alloc
        pool = self.pool_of[node]
        left = self.share_left.pop((node, gpu))
        if left:
            partial = pool.partial
            del partial[bisect_left(partial, (left, node, gpu))]
        if left + share == WHOLE:
            self.release(alloc)
        else:
            self._lend(pool, node, gpu, left + share)
            if pool.freed < 0:
                pool.freed = 0

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
        _move(by_free, node, c, c - k)
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
            _move(pool.by_free, node, c, new)
            if new > pool.max_free:
                pool.max_free = new
            if new > pool.freed:
                pool.freed = new

    def all_freed(self) -> None:
        """Count every node as freed (`Pool.freed`): the scheduler's rules changed."""
        for pool in self.all_pools:
            pool.freed = self.gpus_per_node

    def unreserve(self, node: int) -> None:
        """A node leaves a reservation: to backfill it is as good as freed."""
        pool = self.pool_of[node]
        if self.free_count[node] > pool.freed:
            pool.freed = self.free_count[node]


def _move(by_free: list[list[int]], node: int, old: int, new: int) -> None:
    """Move `node` from bucket `old` of a free-count index to bucket `new`, both kept sorted.
    Half the time the node is its old bucket's first or goes last in the new one: those are
    tried before a bisect."""
    bucket = by_free[old]
    if bucket[0] == node:
        del bucket[0]
    else:
        del bucket[bisect_left(bucket, node)]
    bucket = by_free[new]
    if not bucket or node > bucket[-1]:
        bucket.append(node)
    else:
        insort(bucket, node)


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
    top = pool.max_free
    if top < shares[0] or len(pool.by_free[top]) < shares.count(top):
        return None  # not enough free nodes for the largest shares
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
