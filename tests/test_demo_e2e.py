"""End to end: `sing demo` on real processes, for a bounded time.

Checks what a person trying the project would: every simulated node is scraped, samples and
jobs grow in the warehouse, `sing report idle --running` lists the injected idle two-node job
(started an hour before the demo), no seeded job stays running, the seeded history is fully
sampled at the demo's interval, the dry-run waste rules judge the idle job, the
dashboard serves its pages in a real headless browser, a collector killed with SIGKILL in the
middle of its work is restarted and loses nothing committed, scraping kept up in every minute
from the first (every node answered, and at least 95% of scrapes did, even on a loaded 2-core
machine), and after shutdown no child process is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from sing.config import Config
from sing.demo import synthetic
from sing.demo.health import Minute, scrape_minutes
from sing.demo.run import children_of
from sing.policy.settings import site_coverage
from sing.warehouse import analytics
from sing.warehouse.store import Warehouse
from tests.debian import BROWSER_PACKAGES, ensure_packages
from tests.ports import free_port_block

NODES = 16
ANSWERED = 0.95  # of the scrapes in each minute
MINUTES = 2  # full minutes of scrapes the health check waits for, the first one included


def descendants(pid: int) -> list[int]:
    return [d for child in children_of(pid) for d in (child, *descendants(child))]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def wait_for(predicate, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def counts(wh: Warehouse) -> dict[str, int]:
    con = wh.connect()
    try:
        return {
            "gpu_samples": con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0],
            "live_jobs": con.execute(
                "SELECT count(*) FROM jobs WHERE TRY_CAST(job_id AS BIGINT) >= 500000"
            ).fetchone()[0],
            "nodes_up": con.execute(
                "SELECT count(DISTINCT node) FROM scrapes "
                "WHERE up AND ts > now() - INTERVAL 20 SECOND"
            ).fetchone()[0],
        }
    finally:
        con.close()


def health(wh: Warehouse, since: datetime) -> list[Minute]:
    con = wh.connect()
    try:
        return scrape_minutes(con, since)
    finally:
        con.close()


def test_scrape_minutes_count_whole_minutes_from_the_first_scrape(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    t0 = datetime(2026, 6, 1, 12, 0, 40, tzinfo=UTC)
    rounds = {  # seconds after t0 -> whether nodes a and b answered
        0: (True, True),
        30: (True, True),
        60: (True, False),
        119: (True, False),
        125: (True,),
    }
    wh.append(
        "scrapes",
        pl.DataFrame(
            [
                {"ts": t0 + timedelta(seconds=s), "node": node, "up": up}
                for s, ups in rounds.items()
                for node, up in zip(("a", "b"), ups, strict=False)
            ]
            + [{"ts": t0 - timedelta(seconds=1), "node": "a", "up": False}]
        ),
    )
    # The third minute is not over at the last scrape; the scrape before `since` is left out.
    assert health(wh, t0) == [Minute(t0, 2, 4, 4, 2), Minute(t0 + timedelta(minutes=1), 2, 4, 2, 1)]
    assert health(wh, t0)[1].answered_share == 0.5


@pytest.mark.e2e
def test_live_demo_end_to_end(tmp_path: Path) -> None:
    ensure_packages(*BROWSER_PACKAGES)
    from playwright.sync_api import sync_playwright

    home = tmp_path / "demo"
    base = free_port_block(NODES + 3)
    dashboard_port, metrics_port = base + NODES, base + NODES + 1
    started = datetime.now(UTC)
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sing.cli",
            "demo",
            "--home",
            str(home),
            "--history-days",
            "1",
            "--speed",
            "600",
            "--port-base",
            str(base),
            "--dashboard-port",
            str(dashboard_port),
            "--collector-metrics-port",
            str(metrics_port),
            "--duration",
            "600",  # a bound should the test die; it stops the demo itself when done
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wh = wait_for(
            lambda: (home / "warehouse" / "_meta.json").exists() and Warehouse(home / "warehouse"),
            90,
            "the demo warehouse",
        )
        # Every exporter is scraped, and samples and jobs grow.
        first = wait_for(lambda: (c := counts(wh))["nodes_up"] == NODES and c, 90, "16 nodes up")
        later = wait_for(
            lambda: (
                (c := counts(wh))["gpu_samples"] > first["gpu_samples"]
                and c["live_jobs"] > first["live_jobs"]
                and c
            ),
            60,
            "samples and jobs to grow",
        )
        assert later["live_jobs"] > 1

        # The injected idle two-node job, started an hour before the demo, is listed by the
        # admins' morning report as they run it (its own minimum of an hour and all).
        def idle_listed() -> bool:
            report = sing(home, "report", "idle", "--running")
            return any(line.split()[:1] == ["500000"] for line in report.splitlines())

        wait_for(idle_listed, 60, "the injected idle multi-node job in `sing report idle`")
        # No seeded job is left running or pending for ever, and the seeded history reads as
        # fully sampled at the demo's collector interval.
        con = wh.connect()
        seeded = "TRY_CAST(job_id AS BIGINT) < 500000"
        unfinished = f"SELECT count(*) FROM jobs WHERE {seeded} AND end_time IS NULL"
        assert con.execute(unfinished).fetchall() == [(0,)]
        # The live GPUs are the seeded history's: one model in the inventory (the trace
        # export's k rule read a node's two models differently on each evaluation).
        models = con.execute("SELECT DISTINCT gpu_model FROM nodes").fetchall()
        assert models == [(synthetic.GPU_MODEL,)]
        usage = analytics.job_usage(con, needs=site_coverage(Config.load(home / "sing.toml")))
        con.close()
        coverage = usage.filter(pl.col("job_id").cast(pl.Int64) < 500000)["coverage"]
        assert coverage.len() > 0 and coverage.min() >= 0.99, coverage.describe()

        # The dry-run waste rules judge it within the demo's first minutes (Waste policies).
        def judged() -> bool:
            con = wh.connect()
            try:
                events = "SELECT count(*) FROM policy_events WHERE job_id = '500000' AND dry_run"
                return con.execute(events).fetchall()[0][0] > 0
            finally:
                con.close()

        wait_for(judged, 120, "a dry-run policy event for the idle job", every=5)

        # The dashboard serves its pages in a real browser.
        url = f"http://127.0.0.1:{dashboard_port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page()
            wait_for(lambda: _loads(page, url), 90, "the dashboard")
            page.wait_for_selector("text=Demo mode", timeout=60_000)
            page.wait_for_selector("text=GPUs assigned vs used", timeout=60_000)
            page.wait_for_selector("text=Now: every GPU", timeout=60_000)
            page.wait_for_selector("canvas, svg.marks", timeout=60_000)  # a chart has drawn
            assert page.locator("text=Traceback").count() == 0
            out = Path(os.environ.get("SING_TEST_ARTIFACTS", tmp_path))
            out.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out / "demo-dashboard.png"), full_page=True)
            browser.close()

        # A collector killed with SIGKILL mid-work is restarted; nothing committed is lost.
        collector = _collector_pid(demo.pid)
        before = counts(wh)
        os.kill(collector, signal.SIGKILL)
        wait_for(lambda: _collector_pid(demo.pid) not in (None, collector), 30, "a new collector")
        after = wait_for(
            lambda: (c := counts(wh))["gpu_samples"] > before["gpu_samples"] and c,
            60,
            "sampling to resume after the kill",
        )
        assert after["live_jobs"] >= before["live_jobs"]

        # Scraping kept up in every minute from the first: every node and nearly every scrape.
        minutes = wait_for(
            lambda: len(m := health(wh, started)) >= MINUTES and m,
            150,
            f"{MINUTES} full minutes of scrapes",
            every=5,
        )
        for minute in minutes:
            assert minute.nodes_up == NODES and minute.answered_share >= ANSWERED, minutes

        assert len(children_of(demo.pid)) == 3  # exporter, collector, dashboard
        left_behind = descendants(demo.pid)
    finally:
        demo.send_signal(signal.SIGTERM)
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output
    assert "stopped" in output
    wait_for(lambda: not any(alive(c) for c in left_behind), 10, "every descendant to exit")


def sing(home: Path, *args: str) -> str:
    """A `sing` command against the demo's config, as a person would type it; its stdout."""
    command = [sys.executable, "-m", "sing.cli", "--config", str(home / "sing.toml"), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def _loads(page, url: str) -> bool:
    try:
        page.goto(url, timeout=10_000)
        return True
    except Exception:
        return False


def _collector_pid(demo_pid: int) -> int | None:
    for pid in children_of(demo_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"collector" in cmdline:
            return pid
    return None
