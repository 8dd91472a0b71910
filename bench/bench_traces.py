"""Trace export and import rates for 1M synthetic jobs (target: export with anonymization < 10 s).

Builds a warehouse of N jobs (2,000 users, 60 groups, 400 nodes, one job in ten on 2-4 whole
nodes; one GPU sample and one RDMA sample per node of each job so the telemetry joins, node lists
and medians do real work; closed days compacted into rollups as a running site's collector does),
then times side by side in one run:
export with the default policy (Parquet + CSV, with the privacy report every export carries),
with the precise policy (sing 1.0's: every job kept and written, the most rows), the default
export's parts (building the anonymized release in memory, the same with its privacy report,
writing its files), export Parquet only, validation, and importing
the same number of jobs from a Helios-format CSV.

Each step prints wall time and CPU time (all threads of this process); the machine may be shared,
so the load average is printed beside them: on a busy machine wall time is mostly waiting, and
CPU time is the figure that compares across runs.

    .venv/bin/python bench/bench_traces.py [--jobs 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from sing.traces.export import build_release, export_trace
from sing.traces.importers import import_trace
from sing.traces.linkage import public_view
from sing.traces.package import write_trace
from sing.traces.settings import TraceSettings
from sing.traces.validate import validate
from sing.warehouse.store import Warehouse

T0 = datetime(2025, 1, 1, tzinfo=UTC)
DAYS = 60
TARGET_S = 10.0


def _utc(micros: np.ndarray) -> pl.Series:
    return pl.Series(micros).cast(pl.Datetime("us", "UTC"))


def synthetic_jobs(n: int, rng: np.random.Generator) -> pl.DataFrame:
    origin = int(T0.timestamp()) * 1_000_000
    submit = origin + np.sort(rng.integers(0, DAYS * 86_400, n)) * 1_000_000
    queue = rng.exponential(600, n).astype(np.int64) * 1_000_000
    run = (rng.lognormal(7, 1.5, n).astype(np.int64) + 1) * 1_000_000
    users = rng.integers(0, 2000, n)
    span = np.where(rng.random(n) < 0.1, rng.integers(2, 5, n), 1)  # nodes per job
    gpus = np.where(span > 1, 8, rng.choice([1, 2, 4, 8], n, p=[0.6, 0.15, 0.15, 0.1]))
    node = rng.integers(0, 400, n)
    deps = [json.dumps({"torch": f"2.{i}", "python": "3.11"}) for i in range(5)]
    return pl.DataFrame(
        {
            "job_id": np.arange(n).astype(str),
            "cluster": "bench",
            "user": [f"user{u:04d}" for u in users],
            "account": [f"lab{u % 60:02d}" for u in users],
            "partition": "gpu",
            "name": "job",
            "submit_time": _utc(submit),
            "start_time": _utc(submit + queue),
            "end_time": _utc(submit + queue + run),
            "state": "COMPLETED",
            "exit_code": 0,
            "num_nodes": span,
            "gpus_per_node": gpus,
            "num_gpus": gpus * span,
            "nodes": [
                [f"node{(x + i) % 400:03d}" for i in range(k)]
                for x, k in zip(node, span, strict=True)
            ],
            "dependencies": [deps[i % 5] for i in range(n)],
        }
    )


def build_warehouse(root: Path, n: int) -> Warehouse:
    rng = np.random.default_rng(7)
    wh = Warehouse(root)
    jobs = synthetic_jobs(n, rng)
    wh.append(
        "nodes",
        pl.DataFrame(
            {
                "node": [f"node{x:03d}" for x in range(400)],
                "gpus": 8,
                "gpu_model": "H100",
                "cluster": "bench",
                "valid_from": T0,
            }
        ),
    )
    wh.append("jobs", jobs)
    samples = jobs.explode("nodes").select(
        ts=pl.col("start_time"),
        node=pl.col("nodes"),
        gpu_index=pl.lit(0),
        util=pl.lit(0.5),
        sm_active=pl.lit(0.3),
        mem_used_bytes=pl.lit(10**9),
        energy_j=pl.lit(100.0),
        power_w=pl.lit(250.0),
        job_id=pl.col("job_id"),
    )
    wh.append("gpu_samples", samples)
    wh.append(
        "rdma_samples",
        samples.select(
            "ts",
            "node",
            "job_id",
            device=pl.lit("mlx5_0"),
            port=pl.lit(1),
            tx_delta_bytes=pl.lit(10**6),
            rx_delta_bytes=pl.lit(10**6),
        ),
    )
    # A running site's collector compacts closed days into stored rollups; do it now (this is the
    # only writer and it has finished, so nothing needs to settle).
    rolled = wh.compact(settle_s=0).rollup_days
    assert rolled, "no closed day was rolled up"
    return wh


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def timed(label: str, n: int, fn) -> tuple[float, float]:
    """Run fn once; print and return its wall and CPU seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"{label:<52} {seconds:6.2f} s wall {cpu:6.2f} s CPU {n / seconds:10,.0f} jobs/s"
        f"   ({load()})"
    )
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    n = parser.parse_args().jobs
    key = bytes(32)
    print(f"{os.cpu_count()} CPUs, {load()} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        wh = build_warehouse(tmp / "wh", n)
        print(f"{n:,} synthetic jobs in a warehouse: built in {time.perf_counter() - start:.1f} s")
        until = datetime(2025, 3, 2, tzinfo=UTC)
        wall, cpu = timed(
            "export, anonymized, Parquet + CSV",
            n,
            lambda: export_trace(wh, T0, until, tmp / "full", key=key, settings=TraceSettings()),
        )
        timed(
            "export, precise policy (every job written), Parquet + CSV",
            n,
            lambda: export_trace(
                wh, T0, until, tmp / "precise", key=key, settings=TraceSettings.precise()
            ),
        )
        release = []
        timed(
            "  of which: select, summarise, anonymize (memory)",
            n,
            lambda: release.append(build_release(wh, T0, until, key)),
        )
        public = public_view(wh, T0, until)
        timed(
            "  of which: the same with its privacy report (attacks on <= 10,000 jobs)",
            n,
            lambda: build_release(wh, T0, until, key, public=public),
        )
        timed(
            "  of which: write Parquet + CSV + metadata",
            n,
            lambda: write_trace(tmp / "again", release[0].jobs, release[0].info),
        )
        timed(
            "export, anonymized, Parquet only",
            n,
            lambda: export_trace(
                wh, T0, until, tmp / "pq", key=key, settings=TraceSettings(write_csv=False)
            ),
        )
        timed(
            "validate (hashes, types, CSV = Parquet, aggregates)",
            n,
            lambda: validate(tmp / "precise"),
        )
        helios = tmp / "cluster_log.csv"
        jobs = synthetic_jobs(n, np.random.default_rng(8))
        fmt = "%Y-%m-%d %H:%M:%S"
        jobs.select(
            "job_id",
            "user",
            vc=pl.col("account"),
            jobname=pl.col("name"),
            gpu_num=pl.col("num_gpus"),
            cpu_num=pl.col("num_gpus") * 4,
            node_num="num_nodes",
            state="state",
            submit_time=pl.col("submit_time")
            .dt.convert_time_zone("Asia/Shanghai")
            .dt.strftime(fmt),
            start_time=pl.col("start_time").dt.convert_time_zone("Asia/Shanghai").dt.strftime(fmt),
            end_time=pl.col("end_time").dt.convert_time_zone("Asia/Shanghai").dt.strftime(fmt),
        ).write_csv(helios)
        timed(
            "import Helios cluster_log.csv",
            n,
            lambda: import_trace("helios", helios, tmp / "helios"),
        )
        print(
            f"export target: {n:,} jobs anonymized (Parquet + CSV) in < {TARGET_S:.0f} s -> "
            f"wall {wall:.2f} s = {wall / TARGET_S:.2f} x target "
            f"({'meets' if wall < TARGET_S else 'MISSES'}), "
            f"CPU {cpu:.2f} s = {cpu / TARGET_S:.2f} x target "
            f"({'meets' if cpu < TARGET_S else 'MISSES'}); {load()} at the end"
        )


if __name__ == "__main__":
    main()
