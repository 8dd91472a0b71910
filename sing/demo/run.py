"""`sing demo`: a live simulated campus cluster on this machine, on real processes.

    sing exporter   one process serving 16 fake nodes (8 GPUs each) on 16 ports
    sing collector  scraping them via a file_sd file, syncing the simulated jobs
    sing dashboard  in demo mode
    this process    the workload and the SING scheduler (sing.demo.cluster), one tick a second

The first run seeds the warehouse with a week of synthetic history so the dashboard has
something to show at once; later runs resume with the same warehouse (`--reset` starts over).
Ctrl-C or SIGTERM stops every child; children also die with this process if it is killed.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import yaml

from sing.demo import synthetic
from sing.demo.cluster import LiveCluster, now_utc
from sing.demo.synthetic import SAMPLE_S, generate, node_names
from sing.testing.fake_nvml import DEFAULT_DESCRIPTION, load_yaml
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
MAX_RESTARTS = 5
# Job records change only when a job is submitted, starts or ends; a job sync costs the collector
# a warehouse connection and two appends, and syncing every scrape round was most of its CPU.
MIN_JOB_SYNC_S = 10.0
# The seeded history ends this long before the demo starts: room for the injected idle job's
# seeded past (sing.demo.cluster.IDLE_JOB_RAN_S) on GPUs no seeded job holds.
HISTORY_GAP = timedelta(hours=2)
# Waste rules the demo evaluates in dry run (logged and shown on the Waste policies page,
# never sent or acted on), each round a minute apart so warnings show in the first minutes.
POLICY = """
[policy]
dry_run = true
interval_s = 60

[policy.rules.idle-gpus]
kind = "idle_gpus"
minutes = 60
actions = ["notify", "warn"]
warn_after_minutes = 1

[policy.rules.silent-multinode]
kind = "multinode_idle"
minutes = 60
actions = ["notify"]
"""


@dataclass(frozen=True)
class DemoOptions:
    home: Path
    nodes: int = 16
    gpus_per_node: int = 8
    port_base: int = 9500
    dashboard_port: int = 8501
    collector_metrics_port: int = 9499
    interval_s: float = SAMPLE_S  # the seeded history's step, so its jobs read as fully sampled
    speed: float = 120.0
    history_days: float = 7.0
    seed: int = 0
    duration_s: float | None = None
    reset: bool = False
    dashboard: bool = True


def _die_with_parent() -> None:
    """Run in each child before exec: the kernel sends it SIGTERM if the demo dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Demo:
    def __init__(self, options: DemoOptions) -> None:
        self.o = options
        self.home = options.home
        self.warehouse = self.home / "warehouse"
        self.config = self.home / "sing.toml"
        self.children: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, tuple[str, ...]] = {}
        self.restarts: dict[str, int] = {}
        self.stop = threading.Event()

    def prepare(self) -> None:
        if self.o.reset and self.home.exists():
            shutil.rmtree(self.home)
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        names = node_names(self.o.nodes)
        targets = [
            {"targets": [f"127.0.0.1:{self.o.port_base + n}"], "labels": {"node": name}}
            for n, name in enumerate(names)
        ]
        (self.home / "targets.json").write_text(json.dumps(targets, indent=1))
        self.config.write_text(
            f"""# Written by `sing demo`.
[site]
cluster = "campus"
warehouse = "warehouse"

[collector]
file_sd = "targets.json"
interval_s = {self.o.interval_s}
job_sync = "sing.demo.executor:sync"
job_sync_interval_s = {max(self.o.interval_s, MIN_JOB_SYNC_S)}
maintenance_interval_s = 120
metrics_port = {self.o.collector_metrics_port}

[demo]
state_file = "state.json"
records_file = "jobs.json"
{POLICY}"""
        )
        wh = Warehouse(self.warehouse)
        wh.require_writable()
        fresh = not any((self.warehouse / "jobs").glob("*.parquet"))
        if fresh and self.o.history_days > 0:
            log.info("seeding %s days of synthetic history", self.o.history_days)
            generate(
                wh,
                nodes=self.o.nodes,
                gpus_per_node=self.o.gpus_per_node,
                days=self.o.history_days,
                seed=self.o.seed,
                end=now_utc() - HISTORY_GAP,
            )
            end_unfinished(wh, wh.newest_time("gpu_samples"))

    def first_job_id(self) -> int:
        con = Warehouse(self.warehouse).connect()
        (top,) = con.execute("SELECT max(TRY_CAST(job_id AS BIGINT)) FROM jobs").fetchone()
        return max(500_000, (top or 0) + 1)

    def spawn(self, name: str, *args: str) -> None:
        self.commands[name] = args
        log_file = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - child owns it
        command = [sys.executable, "-m", "sing.cli", "--config", str(self.config), *args]
        self.children[name] = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            cwd=self.home,
        )
        log.info("started %s (pid %d)", name, self.children[name].pid)

    def write_devices(self) -> Path:
        """The fake GPUs the exporter serves: the built-in node with the seeded history's model,
        memory and count, so each node keeps one inventory version from history to live."""
        seeded = {
            "model": synthetic.GPU_MODEL,
            "memory_total": synthetic.GPU_MEMORY,
            "count": self.o.gpus_per_node,
        }
        path = self.home / "devices.yaml"
        description = load_yaml(DEFAULT_DESCRIPTION, "fake device description") | seeded
        path.write_text(yaml.safe_dump(description, sort_keys=False))
        return path

    def start_children(self) -> None:
        nodes = [
            f"--node={name}:{self.o.port_base + n}"
            for n, name in enumerate(node_names(self.o.nodes))
        ]
        self.spawn(
            "exporter",
            "exporter",
            "--fake",
            str(self.write_devices()),
            "--fake-state",
            str(self.home / "state.json"),
            "--fake-root",
            str(self.home / "fake-nodes"),
            "--listen-address",
            "127.0.0.1",
            *nodes,
        )
        self.spawn("collector", "collector")
        if self.o.dashboard:
            self.spawn(
                "dashboard",
                "dashboard",
                "--demo",
                "--address",
                "127.0.0.1",
                "--port",
                str(self.o.dashboard_port),
            )

    def run(self) -> int:
        self.prepare()
        cluster = LiveCluster(
            self.home / "state.json",
            self.home / "jobs.json",
            nodes=self.o.nodes,
            gpus_per_node=self.o.gpus_per_node,
            speed=self.o.speed,
            seed=self.o.seed + int(time.time()),
            first_job_id=self.first_job_id(),
        )
        now = now_utc()
        idle = cluster.inject_idle_multinode_job(now)
        Warehouse(self.warehouse).append(
            "gpu_samples", cluster.history(idle, now, self.o.interval_s)
        )
        cluster.tick(now)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop.set())
        self.start_children()
        if self.o.dashboard:
            print(f"sing demo: dashboard at http://127.0.0.1:{self.o.dashboard_port}", flush=True)
        print(f"sing demo: files in {self.home}; Ctrl-C stops everything", flush=True)
        print(
            f"sing demo: ask it from another shell: sing --config {self.config} report idle "
            "--running (or any sing command)",
            flush=True,
        )
        deadline = time.monotonic() + self.o.duration_s if self.o.duration_s else None
        try:
            while not self.stop.wait(1.0):
                cluster.tick(now_utc())
                self.revive_children()
                if deadline and time.monotonic() > deadline:
                    break
        finally:
            self.shutdown()
        return 0

    def revive_children(self) -> None:
        """Restart a child that died (a crash, an OOM kill), a few times, like a supervisor."""
        for name, child in list(self.children.items()):
            if child.poll() is None:
                continue
            count = self.restarts[name] = self.restarts.get(name, 0) + 1
            log.error("%s exited with %s (see %s/logs)", name, child.returncode, self.home)
            if count > MAX_RESTARTS:
                log.error("%s keeps dying; stopping the demo", name)
                self.stop.set()
                return
            self.spawn(name, *self.commands[name])

    def shutdown(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + 15
        for name, child in self.children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop on SIGTERM; killing it", name)
                child.kill()
                child.wait()
        print("sing demo: stopped", flush=True)


def end_unfinished(wh: Warehouse, at: datetime | None) -> None:
    """End the seeded jobs still running or pending where the history stops (at `at`): the live
    cluster does not run them, so they would hold their GPUs in every report for ever."""
    if at is None:
        return
    con = wh.connect()
    try:
        jobs = con.sql("SELECT * FROM jobs WHERE end_time IS NULL").pl()
        held = con.sql(
            "SELECT g.* FROM job_gpus g JOIN jobs j USING (cluster, job_id) "
            "WHERE j.end_time IS NULL"
        ).pl()
    finally:
        con.close()
    ended = pl.lit(at, pl.Datetime("us", "UTC"))
    started = pl.col("start_time").is_not_null()
    wh.append(
        "jobs",
        jobs.drop("recorded_at").with_columns(
            end_time=ended,
            state=pl.when(started).then(pl.lit("COMPLETED")).otherwise(pl.lit("CANCELLED")),
            exit_code=pl.lit(0, pl.Int32),
        ),
    )
    wh.append("job_gpus", held.drop("recorded_at").with_columns(end_time=ended))


def children_of(pid: int) -> list[int]:
    """Direct children of a process, from /proc (no procps needed on a bare machine)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def default_home() -> Path:
    return Path(os.environ.get("SING_DEMO_HOME", "var/demo")).resolve()
