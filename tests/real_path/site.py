"""The site a real-path test plays around a real Slurm: one exporter per node over fake NVML
scripted to known use, `sing collector` scraping them through file_sd targets, and ordinary
users submitting with `sing submit`.

The fake NVML's description is fixed per node when its exporter starts; the shared
`--fake-state` file (docs/exporter.md) changes GPUs while the exporters run (`script_state`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.real_path.processes import Service, run, wait_for
from tests.slurm_harness import GPUS_PER_NODE, NODES, SlurmCluster
from warehouse.store import Warehouse

PYTHON = sys.executable
SING = str(Path(sys.executable).with_name("sing"))
MODEL = "NVIDIA A100-SXM4-80GB"
GPU_MEMORY = 80 * 2**30


@dataclass(frozen=True)
class Use:
    """What a GPU does: the fake NVML's scripted values (SI units)."""

    util: float
    sm_active: float
    power_w: float
    memory_used: int

    def fields(self) -> dict[str, float | int]:
        return {
            "util": self.util,
            "sm_active": self.sm_active,
            "power_w": self.power_w,
            "memory_used": self.memory_used,
        }


IDLE = Use(util=0.0, sm_active=0.0, power_w=60.0, memory_used=0)


def description(use_of: Callable[[int], Use]) -> dict[str, Any]:
    """The fake NVML device description of one node whose GPU `i` does `use_of(i)`."""
    return {
        "model": MODEL,
        "count": GPUS_PER_NODE,
        "memory_total": GPU_MEMORY,
        "driver_version": "535.129.03",
        "defaults": {
            "energy_j": 5.0e6,  # the driver's counter since it loaded; grows by power_w
            "temperature_c": 35,
            "sm_clock_hz": 1.41e9,
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            "mig_mode": 0,
            "processes": [],
            "xids": {},
        },
        "gpus": {str(i): use_of(i).fields() for i in range(GPUS_PER_NODE)},
    }


def script_state(path: Path, nodes: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Replace the exporters' `--fake-state` file whole: node -> GPU index -> keys to override
    (a `Use`'s fields, `driver_loaded_at`, ...); the exporters re-read it when it changes."""
    state = {"nodes": {node: {"gpus": gpus} for node, gpus in nodes.items()}}
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(state))
    os.replace(staged, path)


def mapping_files(cluster: SlurmCluster) -> dict[str, dict[str, list[int]]]:
    """Job id -> node -> GPU indices, as the prolog wrote them (one file per GPU index)."""
    jobs: dict[str, dict[str, list[int]]] = {}
    for node in NODES:
        directory = cluster.mapping_dir(node)
        for file in directory.iterdir() if directory.exists() else ():
            if file.name.isdigit():
                for job_id in file.read_text().split():
                    jobs.setdefault(job_id, {}).setdefault(node, []).append(int(file.name))
    return {j: {n: sorted(g) for n, g in a.items()} for j, a in jobs.items()}


def exporter_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return reply.read().decode().count("sing_gpu_info{") == GPUS_PER_NODE
    except OSError:
        return False


def start_exporter(
    cluster: SlurmCluster, base: Path, node: str, port: int, env: dict[str, str],
    nvml: dict[str, Any],
) -> Service:  # fmt: skip
    """One node's exporter as the systemd unit runs it, over the node's files under `base`
    (sysfs in sys/<node>, the prolog's mapping, the shared fake-state.json); not yet ready."""
    cluster.mapping_dir(node).mkdir(parents=True, exist_ok=True)  # as /run/sing/gpu-jobs
    (base / "sys" / node).mkdir(parents=True, exist_ok=True)
    fake = base / f"{node}.json"
    fake.write_text(json.dumps(nvml))
    return Service(
        [
            PYTHON, "-m", "exporters", "--fake", str(fake), "--node", f"{node}:{port}",
            "--listen-address", "127.0.0.1", "--cache-seconds", "0",
            "--sysfs-root", str(base / "sys" / node),
            "--job-mapping-dir", str(cluster.mapping_dir(node)),
            "--fake-state", str(base / "fake-state.json"),
        ],
        base / f"exporter-{node}.log",
        env,
    )  # fmt: skip


def wait_exporters(ports: dict[str, int], services: list[Service]) -> None:
    for port in ports.values():
        wait_for(lambda port=port: exporter_ready(port), f"exporter on :{port}", 60, services)


def write_targets(base: Path, ports: dict[str, int]) -> None:
    """The collector's file_sd targets (targets.json), one per node with its `node` label."""
    targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": node}}
               for node, port in ports.items()]  # fmt: skip
    (base / "targets.json").write_text(json.dumps(targets))


def start_collector(config: Path, base: Path, env: dict[str, str]) -> Service:
    return Service([SING, "--config", str(config), "collector"], base / "collector.log", env)


def up_scrapes(warehouse: Path, after: datetime) -> int:
    """The fewest successful scrapes of any node in rounds that started after `after`."""
    try:
        con = Warehouse(warehouse).connect()
        try:
            query = "SELECT node, count(*) FILTER (WHERE up AND ts > ?) FROM scrapes GROUP BY node"
            rows = dict(con.execute(query, [after]).fetchall())
        finally:
            con.close()
    except Exception:  # noqa: BLE001 - no scrapes file yet: the view may not exist
        return 0
    return min((rows.get(node, 0) for node in NODES), default=0)


class Submitter:
    """`sing submit PROFILE` as an ordinary user, the way that user would run it.

    The venv's interpreter lives under /root, out of the test users' reach, so `sing` runs as
    root and a shim `sbatch` first on its PATH submits as the user: the job is the user's.
    """

    def __init__(self, cluster: SlurmCluster, config: Path, base: Path, env: dict[str, str]):
        self.cluster, self.config, self.env = cluster, config, env
        self.profiles = base / "profiles"
        self.profiles.mkdir()
        self.shim = base / "bin" / "sbatch"
        self.shim.parent.mkdir()
        sbatch = shutil.which("sbatch")
        self.shim.write_text(f'#!/bin/sh\nexec runuser -u "$SUBMIT_AS" -- {sbatch} "$@"\n')
        self.shim.chmod(0o755)

    def submit(self, user: str, name: str, profile: str) -> str:
        """Submit the job profile `profile` (YAML, docs/executors.md) as `user`; its id."""
        path = self.profiles / f"{name}.yaml"
        path.write_text(profile)
        path_var = f"{self.shim.parent}:{os.environ['PATH']}"
        env = {**self.env, "SUBMIT_AS": user, "PATH": path_var}
        out = run([SING, "--config", str(self.config), "submit", str(path)], env,
                  self.cluster.jobs_dir)  # fmt: skip
        return out.split()[-1]
