"""Server-side render time of every dashboard page on 90 and 365 days of the 16x8 synthetic cluster.

Each page runs through Streamlit's AppTest (the script run a browser would trigger, minus the
network), as an admin in demo mode so every page is open:
- cold: the dashboards' query caches cleared (the first visitor after a restart or a TTL expiry;
  the operating system's file cache is warm, as on a server that has been up);
- warm: the same page again (the next visitor within the cache TTL), median of 3.
Targets (issue 7): every page under 5 s cold and under 2 s warm on this 2-core machine.

The warehouses are generated once into $SING_BENCH_CACHE (default /tmp/sing-bench-cache) and
reused: a year of 15-second samples for 128 GPUs is ~270 M rows (~9 GB, ~15 min to generate).

    .venv/bin/python bench/bench_dashboards.py [DAYS ...]    # default: 90 365
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from sing.dashboards.access import PAGES
from sing.demo.synthetic import generate
from sing.warehouse.store import Warehouse

APP = str(Path(__file__).parents[1] / "sing" / "dashboards" / "app.py")
CACHE = Path(os.environ.get("SING_BENCH_CACHE", "/tmp/sing-bench-cache"))
END = datetime(2026, 11, 1, tzinfo=UTC)
COLD_S, WARM_S = 5.0, 2.0


def warehouse(days: int) -> Path:
    """The cached synthetic warehouse of `days` days (generated on first use)."""
    root = CACHE / f"16x8-{days}d-seed0"
    done = root / ".complete"
    if not done.exists():
        print(f"generating {days} days into {root} (once) ...", file=sys.stderr, flush=True)
        began = time.perf_counter()
        generate(Warehouse(root), days=days, seed=0, end=END)
        done.write_text(f"{time.perf_counter() - began:.0f} s\n")
    return root


def biggest_job(root: Path) -> str:
    """The job page's worst case: the job with the most GPU-hours."""
    (job,) = (
        Warehouse(root)
        .connect()
        .execute(
            "SELECT job_id FROM jobs WHERE end_time IS NOT NULL "
            "ORDER BY num_gpus * epoch(end_time - start_time) DESC LIMIT 1"
        )
        .fetchall()[0]
    )
    return job


def timed_run(at: AppTest) -> float:
    began = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - began
    if at.exception:
        raise RuntimeError(at.exception[0].message)
    return elapsed


def measure(root: Path) -> list[tuple[str, float, float]]:
    os.environ["SING_WAREHOUSE"] = str(root)
    sys.argv = [APP, "--demo"]  # demo mode, as `streamlit run app.py -- --demo` gets it
    job = biggest_job(root)
    rows = []
    for spec in PAGES:
        at = AppTest.from_file(APP, default_timeout=600)
        at.query_params["job"] = job
        at.run()  # the first run draws the default page; what is timed is the switch below
        st.cache_data.clear()
        st.cache_resource.clear()
        cold = timed_run(at.switch_page(spec.file))
        warm = statistics.median(timed_run(at) for _ in range(3))
        rows.append((spec.title, cold, warm))
        print(f"  {spec.title:<14} cold {cold:6.2f} s   warm {warm:6.2f} s", flush=True)
    return rows


def main(days_list: list[int]) -> int:
    logging.getLogger("streamlit").setLevel(logging.ERROR)  # AppTest's "no runtime" chatter
    results = {}
    for days in days_list:
        root = warehouse(days)
        (jobs, samples) = (
            Warehouse(root)
            .connect()
            .execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM gpu_samples)")
            .fetchall()[0]
        )
        print(f"{days} days: {jobs:,} jobs, {samples:,} GPU samples", flush=True)
        results[days] = measure(root)
    print()
    print("page           " + "".join(f"| {d:>4} d cold | {d:>4} d warm " for d in days_list))
    failed = []
    for k, spec in enumerate(PAGES):
        cells = ""
        for days in days_list:
            _, cold, warm = results[days][k]
            cells += f"| {cold:9.2f} s | {warm:9.2f} s "
            if cold > COLD_S or warm > WARM_S:
                failed.append(f"{spec.title} at {days} days")
        print(f"{spec.title:<15}{cells}")
    for days in days_list:
        worst_cold = max(r[1] for r in results[days])
        worst_warm = max(r[2] for r in results[days])
        print(
            f"{days} days: worst cold {worst_cold:.2f} s ({worst_cold / COLD_S:.0%} of the 5 s "
            f"target), worst warm {worst_warm:.2f} s ({worst_warm / WARM_S:.0%} of the 2 s target)"
        )
    print("targets met" if not failed else "over target: " + ", ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [90, 365]))
