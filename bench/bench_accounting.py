"""Latency of the usage report and of every account's monthly statements over a year of 16 x 8 GPUs.

Targets: `usage()` under 1 s warm (by account, user, partition and model, over the last month
and over the whole year); a month's statements of every account under 5 s together, as `sing
report statement --all` builds them (sing.accounting.statement, HTML included), for each month of
the year (the slowest month against the target; the year's total is printed beside it).

The history (seed 0, 365 days ending 2026-01-01) is generated once with sing.demo.synthetic and
cached in /tmp/sing-bench-accounting-365d. It is sampled every 5 minutes instead of 15 s: the
reports read the per-day and per-hour rollups, whose rows (per job, GPU and day; per GPU and
hour) do not depend on the scrape interval, and a year at 15 s would take half an hour to write.
Every timing opens a fresh snapshot (`sing.accounting.usage.snapshot`), as the CLI does, and shows
that part apart;
"warm" is the median of 3 calls after a first ("cold") one, all in this process, with its CPU
time beside it; the load average is printed before and after.

    .venv/bin/python bench/bench_accounting.py
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_reports import ensure_history  # noqa: E402
from sing.accounting import statement  # noqa: E402
from sing.accounting.periods import period_window  # noqa: E402
from sing.accounting.settings import AccountingSettings  # noqa: E402
from sing.accounting.usage import snapshot, usage  # noqa: E402
from sing.warehouse import synthetic  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

CACHE = Path("/tmp/sing-bench-accounting-365d")
DAYS, SAMPLE_S = 365, 300  # seed 0, as bench_reports
END = datetime(2026, 1, 1, tzinfo=UTC)
MONTHS = [f"2025-{m:02d}" for m in range(1, 13)]
WARM_RUNS = 3
REPORT_TARGET_S, STATEMENTS_TARGET_S = 1.0, 5.0
# A site's settings: weights, host power, PUE and a constant carbon intensity.
SETTINGS = AccountingSettings(
    gpu_weights={synthetic.GPU_MODEL: 2.0},
    node_power_w=1500.0,
    pue=1.3,
    carbon_intensity=350.0,
)


def timed(by: str, since: datetime | None, until: datetime, settings: AccountingSettings) -> dict:
    """A first (cold) call, then WARM_RUNS more, each on a fresh connection as the CLI opens one:
    medians of the whole call, of its CPU time (all threads: on a shared machine it says what
    the wall time would be without waiting for a core) and of its snapshot alone."""
    total, cpu, connect = [], [], []
    for _ in range(1 + WARM_RUNS):
        started, cpu_started = time.perf_counter(), time.process_time()
        series = bool(settings.carbon_intensity_file)
        con = snapshot(Warehouse(CACHE), since, until, END, carbon_series=series)
        connected = time.perf_counter()
        usage(con, by, since, until, settings, now=END)
        total.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        connect.append(connected - started)
    return {
        "cold": total[0],
        "warm": statistics.median(total[1:]),
        "cpu": statistics.median(cpu[1:]),
        "connect": statistics.median(connect[1:]),
    }


def statements_of(month: str) -> int:
    """Every account's statement for `month`, as `sing report statement --all` builds them (a
    snapshot, two usage queries, then each account's HTML)."""
    con = snapshot(Warehouse(CACHE), *period_window(month), END, carbon_series=False)
    found = statement.statements(con, month, SETTINGS, now=END)
    for one in found:
        statement.render_html(one, "campus")
    return len(found)


def with_series() -> AccountingSettings:
    """SETTINGS with an hourly carbon series for the year (a daily swing, 200-500 g/kWh)."""
    path = CACHE / "intensity.csv"
    if not path.exists():
        hours = [datetime(2025, 1, 1, tzinfo=UTC) + timedelta(hours=h) for h in range(DAYS * 24)]
        rows = [
            f"{t:%Y-%m-%dT%H:%M:%SZ},{350 + 150 * math.sin(t.hour / 24 * math.tau):.1f}"
            for t in hours
        ]
        path.write_text("time,g_per_kwh\n" + "\n".join(rows) + "\n")
    return replace(SETTINGS, carbon_intensity_file=str(path))


def verdict(seconds: float, target: float) -> str:
    return f"{'ok' if seconds < target else 'MISSED'} ({seconds / target:.0%} of target)"


def main() -> int:
    counts = ensure_history(CACHE, DAYS, END, SAMPLE_S)
    print(f"warehouse {CACHE}: {counts}")
    print(f"target: each usage report < {REPORT_TARGET_S:.1f} s warm")
    print(f"load average {os.getloadavg()[0]:.2f}\n")
    header = f"{'cold s':>8} {'warm s':>8} {'cpu s':>8} {'connect s':>10}"
    print(f"{'usage report':<42} {header}  target")
    year, month = (None, END), period_window(MONTHS[-1])
    missed = 0
    series = with_series()
    cases = [
        (f"--by {by}, {window_name}", by, window, SETTINGS)
        for window_name, window in (("last month", month), ("whole year", year))
        for by in ("account", "user", "partition", "model")
    ]
    cases += [
        (f"--by account, {name}, hourly CO2", "account", window, series)
        for name, window in (("last month", month), ("whole year", year))
    ]
    for name, by, (since, until), settings in cases:
        r = timed(by, since, until, settings)
        missed += r["warm"] >= REPORT_TARGET_S
        print(
            f"{name:<42} {r['cold']:8.3f} {r['warm']:8.3f} {r['cpu']:8.3f} {r['connect']:10.3f}  "
            f"{verdict(r['warm'], REPORT_TARGET_S)}"
        )
    took = {}
    for month in MONTHS:
        started = time.perf_counter()
        made = statements_of(month)
        took[month] = time.perf_counter() - started
    slowest = max(took, key=took.__getitem__)
    missed += took[slowest] >= STATEMENTS_TARGET_S
    print(
        f"\nmonthly statements of every account ({made} in {MONTHS[-1]}): median month "
        f"{statistics.median(took.values()):.2f} s, slowest {slowest} {took[slowest]:.2f} s "
        f"(target < {STATEMENTS_TARGET_S:.0f} s: {verdict(took[slowest], STATEMENTS_TARGET_S)}); "
        f"all 12 months {sum(took.values()):.1f} s"
    )
    print(f"{'all targets met' if not missed else f'{missed} target(s) missed'}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
