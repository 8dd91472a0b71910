"""Latency and peak memory of one policy round over 10,000 running jobs on a year-old warehouse.

Target (issue 16): a round (every rule evaluated, every ladder's step decided and recorded, dry
run) under 2 s, peak memory under 1 GB.

The warehouse, made once and cached in /tmp/sing-bench-policy (30 min on the shared 2-core dev
box under load; then a default run takes about 3 min, --quick under 1 min):
- 365 days of history from sing.demo.synthetic on a small cluster (2 nodes x 8 GPUs: jobs,
  samples, the closed days' rollups). A round opens only the `jobs` table, the sample days of
  its windows and the trail, so the history's size shows in the files the round must list,
  not in rows it reads.
- a year of audit trail (~60 events a day), and the dry-run ladders of the running jobs:
  notified, warned with a deadline still ahead, warned with one passed (cancel due).
- RUNNING jobs on a large cluster (8-GPU nodes), started up to 4 h before "now", 1 to 16 GPUs
  (1 to 2 nodes), sampled every 30 s since they started: most busy, some idle, some with idle
  GPUs, some barely using them, some that never touched a GPU (no RDMA samples: the
  multi-node rule judges idle nodes only). Written in hourly batches, as a collector's rounds
  land before maintenance merges them.

Each round runs on a hard-linked copy of the cache (a round appends to the trail), in its own
child process: "cold" is the first round of a fresh process (imports done, DuckDB and the page
cache as the machine left them), "warm" the median of the next rounds, each on a fresh copy.
Peak RSS is the child's own (VmHWM). The rules are the four kinds with their whole ladders.
The executor is a stand-in answering `running()` with the running jobs, as squeue would (there
is no Slurm with 10,000 jobs here); a dry run cancels nothing.

    .venv/bin/python bench/bench_policy.py            # 365 days, 10,000 running jobs
    .venv/bin/python bench/bench_policy.py --quick    # 30 days, 1,000 jobs: a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sing.executors.records import JobRecord  # noqa: E402
from sing.policy.engine import Engine  # noqa: E402
from sing.policy.settings import PolicySettings  # noqa: E402
from sing.warehouse import synthetic  # noqa: E402
from sing.warehouse.audit import Event, record  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

NOW = datetime(2026, 1, 10, 6, 0, tzinfo=UTC)  # every round's "now": the data's end
CLUSTER = "campus"
HISTORY_NODES = 2
GPUS_PER_NODE = 8
SAMPLE_S = 30
MAX_AGE_H = 4.0  # the oldest running job started this long before NOW
WARM_RUNS = 3
TARGET_S, TARGET_MIB = 2.0, 1024
SEED = 0


@dataclass(frozen=True)
class Scale:
    days: int
    running: int
    cache: Path


FULL = Scale(365, 10_000, Path("/tmp/sing-bench-policy"))
QUICK = Scale(30, 1_000, Path("/tmp/sing-bench-policy-quick"))

# The site's policy: every kind of rule, each with its whole ladder (the bench is a dry run).
SETTINGS = PolicySettings(
    dry_run=True,
    max_data_age_s=600,
    rules={
        "idle-gpus": {"kind": "idle_gpus", "actions": ["notify", "warn", "cancel"]},
        "idle-since-start": {
            "kind": "idle_gpus",
            "window": "since_start",
            "minutes": 30,
            "idle_gpu_share": 0.5,
            "actions": ["notify"],
        },
        "multinode": {"kind": "multinode_idle", "actions": ["notify", "warn"]},
        "untouched": {"kind": "untouched_gpus", "minutes": 30, "actions": ["notify"]},
        "under-request": {"kind": "under_request", "min_run_hours": 2, "actions": ["notify"]},
    },
)

# How running jobs use their GPUs: (share of jobs, mean utilisation of busy GPUs, share idle).
BEHAVIOURS = {
    "busy": (0.70, 0.65, 0.0),
    "idle": (0.12, 0.0, 1.0),
    "half_idle": (0.10, 0.5, 0.5),
    "light": (0.08, 0.08, 0.0),
}
SIZES = {1: 0.45, 2: 0.2, 4: 0.15, 8: 0.12, 16: 0.08}  # GPUs per job -> share of jobs


# ---- the warehouse -------------------------------------------------------------------------


def ensure_warehouse(scale: Scale) -> dict:
    """The cached warehouse; rebuilt when missing, half-written, or made by another version of
    the code that makes it (the marker records a hash of the generator and the builders)."""
    marker = scale.cache / ".bench-complete"
    builders = (running_jobs, write_samples, trail)
    sources = Path(synthetic.__file__).read_text() + "".join(map(inspect.getsource, builders))
    version = hashlib.sha256(sources.encode()).hexdigest()[:12]
    if marker.exists():
        made = json.loads(marker.read_text())
        if made.get("version") == version:
            return made
    shutil.rmtree(scale.cache, ignore_errors=True)
    started = time.perf_counter()
    wh = Warehouse(scale.cache)
    made: dict = synthetic.generate(
        wh, nodes=HISTORY_NODES, gpus_per_node=GPUS_PER_NODE, days=scale.days, seed=SEED,
        end=NOW - timedelta(hours=MAX_AGE_H), cluster=CLUSTER,
    )  # fmt: skip
    rng = np.random.default_rng(SEED)
    jobs = running_jobs(rng, scale.running)
    wh.append("jobs", jobs)
    made["running_jobs"] = jobs.num_rows
    made["running_gpu_samples"] = write_samples(wh, rng, jobs)
    made["policy_events"] = record(wh, trail(rng, scale.days, jobs))
    made.update(build_s=round(time.perf_counter() - started), version=version)
    (scale.cache / ".bench-complete").write_text(json.dumps(made))
    return made


def running_jobs(rng: np.random.Generator, count: int) -> pa.Table:
    """`count` running jobs packed onto 8-GPU nodes, with their behaviour in `name`."""
    sizes = rng.choice(list(SIZES), size=count, p=list(SIZES.values()))
    kinds = rng.choice(list(BEHAVIOURS), size=count, p=[b[0] for b in BEHAVIOURS.values()])
    ages_s = rng.integers(600, int(MAX_AGE_H * 3600), count).tolist()  # whole seconds, as Slurm
    rows, node = [], 0
    for i, (gpus, kind) in enumerate(zip(sizes.tolist(), kinds.tolist(), strict=True)):
        n_nodes = max(1, gpus // GPUS_PER_NODE)
        nodes = [f"r{node + k:05d}" for k in range(n_nodes)]
        node += n_nodes  # one job per node: simple, and the most nodes a round can meet
        start = NOW - timedelta(seconds=ages_s[i])
        rows.append({
            "job_id": str(1_000_000 + i), "cluster": CLUSTER, "user": f"u{i % 700:03d}",
            "account": f"lab{i % 60:02d}", "partition": "gpu", "name": f"{kind}-{i}",
            "submit_time": start - timedelta(minutes=5), "start_time": start,
            "state": "RUNNING", "num_nodes": n_nodes, "gpus_per_node": gpus // n_nodes,
            "num_gpus": gpus, "time_limit_s": 86_400, "nodes": nodes, "interactive": False,
        })  # fmt: skip
    return pa.Table.from_pylist(rows)


def gpu_samples(
    rng: np.random.Generator, gpus: list[tuple], t0: datetime, t1: datetime, sample_s: float
) -> pa.Table:
    """The samples in [t0, t1) of GPUs (job_id, node, index, start, end, util), one every
    `sample_s` on the clock's grid while the job runs, util with noise where it is busy."""
    columns: dict[str, list] = {k: [] for k in ("ts", "job_id", "node", "gpu_index", "util")}
    for job_id, node, index, start, end, util in gpus:
        lo, hi = max(t0, start).timestamp(), min(t1, end).timestamp()
        ts = np.arange(np.ceil(lo / sample_s) * sample_s, hi, sample_s)
        columns["ts"].append(ts)
        columns["job_id"].append(np.full(len(ts), job_id, dtype=object))
        columns["node"].append(np.full(len(ts), node, dtype=object))
        columns["gpu_index"].append(np.full(len(ts), index, dtype=np.int16))
        noise = rng.normal(0, 0.05, len(ts)) if util else np.zeros(len(ts))
        columns["util"].append(np.clip(util + noise, 0, 1).astype(np.float32))
    data = {k: np.concatenate(v) for k, v in columns.items()}
    return pa.table({
        "ts": pa.array((data["ts"] * 1e6).astype("int64"), pa.timestamp("us", "UTC")),
        "node": data["node"], "gpu_index": data["gpu_index"], "util": data["util"],
        "job_id": data["job_id"], "cluster": np.full(len(data["ts"]), CLUSTER, dtype=object),
    })  # fmt: skip


def write_samples(wh: Warehouse, rng: np.random.Generator, jobs: pa.Table) -> int:
    """Every running job's GPU samples since it started, one append per hour of them."""
    per_gpu = []  # (job_id, node, index, start, busy util or 0)
    for job in jobs.to_pylist():
        _, mean, idle_share = BEHAVIOURS[job["name"].split("-")[0]]
        gpus = job["num_gpus"]
        idle = set(rng.choice(gpus, size=round(gpus * idle_share), replace=False).tolist())
        for g in range(gpus):
            node = job["nodes"][g // job["gpus_per_node"]]
            util = 0.0 if g in idle else mean
            per_gpu.append(
                (job["job_id"], node, g % job["gpus_per_node"], job["start_time"], NOW, util)
            )
    first = NOW - timedelta(hours=MAX_AGE_H)
    total = 0
    for hour in range(int(MAX_AGE_H)):
        t0, t1 = first + timedelta(hours=hour), first + timedelta(hours=hour + 1)
        batch = gpu_samples(rng, per_gpu, t0, t1, SAMPLE_S)
        util = batch["util"].to_numpy()
        batch = (
            batch.append_column("sm_active", pa.array(util * 0.8))
            .append_column("mem_total_bytes", pa.array(np.full(len(util), 80 * 2**30)))
            .append_column("power_w", pa.array((60 + 300 * util).astype(np.float32)))
        )
        total += wh.append("gpu_samples", batch)
    return total


def trail(rng: np.random.Generator, days: int, jobs: pa.Table) -> list[Event]:
    """A year of finished ladders (~60 events a day), and the running jobs' open ones."""
    events = []
    actor = "sing policy run@bench"
    for day in range(days, 0, -1):
        for k in range(20):  # notify, warn, left alone: 20 ladders a day
            ts = NOW - timedelta(days=day, minutes=k * 37)
            job = {"job_id": f"h{day}-{k}", "user": f"u{k:03d}", "account": f"lab{k % 60:02d}"}
            for offset_h, event, outcome in ((0, "message", "notify"), (1, "message", "warn"),
                                              (1.5, "action", "left_alone")):  # fmt: skip
                events.append(Event(ts=ts + timedelta(hours=offset_h), cluster=CLUSTER,
                                    event=event, outcome=outcome, actor=actor, dry_run=True,
                                    rule="idle-gpus", **job))  # fmt: skip
    # Open ladders of the running idle jobs: notified, warned (deadline ahead), cancel due.
    for job in jobs.to_pylist():
        if not job["name"].startswith("idle") or job["start_time"] > NOW - timedelta(hours=2):
            continue
        fields = {"cluster": CLUSTER, "actor": actor, "dry_run": True, "rule": "idle-gpus",
                  "job_id": job["job_id"], "user": job["user"], "account": job["account"],
                  "detail": {"start_time": job["start_time"].isoformat()}}  # fmt: skip
        notified = job["start_time"] + timedelta(hours=1)
        events.append(Event(ts=notified, event="evaluation", outcome="violating", **fields))
        events.append(Event(ts=notified, event="message", outcome="notify", **fields))
        if rng.random() < 0.6:
            warned = notified + timedelta(minutes=30)
            deadline = warned + timedelta(minutes=int(rng.choice([30, 90])))
            events.append(Event(ts=warned, event="message", outcome="warn", deadline=deadline,
                                **fields))  # fmt: skip
    return events


# ---- the rounds ----------------------------------------------------------------------------


class RunningJobs:
    """The executor's view of the running jobs (squeue's, on a real cluster)."""

    cluster = CLUSTER

    def __init__(self, wh: Warehouse) -> None:
        con = wh.connect({"jobs": None})
        rows = con.sql("FROM jobs WHERE end_time IS NULL AND start_time IS NOT NULL").pl()
        con.close()
        self.records = [
            JobRecord(job_id=r["job_id"], cluster=CLUSTER, state="RUNNING", user=r["user"],
                      start_time=r["start_time"], nodes=tuple(r["nodes"] or ()),
                      num_gpus=r["num_gpus"] or 0)
            for r in rows.iter_rows(named=True)
        ]  # fmt: skip

    def running(self) -> list[JobRecord]:
        return self.records

    def cancel(self, job_id: str) -> None:
        raise AssertionError("a dry run cancels nothing")


class NoChannels:
    def send(self, message: object) -> list:
        return []


def one_round(cache: Path) -> tuple[float, float, dict[str, int]]:
    """One `Engine.run` on a fresh hard-linked copy of the cache: wall and CPU seconds (all
    threads; on a shared machine the wall time also holds others' work), the steps taken."""
    with tempfile.TemporaryDirectory(prefix="sing-bench-policy-") as tmp:
        copy = Path(tmp) / "wh"
        shutil.copytree(cache, copy, copy_function=os.link)
        wh = Warehouse(copy)
        executor = RunningJobs(wh)
        started, cpu = time.perf_counter(), time.process_time()
        engine = Engine(SETTINGS, wh, executor, NoChannels(), "bench", sample_interval_s=SAMPLE_S)
        result = engine.run(NOW)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    actions: dict[str, int] = {}
    for d in result.decisions:
        actions[d.action] = actions.get(d.action, 0) + 1
    return (
        elapsed,
        cpu,
        actions | {"events": len(result.events), "decisions": len(result.decisions)},
    )


def measure(cache: Path) -> dict:
    """In a child process: one cold round, then WARM_RUNS warm ones."""
    rounds = [one_round(cache) for _ in range(1 + WARM_RUNS)]
    return {
        "cold_s": rounds[0][0],
        "warm_s": statistics.median(r[0] for r in rounds[1:]),
        "cold_cpu_s": rounds[0][1],
        "warm_cpu_s": statistics.median(r[1] for r in rounds[1:]),
        "rss_mib": peak_rss_mib(),
        "actions": rounds[-1][2],
    }


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM); not ru_maxrss, which Linux carries across fork."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 days, 1,000 running jobs")
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    made = ensure_warehouse(scale)
    print(f"warehouse {scale.cache}: {scale.days} days of history, {made}")
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(scale.cache)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    r = json.loads(child.stdout)
    print(f"rules: {', '.join(SETTINGS.rules)}; dry run; now = {NOW:%Y-%m-%d %H:%M} UTC")
    # The wall times hold whatever else the machine ran; the load says how much that was.
    print(f"load average after the rounds: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"one round decided: {r['actions']}\n")
    print(f"{'measure':<32} {'figure':>10} {'target':>10}  verdict")
    rows = [
        ("round, cold (s)", r["cold_s"], TARGET_S),
        ("  its CPU time, all threads (s)", r["cold_cpu_s"], None),
        (f"round, warm (s, median of {WARM_RUNS})", r["warm_s"], TARGET_S),
        ("  its CPU time, all threads (s)", r["warm_cpu_s"], None),
        ("peak RSS (MiB)", r["rss_mib"], TARGET_MIB),
    ]
    for name, figure, target in rows:
        if target is None:  # CPU time: what the round costs whatever else the machine runs
            print(f"{name:<32} {figure:10.2f} {'':>10}")
            continue
        verdict = "ok" if figure < target else "MISSED"
        print(f"{name:<32} {figure:10.2f} {target:10.0f}  {verdict} ({figure / target:.0%})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(Path(sys.argv[2]))))
    else:
        sys.exit(main())
