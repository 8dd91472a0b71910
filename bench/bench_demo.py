"""How much CPU the live demo uses in steady state (target: under one core in total).

Starts `sing demo` (exporter serving 16 fake nodes, collector, dashboard, scheduler loop) in a
temporary home, lets it settle, then reads the CPU time of the whole process tree from /proc
over a measuring window.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo.run import children_of

SETTLE_S = 45
WINDOW_S = 60
TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    return [pid] + [c for child in children_of(pid) for c in tree(child)]


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return "?"
    for word in (b"exporter", b"collector", b"dashboard", b"streamlit", b"demo"):
        if word in args or any(word in a for a in args[:3]):
            return word.decode()
    return args[0].decode()


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="sing-bench-demo-"))
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
            "--port-base",
            "19500",
            "--dashboard-port",
            "18501",
            "--collector-metrics-port",
            "19499",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(SETTLE_S)
        pids = tree(demo.pid)
        names = {pid: name(pid) for pid in pids}
        start = cpu_seconds(pids)
        time.sleep(WINDOW_S)
        end = cpu_seconds(pids)
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
    print(f"live demo steady state over {WINDOW_S} s (16 nodes x 8 GPUs, 5 s scrapes):")
    total = 0.0
    for pid in pids:
        if pid in start and pid in end:
            used = (end[pid] - start[pid]) / WINDOW_S
            total += used
            print(f"  {names[pid]:10} pid {pid:7}  {used:6.3f} cores")
    print(f"  total                {total:6.3f} cores (target < 1.0; ratio {total:.2f})")


if __name__ == "__main__":
    main()
