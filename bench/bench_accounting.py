"""Latency of the usage report and of every account's monthly statements over a year of 16 x 8 GPUs.

Targets: `usage()` under 1 s warm (by account, user, partition and model, over the last month
and over the whole year); the monthly statements of every account for the year (one usage by
user per account and month, the numbers behind a statement) under 5 s together.

The history (seed 0, 365 days ending 2026-01-01) is generated once with warehouse.synthetic and
cached in /tmp/sing-bench-accounting-365d. It is sampled every 5 minutes instead of 15 s: the
reports read the per-day and per-hour rollups, whose rows (per job, GPU and day; per GPU and
hour) do not depend on the scrape interval, and a year at 15 s would take half an hour to write.
Every timing opens a fresh `Warehouse.connect()`, as the CLI does; "warm" is the median of 5
calls after a first ("cold") one, all in this process.

    .venv/bin/python bench/bench_accounting.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accounting.periods import period_window  # noqa: E402
from accounting.settings import AccountingSettings  # noqa: E402
from accounting.usage import usage  # noqa: E402
from bench.bench_reports import ensure_history  # noqa: E402
from warehouse import synthetic  # noqa: E402
from warehouse.store import Warehouse  # noqa: E402

CACHE = Path("/tmp/sing-bench-accounting-365d")
DAYS, SAMPLE_S = 365, 300  # seed 0, as bench_reports
END = datetime(2026, 1, 1, tzinfo=UTC)
MONTHS = [f"2025-{m:02d}" for m in range(1, 13)]
WARM_RUNS = 5
REPORT_TARGET_S, STATEMENTS_TARGET_S = 1.0, 5.0
# A site's settings: weights, host power, PUE and a constant carbon intensity.
SETTINGS = AccountingSettings(
    gpu_weights={synthetic.GPU_MODEL: 2.0},
    node_power_w=1500.0,
    pue=1.3,
    carbon_intensity=350.0,
)


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """(cold s, warm s): the first call, then the median of WARM_RUNS more."""
    times = []
    for _ in range(1 + WARM_RUNS):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times[0], statistics.median(times[1:])


def statements(accounts: list[str]) -> int:
    """Every account's statement for every month: its users' usage; returns the rows."""
    con = Warehouse(CACHE).connect()
    rows = 0
    for month in MONTHS:
        since, until = period_window(month)
        for account in accounts:
            rows += usage(con, "user", since, until, SETTINGS, now=END, account=account).height
    return rows


def verdict(seconds: float, target: float) -> str:
    return f"{'ok' if seconds < target else 'MISSED'} ({seconds / target:.0%} of target)"


def main() -> int:
    counts = ensure_history(CACHE, DAYS, END, SAMPLE_S)
    print(f"warehouse {CACHE}: {counts}")
    print(f"target: each usage report < {REPORT_TARGET_S:.1f} s warm\n")
    print(f"{'usage report':<30} {'cold s':>8} {'warm s':>8}  target")
    year, month = (None, END), period_window(MONTHS[-1])
    missed = 0
    for window_name, (since, until) in (("last month", month), ("whole year", year)):
        for by in ("account", "user", "partition", "model"):
            cold, warm = timed(
                lambda by=by, since=since, until=until: usage(
                    Warehouse(CACHE).connect(), by, since, until, SETTINGS, now=END
                )
            )
            missed += warm >= REPORT_TARGET_S
            name = f"--by {by}, {window_name}"
            print(f"{name:<30} {cold:8.3f} {warm:8.3f}  {verdict(warm, REPORT_TARGET_S)}")
    accounts = usage(Warehouse(CACHE).connect(), "account", None, END, SETTINGS, now=END)
    names = sorted(accounts["account"].to_list())
    started = time.perf_counter()
    rows = statements(names)
    took = time.perf_counter() - started
    missed += took >= STATEMENTS_TARGET_S
    print(
        f"\nmonthly statements: {len(names)} accounts x {len(MONTHS)} months "
        f"({rows} user rows) in {took:.2f} s; target < {STATEMENTS_TARGET_S:.0f} s: "
        f"{verdict(took, STATEMENTS_TARGET_S)}"
    )
    print(f"{'all targets met' if not missed else f'{missed} target(s) missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
