"""The site a real-path test plays around a real Slurm: one exporter per node over fake NVML
scripted to known use, `sing collector` scraping them through file_sd targets, and ordinary
users submitting with `sing submit`.

The fake NVML's description is fixed per node when its exporter starts; the shared
`--fake-state` file (docs/exporter.md) changes GPUs while the exporters run (`script_state`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pytest

from sing.warehouse.store import Warehouse
from tests.real_path.processes import Service, run, wait_for
from tests.real_path.slurm import job_states
from tests.slurm_harness import GPUS_PER_NODE, NODES, SlurmCluster, scratch

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


class Placed(Protocol):
    use: Use  # of each of its GPUs
    placement: dict[str, list[int]]  # node -> GPU indices


def scripted_use(jobs: Iterable[Placed], node: str, gpu: int) -> Use:
    """The scripted use of one GPU: its job's, or idle when no job is placed on it."""
    for job in jobs:
        if gpu in job.placement.get(node, []):
            return job.use
    return IDLE


@contextlib.contextmanager
def slurm_site(
    request: pytest.FixtureRequest, prefix: str, what: str, first_job_id: int
) -> Iterator[tuple[SlurmCluster, Path, contextlib.ExitStack]]:
    """A module's scenario: a scratch directory, a real Slurm with the project's prolog in it,
    and an exit stack that stops everything the scenario starts (Slurm last).

    The scratch directory (logs of every process, the warehouse) is kept when a test of the
    module failed, its path given in a warning; MariaDB's files are removed either way.
    """
    base = scratch(prefix)
    cluster = SlurmCluster(base / "slurm", gpu_job_mapping=True, first_job_id=first_job_id)
    failed_before, keep = request.session.testsfailed, True
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(cluster.down)
            cluster.up()
            yield cluster, base, stack
            keep = request.session.testsfailed > failed_before
    finally:
        shutil.rmtree(base / "slurm" / "mysql", ignore_errors=True)
        if keep:
            warnings.warn(f"{what}: logs and warehouse kept in {base}", stacklevel=1)
        else:
            shutil.rmtree(base, ignore_errors=True)


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
            PYTHON, "-m", "sing.exporters", "--fake", str(fake), "--node", f"{node}:{port}",
            "--listen-address", "127.0.0.1", "--cache-seconds", "0",
            "--sysfs-root", str(base / "sys" / node),
            "--job-mapping-dir", str(cluster.mapping_dir(node)),
            "--fake-state", str(base / "fake-state.json"),
        ],
        base / f"exporter-{node}.log",
        env,
    )  # fmt: skip


def start_exporters(
    cluster: SlurmCluster, base: Path, env: dict[str, str], ports: dict[str, int],
    use_of: Callable[[str, int], Use], stack: contextlib.ExitStack,
) -> list[Service]:  # fmt: skip
    """One exporter per node (`ports`: node -> port), GPU `i` of `node` doing `use_of(node,
    i)`; returns once every one serves its GPUs. The stack stops them."""
    services = []
    for node, port in ports.items():
        nvml = description(lambda gpu, node=node: use_of(node, gpu))
        service = start_exporter(cluster, base, node, port, env, nvml)
        stack.callback(service.stop)
        services.append(service)
    for port in ports.values():
        wait_for(lambda port=port: exporter_ready(port), f"exporter on :{port}", 60, services)
    return services


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

    def submit(
        self, user: str, name: str, profile: str, nodes: int, services: list[Service]
    ) -> str:
        """Submit the job profile `profile` (YAML, docs/executors.md) as `user`; its id, once
        it runs with its GPUs on all its `nodes` mapped by the prolog."""
        path = self.profiles / f"{name}.yaml"
        path.write_text(profile)
        path_var = f"{self.shim.parent}:{os.environ['PATH']}"
        env = {**self.env, "SUBMIT_AS": user, "PATH": path_var}
        out = run([SING, "--config", str(self.config), "submit", str(path)], env,
                  self.cluster.jobs_dir)  # fmt: skip
        job_id = out.split()[-1]
        wait_for(
            lambda: (
                job_states(self.env).get(job_id) == "RUNNING"
                and len(mapping_files(self.cluster).get(job_id, {})) == nodes
            ),
            f"job {name} ({job_id}) to run with its GPUs mapped by the prolog",
            60,
            services,
        )
        return job_id
