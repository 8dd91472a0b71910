"""`sing doctor node|head`: check a GPU node or a head node and say what is misconfigured.

Each check returns OK, WARN or FAIL with one line saying what was seen and what to do. The
command exits 1 when any check fails, so it fits a deployment script or a cron mail.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sing.collector.client import PayloadError, fetch
from sing.config import Config, ConfigError
from sing.digits import ascii_digits
from sing.errors import UserError

if TYPE_CHECKING:
    from sing.collector.client import ScrapeClient
    from sing.collector.settings import CollectorSettings
    from sing.collector.targets import Target
    from sing.executors.slurm import Runner
    from sing.exporters.settings import ExporterSettings
    from sing.exporters.webconfig import WebConfig

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True)
class Finding:
    status: str
    check: str
    detail: str


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor")
    p.add_argument("role", choices=("node", "head"), help="what this machine is")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, config: Config) -> int:
    checks = NODE_CHECKS if args.role == "node" else HEAD_CHECKS
    findings = [check_config(config)]
    for check in checks:
        try:
            findings.append(check(args, config))
        except (ConfigError, UserError) as err:  # said once by the config finding, in words
            findings.append(Finding(FAIL, check.__name__, f"not checked: {err}"))
        except Exception as err:  # a check that breaks is itself a finding, not a crash
            findings.append(Finding(FAIL, check.__name__, f"check raised {err!r}"))
    for f in findings:
        print(f"{f.status:4}  {f.check:22} {f.detail}")
    return 1 if any(f.status == FAIL for f in findings) else 0


def check_config(config: Config) -> Finding:
    """Every section of the site file must parse against its owner's settings."""
    from sing.collector.settings import CollectorSettings
    from sing.exporters.settings import ExporterSettings

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


def exporter_settings(config: Config) -> ExporterSettings:
    from sing.exporters.settings import ExporterSettings

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
            f"{directory} does not exist: install sing/exporters/deploy/slurm-prolog.sh and "
            "slurm-epilog.sh as Slurm's Prolog/Epilog, or GPUs without a process go unattributed",
        )
    bad = []
    for entry in directory.iterdir():
        text = entry.read_text().split()
        if not ascii_digits(entry.name) or not all(ascii_digits(t.replace("_", "")) for t in text):
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
    """Fetch this node's page as the collector would: over the scheme the exporter's web config
    sets, with the [collector]'s CA and credentials when this file has them."""
    from sing.collector.client import PLAIN
    from sing.collector.settings import CollectorSettings
    from sing.exporters.webconfig import WebConfigError

    settings = exporter_settings(config)
    try:
        web = _web_config(settings, config)
    except WebConfigError as err:
        return Finding(FAIL, "exporter", f"{err}; the exporter will not start with it")
    scheme = "https" if web.tls else "http"
    url = f"{scheme}://{_local_host(settings.listen_address)}:{settings.port}/metrics"
    collector = config.section("collector", CollectorSettings)
    try:
        client = _own_exporter_client(collector, config) if web.tls or web.users else PLAIN
    except UserError as err:
        return Finding(WARN, "exporter", f"{url} is {web.describe()}; cannot check it: {err}")
    try:
        body = fetch(url, collector.scrape_timeout_s, collector.max_payload_bytes, client)
    except FETCH_ERRORS as err:
        problem = diagnose(err, url, collector)
        return Finding(WARN if problem.setting_missing else FAIL, "exporter", f"{url}: {problem}")
    if "sing_gpu_info" not in body:
        return Finding(WARN, "exporter", f"{url} answers but shows no GPU (sing_gpu_info)")
    protected = f" ({web.describe()})" if settings.web_config_file else ""
    return Finding(OK, "exporter", f"{url} serves GPU metrics{protected}")


def check_exporter_access(args: argparse.Namespace, config: Config) -> Finding:
    """The page names users and their jobs: warn when the network can read it in clear."""
    from sing.exporters.cli import exposure_warning
    from sing.exporters.webconfig import WebConfigError

    settings = exporter_settings(config)
    try:
        web = _web_config(settings, config)
    except WebConfigError as err:
        return Finding(FAIL, "exporter access", f"cannot tell: {err}")
    if warning := exposure_warning(settings.listen_address, web):
        return Finding(WARN, "exporter access", f"{warning}; set [exporter] web_config_file")
    return Finding(OK, "exporter access", f"listens on {settings.listen_address}: {web.describe()}")


def _web_config(settings: ExporterSettings, config: Config) -> WebConfig:
    """The exporter's web config as `sing exporter` reads it (relative to the config file)."""
    from sing.exporters.webconfig import WebConfig, load_web_config

    if not settings.web_config_file:
        return WebConfig()
    return load_web_config(config.resolve_path(settings.web_config_file))


def _own_exporter_client(collector: CollectorSettings, config: Config) -> ScrapeClient:
    """The collector's client without its host name check: this node reaches its exporter
    through its listen address, the collector by whatever name it knows the node by (which
    `sing doctor head` checks against the certificate)."""
    from sing.collector.client import ScrapeClient

    client = ScrapeClient.from_settings(collector, config)
    tls = client.tls or ssl.create_default_context()  # a context of our own, never the shared one
    tls.check_hostname = False
    return replace(client, tls=tls)


def _local_host(address: str) -> str:
    """How this node reaches its own exporter listening on `address`, written for a URL: a
    wildcard address through loopback, an IPv6 address in brackets."""
    address = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)
    return f"[{address}]" if ":" in address else address


def check_warehouse(args: argparse.Namespace, config: Config) -> Finding:
    from sing.warehouse.migrations import CURRENT_VERSION
    from sing.warehouse.store import Warehouse

    root = config.warehouse_dir(args.warehouse)
    try:
        wh = Warehouse(root)
        wh.require_writable()  # creates a new site's warehouse, as its first round would
        if isinstance(root, Path):  # an object store was written already: its commit probe
            probe = root / ".doctor-probe"
            probe.write_text("ok")
            probe.unlink()
    except (OSError, UserError) as err:
        return Finding(FAIL, "warehouse", f"{root} is not writable: {err}")
    con = wh.connect()
    (jobs,) = con.execute("SELECT count(*) FROM jobs").fetchone()
    return Finding(OK, "warehouse", f"{root} writable, schema v{CURRENT_VERSION}, {jobs} jobs")


def check_sacct(args: argparse.Namespace, config: Config) -> Finding:
    from sing.executors.base import executor_settings

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


# TRES that Slurm accounts whatever slurm.conf says: `scontrol show config` lists them always.
SLURM_DEFAULT_TRES = ("cpu", "mem", "energy", "node", "billing", "fs/disk", "vmem", "pages")


def check_gpu_accounting(
    args: argparse.Namespace, config: Config, run: Runner | None = None
) -> Finding:
    """Slurm puts GPUs into job TRES (sacct, sreport, finished jobs' GPU counts) only when
    `gres/gpu` is in AccountingStorageTRES, which is not the default: say the line to add."""
    from sing.executors.base import executor_settings
    from sing.executors.slurm import SlurmExecutor
    from sing.executors.slurm_parse import config_value

    settings = executor_settings(config)
    if settings.kind != "slurm":
        return Finding(OK, "gpu accounting", "executor is not Slurm")
    try:
        shown = SlurmExecutor(config.site.cluster, settings, run).show_config()
    except UserError as err:
        return Finding(WARN, "gpu accounting", f"cannot read scontrol show config: {err}")
    tres = config_value(shown, "AccountingStorageTRES")
    if tres is None:
        return Finding(WARN, "gpu accounting", "scontrol show config has no AccountingStorageTRES")
    tracked = [t.strip() for t in tres.split(",") if t.strip()]
    if "gres/gpu" in tracked:
        return Finding(OK, "gpu accounting", "Slurm accounts GPUs (AccountingStorageTRES)")
    extra = [t for t in tracked if t not in SLURM_DEFAULT_TRES]
    line = "AccountingStorageTRES=" + ",".join([*extra, "gres/gpu"])
    return Finding(
        WARN,
        "gpu accounting",
        f"AccountingStorageTRES ({tres}) lacks gres/gpu, so Slurm accounts no GPU of any job "
        "(sing counts running jobs' GPUs from gres_detail, and finished jobs' only where it saw "
        f"them run); add this line to slurm.conf, then restart slurmdbd and slurmctld: {line}",
    )


FAILURE_WINDOW = timedelta(hours=1)


def check_slurm_commands(args: argparse.Namespace, config: Config) -> Finding:
    """Scheduler commands that timed out or failed within the last hour, as the collector
    recorded them in `command_failures`: a hung slurmctld stalls job sync, policy rounds and
    drains, and says so only here and in the collector's log and /metrics."""
    from sing.executors.base import TIMEOUT
    from sing.warehouse.store import Warehouse

    since = datetime.now(UTC) - FAILURE_WINDOW
    try:
        con = Warehouse(config.warehouse_dir(args.warehouse)).connect(
            {"command_failures": since.date()}
        )
    except OSError as err:
        return Finding(WARN, "slurm commands", f"cannot read the warehouse: {err}")
    rows = con.execute(
        """
        SELECT command, reason, count(*), max(ts), arg_max(error, ts)
        FROM command_failures WHERE ts >= $since
        GROUP BY ALL ORDER BY max(ts) DESC
        """,
        {"since": since},
    ).fetchall()
    if not rows:
        return Finding(OK, "slurm commands", "none timed out or failed in the last hour")
    said = [
        f"{command} {'timed out' if reason == TIMEOUT else 'failed'} {times} "
        f"time{'s' if times != 1 else ''} in the last hour, last at {last:%Y-%m-%d %H:%M:%S} UTC"
        for command, reason, times, last, _ in rows
    ]
    newest_error = rows[0][4]
    return Finding(WARN, "slurm commands", f"{'; '.join(said)} ({newest_error})")


def check_policy_reach(args: argparse.Namespace, config: Config) -> Finding:
    """A real ladder (a rule with dry_run = false) needs a channel to every job's owner: the
    collector and `sing policy run` refuse to start without one, so say it here first."""
    from sing.policy.postman import unreached_owners
    from sing.policy.rules import load_rules
    from sing.policy.settings import PolicySettings

    settings = config.section("policy", PolicySettings)
    problem = unreached_owners(settings)
    if problem:
        return Finding(FAIL, "policy channels", problem)
    acting = [r.name for r in load_rules(settings) if r.acts(settings)]
    if not acting:
        return Finding(OK, "policy channels", "no rule acts for real (dry run)")
    return Finding(OK, "policy channels", f"{', '.join(acting)} act; owners are reached")


def check_targets(args: argparse.Namespace, config: Config) -> Finding:
    """Fetch every target with the collector's own client, settings and limits."""
    from sing.cli.collector import target_source
    from sing.collector.settings import CollectorSettings

    try:
        settings = config.section("collector", CollectorSettings)
        targets = target_source(settings, config)()
    except UserError as err:
        return Finding(FAIL, "scrape targets", str(err))
    if not targets:
        return Finding(FAIL, "scrape targets", "no targets: the file_sd file lists none")
    with ThreadPoolExecutor(min(settings.concurrency, len(targets))) as pool:
        problems = list(pool.map(lambda t: _probe(t, settings), targets))
    down: dict[Problem, list[str]] = {}
    for target, problem in zip(targets, problems, strict=True):
        if problem is not None:
            down.setdefault(problem, []).append(target.node)
    if not down:
        return Finding(OK, "scrape targets", f"all {len(targets)} target(s) answer")
    # The commonest problem first: with hundreds of nodes the line must stay one line.
    groups = sorted(down.items(), key=lambda item: -len(item[1]))
    shown = " | ".join(f"{', '.join(nodes[:8])}: {problem}" for problem, nodes in groups[:3])
    if len(groups) > 3:
        shown += f" (and {len(groups) - 3} other problems)"
    failed = sum(len(nodes) for nodes in down.values())
    if failed == len(targets):
        return Finding(FAIL, "scrape targets", f"none of {failed} target(s) answers: {shown}")
    return Finding(WARN, "scrape targets", f"{failed} of {len(targets)} down: {shown}")


def _probe(target: Target, settings: CollectorSettings) -> Problem | None:
    """What stops the collector scraping `target`, or None when nothing does."""
    from sing.collector.convert import WANTED
    from sing.collector.promtext import ParseError, parse

    try:
        text = fetch(
            target.url, settings.scrape_timeout_s, settings.max_payload_bytes, target.client
        )
        parse(text, WANTED)
    except ParseError as err:
        return Problem(f"malformed payload: {err}", "is this a Prometheus exporter?")
    except FETCH_ERRORS as err:
        return diagnose(err, target.url, settings)
    return None


@dataclass(frozen=True)
class Problem:
    """Why a page could not be fetched, and the one change that fixes it."""

    cause: str
    fix: str
    setting_missing: bool = False  # [collector] lacks a setting the exporter needs

    def __str__(self) -> str:
        return f"{self.cause}; {self.fix}"


FETCH_ERRORS = (OSError, http.client.HTTPException, PayloadError)
HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH = 62, 64  # OpenSSL's X509_V_ERR_* codes


def diagnose(err: Exception, url: str, settings: CollectorSettings) -> Problem:
    """Turn an error of `sing.collector.client.fetch` into what went wrong and how to fix it."""
    if isinstance(err, PayloadError) and str(err).startswith("HTTP 401"):
        if not settings.basic_auth_username:
            return Problem(
                "HTTP 401, basic auth is on",
                "the collector needs [collector] basic_auth_username and basic_auth_password_file",
                setting_missing=True,
            )
        return Problem(
            f"HTTP 401, wrong credentials for user {settings.basic_auth_username!r}",
            "put that user's password from the exporter's basic_auth_users in "
            f"[collector] basic_auth_password_file ({settings.basic_auth_password_file})",
        )
    if isinstance(err, ssl.SSLCertVerificationError):
        seen = err.verify_message.rstrip(".")
        if err.verify_code in (HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH):
            return Problem(
                f"TLS: {seen}",
                "reach the exporter by a name its certificate holds, or add this one to it",
            )
        if settings.tls_ca_file:
            return Problem(
                f"TLS verify failed ({seen}): wrong CA",
                f"[collector] tls_ca_file ({settings.tls_ca_file}) must be the CA that signed "
                "the exporter's cert_file",
            )
        return Problem(
            f"TLS is on and the system store does not trust the certificate ({seen})",
            'the collector needs [collector] scheme = "https" and tls_ca_file = the CA that '
            "signed the exporter's cert_file",
            setting_missing=True,
        )
    if isinstance(err, ssl.SSLError):
        reason = err.reason or ""
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE"):
            return Problem(
                "speaks plain HTTP, not TLS",
                'set scheme = "http" (file_sd: __scheme__), or give the exporter a '
                "tls_server_config",
            )
        if "CERTIFICATE_REQUIRED" in reason:
            return Problem(
                "the exporter requires a client certificate",
                "set [collector] tls_cert_file and tls_key_file",
                setting_missing=not settings.tls_cert_file,
            )
        if "ALERT" in reason:
            return Problem(
                f"the exporter refused the TLS connection ({reason})",
                "[collector] tls_cert_file must be signed by the exporter's client_ca_file",
            )
        return Problem(f"TLS failed: {err}", "compare tls_server_config with [collector] tls_*")
    if isinstance(err, ConnectionRefusedError):
        return Problem(
            "connection refused",
            "start it (systemctl enable --now sing-exporter); check its listen_address and port",
        )
    if isinstance(err, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
        if url.startswith("http:"):
            return Problem(
                "closed the connection without answering",
                'if the exporter has a tls_server_config, set [collector] scheme = "https"',
            )
        return Problem(
            "closed the connection after the TLS handshake",
            "it requires a client certificate: set [collector] tls_cert_file and tls_key_file "
            "to one signed by its client_ca_file (naming one of its client_allowed_sans)",
            setting_missing=not settings.tls_cert_file,
        )
    if isinstance(err, TimeoutError):
        return Problem(
            f"no answer within {settings.scrape_timeout_s:g} s",
            "check the firewall between here and the exporter, and the exporter's load",
        )
    if isinstance(err, socket.gaierror):
        return Problem(f"cannot resolve the host ({err.strerror})", "fix the target's host name")
    return Problem(f"{type(err).__name__}: {err}", "see the exporter's log")


NODE_CHECKS: tuple[Callable[[argparse.Namespace, Config], Finding], ...] = (
    check_nvml,
    check_job_mapping,
    check_rdma,
    check_exporter,
    check_exporter_access,
)
HEAD_CHECKS: tuple[Callable[[argparse.Namespace, Config], Finding], ...] = (
    check_warehouse,
    check_sacct,
    check_gpu_accounting,
    check_slurm_commands,
    check_policy_reach,
    check_targets,
)
