"""Wall and CPU time of `sing policy replay` over a month of a 16-node x 8-GPU cluster.

Target (issue 27, item 6): a month of a 128-GPU cluster replayed in under a minute.

The warehouse, made once and cached in /tmp/sing-bench-policy-replay: about 1,500 jobs packed
onto the nodes' GPUs (each node split into lanes of 1, 2, 4 or 8 GPUs, one job after another
in each lane, with short gaps), behaving as bench_policy's running jobs do (mostly busy, some
idle, some half idle, some light), sampled every 60 s, written one day per append as the
collector's rounds land. The jobs that outlast the month have no recorded end. The rules are
bench_policy's (every kind, whole ladders); the replay steps at `[policy] interval_s` = 300 s.

    .venv/bin/python bench/bench_policy_replay.py            # 30 days
    .venv/bin/python bench/bench_policy_replay.py --days 7   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_policy import (  # noqa: E402
    BEHAVIOURS,
    CLUSTER,
    GPUS_PER_NODE,
    NOW,
    SEED,
    SETTINGS,
    gpu_samples,
)
from sing.policy.replay import replay, totals  # noqa: E402
from sing.policy.rules import load_rules  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

NODES = 16
SAMPLE_S = 60
JOBS = 1_500
TARGET_S = 60.0
LANES = ([8], [4, 4], [4, 2, 2], [2, 2, 2, 2], [4, 2, 1, 1], [2, 2, 2, 1, 1])  # GPUs per lane


def ensure_warehouse(days: int) -> Path:
    """The cached warehouse of `days` ending at bench_policy's NOW (rebuilt when half-made)."""
    cache = Path(f"/tmp/sing-bench-policy-replay-{days}d")
    marker = cache / ".bench-complete"
    if marker.exists():
        return cache
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    wh = Warehouse(cache)
    rng = np.random.default_rng(SEED)
    jobs, gpus = draw_jobs(rng, days)
    wh.append("jobs", pa.Table.from_pylist(jobs))
    samples = write_samples(wh, rng, days, gpus)
    made = {"jobs": len(jobs), "gpu_samples": samples, "build_s": time.perf_counter() - started}
    marker.write_text(json.dumps(made))
    print(f"built {cache}: {made}")
    return cache


def draw_jobs(rng: np.random.Generator, days: int) -> tuple[list[dict], list[tuple]]:
    """Jobs one after another in each lane; returns their records and their GPUs as
    (job id, node, index, start, end, util)."""
    lanes = [
        (f"g{n:03d}", offset, size)
        for n in range(NODES)
        for offset, size in _offsets(LANES[rng.integers(len(LANES))])
    ]
    first = NOW - timedelta(days=days)
    mean_s = days * 86_400 * len(lanes) / JOBS
    kinds = list(BEHAVIOURS)
    shares = [b[0] for b in BEHAVIOURS.values()]
    jobs, gpus = [], []
    for node, offset, size in lanes:
        t = first - timedelta(seconds=float(rng.uniform(0, mean_s)))  # some began before
        while t < NOW:
            run_s = float(rng.exponential(mean_s * 0.9)) + 600
            start, end = t, t + timedelta(seconds=round(run_s))
            kind = kinds[rng.choice(len(kinds), p=shares)]
            i = len(jobs)
            jobs.append({
                "job_id": str(2_000_000 + i), "cluster": CLUSTER, "user": f"u{i % 300:03d}",
                "account": f"lab{i % 40:02d}", "partition": "gpu", "name": f"{kind}-{i}",
                "submit_time": start - timedelta(minutes=5), "start_time": start,
                "end_time": end if end <= NOW else None,
                "state": "COMPLETED" if end <= NOW else "RUNNING", "num_nodes": 1,
                "gpus_per_node": size, "num_gpus": size, "time_limit_s": 7 * 86_400,
                "nodes": [node], "interactive": False,
            })  # fmt: skip
            _, mean, idle_share = BEHAVIOURS[kind]
            idle = set(rng.choice(size, size=round(size * idle_share), replace=False).tolist())
            for g in range(size):
                util = 0.0 if g in idle else mean
                gpus.append((jobs[-1]["job_id"], node, offset + g, start, min(end, NOW), util))
            t = end + timedelta(seconds=float(rng.uniform(60, 3600)))
    return jobs, gpus


def _offsets(sizes: list[int]) -> list[tuple[int, int]]:
    offsets, at = [], 0
    for size in sizes:
        offsets.append((at, size))
        at += size
    assert at == GPUS_PER_NODE
    return offsets


def write_samples(wh: Warehouse, rng: np.random.Generator, days: int, gpus: list[tuple]) -> int:
    """Every GPU's samples while its job runs, one append per day."""
    first = NOW - timedelta(days=days)
    total = 0
    for day in range(days):
        t0, t1 = first + timedelta(days=day), first + timedelta(days=day + 1)
        batch = gpu_samples(rng, gpus, t0, t1, SAMPLE_S)
        total += wh.append("gpu_samples", batch)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30, help="history replayed (default 30)")
    args = parser.parse_args()
    cache = ensure_warehouse(args.days)
    rules = load_rules(SETTINGS)
    since = NOW - timedelta(days=args.days)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    result = replay(Warehouse(cache), SETTINGS, rules, since, NOW, SAMPLE_S)
    wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    print(json.dumps(totals(result), default=str))
    print(
        f"replay of {args.days} days, {len(rules)} rules, {result.steps} rounds: "
        f"wall {wall:.1f} s, CPU {cpu:.1f} s; {wall / TARGET_S:.2f} x the {TARGET_S:g} s target"
    )
    return 0


def _cpu_s() -> float:
    """This process's CPU seconds, DuckDB's threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
