"""`sing report ...`, `sing job JOB_ID` and `sing demo-data`: analytics from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from accounting.periods import FORMS, period_window
from accounting.settings import AccountingSettings
from accounting.usage import GROUPS, method, usage
from sing import tables
from sing.config import Config
from sing.errors import UserError
from sing.tables import Column, hours
from warehouse import analytics
from warehouse.job_report import job_report, load_notes, render
from warehouse.store import Warehouse
from warehouse.synthetic import check_size, generate

NOW_HELP = "count running jobs up to this time (default: now, or the newest sample if older)"
# A warehouse whose samples stopped longer ago than this reports as of its newest sample, so
# a stale copy does not count running jobs up to today's date.
STALE_AFTER = timedelta(hours=1)


def report_now(wh: Warehouse, given: datetime | None) -> datetime:
    if given:
        return given
    wall = datetime.now(UTC)
    newest = wh.newest_time("gpu_samples")
    return newest if newest is not None and newest < wall - STALE_AFTER else wall


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="cluster, fairness and efficiency reports")
    sub = report.add_subparsers(dest="report", metavar="REPORT", required=True)
    for name, help_text in (
        ("jobs", "per-job efficiency: GPU-hours, utilization, idle GPU-hours, energy, RDMA"),
        ("by-nodes", "GPU utilization by job node count (the SING paper's headline figure)"),
        ("fairness", "GPU-hours per user vs equal share, Jain's index, queueing delay"),
        ("idle", "multi-node jobs holding GPUs they barely use, by wasted GPU-hours"),
        ("cluster", "GPU assignment rate and utilization over time"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--since", type=_time, help="window start (ISO 8601, UTC)")
        p.add_argument("--until", type=_time, help="window end (ISO 8601, UTC)")
        p.add_argument("--now", type=_time, help=NOW_HELP)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_report)
    sub.choices["by-nodes"].add_argument("--partition")
    sub.choices["idle"].add_argument("--threshold", type=float, help="mean util below this")
    sub.choices["idle"].add_argument("--min-nodes", type=int, default=2)
    sub.choices["idle"].add_argument("--running", action="store_true", help="only jobs running now")
    sub.choices["cluster"].add_argument("--bucket", choices=("hour", "day", "week"), default="day")
    add_usage(sub)

    job = subparsers.add_parser("job", help="one job's efficiency report with notes")
    job.add_argument("job_id")
    job.add_argument("--cluster", help="the job's cluster, where job ids repeat across clusters")
    job.add_argument("--now", type=_time, help=NOW_HELP)
    job.add_argument("--json", action="store_true")
    job.set_defaults(func=cmd_job)

    demo = subparsers.add_parser("demo-data", help="write a synthetic campus history")
    demo.add_argument("--nodes", type=int, default=16)
    demo.add_argument("--gpus-per-node", type=int, default=8)
    demo.add_argument("--days", type=float, default=14)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--end", type=_time, help="end of the history (default: now)")
    demo.set_defaults(func=cmd_demo_data)


def _time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time") from err
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def run_report(args: argparse.Namespace, config: Config) -> tuple[pl.DataFrame, dict]:
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    con = wh.connect()
    window = {"since": args.since, "until": args.until, "now": report_now(wh, args.now)}
    extra: dict = {}
    if args.report == "jobs":
        frame = analytics.job_usage(con, **window)
    elif args.report == "by-nodes":
        frame = analytics.utilization_by_node_count(con, partition=args.partition, **window)
    elif args.report == "fairness":
        frame, jain = analytics.fairness(con, **window)
        extra["jain_index"] = jain
    elif args.report == "idle":
        t = config.thresholds
        frame = analytics.idle_multinode_jobs(
            con,
            util_threshold=args.threshold if args.threshold is not None else t.idle_util,
            rdma_threshold=t.low_rdma_bytes_per_node_hour,
            min_nodes=args.min_nodes,
            min_hours=t.idle_job_min_hours,
            running_only=args.running,
            **window,
        )
    else:
        frame = analytics.cluster_usage(con, bucket=args.bucket, **window)
    return frame, extra


def cmd_report(args: argparse.Namespace, config: Config) -> int:
    frame, extra = run_report(args, config)
    if args.json:
        json.dump({"rows": frame.to_dicts(), **extra}, sys.stdout, default=str)
        print()
        return 0
    with pl.Config(tbl_rows=50, tbl_cols=20, fmt_str_lengths=40, tbl_width_chars=160):
        print(show_unknown(frame))
    for key, value in extra.items():
        print(f"{key}: {value:.3f}")
    for line in explain_unknown(frame):
        print(line)
    return 0


# Measured figures: NULL in one of these means sing could not know it (no samples, no node
# inventory, no job records, a saturated counter), which the human output says in words.
MEASURED = (
    "allocated_gpu_hours",
    "capacity_gpu_hours",
    "assignment_rate",
    "util",
    "sampled_assignment",
    "mean_util",
    "mean_sm_active",
    "idle_share",
    "idle_gpu_hours",
    "peak_mem_bytes",
    "energy_j",
    "rdma_tx_bytes",
    "rdma_rx_bytes",
    "rdma_bytes_per_node_hour",
    "low_rdma",
)


def show_unknown(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame for people: measured figures that are NULL print as "unknown", not "null"."""
    columns = [c for c in MEASURED if c in frame.columns and frame[c].null_count()]
    return frame.with_columns(
        pl.when(pl.col(c).is_null())
        .then(pl.lit("unknown"))
        .otherwise((pl.col(c).round(4) if frame[c].dtype.is_float() else pl.col(c)).cast(pl.String))
        .alias(c)
        for c in columns
    )


def explain_unknown(frame: pl.DataFrame) -> list[str]:
    """Why a cluster figure is unknown, and what makes it known."""
    lines = []
    if "capacity_gpu_hours" in frame.columns and frame["capacity_gpu_hours"].null_count():
        lines.append(
            f"capacity unknown for {frame['capacity_gpu_hours'].null_count()} of "
            f"{frame.height} bucket(s): no node inventory covers them, so no assignment rate "
            "there. The collector records the nodes its exporters (and sinfo) report; or "
            "import an inventory: sing warehouse import nodes FILE"
        )
    if "allocated_gpu_hours" in frame.columns and frame["allocated_gpu_hours"].null_count():
        lines.append(
            "allocations unknown: the warehouse has no job records, so no assignment rate. "
            "Sync jobs (the collector's job sync, [executor]) or import them: "
            "sing warehouse import jobs FILE"
        )
    return lines


def add_usage(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "usage",
        help="GPU-hours, charge units, energy and carbon by account, user, partition, model",
    )
    p.add_argument("--by", choices=GROUPS, default="account", help="one row per (default account)")
    p.add_argument("--since", type=_time, help="window start (ISO 8601, UTC)")
    p.add_argument("--until", type=_time, help="window end (ISO 8601, UTC)")
    p.add_argument("--period", help=f"a whole period instead of --since/--until: {FORMS}")
    p.add_argument("--cluster", help="only this cluster's jobs (default: all)")
    p.add_argument("--now", type=_time, help=NOW_HELP)
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="rows and method as JSON")
    form.add_argument("--csv", action="store_true", help="rows as CSV")
    p.set_defaults(func=cmd_usage)


USAGE_COLUMNS = (
    Column("jobs", "jobs"),
    Column("allocated_gpu_hours", "allocated GPU-h", digits=1),
    Column("used_gpu_hours", "used GPU-h", digits=1),
    Column("idle_gpu_hours", "idle GPU-h", digits=1),
    Column("unmeasured_gpu_hours", "unmeasured GPU-h", digits=1),
    Column("charge_units", "charge units", digits=1),
    Column("allocation_units", "allocation units", digits=1, missing="none"),
    Column("remaining_units", "remaining units", digits=1, missing="n/a"),
    Column("energy_kwh", "energy kWh", digits=2),
    Column("carbon_kg", "carbon kg CO2e", digits=2),
    hours("mean_wait_s", "mean wait"),
)


def cmd_usage(args: argparse.Namespace, config: Config) -> int:
    """`sing report usage`: accounting.usage over a window or a named period."""
    if args.period and (args.since or args.until):
        raise UserError("give either --period or --since/--until, not both")
    since, until = (
        period_window(args.period, "--period") if args.period else (args.since, args.until)
    )
    settings = config.section("accounting", AccountingSettings)
    if settings.carbon_intensity_file:
        settings = replace(
            settings, carbon_intensity_file=str(config.resolve_path(settings.carbon_intensity_file))
        )
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    now = report_now(wh, args.now)
    frame = usage(wh.connect(), args.by, since, until, settings, now=now, cluster=args.cluster)
    notes = method(settings)
    if args.json:
        window = {"since": since, "until": until, "now": now}
        json.dump(
            {"rows": frame.to_dicts(), "window": window, "method": notes}, sys.stdout, default=str
        )
        print()
    elif args.csv:
        sys.stdout.write(frame.write_csv())
    else:
        columns = [Column(args.by, args.by), *(c for c in USAGE_COLUMNS if c.key in frame.columns)]
        print(tables.render(frame.to_dicts(), columns))
        for name in ("charge", "energy", "carbon"):
            print(f"{name}: {notes[name]}")
    return 0


def cmd_job(args: argparse.Namespace, config: Config) -> int:
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    thresholds = config.thresholds
    notes_file = config.resolve_path(thresholds.notes_file) if thresholds.notes_file else None
    notes = load_notes(notes_file)
    job = job_report(
        wh.connect(),
        args.job_id,
        thresholds,
        notes,
        now=report_now(wh, args.now),
        cluster=args.cluster,
    )
    if args.json:
        json.dump(job, sys.stdout, default=str)
        print()
    else:
        print(render(job))
    return 0


def cmd_demo_data(args: argparse.Namespace, config: Config) -> int:
    root = Path(config.warehouse_dir(args.warehouse))
    check_size(args.nodes, args.gpus_per_node, args.days)  # before the directory is created
    counts = generate(
        Warehouse(root),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        days=args.days,
        seed=args.seed,
        end=args.end,
        cluster=config.site.cluster,
    )
    print(f"wrote {counts} into {root}")
    return 0
