"""One collector round over 1,000 simulated 8-GPU nodes: scrape, parse, stamp, write.

The payload is a real one: captured once from `sing exporter --fake` (the built-in 8-GPU,
4-port node). Four server processes serve it as 1,000 targets (250 metrics paths each, listed in
a file_sd-style target list with `__metrics_path__`), so the collector makes 1,000 real HTTP
requests. The collector runs in this process; its CPU time is this process's CPU time.

Prints targets/s, rows/s, CPU seconds per round and the parse share, next to the per-payload cost
of prometheus_client's parser on the same payload. Target: a round of 1,000 nodes within a 15 s
interval using under half of one core (< 7.5 CPU s per round). `--jobs N` captures the page of
the same node running N Slurm jobs, each with its cgroup (v2) read: N more `job_host_samples`
rows per node and round (issue 32).

    .venv/bin/python bench/bench_collector.py [--nodes 1000] [--rounds 3] [--jobs 8]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sing.collector.convert import WANTED, read_node
from sing.collector.promtext import parse
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import target_from
from sing.config import Config
from sing.testing.fake_nvml import load_description
from sing.warehouse.store import Warehouse

SERVERS = 4
INTERVAL_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture_payload(jobs: int) -> bytes:
    """GET /metrics once from a real `sing exporter --fake` process of the built-in node, with
    `jobs` Slurm jobs' cgroups on it."""
    description = load_description(None)
    if jobs:
        job = {"cpus": 8, "cpu_busy": 2.0, "memory_used": 3.2e10, "memory_limit": 6.4e10,
               "io_read_bytes_per_s": 1e8, "io_write_bytes_per_s": 1e7}  # fmt: skip
        description["cgroup"] = {"layout": "v2", "jobs": {str(1000 + n): job for n in range(jobs)}}
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sing-bench-node-") as tmp:
        node = Path(tmp) / "node.json"
        node.write_text(json.dumps(description))
        argv = [sys.executable, "-m", "sing.cli", "exporter", f"--fake={node}", f"--port={port}"]
        proc = subprocess.Popen(
            [*argv, "--listen-address=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
                        return r.read()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait()


def serve(port: int, payload: bytes) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.request_queue_size = 512
    server.serve_forever()


def cpu_per_payload(function, payload: str, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        function(payload)
    return (time.process_time() - start) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=0, help="Slurm jobs (cgroups) on each node")
    args = ap.parse_args()

    payload = capture_payload(args.jobs)
    text = payload.decode()
    ports = [free_port() for _ in range(SERVERS)]
    servers = [multiprocessing.Process(target=serve, args=(p, payload), daemon=True) for p in ports]
    for s in servers:
        s.start()
    targets = [
        target_from(
            f"127.0.0.1:{ports[i % SERVERS]}",
            {"node": f"gpu{i:04d}", "__metrics_path__": f"/node/{i}/metrics"},
        )
        for i in range(args.nodes)
    ]
    time.sleep(1.0)

    with tempfile.TemporaryDirectory(prefix="sing-bench-collector-") as tmp:
        settings = CollectorSettings(scrape_timeout_s=10.0, metrics_port=0)
        collector = Collector(Config({}), settings, Warehouse(Path(tmp) / "wh"), lambda: targets)
        collector.scrape_round()  # warm-up: connections, imports, first counter values
        walls, cpus, rows, ups = [], [], [], []
        for _ in range(args.rounds):
            cpu0 = time.process_time()
            summary = collector.scrape_round()
            cpus.append(time.process_time() - cpu0)
            walls.append(summary.seconds)
            rows.append(summary.rows)
            ups.append(summary.up)
        collector.close()

    ours = cpu_per_payload(lambda t: read_node(parse(t, WANTED)), text, 300)
    theirs = cpu_per_payload(lambda t: list(text_string_to_metric_families(t)), text, 30)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    n = args.nodes
    print(f"payload: {len(payload):,} bytes, {text.count(chr(10)):,} lines (sing exporter --fake, "
          f"{args.jobs} jobs' cgroups)")  # fmt: skip
    print(f"round of {n} nodes x 8 GPUs, median of {args.rounds} (targets up: {min(ups)}/{n})")
    print(f"  wall per round        {wall:8.2f} s   ({n / wall:,.0f} targets/s)")
    per_round = statistics.median(rows)
    print(f"  rows per round        {per_round:8,.0f}     ({per_round / wall:,.0f} rows/s)")
    print(f"  CPU per round         {cpu:8.2f} s   (target < {INTERVAL_S / 2:.1f} s)")
    print(f"  share of one core     {cpu / INTERVAL_S:8.1%}     of a {INTERVAL_S:g} s interval")
    print(f"  parse share           {ours * n / cpu:8.1%}     ({ours * 1e3:.3f} ms per payload)")
    print(
        f"prometheus_client parser: {theirs * 1e3:.2f} ms per payload, "
        f"{theirs / ours:.0f}x the collector's parse+convert; "
        f"{theirs * n:.1f} CPU s for {n} nodes"
    )
    ok = wall < INTERVAL_S and cpu < INTERVAL_S / 2 and min(ups) == n
    print("target met" if ok else "TARGET MISSED")
    for s in servers:
        s.terminate()


if __name__ == "__main__":
    main()
