"""Exporter cost per scrape and memory, measured side by side with a bare prometheus_client.

Scrape cost: an 8-GPU (18 NVLinks each), 4-port node on the fake NVML, with the real
sysfs/procfs readers on a static fake tree, against a bare CollectorRegistry of plain Gauges
holding the same series (the least any Python exporter built on prometheus_client can cost),
best of alternating rounds. Target: under 2x.
Memory: resident set of a real `python -m exporters --fake` and `sing exporter --fake` process
after some scrapes. Target: under 60 MB (dcgm-exporter users report 70-150 MB).

Run: .venv/bin/python bench/bench_exporter.py
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exporters.fake_nvml import FakeNvml, load_description  # noqa: E402
from exporters.fake_world import FakeWorld  # noqa: E402
from exporters.node import NodeCollector, node_registry  # noqa: E402

SCRAPES = 300
ROUNDS = 5  # alternating rounds, best of each kept: the dev box is shared and noisy


def exporter_registry(root: Path) -> CollectorRegistry:
    nvml = FakeNvml(load_description(None), node="bench")
    world = FakeWorld(root, nvml)
    world.sync()  # a static tree: the bench times the exporter's reads, not the fake's writes
    collector = NodeCollector(
        nvml, str(world.sysfs_root), str(world.proc_root), str(world.mapping_dir), 0.0
    )
    return node_registry(collector, process_metrics=False)


def bare_registry(page: str) -> CollectorRegistry:
    """Plain Gauges holding every series of `page`, as a hand-written exporter would."""
    registry = CollectorRegistry()
    for family in text_string_to_metric_families(page):
        labels = sorted({k for s in family.samples for k in s.labels})
        gauge = Gauge(family.name + "_bare", family.documentation, labels, registry=registry)
        for s in family.samples:
            (gauge.labels(**s.labels) if labels else gauge).set(s.value)
    return registry


def per_scrape(registry: CollectorRegistry) -> tuple[float, float]:
    """Mean (CPU seconds, wall seconds) of one generate_latest over SCRAPES runs."""
    for _ in range(20):
        generate_latest(registry)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(SCRAPES):
        generate_latest(registry)
    return (time.process_time() - cpu) / SCRAPES, (time.perf_counter() - wall) / SCRAPES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(command: list[str]) -> float:
    """Resident memory of an exporter process after 20 scrapes, from /proc."""
    port = free_port()
    proc = subprocess.Popen([*command, "--port", str(port), "--listen-address", "127.0.0.1"],
                            cwd=ROOT, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        scraped = 0
        while scraped < 20:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                scraped += 1
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        return kb / 1024
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ours = exporter_registry(Path(tmp))
        page = generate_latest(ours).decode()
        series = sum(len(f.samples) for f in text_string_to_metric_families(page))
        bare = bare_registry(page)
        rounds = [(per_scrape(ours), per_scrape(bare)) for _ in range(ROUNDS)]
        ours_cpu, ours_wall = (min(r[0][i] for r in rounds) for i in (0, 1))
        bare_cpu, bare_wall = (min(r[1][i] for r in rounds) for i in (0, 1))
    print(f"node: 8 GPUs (fake NVML), 4 RDMA ports (sysfs tree), {series} series")
    print(f"{'':24}{'CPU ms/scrape':>15}{'wall ms/scrape':>16}")
    print(f"{'sing exporter':24}{ours_cpu * 1e3:>15.3f}{ours_wall * 1e3:>16.3f}")
    print(f"{'bare prometheus_client':24}{bare_cpu * 1e3:>15.3f}{bare_wall * 1e3:>16.3f}")
    print(f"{'ratio (target < 2)':24}{ours_cpu / bare_cpu:>15.2f}{ours_wall / bare_wall:>16.2f}")
    python = [sys.executable, "-m"]
    for name, cmd in [
        ("python -m exporters --fake", [*python, "exporters", "--fake"]),
        ("sing exporter --fake", [*python, "sing.cli", "exporter", "--fake"]),
    ]:
        print(f"RSS {name}: {rss_mb(cmd):.1f} MB (target < 60)")


if __name__ == "__main__":
    main()
