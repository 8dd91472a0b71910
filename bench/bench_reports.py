"""Latency and peak memory of every `sing report` (and `sing job`) over 90 days of 16 x 8 GPUs.

Target: each report under 1 s warm. The history (seed 0, 90 days ending 2026-01-10, ~80 M GPU
samples) is generated once and cached in /tmp/sing-bench-90d (about 90 s). Each report runs in
its own child process, so "cold" is a first call in a fresh process (imports done, DuckDB and the
page cache as the machine left them) and peak RSS is that report's alone; "warm" is the median of
5 further calls. Every call opens a fresh `Warehouse.connect()`, as the CLI does.

    .venv/bin/python bench/bench_reports.py
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sing.config import Thresholds  # noqa: E402
from sing.warehouse import analytics, synthetic  # noqa: E402
from sing.warehouse.job_report import job_report, load_notes  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

CACHE = Path("/tmp/sing-bench-90d")
DAYS, SEED = 90, 0
END = datetime(2026, 1, 10, tzinfo=UTC)
WARM_RUNS = 5
TARGET_S = 1.0

# Each report as the CLI runs it, with `now` pinned to the end of the history so running jobs
# are counted up to where the data stops.
REPORTS = {
    "jobs": lambda con, _: analytics.job_usage(con, now=END),
    "by-nodes": lambda con, _: analytics.utilization_by_node_count(con, now=END),
    "fairness": lambda con, _: analytics.fairness(con, now=END),
    "idle": lambda con, _: analytics.idle_multinode_jobs(con, now=END),
    "cluster --bucket day": lambda con, _: analytics.cluster_usage(con, bucket="day", now=END),
    "cluster --bucket hour": lambda con, _: analytics.cluster_usage(con, bucket="hour", now=END),
    "job ID": lambda con, job_id: job_report(con, job_id, Thresholds(), load_notes(None), END),
}


def ensure_history(
    cache: Path = CACHE, days: float = DAYS, end: datetime = END, sample_s: int = synthetic.SAMPLE_S
) -> dict:
    """The cached warehouse of `days` ending at `end`, sampled every `sample_s`; regenerated when
    missing, half-written, or made by another version of the generator or another interval (the
    marker records a hash of sing/demo/synthetic.py and the interval)."""
    marker = cache / ".bench-complete"
    version = hashlib.sha256(Path(synthetic.__file__).read_bytes()).hexdigest()[:12]
    version += "" if sample_s == synthetic.SAMPLE_S else f"-every-{sample_s}s"
    if marker.exists():
        made = json.loads(marker.read_text())
        if made.get("generator") == version:
            return made
    shutil.rmtree(cache, ignore_errors=True)
    default, synthetic.SAMPLE_S = synthetic.SAMPLE_S, sample_s
    try:
        started = time.perf_counter()
        made: dict = synthetic.generate(Warehouse(cache), days=days, seed=SEED, end=end)
    finally:
        synthetic.SAMPLE_S = default
    made.update(generate_s=round(time.perf_counter() - started), generator=version)
    marker.write_text(json.dumps(made))
    return made


def measure(name: str, job_id: str) -> dict[str, float]:
    """In a child process: one cold call, then WARM_RUNS warm calls, each on a fresh connection."""
    times = []
    for _ in range(1 + WARM_RUNS):
        started = time.perf_counter()
        REPORTS[name](Warehouse(CACHE).connect(), job_id)
        times.append(time.perf_counter() - started)
    return {"cold_s": times[0], "warm_s": statistics.median(times[1:]), "rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM). Not ru_maxrss: Linux carries that across fork and
    exec, so a child would report its parent's peak (e.g. the generator's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def busiest_idle_job() -> str:
    """The job `sing job` is timed on: the idle multi-node job wasting most GPU-hours."""
    idle = analytics.idle_multinode_jobs(Warehouse(CACHE).connect(), now=END)
    return str(idle["job_id"][0])


def main() -> int:
    counts = ensure_history()
    job_id = busiest_idle_job()
    print(f"warehouse {CACHE}: {counts}")
    print(f"`sing job` timed on job {job_id}; target: every report < {TARGET_S:.1f} s warm\n")
    print(f"{'report':<22} {'cold s':>8} {'warm s':>8} {'peak RSS MiB':>13}  target")
    missed = []
    for name in REPORTS:
        child = subprocess.run(
            [sys.executable, __file__, "--child", name, job_id],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(child.stdout)
        ok = r["warm_s"] < TARGET_S
        missed += [] if ok else [name]
        print(
            f"{name:<22} {r['cold_s']:8.3f} {r['warm_s']:8.3f} {r['rss_mib']:13.0f}  "
            f"{'ok' if ok else 'MISSED'} ({r['warm_s'] / TARGET_S:.0%} of target)"
        )
    print(f"\n{len(REPORTS) - len(missed)} of {len(REPORTS)} reports under target")
    print(f"plus the `sing` process start a CLI call pays: {cli_start_s():.2f} s (`sing --help`)")
    return 0


def cli_start_s() -> float:
    """Median wall time of `sing --help`: interpreter, imports and argument parsing."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([ROOT / ".venv" / "bin" / "sing", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2], sys.argv[3])))
    else:
        sys.exit(main())
