"""`sing doctor node|head`: check a GPU node or a head node and say what is misconfigured.

Each check returns OK, WARN or FAIL with one line saying what was seen and what to do. The
command exits 1 when any check fails, so it fits a deployment script or a cron mail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sing.config import Config, ConfigError

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True)
class Finding:
    status: str
    check: str
    detail: str


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="check a GPU node or the head node's setup")
    p.add_argument("role", choices=("node", "head"), help="what this machine is")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, config: Config) -> int:
    checks = NODE_CHECKS if args.role == "node" else HEAD_CHECKS
    findings = [check_config(config)]
    for check in checks:
        try:
            findings.append(check(args, config))
        except Exception as err:  # a check that breaks is itself a finding, not a crash
            findings.append(Finding(FAIL, check.__name__, f"check raised {err!r}"))
    for f in findings:
        print(f"{f.status:4}  {f.check:22} {f.detail}")
    return 1 if any(f.status == FAIL for f in findings) else 0


def check_config(config: Config) -> Finding:
    """Every section of the site file must parse against its owner's settings."""
    from collector.settings import CollectorSettings
    from exporters.settings import ExporterSettings

    schemas = {"collector": CollectorSettings, "exporter": ExporterSettings}
    where = str(config.path) if config.path else "built-in defaults (no sing.toml found)"
    try:
        config.site  # noqa: B018 - validates [site]
        config.thresholds  # noqa: B018
        for name, schema in schemas.items():
            config.section(name, schema)
    except ConfigError as err:
        return Finding(FAIL, "config", str(err))
    return Finding(OK, "config", f"read {where}")


def exporter_settings(config: Config):
    from exporters.settings import ExporterSettings

    return config.section("exporter", ExporterSettings)


def check_nvml(args: argparse.Namespace, config: Config) -> Finding:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as err:
        return Finding(
            FAIL, "nvml", f"NVML unavailable ({err}); install the NVIDIA driver on this node"
        )
    if count == 0:
        return Finding(FAIL, "nvml", "NVML sees no GPU")
    return Finding(OK, "nvml", f"{count} GPU(s), driver {driver}")


def check_job_mapping(args: argparse.Namespace, config: Config) -> Finding:
    directory = Path(exporter_settings(config).job_mapping_dir)
    if not directory.is_dir():
        return Finding(
            WARN,
            "gpu-job mapping",
            f"{directory} does not exist: install exporters/deploy/slurm-prolog.sh and "
            "slurm-epilog.sh as Slurm's Prolog/Epilog, or GPUs without a process go unattributed",
        )
    bad = []
    for entry in directory.iterdir():
        text = entry.read_text().split()
        if not entry.name.isdigit() or not all(t.replace("_", "").isdigit() for t in text):
            bad.append(entry.name)
    if bad:
        return Finding(FAIL, "gpu-job mapping", f"unexpected files in {directory}: {bad[:5]}")
    running = _slurm_running_jobs()
    mapped = {t for e in directory.iterdir() for t in e.read_text().split()}
    if running is not None and mapped - running:
        stale = sorted(mapped - running)[:5]
        return Finding(
            FAIL,
            "gpu-job mapping",
            f"maps GPUs to jobs Slurm does not run here: {stale}; is the epilog installed?",
        )
    return Finding(OK, "gpu-job mapping", f"{directory}: {len(mapped)} job(s) mapped")


def _slurm_running_jobs() -> set[str] | None:
    if shutil.which("squeue") is None:
        return None
    result = subprocess.run(
        ["squeue", "-h", "-t", "R", "-w", os.uname().nodename, "-o", "%A"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return set(result.stdout.split()) if result.returncode == 0 else None


def check_rdma(args: argparse.Namespace, config: Config) -> Finding:
    base = Path(exporter_settings(config).sysfs_root) / "class" / "infiniband"
    counters = sorted(base.glob("*/ports/*/counters/port_xmit_data"))
    if not counters:
        return Finding(WARN, "rdma counters", f"no InfiniBand/RoCE devices under {base}")
    unreadable = []
    for path in counters:
        try:
            int(path.read_text().strip())
        except (OSError, ValueError):
            unreadable.append(str(path))
    if unreadable:
        return Finding(FAIL, "rdma counters", f"cannot read {unreadable[0]} (permissions?)")
    return Finding(OK, "rdma counters", f"{len(counters)} port(s) readable under {base}")


def check_exporter(args: argparse.Namespace, config: Config) -> Finding:
    port = exporter_settings(config).port
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    except OSError as err:
        return Finding(
            FAIL, "exporter", f"{url}: {err}; start it: systemctl enable --now sing-exporter"
        )
    if "sing_gpu_info" not in body:
        return Finding(WARN, "exporter", f"{url} answers but shows no GPU (sing_gpu_info)")
    return Finding(OK, "exporter", f"{url} serves GPU metrics")


def check_warehouse(args: argparse.Namespace, config: Config) -> Finding:
    from warehouse.migrations import CURRENT_VERSION
    from warehouse.store import Warehouse

    root = config.warehouse_dir(args.warehouse)
    try:
        wh = Warehouse(root)
        probe = root / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        return Finding(FAIL, "warehouse", f"{root} is not writable: {err}")
    con = wh.connect()
    (jobs,) = con.execute("SELECT count(*) FROM jobs").fetchone()
    return Finding(OK, "warehouse", f"{root} writable, schema v{CURRENT_VERSION}, {jobs} jobs")


def check_sacct(args: argparse.Namespace, config: Config) -> Finding:
    from executors.base import executor_settings

    if executor_settings(config).kind != "slurm":
        return Finding(OK, "job records", "executor is not Slurm; sacct not needed")
    if shutil.which("sacct") is None:
        return Finding(FAIL, "job records", "sacct not found: install slurm-client here")
    result = subprocess.run(
        ["sacct", "-n", "-X", "-S", "now-1hour", "-o", "JobID"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        return Finding(FAIL, "job records", f"sacct failed: {result.stderr.strip()[:200]}")
    return Finding(OK, "job records", f"sacct answers ({len(result.stdout.split())} jobs, 1 h)")


def check_targets(args: argparse.Namespace, config: Config) -> Finding:
    from collector.cli import target_source
    from collector.settings import CollectorSettings

    settings = config.section("collector", CollectorSettings)
    targets = target_source(settings, config)()
    down = []
    for target in targets:
        try:
            with urllib.request.urlopen(target.url, timeout=3) as response:
                response.read(1)
        except OSError:
            down.append(target.node)
    if len(down) == len(targets):
        return Finding(FAIL, "scrape targets", f"none of {len(targets)} target(s) answers")
    if down:
        return Finding(WARN, "scrape targets", f"{len(down)} of {len(targets)} down: {down[:8]}")
    return Finding(OK, "scrape targets", f"all {len(targets)} target(s) answer")


NODE_CHECKS: tuple[Callable[[argparse.Namespace, Config], Finding], ...] = (
    check_nvml,
    check_job_mapping,
    check_rdma,
    check_exporter,
)
HEAD_CHECKS: tuple[Callable[[argparse.Namespace, Config], Finding], ...] = (
    check_warehouse,
    check_sacct,
    check_targets,
)
