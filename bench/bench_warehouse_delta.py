"""The Delta Lake warehouse side by side with the old file format, on the same machine and run.

Pass a checkout of the commit before the change (`git worktree add /tmp/wt-base ca43e4b`); every
measurement runs in its own child process with that checkout or this one first on the path:

- appends: into a table that already holds a year of closed days (one file each), 128-row
  batches (one scrape of 16 nodes x 8 GPUs) 15 s of data apart, with the collector's
  `checkpoint_due()` after each and maintenance (`compact()`) after every 20 (its 300 s
  interval); p50/p99/max of the appends alone, and the mean maintenance time; with `--load`,
  the same while one process per core spins and another writes and fsyncs 32 MB files in a
  loop (a busy head node);
- long writer: one process making 3,000 appends (100 a simulated day for 30 days), as the
  collector does for weeks; CPU per append on the last day;
- bulk: one append of ROWS gpu_samples rows (one day);
- log: a simulated year of commits (COMMITS a day, `checkpoint_due()` after each, maintenance
  every 20), each day stamped as that many days ago; the log's files and bytes over the year.
  It understates the log by the tombstones of the last real hour (12 compactions of at most 16
  files);
- history: a synthetic warehouse of DAYS days (`sing.demo.synthetic`, 2 nodes x 8 GPUs),
  compacted, then snapshot open (`Warehouse(root).connect()`) and the job and cluster reports
  over all of it, medians of 5 warm runs.

    .venv/bin/python bench/bench_warehouse_delta.py --old /tmp/wt-base [--days 90 365]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

NEW = Path(__file__).resolve().parents[1]
END = datetime(2026, 1, 10, tzinfo=UTC)


def phase_appends(batches: int) -> dict:
    import pyarrow as pa

    from sing.warehouse.store import Warehouse

    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    nodes = [f"n{i // 8:02d}" for i in range(128)]
    gpus = pa.array([i % 8 for i in range(128)], pa.int16())
    appends, maintenance = [], []
    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse(tmp)
        year = [start - timedelta(days=d) for d in range(365, 0, -1)]
        old = {"ts": pa.array(year, pa.timestamp("us", tz="UTC")), "node": ["n00"] * len(year)}
        wh.append("gpu_samples", pa.table(old))
        wh.compact(now=start, settle_s=0)
        for k in range(batches):
            ts = start + timedelta(seconds=15 * k)
            batch = pa.table(
                {
                    "ts": pa.array([ts] * 128, pa.timestamp("us", tz="UTC")),
                    "node": nodes,
                    "gpu_index": gpus,
                    "util": pa.array(np.random.default_rng(k).random(128), pa.float32()),
                    "job_id": [f"j{i // 16}" for i in range(128)],
                }
            )
            t0 = time.perf_counter()
            wh.append("gpu_samples", batch)
            appends.append(time.perf_counter() - t0)
            if hasattr(wh, "checkpoint_due"):  # as the collector does after each round
                wh.checkpoint_due()
            if k % 20 == 19:
                t0 = time.perf_counter()
                wh.compact(now=ts, settle_s=0)
                maintenance.append(time.perf_counter() - t0)
    ms = np.array(appends) * 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "maintenance_ms": statistics.mean(maintenance) * 1000,
    }


def phase_long_writer(days: int, per_day: int) -> dict:
    """One writer process over many commits, as the collector runs for weeks: `per_day` 128-row
    appends a day for `days` days, `checkpoint_due()` after each, `compact()` every 20; the
    CPU time of the last day's appends."""
    import pyarrow as pa

    from sing.warehouse.store import Warehouse

    nodes = [f"n{i // 8:02d}" for i in range(128)]
    cpu = []
    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse(tmp)
        for k in range(days * per_day):
            ts = END + timedelta(seconds=86_400 * k // per_day)
            rows = {"ts": pa.array([ts] * 128, pa.timestamp("us", tz="UTC")), "node": nodes}
            t0 = time.process_time()
            wh.append("gpu_samples", pa.table(rows))
            cpu.append(time.process_time() - t0)
            if hasattr(wh, "checkpoint_due"):
                wh.checkpoint_due()
            if k % 20 == 19:
                wh.compact(now=ts, settle_s=0)
    last = np.array(cpu[-per_day:]) * 1000
    return {
        "cpu_p50_ms": float(np.percentile(last, 50)),
        "cpu_p99_ms": float(np.percentile(last, 99)),
    }


def busy_machine() -> list[subprocess.Popen]:
    """One spinning process per core and one that writes and fsyncs 32 MB files in a loop."""
    spin = "while True: pass"
    write = (
        "import os, tempfile\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    while True:\n"
        "        with open(os.path.join(d, 'f'), 'wb') as f:\n"
        "            f.write(os.urandom(32 << 20)); f.flush(); os.fsync(f.fileno())\n"
    )
    programs = [spin] * (os.cpu_count() or 1) + [write]
    return [subprocess.Popen([sys.executable, "-c", p]) for p in programs]


def phase_bulk(rows: int) -> dict:
    import pyarrow as pa

    from sing.warehouse.store import Warehouse

    rng = np.random.default_rng(0)
    start = int(END.timestamp() * 1_000_000)
    data = pa.table(
        {
            "ts": pa.array(start + np.sort(rng.integers(0, 86_399_000_000, rows)), pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "node": pa.array([f"n{i % 217:03d}" for i in range(rows)]),
            "gpu_index": pa.array(np.arange(rows) % 8, pa.int16()),
            "util": pa.array(rng.random(rows), pa.float32()),
            "mem_used_bytes": pa.array(rng.integers(0, 80 << 30, rows), pa.int64()),
            "power_w": pa.array(rng.random(rows) * 700, pa.float32()),
            "energy_j": pa.array(rng.random(rows) * 1e9),
            "job_id": pa.array([f"{i % 5000}" for i in range(rows)]),
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse(tmp)
        t0 = time.perf_counter()
        wh.append("gpu_samples", data)
        seconds = time.perf_counter() - t0
    return {"rows_per_s": rows / seconds, "seconds": seconds}


def phase_log(days: int, commits: int) -> dict:
    """A simulated year of one table's log. Each simulated day is stamped that many days before
    today (log entries by their mtime, removals by `delta.now_ms`), so the day's clean-up rules
    (log entries a day, removed files' tombstones an hour) see their real ages."""
    import pyarrow as pa

    from sing.warehouse import delta, maintenance
    from sing.warehouse.store import Warehouse

    samples: dict[int, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse(tmp)
        log_dir = wh.table_dir("gpu_samples") / "_delta_log"
        now = time.time()
        for day in range(days):
            age_s = (days - day) * 86_400
            delta.now_ms = lambda age_s=age_s: int((time.time() - age_s) * 1000)
            for k in range(commits):
                ts = END + timedelta(days=day, seconds=86_400 * k // commits)
                wh.append("gpu_samples", pa.table({"ts": [ts], "node": ["n1"]}))
                wh.checkpoint_due()
                if k % 20 == 19 and k < commits - 1:
                    maintenance.compact(wh, ts)
            maintenance.compact(wh, END + timedelta(days=day + 1))  # rolls the day up
            for entry in log_dir.iterdir():
                if entry.stat().st_mtime > now - age_s:
                    os.utime(entry, (now - age_s, now - age_s))
            entries = list(log_dir.iterdir())
            samples[day + 1] = (len(entries), sum(p.stat().st_size for p in entries))
        live = len(wh.live_files("gpu_samples"))
    marks = sorted({d for d in (1, 7, 30, 90, 180, 365) if d <= days} | {days})
    return {
        "days": marks,
        "files": [samples[d][0] for d in marks],
        "bytes": [samples[d][1] for d in marks],
        "live_data_files": live,
    }


def phase_history(days: int, label: str) -> dict:
    from sing.demo import synthetic
    from sing.warehouse import analytics
    from sing.warehouse.store import Warehouse

    root = Path(tempfile.gettempdir()) / f"sing-bench-delta-{label}-{days}d"
    marker = root / ".bench-complete"
    build_s = None
    if not marker.exists():
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        wh = Warehouse(root)
        synthetic.generate(wh, nodes=2, gpus_per_node=8, days=days, seed=0, end=END)
        wh.compact(now=END + timedelta(days=1), settle_s=0)
        build_s = time.perf_counter() - t0
        marker.write_text("ok")

    def median_s(fn) -> float:
        fn()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    return {
        "build_s": build_s,
        "open_s": median_s(lambda: Warehouse(root).connect().close()),
        "jobs_report_s": median_s(lambda: analytics.job_usage(Warehouse(root).connect(), now=END)),
        "cluster_day_s": median_s(
            lambda: analytics.cluster_usage(Warehouse(root).connect(), bucket="day", now=END)
        ),
    }


def run(checkout: Path, phase: str, *args: object) -> dict:
    env = os.environ | {"PYTHONPATH": str(checkout)}
    cmd = [sys.executable, __file__, "--phase", phase, *map(str, args)]
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{phase} in {checkout} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="a checkout of the commit before the change")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--load", action="store_true", help="appends on a busy machine too")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--days", type=int, nargs="*", default=[90, 365])
    parser.add_argument("--log-days", type=int, default=365)
    parser.add_argument("--commits", type=int, default=20, help="commits per simulated day")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        phases = {
            "appends": phase_appends,
            "bulk": phase_bulk,
            "history": phase_history,
            "log": phase_log,
            "long": phase_long_writer,
        }
        values = [int(a) if a.isdigit() else a for a in args.args]
        print(json.dumps(phases[args.phase](*values)))
        return
    checkouts = {"old": args.old, "delta": NEW} if args.old else {"delta": NEW}

    def row(name: str, key: str, unit: str, scale: float = 1.0) -> None:
        cells = "  ".join(
            f"{label} {results[label][name][key] * scale:9.1f} {unit}" for label in results
        )
        print(f"  {name:14s} {key:16s} {cells}")

    results: dict[str, dict] = {label: {} for label in checkouts}
    for label, checkout in checkouts.items():
        results[label]["appends"] = run(checkout, "appends", args.batches)
        if args.load:
            load = busy_machine()
            try:
                results[label]["appends loaded"] = run(checkout, "appends", args.batches)
            finally:
                for process in load:
                    process.kill()
        results[label]["long writer"] = run(checkout, "long", 30, 100)
        results[label]["bulk"] = run(checkout, "bulk", args.rows)
        for days in args.days:
            results[label][f"{days} days"] = run(checkout, "history", days, label)
    print(f"appends: {args.batches} x 128 rows, compact() every 20; bulk: {args.rows:,} rows")
    for name in ("appends", "appends loaded") if args.load else ("appends",):
        for key in ("p50_ms", "p99_ms", "max_ms", "maintenance_ms"):
            row(name, key, "ms")
    for key in ("cpu_p50_ms", "cpu_p99_ms"):
        row("long writer", key, "ms")
    row("bulk", "rows_per_s", "k/s", 1e-3)
    for days in args.days:
        for key in ("open_s", "jobs_report_s", "cluster_day_s"):
            row(f"{days} days", key, "ms", 1e3)
    log = run(NEW, "log", args.log_days, args.commits)
    print(f"delta log of gpu_samples, {args.commits} commits a simulated day")
    print("  day        " + "".join(f"{d:>9}" for d in log["days"]))
    print("  log files  " + "".join(f"{n:>9}" for n in log["files"]))
    print("  log kB     " + "".join(f"{b / 1000:>9.0f}" for b in log["bytes"]))
    print(f"  live data files at the end: {log['live_data_files']}")
    print(json.dumps(results | {"log": log}))


if __name__ == "__main__":
    main()
