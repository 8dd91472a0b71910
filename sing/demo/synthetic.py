"""A synthetic campus workload: the embedded default's history and the tests' data.

Calibration (docs/synthetic-workload.md has the figures it produces):
- Users have habits (`HABITS`): many 1-GPU jobs from students iterating, 8-GPU trainers,
  multi-node trainers, interactive sessions that hold GPUs and idle, hyper-parameter sweeps.
- Job lengths are bimodal: a short mode (median ~12 min: debugging, failed starts) and a long
  mode (median ~6 h: training), capped by the time limit (TIMEOUT when reached).
- Mean GPU utilisation falls with node count as the SING paper measured on its campus cluster
  (1 node ~0.60, 2 ~0.45, 4 ~0.35, 8 nodes ~0.25); ~4% of jobs hold their GPUs and do nothing,
  and the first multi-node job of every two days holds its GPUs idle, for admins to find.
- Multi-node jobs move RDMA traffic in proportion to their GPU activity (a share of a 4 x 200 Gb/s
  node link); idle ones move next to nothing.
- Power follows utilisation between the H100's idle (~70 W) and its 700 W limit; the energy
  counter is the running integral; memory use is a per-job share of the 80 GiB card.
- Arrivals are sized so ~75-80% of GPUs are assigned; the jobs are placed by the project's own
  scheduler (sing/scheduler/, SING policy: FCFS with bounded backfill, small jobs packed on one
  node, larger jobs on whole nodes), so the history is what sing itself would have done.
Everything is drawn from one numpy Generator: the same seed gives the same warehouse (the end
time shifts it, nothing else).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from sing.errors import UserError
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import replay
from sing.scheduler.workload import Workload
from sing.warehouse.files import fsync_path, uninterrupted
from sing.warehouse.store import Warehouse

SAMPLE_S = 15
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_MEMORY = 80 * 2**30
IDLE_POWER_W, MAX_POWER_W = 70.0, 700.0
UTIL_NOISE = 0.08  # standard deviation of a busy GPU's utilisation around its job's mean
LINK_SHARE = 0.35  # share of the node's RDMA link a fully busy multi-node job uses
RDMA_PORTS = 4
NODE_LINK_BYTES_S = RDMA_PORTS * 200e9 / 8  # 4 x 200 Gb/s
MEAN_UTIL_BY_NODES = {1: 0.60, 2: 0.45, 4: 0.35, 8: 0.25}
LOAD_SCALE = 1.1  # arrival-rate multiplier: ~75-80% of GPUs assigned, queues of hours
IDLE_MULTINODE_EVERY_S = 2 * 86_400
POLICY = "sing"  # the history is scheduled by the project's own SING policy
MAX_GPUS_PER_NODE = 1024  # gpu_index is a 16-bit column; no real node comes close


@dataclass(frozen=True)
class Habit:
    """How one kind of user submits: sizes (GPUs) with weights, share of short jobs, idleness."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    short_share: float
    idle_share: float
    interactive: bool = False
    jobs_per_day: float = 4.0


HABITS: dict[str, Habit] = {
    "student": Habit((1, 2), (0.85, 0.15), 0.6, 0.03, jobs_per_day=16),
    "trainer": Habit((1, 4, 8), (0.3, 0.3, 0.4), 0.3, 0.02, jobs_per_day=6),
    "multinode": Habit((8, 16, 32, 64), (0.3, 0.4, 0.2, 0.1), 0.3, 0.08, jobs_per_day=2.6),
    "interactive": Habit((1, 2), (0.7, 0.3), 0.2, 0.45, interactive=True, jobs_per_day=4),
    "sweeper": Habit((1,), (1.0,), 0.5, 0.01, jobs_per_day=28),
}

USERS: tuple[tuple[str, str, str], ...] = (
    # (user, account, habit)
    ("aturing", "theory-lab", "student"),
    ("ghopper", "systems-lab", "trainer"),
    ("alovelace", "nlp-lab", "multinode"),
    ("dknuth", "theory-lab", "student"),
    ("bliskov", "systems-lab", "interactive"),
    ("jmccarthy", "nlp-lab", "trainer"),
    ("fallen", "vision-lab", "multinode"),
    ("kjohnson", "vision-lab", "sweeper"),
    ("mhamilton", "robotics-lab", "student"),
    ("rkahn", "robotics-lab", "interactive"),
    ("sgoldwasser", "theory-lab", "sweeper"),
    ("lvaliant", "nlp-lab", "student"),
    ("yli", "vision-lab", "trainer"),
    ("hchen", "bio-ml-lab", "student"),
    ("pwang", "bio-ml-lab", "multinode"),
    ("nsingh", "robotics-lab", "student"),
)

SOFTWARE = (
    {"python": "3.11", "torch": "2.3.1", "cuda": "12.1"},
    {"python": "3.10", "torch": "2.1.2", "cuda": "11.8"},
    {"python": "3.11", "jax": "0.4.30", "cuda": "12.4"},
    {"python": "3.12", "torch": "2.5.0", "cuda": "12.4", "deepspeed": "0.15.1"},
)


@dataclass
class SyntheticJob:
    job_id: str
    user: str
    account: str
    habit: str
    submit: float  # seconds since the window start
    duration: float
    time_limit: float
    num_gpus: int
    mean_util: float
    sm_factor: float
    mem_share: float
    state: str
    exit_code: int
    interactive: bool
    dependencies: dict[str, str]
    start: float = -1.0
    placement: dict[int, list[int]] = field(default_factory=dict)  # node index -> GPU indices

    @property
    def num_nodes(self) -> int:
        return len(self.placement)


def draw_jobs(
    rng: np.random.Generator, seconds: float, gpus: int, gpus_per_node: int = 8
) -> list[SyntheticJob]:
    """Jobs submitted over `seconds` to a cluster of `gpus` GPUs, arrival rate scaled to its size;
    no job asks for more GPUs than the cluster has."""
    scale = gpus / 128  # habits are tuned for a 16 x 8 cluster
    jobs: list[SyntheticJob] = []
    for user, account, habit_name in USERS:
        habit = HABITS[habit_name]
        count = rng.poisson(LOAD_SCALE * habit.jobs_per_day * scale * seconds / 86_400)
        for submit in np.sort(rng.uniform(0, seconds, count)):
            jobs.append(
                draw_job(
                    rng,
                    user,
                    account,
                    habit_name,
                    habit,
                    float(submit),
                    max_gpus=gpus,
                    gpus_per_node=gpus_per_node,
                )
            )
    jobs.sort(key=lambda j: j.submit)
    for n, job in enumerate(jobs, start=1):
        job.job_id = str(1000 + n)
    _make_idle_multinode_jobs(jobs)
    return jobs


def _make_idle_multinode_jobs(jobs: list[SyntheticJob]) -> None:
    """Make the first multi-node job of every IDLE_MULTINODE_EVERY_S window hold its GPUs idle,
    so every history, however short, has the waste admins look for."""
    seen: set[int] = set()
    for job in jobs:
        window = int(job.submit // IDLE_MULTINODE_EVERY_S)
        if job.habit == "multinode" and job.num_gpus > 8 and window not in seen:
            seen.add(window)
            job.mean_util, job.mem_share = 0.005, 0.03


def draw_job(
    rng: np.random.Generator,
    user: str,
    account: str,
    habit_name: str,
    habit: Habit,
    submit: float,
    *,
    max_gpus: int | None = None,
    gpus_per_node: int = 8,
) -> SyntheticJob:
    """One job of the habit; a size above `max_gpus` (the cluster's GPUs) is capped to it, so a
    small cluster gets whole-cluster jobs instead of jobs it could never start. The draws are
    the same either way: a cluster that fits every size gets the same history as before."""
    num_gpus = int(rng.choice(habit.sizes, p=habit.weights))
    if max_gpus is not None:
        num_gpus = min(num_gpus, max_gpus)
    short = rng.random() < habit.short_share
    duration = float(rng.lognormal(np.log(720 if short else 6 * 3600), 0.8))
    time_limit = 4 * 3600.0 if habit.interactive else 48 * 3600.0
    state, exit_code = "COMPLETED", 0
    if duration >= time_limit:
        duration, state = time_limit, "TIMEOUT"
    elif rng.random() < 0.08:
        state, exit_code = "FAILED", int(rng.choice([1, 2, 137]))
    elif rng.random() < 0.05:
        state = "CANCELLED"
    idle = rng.random() < habit.idle_share
    mean = mean_util_by_nodes(-(-num_gpus // gpus_per_node))
    mean_util = 0.005 if idle else float(rng.beta(4, 4 / mean - 4))
    return SyntheticJob(
        job_id="",
        user=user,
        account=account,
        habit=habit_name,
        submit=submit,
        duration=max(duration, 60.0),
        time_limit=time_limit,
        num_gpus=num_gpus,
        mean_util=mean_util,
        sm_factor=float(rng.uniform(0.55, 0.9)),
        mem_share=float(rng.uniform(0.02, 0.08) if idle else rng.uniform(0.2, 0.95)),
        state=state,
        exit_code=exit_code,
        interactive=habit.interactive,
        dependencies=dict(SOFTWARE[int(rng.integers(len(SOFTWARE)))]),
    )


def mean_util_by_nodes(nodes: int) -> float:
    """The calibrated mean utilisation of a job on `nodes` nodes (the largest calibrated node
    count not above it: 3 nodes get the 2-node figure)."""
    return MEAN_UTIL_BY_NODES[max(n for n in MEAN_UTIL_BY_NODES if n <= nodes)]


def place_jobs(jobs: list[SyntheticJob], nodes: int, gpus_per_node: int, policy: str) -> None:
    """Schedule the jobs with the project's own scheduler; sets each job's start and placement."""
    workload = Workload(
        job_id=[j.job_id for j in jobs],
        user=[j.user for j in jobs],
        submit=[j.submit for j in jobs],
        duration=[j.duration for j in jobs],
        num_gpus=[j.num_gpus for j in jobs],
        num_nodes=[0] * len(jobs),
        time_limit=[j.time_limit for j in jobs],
    )
    result = replay(workload, nodes, gpus_per_node, SchedulerSettings(policy=policy))
    by_id = {j.job_id: j for j in jobs}
    for k, job_id in enumerate(result.workload.job_id):
        job = by_id[job_id]
        job.start = result.start[k]
        job.placement = {node: list(gpus) for node, gpus in result.allocs[k]}


def node_names(nodes: int) -> list[str]:
    return [f"gpu{n + 1:02d}" for n in range(nodes)]


def gpu_uuid(seed: int, node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"sing-demo-{seed}-{node}-{index}"))


def generate(
    wh: Warehouse,
    *,
    nodes: int = 16,
    gpus_per_node: int = 8,
    days: float = 7,
    seed: int = 0,
    end: datetime | None = None,
    cluster: str = "campus",
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, int]:
    """Write `days` of synthetic history ending at `end` into `wh`; returns row counts.
    `on_progress` hears the seconds of history written so far, after each day.

    The nodes are in the inventory from the history's start (`valid_from`), so capacity is
    known for every hour of it."""
    check_size(nodes, gpus_per_node, days)
    end = (end or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(days=days)
    seconds = (end - start).total_seconds()
    rng = np.random.default_rng(seed)
    jobs = draw_jobs(rng, seconds, nodes * gpus_per_node, gpus_per_node)
    place_jobs(jobs, nodes, gpus_per_node, POLICY)
    names = node_names(nodes)
    counts = {"jobs": 0, "gpu_samples": 0, "rdma_samples": 0}
    wh.append("nodes", _nodes_table(names, gpus_per_node, cluster, start))
    jobs_table, job_gpus_table = _job_tables(
        jobs, names, gpus_per_node, start, seconds, seed, cluster
    )
    counts["jobs"] = wh.append("jobs", jobs_table)
    wh.append("job_gpus", job_gpus_table)
    sampler = _Sampler(jobs, names, gpus_per_node, seed, rng, cluster)
    day_start = 0.0
    while day_start < seconds:
        day_end = min(seconds, day_start + 86_400 - (start.timestamp() + day_start) % 86_400)
        gpu, rdma = sampler.window(start, day_start, day_end)
        counts["gpu_samples"] += wh.append("gpu_samples", gpu)
        counts["rdma_samples"] += wh.append("rdma_samples", rdma)
        day_start = day_end
        if on_progress:
            on_progress(day_end)
    wh.compact(now=end, settle_s=0)
    return counts


def generate_whole(root: Path, **options) -> dict[str, int]:
    """`generate` into a new warehouse at `root`, all or nothing.

    The history is written into a hidden staging warehouse inside `root`, whose tables are
    moved into place only when it is complete, with Ctrl-C held off for the moves: an
    interrupted run leaves `root` as it was. A warehouse that has data is refused, since a
    second history would count every GPU hour twice."""
    wh = Warehouse(root)
    tables = [p for p in root.iterdir() if (p / "_delta_log").is_dir()] if root.is_dir() else []
    present = sorted(p.name for p in tables)
    if present:
        raise UserError(
            f"warehouse {root} already has data ({', '.join(present)}); demo data would count "
            "twice: give another --warehouse, or remove that directory first"
        )
    wh.require_writable()
    stage = root / f".demo-data-{uuid.uuid4().hex}"
    try:
        counts = generate(Warehouse(stage), **options)
        with uninterrupted():
            for table_dir in sorted(stage.iterdir()):
                if (table_dir / "_delta_log").is_dir():
                    os.replace(table_dir, root / table_dir.name)
            fsync_path(root)
    finally:
        with uninterrupted():  # a Ctrl-C here would leave the staging warehouse behind
            shutil.rmtree(stage, ignore_errors=True)
    return counts


def check_size(nodes: int, gpus_per_node: int, days: float) -> None:
    """Refuse sizes the generator cannot honour, with the reason, before anything is written."""
    if nodes < 1 or gpus_per_node < 1 or not days > 0:
        raise UserError("--nodes, --gpus-per-node and --days must be positive")
    if gpus_per_node > MAX_GPUS_PER_NODE:
        raise UserError(f"--gpus-per-node must be at most {MAX_GPUS_PER_NODE}")


def _nodes_table(
    names: list[str], gpus_per_node: int, cluster: str, valid_from: datetime
) -> pa.Table:
    return pa.table(
        {
            "node": names,
            "gpus": [gpus_per_node] * len(names),
            "gpu_model": [GPU_MODEL] * len(names),
            "gpu_memory_bytes": [GPU_MEMORY] * len(names),
            "partition": ["gpu"] * len(names),
            "cluster": [cluster] * len(names),
            "valid_from": pa.array([valid_from] * len(names), pa.timestamp("us", tz="UTC")),
            "source": ["synthetic"] * len(names),
        }
    )


def _job_tables(
    jobs: list[SyntheticJob],
    names: list[str],
    gpus_per_node: int,
    start: datetime,
    seconds: float,
    seed: int,
    cluster: str,
) -> tuple[pa.Table, pa.Table]:
    def at(offset: float) -> datetime:
        return start + timedelta(seconds=round(offset))

    job_rows, gpu_rows = [], []
    for job in jobs:
        started = 0 <= job.start < seconds
        ended = started and job.start + job.duration <= seconds
        state = job.state if ended else ("RUNNING" if started else "PENDING")
        job_rows.append(
            {
                "job_id": job.job_id,
                "cluster": cluster,
                "user": job.user,
                "account": job.account,
                "partition": "interactive" if job.interactive else "gpu",
                "name": f"{job.habit}-{job.job_id}",
                "submit_time": at(job.submit),
                "start_time": at(job.start) if started else None,
                "end_time": at(job.start + job.duration) if ended else None,
                "state": state,
                "exit_code": job.exit_code if ended else None,
                "num_nodes": job.num_nodes if started else -(-job.num_gpus // gpus_per_node),
                "gpus_per_node": min(job.num_gpus, gpus_per_node),
                "num_gpus": job.num_gpus,
                "time_limit_s": int(job.time_limit),
                "nodes": [names[n] for n in job.placement] if started else [],
                "interactive": job.interactive,
                "dependencies": json.dumps(job.dependencies, sort_keys=True),
            }
        )
        if not started:
            continue
        for node, indices in job.placement.items():
            for i in indices:
                gpu_rows.append(
                    {
                        "job_id": job.job_id,
                        "cluster": cluster,
                        "node": names[node],
                        "gpu_index": i,
                        "gpu_uuid": gpu_uuid(seed, names[node], i),
                        "start_time": at(job.start),
                        "end_time": at(job.start + job.duration) if ended else None,
                    }
                )
    return pa.Table.from_pylist(job_rows), pa.Table.from_pylist(gpu_rows)


class _Sampler:
    """Turns placed jobs into 15-second GPU and RDMA samples, one window (a day) at a time."""

    def __init__(
        self,
        jobs: list[SyntheticJob],
        names: list[str],
        gpus_per_node: int,
        seed: int,
        rng: np.random.Generator,
        cluster: str,
    ) -> None:
        self.jobs = [j for j in jobs if j.start >= 0]
        self.names = names
        self.gpn = gpus_per_node
        self.rng = rng
        self.cluster = cluster
        self.uuids = [gpu_uuid(seed, n, i) for n in names for i in range(gpus_per_node)]
        total = len(names) * gpus_per_node
        self.energy = np.zeros(total)  # running energy counters, joules
        self.first_window = True  # a GPU's first sample has no energy delta
        self.rdma = np.zeros((len(names), RDMA_PORTS, 2), dtype=np.int64)  # tx, rx, bytes

    def window(self, start: datetime, t0: float, t1: float) -> tuple[pa.Table, pa.Table]:
        steps = np.arange(np.ceil(t0 / SAMPLE_S) * SAMPLE_S, t1, SAMPLE_S)
        n_gpus, n_steps = len(self.names) * self.gpn, len(steps)
        owner = np.full((n_gpus, n_steps), -1, dtype=np.int32)
        for position, job in enumerate(self.jobs):
            if job.start >= t1 or job.start + job.duration <= t0:
                continue
            lo, hi = np.searchsorted(steps, [job.start, job.start + job.duration])
            for node, indices in job.placement.items():
                for i in indices:
                    owner[node * self.gpn + i, lo:hi] = position
        util_mean = np.array([j.mean_util for j in self.jobs] + [0.0], dtype=np.float32)
        sm = np.array([j.sm_factor for j in self.jobs] + [0.0], dtype=np.float32)
        mem = np.array([j.mem_share for j in self.jobs] + [0.0], dtype=np.float32)
        held = owner >= 0
        noise = self.rng.normal(0, UTIL_NOISE, owner.shape).astype(np.float32)
        util = np.where(
            held, np.clip(util_mean[owner] + noise * (util_mean[owner] > 0.01), 0, 1), 0
        )
        power = power_w(util)
        step_j = power.astype(np.float64) * SAMPLE_S
        energy = self.energy[:, None] + np.cumsum(step_j, axis=1)
        self.energy = energy[:, -1].copy()
        if self.first_window and n_steps:
            step_j[:, 0] = np.nan  # written as NULL
            self.first_window = False
        mem_used = np.where(held, mem[owner] * GPU_MEMORY, 0).astype(np.int64)
        job_ids = np.array([j.job_id for j in self.jobs] + [None], dtype=object)
        ts = _timestamps(start, steps)
        gpu = pa.table(
            {
                "ts": pa.array(np.tile(ts, n_gpus), pa.timestamp("us", tz="UTC")),
                "node": np.repeat([n for n in self.names for _ in range(self.gpn)], n_steps),
                "gpu_index": np.repeat(np.tile(np.arange(self.gpn), len(self.names)), n_steps),
                "gpu_uuid": np.repeat(self.uuids, n_steps),
                "util": util.ravel(),
                "sm_active": (util * sm[owner]).ravel(),
                "mem_used_bytes": mem_used.ravel(),
                "mem_total_bytes": np.full(n_gpus * n_steps, GPU_MEMORY, dtype=np.int64),
                "power_w": power.astype(np.float32).ravel(),
                "energy_j": energy.ravel(),
                "energy_delta_j": pa.array(step_j.ravel(), from_pandas=True),
                "temp_c": (30 + 45 * util).astype(np.float32).ravel(),
                "job_id": job_ids[owner].ravel(),
                "cluster": pa.repeat(pa.scalar(self.cluster), n_gpus * n_steps),
            }
        )
        return _sort_by_time(gpu), self._rdma(start, steps, owner, util, job_ids)

    def _rdma(
        self,
        start: datetime,
        steps: np.ndarray,
        owner: np.ndarray,
        util: np.ndarray,
        job_ids: np.ndarray,
    ) -> pa.Table:
        n_nodes, n_steps = len(self.names), len(steps)
        by_node = owner.reshape(n_nodes, self.gpn, n_steps)
        talking = np.array([talks(j.num_nodes, j.mean_util) for j in self.jobs] + [False])
        # The job holding the node's first GPU holds most of it for multi-node jobs (whole nodes).
        node_job = by_node[:, 0, :]
        node_util = util.reshape(n_nodes, self.gpn, n_steps).mean(axis=1)
        rate = np.where(talking[node_job], rdma_bytes_per_s(node_util), 2e4)
        jitter = self.rng.uniform(0.9, 1.1, (n_nodes, RDMA_PORTS, n_steps, 2))
        delta = np.floor(rate[:, None, :, None] / RDMA_PORTS * SAMPLE_S * jitter).astype(np.int64)
        delta -= delta % 4  # counters count 4-byte words
        counters = self.rdma[:, :, None, :] + np.cumsum(delta, axis=2)
        self.rdma = counters[:, :, -1, :].copy()
        ts = _timestamps(start, steps)
        rows = n_nodes * RDMA_PORTS * n_steps
        table = pa.table(
            {
                "ts": pa.array(np.tile(ts, n_nodes * RDMA_PORTS), pa.timestamp("us", tz="UTC")),
                "node": np.repeat(self.names, RDMA_PORTS * n_steps),
                "device": np.tile(
                    np.repeat([f"mlx5_{p}" for p in range(RDMA_PORTS)], n_steps), n_nodes
                ),
                "port": np.ones(rows, dtype=np.int16),
                "tx_bytes": counters[..., 0].ravel(),
                "rx_bytes": counters[..., 1].ravel(),
                "tx_packets": (counters[..., 0] // 4096).ravel(),
                "rx_packets": (counters[..., 1] // 4096).ravel(),
                "tx_delta_bytes": delta[..., 0].ravel(),
                "rx_delta_bytes": delta[..., 1].ravel(),
                "job_id": np.repeat(job_ids[node_job], RDMA_PORTS, axis=0).ravel(),
                "cluster": pa.repeat(pa.scalar(self.cluster), rows),
            }
        )
        return _sort_by_time(table)


def power_w(util: float | np.ndarray) -> float | np.ndarray:
    """Board power at a utilisation, between the H100's idle draw and its limit."""
    return IDLE_POWER_W + (MAX_POWER_W - IDLE_POWER_W) * util**0.9


def talks(num_nodes: int, mean_util: float) -> bool:
    """Multi-node jobs that do work talk over RDMA; idle ones send next to nothing."""
    return num_nodes > 1 and mean_util > 0.01


def rdma_bytes_per_s(node_util: float | np.ndarray) -> float | np.ndarray:
    """A talking job's RDMA traffic on one node, in proportion to its GPUs' activity."""
    return LINK_SHARE * node_util * NODE_LINK_BYTES_S


def _timestamps(start: datetime, steps: np.ndarray) -> np.ndarray:
    base = np.datetime64(start.replace(tzinfo=None), "us")
    return base + (steps * 1_000_000).astype("timedelta64[us]")


def _sort_by_time(table: pa.Table) -> pa.Table:
    return table.sort_by([("ts", "ascending")])
