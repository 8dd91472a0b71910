"""Warehouse ingest speed, side by side with a raw DuckDB Arrow insert of the same rows.

Prints, in one run:
- bulk: rows/s of `Warehouse.append` for ~10 M gpu_samples rows vs `INSERT INTO t SELECT * FROM
  arrow_table` into DuckDB (in memory, and into a file with its checkpoint), with the ratio
  (target: warehouse >= 50% of raw);
- per batch: rows/s of 128-row appends (one scrape of a 16-node cluster) vs one DuckDB insert and
  commit per batch;
- where the bulk time goes (conform, split by day, Parquet encode per compression and row group
  size, fsync+rename), so the writer in files.py can be tuned from numbers.
Each measurement runs in its own process, so its peak RSS is its own.

    .venv/bin/python bench/bench_warehouse_ingest.py [--rows 10000000] [--batches 2000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sing.schema import table
from sing.warehouse import delta, files
from sing.warehouse.store import Warehouse, conform, split_by_day

GPUS_PER_NODE = 8
SCRAPE_S = 15
START = datetime(2026, 1, 5, tzinfo=UTC)


def gpu_samples(rows: int, nodes: int, first_scrape: int = 0) -> pa.Table:
    """Synthetic scrapes of `nodes` x 8 GPUs every 15 s, in scrape order (as they arrive)."""
    gpus = nodes * GPUS_PER_NODE
    rng = np.random.default_rng(first_scrape)
    i = np.arange(rows, dtype=np.int64)
    scrape, gpu = i // gpus + first_scrape, i % gpus
    ts_us = int(START.timestamp() * 1e6) + scrape * SCRAPE_S * 1_000_000
    node_names = pa.array([f"node{n:04d}" for n in range(nodes)])
    uuids = pa.array([f"GPU-{g:08x}-0000-0000-0000-000000000000" for g in range(gpus)])
    jobs = pa.array([f"{1000 + j}" for j in range(gpus)])
    util = rng.random(rows, dtype=np.float32)
    return pa.table(
        {
            "ts": pa.array(ts_us, pa.timestamp("us", tz="UTC")),
            "node": node_names.take(pa.array(gpu // GPUS_PER_NODE)),
            "gpu_index": pa.array((gpu % GPUS_PER_NODE).astype(np.int16)),
            "gpu_uuid": uuids.take(pa.array(gpu)),
            "util": util,
            "sm_active": util * np.float32(0.8),
            "mem_used_bytes": rng.integers(0, 80 << 30, rows),
            "mem_total_bytes": np.full(rows, 80 << 30, dtype=np.int64),
            "power_w": (util * 500 + 60).astype(np.float32),
            "energy_j": (scrape * SCRAPE_S * 300.0).astype(np.float64),
            "temp_c": (util * 40 + 30).astype(np.float32),
            "job_id": jobs.take(pa.array(gpu // 4)),  # 4 GPUs per job
        }
    )


def bulk_table(rows: int) -> pa.Table:
    """~10 M rows = one day of a 217-node (1,736-GPU) cluster at 15 s."""
    return gpu_samples(rows, nodes=max(1, round(rows / (86_400 // SCRAPE_S) / GPUS_PER_NODE)))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---- the measurements, each run in a child process ---------------------------------------------


def phase_warehouse_bulk(rows: int, batches: int, tmp: Path) -> dict:
    data = bulk_table(rows)
    wh = Warehouse(tmp / "wh")
    seconds = timed(lambda: wh.append("gpu_samples", data))
    size = sum(p.stat().st_size for p in (tmp / "wh").rglob("*.parquet"))
    return {"seconds": seconds, "rows": rows, "bytes_on_disk": size}


def phase_duckdb_memory(rows: int, batches: int, tmp: Path) -> dict:
    return _duckdb_bulk(duckdb.connect(), rows, checkpoint=False)


def phase_duckdb_file(rows: int, batches: int, tmp: Path) -> dict:
    return _duckdb_bulk(duckdb.connect(str(tmp / "raw.duckdb")), rows, checkpoint=True)


def _duckdb_bulk(con: duckdb.DuckDBPyConnection, rows: int, checkpoint: bool) -> dict:
    con.register("data", bulk_table(rows))
    con.execute("CREATE TABLE t AS SELECT * FROM data LIMIT 0")

    def insert() -> None:
        con.execute("INSERT INTO t SELECT * FROM data")
        if checkpoint:
            con.execute("CHECKPOINT")

    return {"seconds": timed(insert), "rows": rows}


def scrape_batches(batches: int) -> list[pa.Table]:
    """One 128-row table per scrape of 16 nodes x 8 GPUs."""
    data = gpu_samples(batches * 128, nodes=16)
    return [data.slice(i * 128, 128) for i in range(batches)]


def phase_warehouse_batches(rows: int, batches: int, tmp: Path) -> dict:
    wh = Warehouse(tmp / "wh")
    parts = scrape_batches(batches)
    per_batch = []
    for part in parts:
        per_batch.append(timed(lambda part=part: wh.append("gpu_samples", part)))
    return {"seconds": sum(per_batch), "rows": batches * 128, "p50_ms": _ms(per_batch, 50)} | {
        "p99_ms": _ms(per_batch, 99)
    }


def phase_duckdb_batches(rows: int, batches: int, tmp: Path) -> dict:
    con = duckdb.connect(str(tmp / "raw.duckdb"))
    parts = scrape_batches(batches)
    con.register("part", parts[0])
    con.execute("CREATE TABLE t AS SELECT * FROM part LIMIT 0")

    def insert(part: pa.Table) -> None:
        con.register("part", part)
        con.execute("INSERT INTO t SELECT * FROM part")

    per_batch = [timed(lambda part=part: insert(part)) for part in parts]
    return {"seconds": sum(per_batch), "rows": batches * 128, "p50_ms": _ms(per_batch, 50)} | {
        "p99_ms": _ms(per_batch, 99)
    }


def phase_breakdown(rows: int, batches: int, tmp: Path) -> dict:
    """Where Warehouse.append's time goes, and what Parquet settings would change it."""
    data = bulk_table(rows)
    spec = table("gpu_samples")
    out: dict = {}
    start = time.perf_counter()
    batch = conform(spec, data)
    out["conform_s"] = time.perf_counter() - start
    start = time.perf_counter()
    parts = list(split_by_day(batch, "ts"))
    out["split_by_day_s"] = time.perf_counter() - start
    variants = [
        ("zstd", files.ROW_GROUP_ROWS),
        ("snappy", files.ROW_GROUP_ROWS),
        ("lz4", files.ROW_GROUP_ROWS),
        ("none", files.ROW_GROUP_ROWS),
        ("zstd", 1_048_576),
        ("snappy", 1_048_576),
    ]
    for compression, group in variants:
        paths = [tmp / f"{compression}-{group}-{day}.parquet" for day, _ in parts]

        def write(c: str = compression, g: int = group, ps: list[Path] = paths) -> None:
            for (_, part), path in zip(parts, ps, strict=True):
                pq.write_table(part, path, compression=c, row_group_size=g)

        out[f"pyarrow {compression} rg={group}"] = _write_cost(write, paths)
    # The warehouse's own writer settings, on one thread (append adds a second for big batches).
    paths = [tmp / f"warehouse-{day}.parquet" for day, _ in parts]

    def warehouse_writer() -> None:
        for (_, part), path in zip(parts, paths, strict=True):
            files.write_parquet(part, path)

    out["pyarrow zstd-1, dictionaries on text only (1 thread)"] = _write_cost(
        warehouse_writer, paths
    )
    # DuckDB's Parquet writer encodes row groups on all cores.
    con = duckdb.connect()
    paths = [tmp / f"duckdb-{day}.parquet" for day, _ in parts]

    def copy() -> None:
        for (_, part), path in zip(parts, paths, strict=True):
            con.register("part", part)
            con.execute(
                f"COPY part TO '{path}' (FORMAT parquet, COMPRESSION zstd, "
                f"ROW_GROUP_SIZE {files.ROW_GROUP_ROWS})"
            )

    out[f"duckdb COPY zstd rg={files.ROW_GROUP_ROWS}"] = _write_cost(copy, paths)
    tmp_file = delta.temporary_path(tmp / "commit", None)
    pq.write_table(parts[0][1], tmp_file, compression="zstd", row_group_size=files.ROW_GROUP_ROWS)
    out["fsync_rename_s"] = timed(lambda: delta.publish(tmp / "commit", None, tmp_file, "ts"))
    return out


def _write_cost(write, paths: list[Path]) -> dict:
    seconds = timed(write)
    size = sum(p.stat().st_size for p in paths)
    for p in paths:
        p.unlink()
    return {"s": seconds, "MB": size / 1e6}


def _ms(seconds: list[float], pct: int) -> float:
    return float(np.percentile(seconds, pct) * 1000)


PHASES = {
    "warehouse_bulk": phase_warehouse_bulk,
    "duckdb_memory": phase_duckdb_memory,
    "duckdb_file": phase_duckdb_file,
    "warehouse_batches": phase_warehouse_batches,
    "duckdb_batches": phase_duckdb_batches,
    "breakdown": phase_breakdown,
}


def run_phase(name: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--rows", str(args.rows)]
    cmd += ["--batches", str(args.batches)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"phase {name} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        with tempfile.TemporaryDirectory(prefix="bench-wh-") as tmp:
            result = PHASES[args.phase](args.rows, args.batches, Path(tmp))
        print(json.dumps(result | {"peak_rss_mb": peak_rss_mb()}))
        return

    r = {name: run_phase(name, args) for name in PHASES}

    def rate(name: str) -> float:
        return r[name]["rows"] / r[name]["seconds"]

    print(f"bulk ingest of {args.rows:,} gpu_samples rows (one Arrow table, one UTC day)")
    for name, label in [
        ("warehouse_bulk", "Warehouse.append (zstd-1, 2 writers, fsync+rename)"),
        ("duckdb_memory", "raw DuckDB INSERT ... SELECT * FROM arrow (in memory)"),
        ("duckdb_file", "raw DuckDB INSERT into a file + CHECKPOINT"),
    ]:
        print(
            f"  {label:55s} {rate(name) / 1e6:6.2f} M rows/s  "
            f"{r[name]['seconds']:6.2f} s  peak RSS {r[name]['peak_rss_mb']:6.0f} MB"
        )
    print(f"  on disk: {r['warehouse_bulk']['bytes_on_disk'] / 1e6:.0f} MB of Parquet")
    for name in ("duckdb_memory", "duckdb_file"):
        ratio = rate("warehouse_bulk") / rate(name)
        verdict = "meets" if ratio >= 0.5 else "MISSES"
        print(f"  ratio warehouse / {name}: {ratio:.0%} ({verdict} the >= 50% target)")

    print(f"per-batch ingest: {args.batches} batches of 128 rows (one scrape of 16 nodes x 8 GPUs)")
    for name, label in [
        ("warehouse_batches", "Warehouse.append per batch"),
        ("duckdb_batches", "raw DuckDB insert+commit per batch (file)"),
    ]:
        print(
            f"  {label:55s} {rate(name) / 1e3:6.1f} k rows/s  p50 {r[name]['p50_ms']:.2f} ms  "
            f"p99 {r[name]['p99_ms']:.2f} ms  peak RSS {r[name]['peak_rss_mb']:.0f} MB"
        )

    b = r["breakdown"]
    print("where Warehouse.append's bulk time goes")
    print(f"  conform (cast, fill nulls)  {b['conform_s']:.2f} s")
    print(f"  split_by_day                {b['split_by_day_s']:.2f} s")
    for key, value in b.items():
        if isinstance(value, dict):
            print(f"  write {key:32s}  {value['s']:5.2f} s  {value['MB']:4.0f} MB")
    print(f"  fsync + rename (one file)   {b['fsync_rename_s'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
