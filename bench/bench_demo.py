"""How much CPU the live demo uses, and whether every simulated node is scraped, from the start.

Starts `sing demo` (one exporter serving 16 fake nodes, the collector, the dashboard, and the
demo's own scheduler loop) in a temporary home, reads the CPU time of each process from /proc
over a window after start-up, and reads the scrapes of every minute from the first one on from
the warehouse (sing.demo.health). The exporter's CPU is the figure that matters on a small machine:
when it cannot answer 16 nodes within the scrape timeout, nodes go down in the dashboard.

Run: .venv/bin/python bench/bench_demo.py [--interval 2 --speed 600]  (the e2e test's pace)
     .venv/bin/python bench/bench_demo.py --startup  (seconds from `sing demo` in a new home,
     a week of history seeded, to the dashboard answering its health check and its page;
     README quotes this figure, plus the time `make setup` takes on a fresh clone)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sing.demo.health import scrape_minutes  # noqa: E402
from sing.demo.run import children_of  # noqa: E402
from sing.warehouse.store import Warehouse  # noqa: E402

NODES = 16
SETTLE_S = 30  # start-up (imports, the first rounds, the dashboard's first run) is left out
RUN_S = 150  # two full minutes of scrapes after the first one
TICKS = os.sysconf("SC_CLK_TCK")
# Targets, in cores (1.0 = one CPU busy all the time) at the demo's default 5 s interval.
TARGET_EXPORTER_PER_NODE = 0.01
TARGET_PER_SCRAPE_S = 0.05
TARGET_ANSWERED = 0.95
TARGET_OTHER = {"demo": 0.05, "collector": 0.10, "dashboard": 0.05}
TARGET_TOTAL = 0.5


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def role(pid: int) -> str:
    """A demo child's part; `sing dashboard` turns itself into
    `python -m sing.dashboards.cli run`."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for word, part in ((b"exporter", "exporter"), (b"collector", "collector"),
                       (b"sing.dashboards.cli", "dashboard")):  # fmt: skip
        if word in args:
            return part
    return "?"


def run_demo(home: Path, interval: float, speed: float) -> tuple[dict[str, float], datetime, float]:
    """Run the demo; the CPU cores each process used over the window, its start, the window."""
    started = datetime.now(UTC)
    demo = subprocess.Popen(
        [sys.executable, "-m", "sing.cli", "demo", "--home", str(home), "--history-days", "1",
         "--interval", str(interval), "--speed", str(speed), "--port-base", "19500",
         "--dashboard-port", "18501", "--collector-metrics-port", "19499"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(SETTLE_S)
        pids = {"demo": demo.pid} | {role(pid): pid for pid in children_of(demo.pid)}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window = time.monotonic()
        time.sleep(RUN_S - SETTLE_S)
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window = time.monotonic() - window
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
    cores = {
        name: (after[name] - before[name]) / window
        for name in pids
        if before[name] is not None and after[name] is not None  # a restarted child is left out
    }
    return cores, started, window


def startup_s(home: Path) -> float:
    """Seconds from starting `sing demo` (default history) to the dashboard serving `/`."""
    url = "http://127.0.0.1:18501"
    began = time.monotonic()
    demo = subprocess.Popen(
        [sys.executable, "-m", "sing.cli", "demo", "--home", str(home), "--port-base", "19500",
         "--dashboard-port", "18501", "--collector-metrics-port", "19499"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while demo.poll() is None:
            try:
                for path in ("/_stcore/health", "/"):
                    urllib.request.urlopen(url + path, timeout=2).close()
                return time.monotonic() - began
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"sing demo exited with {demo.returncode}")
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval, seconds")
    parser.add_argument("--speed", type=float, default=120.0, help="simulated s per real s")
    parser.add_argument("--startup", action="store_true", help="time start-up to the dashboard")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="sing-bench-demo-"))
    if args.startup:
        print(f"sing demo to dashboard serving, fresh home: {startup_s(home):.1f} s")
        return
    cores, started, window = run_demo(home, args.interval, args.speed)
    minutes = scrape_minutes(Warehouse(home / "warehouse").connect(), started)

    pace = args.interval / 5.0  # targets are per 5 s scrape interval: a faster pace costs more
    exporter = cores.get("exporter", float("nan"))
    scrapes_per_s = NODES / args.interval
    print(f"live demo, {NODES} nodes x 8 GPUs, {args.interval:g} s scrapes, speed {args.speed:g};")
    print(f"CPU over {window:.0f} s after {SETTLE_S} s of start-up (1.0 = one core busy;")
    print("targets are for 5 s scrapes, the exporter's scaled to this scrape rate):")
    rows = [
        ("exporter per node", exporter / NODES, TARGET_EXPORTER_PER_NODE / pace, "cores"),
        ("exporter per scrape", exporter / scrapes_per_s, TARGET_PER_SCRAPE_S, "CPU s"),
        *((name, cores.get(name, float("nan")), target, "cores")
          for name, target in TARGET_OTHER.items()),
        ("exporter", exporter, TARGET_EXPORTER_PER_NODE * NODES / pace, "cores"),
        ("total", sum(cores.values()), TARGET_TOTAL, "cores"),
    ]  # fmt: skip
    for label, value, target, unit in rows:
        print(
            f"  {label:20} {value:7.3f} {unit:5} target < {target:.3f} (ratio {value / target:.2f})"
        )
    print(f"scrapes per minute from the first ({len(minutes)} full minutes):")
    for m in minutes:
        print(
            f"  {m.start:%H:%M:%S}  {m.rounds:3} rounds  {m.answered:4}/{m.attempts:<4} answered "
            f"({m.answered_share:6.1%})  {m.nodes_up:2}/{NODES} nodes up"
        )
    worst = min((m.answered_share for m in minutes), default=0.0)
    fewest = min((m.nodes_up for m in minutes), default=0)
    print(f"  min answered share  {worst:7.1%}  target >= {TARGET_ANSWERED:.0%}")
    print(f"  min nodes up        {fewest:7}  target   {NODES}")


if __name__ == "__main__":
    main()
