"""Latency of the workload report (sing/traces/workload.py) over a year of jobs and over Philly.

Sources: the year-old warehouse of bench/bench_accounting.py (365 days of 16 x 8 GPUs, ~74 k
jobs, cached in /tmp/sing-bench-accounting-365d; about 30 min to make the first time), and the
Philly trace of the shared traces (82 k jobs) imported into a temporary release. Each figure is a
first call (cold: imports done, caches as the machine left them) and the median of WARM_RUNS
more; then the whole `sing report workload --trace PHILLY` command, process start included.

    .venv/bin/python bench/bench_workload.py [PHILLY_JOBS_CSV]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_accounting import CACHE, DAYS, END, SAMPLE_S  # noqa: E402
from bench.bench_reports import cli_start_s, ensure_history  # noqa: E402
from sing.traces.importers import import_trace  # noqa: E402
from sing.warehouse import workload  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

PHILLY = ROOT.parent / "shared" / "traces" / "philly" / "philly_pollux_jobs.csv"
WARM_RUNS = 3
TARGET_S = 1.0


def timed(call: Callable[[], object]) -> tuple[float, float, float]:
    """(cold, warm median) wall seconds of `call`, and the warm median of its CPU seconds (all
    threads: the figure a busy shared machine does not inflate)."""
    walls, cpus = [], []
    for _ in range(1 + WARM_RUNS):
        started, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return walls[0], statistics.median(walls[1:]), statistics.median(cpus[1:])


def main(philly: Path) -> int:
    counts = ensure_history(CACHE, DAYS, END, SAMPLE_S)
    print(f"warehouse {CACHE}: {counts['jobs']:,} jobs over {DAYS} days; Philly {philly}")
    with tempfile.TemporaryDirectory(prefix="sing-bench-workload-") as tmp:
        release = import_trace("philly", philly, Path(tmp) / "philly")
        cases = {
            "cluster, a year": lambda: workload.from_warehouse(
                Warehouse(CACHE), None, None, END, "campus"
            ),
            "Philly release": lambda: workload.from_trace(release),
        }
        print(
            f"\n{'source':<18} {'jobs':>8} {'cold s':>8} {'warm s':>8} {'warm CPU s':>10}  "
            f"target {TARGET_S:.1f} s warm"
        )
        for name, call in cases.items():
            jobs = call().counts["jobs"]
            cold, warm, cpu = timed(call)
            verdict = "ok" if warm < TARGET_S else "MISSED"
            print(f"{name:<18} {jobs:>8,} {cold:8.3f} {warm:8.3f} {cpu:10.3f}  {verdict}")
        command = [str(ROOT / ".venv" / "bin" / "sing"), "--warehouse", str(CACHE), "report"]
        command += ["workload", "--trace", str(release), "--now", END.isoformat()]
        walls = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run(command, capture_output=True, check=True)
            walls.append(time.perf_counter() - started)
        print(
            f"\n`sing report workload --trace philly` on the year: {statistics.median(walls):.2f} s"
            f", of which the process start (`sing --help`): {cli_start_s():.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else PHILLY))
