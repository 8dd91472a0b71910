"""Start-up of the `sing` command beside `python -c pass`, and what a GPU node's install costs.

Start-up (issue 33, item 5): wall time of `sing --help`, `sing exporter --help` and
`python -m sing.exporters --help` against `python -c pass` in the same interpreter, medians of
alternating runs. `sing --help` lists the commands from one table (sing/cli/__init__.py) and
imports none of their modules, so its cost is the interpreter's plus sing's core. Target:
well under 0.3 s for `sing --help` and `sing exporter --help`.

Install (issue 30, item 5, with --install): the wheel of this checkout installed into fresh
virtualenvs as a GPU node installs it (`pip install sing`, the exporter's four dependencies)
and as a head node does (`'sing[head]'`), each from the package index: wall time and size on
disk, side by side.

Run: .venv/bin/python bench/bench_startup.py [--runs 15] [--install]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SING = str(Path(sys.executable).with_name("sing"))
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "sing --help": [SING, "--help"],
    "sing exporter --help": [SING, "exporter", "--help"],
    "python -m sing.exporters --help": [sys.executable, "-m", "sing.exporters", "--help"],
}
TARGET_S = 0.3


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def startup(runs: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):  # alternating, so load changes hit every command alike
        for name, argv in COMMANDS.items():
            times[name].append(wall(argv))
    base = statistics.median(times["python -c pass"])
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {runs} alternating runs")
    print(f"{'command':34}{'wall s':>8}{'over python':>13}{'target':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        target = "" if name.startswith("python -c") else f"< {TARGET_S}"
        print(f"{name:34}{median:>8.3f}{median - base:>+12.3f}s{target:>9}")


def du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def install(extra: str, wheel: Path, base: Path) -> tuple[float, float]:
    """Seconds to install the wheel with `extra` into a fresh virtualenv, and its size in MB."""
    target = base / (extra or "node")
    venv.create(target, with_pip=True)
    before = du_mb(target)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    start = time.perf_counter()
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", spec],
                   check=True, env=env)  # fmt: skip
    return time.perf_counter() - start, du_mb(target) - before


def installs() -> None:
    with tempfile.TemporaryDirectory(prefix="sing-install-") as scratch:
        base = Path(scratch)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--wheel-dir", str(base / "wheel"), str(ROOT)], check=True)  # fmt: skip
        (wheel,) = (base / "wheel").glob("sing-*.whl")
        rows = {"node (pip install sing)": install("", wheel, base),
                "head (pip install 'sing[head]')": install("head", wheel, base)}  # fmt: skip
        print(f"{'install':34}{'wall s':>8}{'MB':>8}")
        for name, (seconds, size) in rows.items():
            print(f"{name:34}{seconds:>8.1f}{size:>8.0f}")
        node, head = rows.values()
        print(
            f"node / head: {node[0] / head[0]:.2f} of the time, {node[1] / head[1]:.3f} of the size"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--install", action="store_true", help="also time the two installs")
    args = parser.parse_args()
    startup(args.runs)
    if args.install:
        installs()


if __name__ == "__main__":
    main()
