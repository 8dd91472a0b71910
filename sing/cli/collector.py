"""`sing collector`: keep the warehouse current from the exporters (or a Prometheus server)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable

from sing.collector import inventory
from sing.collector.client import ScrapeClient
from sing.collector.jobsync import load_job_sync
from sing.collector.leader import Leadership
from sing.collector.lean import keep_process_lean
from sing.collector.plugins import load_source
from sing.collector.pull import PrometheusPull
from sing.collector.selfmetrics import SelfMetrics
from sing.collector.service import Collector, run_forever
from sing.collector.settings import CollectorSettings
from sing.collector.shard import Shard
from sing.collector.targets import FileSD, Target, slurm_targets, target_from
from sing.config import Config
from sing.errors import UserError
from sing.policy.settings import PolicySettings
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collector",
        description="Scrape node exporters (sing, dcgm-exporter, node_exporter) or pull from a "
        "Prometheus server into the warehouse every interval; sync job records; compact.",
    )
    p.add_argument("--once", action="store_true", help="run one round (and one job sync), exit")
    p.add_argument("--file-sd", help="Prometheus file_sd JSON/YAML target file")
    p.add_argument(
        "--target", action="append", help="HOST:PORT or URL to scrape (repeatable)", default=[]
    )
    p.add_argument("--pull", metavar="URL", help="read from this Prometheus server instead")
    p.add_argument("--interval", type=float, help="seconds between rounds")
    p.add_argument(
        "--shard", metavar="K/N", help="scrape only shard K of N of the targets (by node name)"
    )
    p.add_argument("--metrics-port", type=int, help="port of the collector's own /metrics (0: off)")
    p.set_defaults(func=run)


def settings_from(args: argparse.Namespace, config: Config) -> CollectorSettings:
    """The [collector] section with the command-line options applied over it."""
    s = config.section("collector", CollectorSettings)
    overrides = {
        "file_sd": args.file_sd,
        "targets": tuple(args.target) or None,
        "prometheus_url": args.pull,
        "interval_s": args.interval,
        "shard": args.shard,
        "metrics_port": args.metrics_port,
    }
    return dataclasses.replace(s, **{k: v for k, v in overrides.items() if v is not None})


def target_source(settings: CollectorSettings, config: Config) -> Callable[[], list[Target]]:
    """A callable giving the current targets of this collector's shard, from the first
    configured source, each with the [collector]'s TLS and basic auth settings."""
    client = ScrapeClient.from_settings(settings, config)
    source = _addresses(settings, config)
    shard = Shard.parse(settings.shard)
    return lambda: [dataclasses.replace(t, client=client) for t in source() if shard.owns(t.node)]


def _addresses(settings: CollectorSettings, config: Config) -> Callable[[], list[Target]]:
    scheme = settings.scheme
    if settings.file_sd:
        file_sd = FileSD(config.resolve_path(settings.file_sd), scheme)
        return file_sd.targets
    if settings.slurm_targets:
        return lambda: slurm_targets(settings.exporter_port, scheme=scheme)
    if not settings.targets:
        raise UserError("[collector] lists no targets: set file_sd, slurm_targets or targets")
    fixed: list[Target] = [target_from(t, scheme=scheme) for t in settings.targets]
    return lambda: fixed


def run(args: argparse.Namespace, config: Config) -> int:
    keep_process_lean()
    settings = settings_from(args, config)
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    warehouse.require_writable()  # the first round creates a new site's warehouse
    metrics = SelfMetrics()
    collector = Collector(
        config,
        settings,
        warehouse,
        targets=(lambda: []) if settings.prometheus_url else target_source(settings, config),
        job_sync=load_job_sync(settings.job_sync, config),
        node_source=load_source(
            settings.node_inventory, config, inventory.DEFAULT, "node_inventory"
        ),
        metrics=metrics,
        # One round syncs jobs itself; a running collector only while it leads.
        leadership=None
        if args.once
        else Leadership(warehouse, settings.leader_lease_ttl_s, metrics),
    )
    if settings.shard:
        log.info("shard %s: scraping the targets whose node name hashes to it", settings.shard)
    if settings.prometheus_url:
        round_job = PrometheusPull(collector, settings.prometheus_url).pull_round
    else:
        round_job = collector.scrape_round
    if args.once:
        collector.sync_jobs()
        summary = round_job()
        collector.close()
        print(
            f"{summary.up}/{summary.targets} targets up, {summary.rows} rows written "
            f"in {summary.seconds:.2f} s"
        )
        return 0 if summary.up or not summary.targets else 1
    if settings.metrics_port:
        collector.metrics.serve(settings.metrics_address, settings.metrics_port)
        log.info(
            "collector metrics on http://%s:%d/metrics",
            settings.metrics_address,
            settings.metrics_port,
        )
    # Incident detection loads only for a long-running collector.
    from sing.health.detect import detection_job

    run_forever(
        collector,
        round_job,
        scheduled_policy(config, warehouse),
        detection_job(config, warehouse, pull=bool(settings.prometheus_url)),
    )
    return 0


def scheduled_policy(
    config: Config, warehouse: Warehouse
) -> tuple[Callable[[], object], float] | None:
    """The policy round and its interval, None without rules or reports. The engine is imported
    only where there is one to run: it loads polars (31 MB of a collector's memory)."""
    if not config.section("policy", PolicySettings).has_work():
        return None
    from sing.cli.policy import policy_job

    return policy_job(config, warehouse)
