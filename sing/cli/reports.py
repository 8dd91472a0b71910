"""`sing report ...` and `sing job JOB_ID`: analytics from the command line."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from sing import tables
from sing.accounting import statement
from sing.accounting.periods import FORMS, period_window
from sing.accounting.settings import accounting_settings
from sing.accounting.usage import GROUPS, footnotes, method, snapshot, usage
from sing.config import Config
from sing.errors import UsageError, UserError
from sing.executors.base import running_accounting_for
from sing.policy.settings import site_coverage
from sing.tables import Column, hours, percent
from sing.tables import render as render_table
from sing.times import time_option
from sing.traces import workload
from sing.warehouse import analytics
from sing.warehouse.coverage import CoverageNeeds
from sing.warehouse.job_report import job_report, render, site_notes
from sing.warehouse.store import Warehouse

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
    report = subparsers.add_parser("report")
    sub = report.add_subparsers(dest="report", metavar="REPORT", required=True)
    for name, help_text in (
        ("jobs", "per-job efficiency: GPU-hours, utilization, idle GPU-hours, energy, RDMA"),
        ("by-nodes", "GPU utilization by job node count (the SING paper's headline figure)"),
        ("fairness", "GPU-hours per user vs equal share, Jain's index, queueing delay"),
        ("idle", "multi-node jobs holding GPUs they barely use, by wasted GPU-hours"),
        ("cluster", "GPU assignment rate and utilization over time"),
        ("rightsize", "GPU-hours that fit a MIG slice, cores and memory held but unused"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--since", type=time_option, help="window start (ISO 8601, UTC)")
        p.add_argument("--until", type=time_option, help="window end (ISO 8601, UTC)")
        p.add_argument("--now", type=time_option, help=NOW_HELP)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_report)
    sub.choices["by-nodes"].add_argument("--partition")
    sub.choices["idle"].add_argument(
        "--threshold", type=ratio, help="mean util below this ratio (0-1, e.g. 0.1)"
    )
    sub.choices["idle"].add_argument("--min-nodes", type=int, default=2)
    sub.choices["idle"].add_argument("--running", action="store_true", help="only jobs running now")
    sub.choices["cluster"].add_argument("--bucket", choices=("hour", "day", "week"), default="day")
    sub.choices["rightsize"].add_argument(
        "--by", choices=analytics.RIGHTSIZE_GROUPS, default="user", help="one row per"
    )
    add_usage(sub)
    add_statement(sub)
    add_workload(sub)

    job = subparsers.add_parser("job")
    job.add_argument("job_id")
    job.add_argument("--cluster", help="the job's cluster, where job ids repeat across clusters")
    job.add_argument("--now", type=time_option, help=NOW_HELP)
    job.add_argument("--json", action="store_true")
    job.set_defaults(func=cmd_job)


def ratio(text: str) -> float:
    """A threshold of a share (`--threshold`): 0 to 1, so 50 (a percent) is refused with the
    ratio it probably meant rather than listing every job."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; give a ratio such as 0.5"
        ) from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{text} is not a ratio from 0 to 1; give one such as 0.5")
    if value > 1:
        raise argparse.ArgumentTypeError(
            f"{text} looks like a percent; give a ratio such as {value / 100:g}"
        )
    return value


Window = tuple[datetime | None, datetime | None]


def checked_window(since: datetime | None, until: datetime | None) -> Window:
    """`--since`/`--until` as given, refused when the window ends before it starts (it would
    answer an empty report, as if nothing had happened)."""
    if since and until and since >= until:
        raise UsageError(
            f"--since {since:%Y-%m-%d %H:%M} is not before --until {until:%Y-%m-%d %H:%M}; "
            "give the earlier time as --since"
        )
    return since, until


def report_window(args: argparse.Namespace) -> Window:
    """The window of a report that takes `--period` or `--since`/`--until` (not both)."""
    if args.period and (args.since or args.until):
        raise UserError("give either --period or --since/--until, not both")
    if args.period:
        return period_window(args.period, "--period")
    return checked_window(args.since, args.until)


def run_report(args: argparse.Namespace, config: Config) -> tuple[pl.DataFrame, dict]:
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    con = wh.connect()
    since, until = checked_window(args.since, args.until)
    window = {"since": since, "until": until, "now": report_now(wh, args.now)}
    extra: dict = {}
    if args.report == "jobs":
        frame = analytics.job_usage(con, **window, needs=site_coverage(config))
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
            needs=site_coverage(config),
            **window,
        )
    elif args.report == "rightsize":
        frame = analytics.rightsize(con, by=args.by, **window)
        extra["mig_models"] = {
            m: [n for n, _ in slices] for m, _, _, slices in analytics.MIG_MODELS
        }
    else:
        frame = analytics.cluster_usage(con, bucket=args.bucket, **window)
    newest = NEWEST_FIRST.get(args.report)
    if newest and not frame.is_empty():
        frame = frame.sort(newest, descending=True, nulls_last=True, maintain_order=True)
    return frame, extra | {"window": window}


# The reports that list jobs or time: the newest first, as a person looks for what just
# happened (the idle report ranks by wasted GPU-hours, fairness by share: their order is theirs).
NEWEST_FIRST = {"jobs": "start_time", "cluster": "bucket"}
# What each report lists, for the line that says it found none.
REPORT_NOUNS = {
    "jobs": "jobs",
    "by-nodes": "jobs",
    "fairness": "users with jobs",
    "idle": "idle multi-node jobs",
    "cluster": "cluster figures",
    "rightsize": "jobs",
}


def nothing_found(args: argparse.Namespace, config: Config, window: dict) -> str:
    """The line an empty report prints instead of a bare heading: what it looked for, in which
    window, and why there is none (no jobs at all, none in the window, none that qualify)."""
    con = Warehouse(config.warehouse_dir(args.warehouse)).connect({"jobs": None})
    total, first, last = con.execute(
        "SELECT count(*), min(start_time), max(coalesce(end_time, start_time)) FROM jobs "
        "WHERE start_time IS NOT NULL"
    ).fetchone()
    head = (
        f"no {REPORT_NOUNS[args.report]} in {tables.window_text(window['since'], window['until'])}"
    )
    if args.report == "idle" and args.running:
        head = f"no running idle multi-node jobs at {window['now']:%Y-%m-%d %H:%M} UTC"
    if not total:
        return (
            f"{head}: the warehouse has no started jobs; sync them (the collector's job sync, "
            "[executor]) or import them: sing warehouse import jobs FILE"
        )
    span = f"its {total:,} started jobs run {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"
    if args.report == "idle":
        t = config.thresholds
        limit = args.threshold if args.threshold is not None else t.idle_util
        return (
            f"{head}: no job on {args.min_nodes} or more nodes for {t.idle_job_min_hours:g} h or "
            f"more averaged under {limit:.0%} GPU utilization ({span})"
        )
    return f"{head}: none of the warehouse's jobs falls in it ({span})"


def cmd_report(args: argparse.Namespace, config: Config) -> int:
    frame, extra = run_report(args, config)
    if args.json:
        tables.print_json(frame.to_dicts(), **extra)
        return 0
    if frame.is_empty():
        print(nothing_found(args, config, extra["window"]))
        return 0
    columns = list(REPORT_COLUMNS[args.report])
    if args.report == "rightsize":
        columns.insert(0, Column(args.by, args.by))
    if "cluster" in frame.columns and frame["cluster"].n_unique() > 1:
        columns.insert(0, Column("cluster", "cluster"))  # job ids repeat across clusters
    print(render_table(frame.to_dicts(), columns))
    if "jain_index" in extra:
        print(f"Jain's fairness index {extra['jain_index']:.3f} (1 = every user the same share)")
    for line in explain_unknown(frame) + explain_partial(frame, site_coverage(config)):
        print(line)
    if args.report == "rightsize":
        print(RIGHTSIZE_NOTE)
    return 0


GPU_H = "GPU-h"
GIB = 2**30
# Who ran a job and what it held: the first columns of every per-job report.
JOB_IDENTITY = (
    Column("job_id", "job"),
    Column("user", "user"),
    Column("account", "account"),
    Column("state", "state"),
    Column("num_nodes", "nodes"),
    Column("num_gpus", "GPUs"),
)
# What each report prints for people, in order. NULL in a measured figure means sing could not
# know it (no samples, no node inventory, no job records, a saturated counter): it prints as
# "unknown", and explain_unknown says why.
REPORT_COLUMNS: dict[str, tuple[Column, ...]] = {
    "jobs": (
        *JOB_IDENTITY,
        hours("run_s", "run"),
        hours("queue_s", "queue"),
        Column("gpu_hours", GPU_H, digits=1),
        percent("mean_util", "util"),
        percent("coverage", "coverage", digits=0, missing="no GPU"),
        percent("mean_sm_active", "SM active"),
        Column("idle_gpu_hours", f"idle {GPU_H}", digits=1),
        Column("peak_mem_bytes", "peak mem GiB", digits=1, per=GIB),
        Column("energy_j", "energy kWh", digits=2, per=3.6e6),
        Column("rdma_bytes_per_node_hour", "RDMA GB/node-h", digits=2, per=1e9),
    ),
    "by-nodes": (
        Column("nodes", "nodes"),
        Column("jobs", "jobs"),
        Column("gpu_hours", GPU_H, digits=1),
        percent("weighted_util", "util (by GPU-h)"),
        percent("mean_job_util", "mean job util"),
        percent("p10_util", "p10"),
        percent("p50_util", "p50"),
        percent("p90_util", "p90"),
        Column("idle_gpu_hours", f"idle {GPU_H}", digits=1),
    ),
    "fairness": (
        Column("user", "user"),
        Column("jobs", "jobs"),
        Column("gpu_hours", GPU_H, digits=1),
        percent("share", "share"),
        percent("equal_share", "equal share"),
        Column("mean_queue_h", "queue mean h", digits=2),
        Column("p95_queue_h", "queue p95 h", digits=2),
    ),
    "idle": (
        *JOB_IDENTITY,
        Column("start_time", "start (UTC)"),
        hours("run_s", "run"),
        Column("gpu_hours", GPU_H, digits=1),
        percent("mean_util", "util"),
        percent("coverage", "coverage", digits=0, missing="no GPU"),
        Column("partial_data", "partial data"),
        Column("wasted_gpu_hours", f"wasted {GPU_H}", digits=1),
        Column("rdma_bytes_per_node_hour", "RDMA GB/node-h", digits=2, per=1e9),
        Column("low_rdma", "low RDMA"),
        Column("nodes", "node list", width=32),
    ),
    "rightsize": (  # the row's user or account goes first (--by)
        Column("jobs", "jobs"),
        Column("gpu_hours", GPU_H, digits=1),
        Column("fit_1g_gpu_hours", f"1g-fit {GPU_H}", digits=1, missing="-"),
        Column("fit_2g_gpu_hours", f"2g-fit {GPU_H}", digits=1, missing="-"),
        Column("fit_3g_gpu_hours", f"3g-fit {GPU_H}", digits=1, missing="-"),
        Column("mig_unjudged_gpu_hours", f"1-GPU not judged {GPU_H}", digits=1),
        Column("host_jobs", "host jobs"),
        Column("core_hours", "core-h", digits=1, missing="-"),
        Column("unused_core_hours", "unused core-h", digits=1, missing="-"),
        Column("mem_gib_hours", "mem GiB-h", digits=1, missing="-"),
        Column("unused_mem_gib_hours", "unused mem GiB-h", digits=1, missing="-"),
    ),
    "cluster": (
        Column("bucket", "from (UTC)"),
        Column("bucket_hours", "span h", digits=1),
        Column("allocated_gpu_hours", f"allocated {GPU_H}", digits=1),
        Column("capacity_gpu_hours", f"capacity {GPU_H}", digits=1),
        percent("assignment_rate", "assigned"),
        percent("util", "util"),
        percent("sampled_assignment", "assigned (samples)"),
    ),
}


RIGHTSIZE_NOTE = (
    "MIG: single-GPU jobs whose peak GPU memory and mean SM activity fit the smallest 1g, 2g or "
    "3g slice (1/7, 2/7, 3/7 of the SMs) of their model; slices are known for "
    f"{', '.join(m[0] for m in analytics.MIG_MODELS)} (NVIDIA's MIG User Guide). '-': no "
    "single-GPU job of the row on those models with GPU memory and SM activity samples (the "
    "'not judged' column). Cores and memory: jobs whose cgroups were read (host jobs), their "
    "allocation times (1 - CPU efficiency) and request - peak, hours inside the window."
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


def explain_partial(frame: pl.DataFrame, needs: CoverageNeeds) -> list[str]:
    """What a job flagged `partial data` means: its figures do not show it idle."""
    if "partial_data" not in frame.columns or not frame["partial_data"].any():
        return []
    return [
        f"partial data for {frame['partial_data'].sum()} job(s): the warehouse holds under "
        f"{needs.min_coverage:.0%} ([policy] min_coverage) of the samples expected from their "
        f"GPUs (one per GPU every {needs.interval_s:g} s, [collector] interval_s), so their "
        "figures rest on part of their data: not evidence that they are idle. Check that "
        "their nodes' exporters are scraped (sing doctor node)."
    ]


def add_usage(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "usage",
        help="GPU-hours, charge units, energy and carbon by account, user, partition, model",
    )
    p.add_argument("--by", choices=GROUPS, default="account", help="one row per (default account)")
    p.add_argument("--since", type=time_option, help="window start (ISO 8601, UTC)")
    p.add_argument("--until", type=time_option, help="window end (ISO 8601, UTC)")
    p.add_argument("--period", help=f"a whole period instead of --since/--until: {FORMS}")
    p.add_argument("--cluster", help="only this cluster's jobs (default: all)")
    p.add_argument("--now", type=time_option, help=NOW_HELP)
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


def add_statement(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("statement", help="an account's usage statement for a period, as HTML")
    p.add_argument("--period", required=True, help=f"e.g. 2026-11 (any of {FORMS})")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--account", help="the account (with --out FILE.html)")
    which.add_argument("--all", metavar="DIR", help="every account's statement into DIR")
    p.add_argument("--out", metavar="FILE", help="the HTML file to write (with --account)")
    p.add_argument("--cluster", help="only this cluster's jobs (default: all)")
    p.add_argument("--now", type=time_option, help=NOW_HELP)
    p.set_defaults(func=cmd_statement)


def cmd_statement(args: argparse.Namespace, config: Config) -> int:
    """`sing report statement`: HTML statements built on sing.accounting.usage."""
    if bool(args.account) != bool(args.out):
        raise UserError("--account needs --out FILE.html (or use --all DIR)")
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    now = report_now(wh, args.now)
    settings = accounting_settings(config)
    found = statement.statements(
        snapshot(
            wh,
            *period_window(args.period, "--period"),
            now,
            carbon_series=bool(settings.carbon_intensity_file),
        ),
        args.period,
        settings,
        accounts=[args.account] if args.account else None,
        now=now,
        cluster=args.cluster,
    )
    site = args.cluster or config.site.cluster
    if args.account:
        paths = [Path(args.out)]
        statement.write(found[0], paths[0], site)
    else:
        paths = statement.write_all(found, Path(args.all), site)
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_usage(args: argparse.Namespace, config: Config) -> int:
    """`sing report usage`: sing.accounting.usage over a window or a named period."""
    since, until = report_window(args)
    settings = accounting_settings(config)
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    now = report_now(wh, args.now)
    con = snapshot(wh, since, until, now, carbon_series=bool(settings.carbon_intensity_file))
    frame = usage(con, args.by, since, until, settings, now=now, cluster=args.cluster)
    notes = method(settings)
    if args.json:
        window = {"since": since, "until": until, "now": now}
        tables.print_json(frame.to_dicts(), window=window, method=notes)
    elif args.csv:
        sys.stdout.write(frame.write_csv())
    else:
        columns = [Column(args.by, args.by), *(c for c in USAGE_COLUMNS if c.key in frame.columns)]
        print(tables.render(frame.to_dicts(), columns))
        for name in ("charge", "energy", "carbon"):
            print(f"{name}: {notes[name]}")
        for line in footnotes(frame):
            print(line)
    return 0


def add_workload(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "workload",
        help="run time, queue time, GPUs and nodes per job, load by hour and weekday; "
        "the cluster beside trace releases",
    )
    p.add_argument("--since", type=time_option, help="jobs submitted from (ISO 8601, UTC)")
    p.add_argument("--until", type=time_option, help="jobs submitted before (ISO 8601, UTC)")
    p.add_argument("--period", help=f"a whole period instead of --since/--until: {FORMS}")
    p.add_argument(
        "--trace", action="append", default=[], metavar="DIR", help="a trace release (repeatable)"
    )
    p.add_argument("--cluster", help="only this cluster's jobs (default: all the warehouse's)")
    p.add_argument("--no-cluster", action="store_true", help="only the traces, not the warehouse")
    p.add_argument("--now", type=time_option, help=NOW_HELP)
    p.add_argument("--json", action="store_true", help="every figure as JSON (seconds, GPUs)")
    p.set_defaults(func=cmd_workload)


def cmd_workload(args: argparse.Namespace, config: Config) -> int:
    """`sing report workload`: sing.traces.workload for the cluster and each --trace, side by
    side."""
    if args.no_cluster and not args.trace:
        raise UserError("--no-cluster needs at least one --trace DIR")
    since, until = report_window(args)
    profiles = []
    if not args.no_cluster:
        wh = Warehouse.existing(
            config.warehouse_dir(args.warehouse), ", or give --no-cluster with --trace DIR"
        )
        now = report_now(wh, args.now)
        name = args.cluster or config.site.cluster
        profiles.append(workload.from_warehouse(wh, since, until, now, name, args.cluster))
    profiles += [workload.from_trace(path) for path in args.trace]
    profiles = workload.unique_names(profiles)
    if args.json:
        tables.print_json(
            (p.as_dict() for p in profiles),
            window={"since": since, "until": until},
            metrics=[vars(m) for m in workload.METRICS],
        )
        return 0
    print(workload_text(profiles))
    return 0


WORKLOAD_COUNTS = (
    Column("name", "source"),
    Column("jobs", "jobs"),
    Column("gpu_jobs", "GPU jobs"),
    Column("cpu_only", "CPU-only"),
    Column("never_started", "never started"),
    Column("note", "note", missing=""),
)


def workload_text(profiles: list[workload.Profile]) -> str:
    """The report for people: the jobs of each source, one table per distribution (a row per
    source: quantiles in the metric's unit, then the share of jobs at or under fixed values),
    then the load by hour of day and by weekday (a column per source)."""
    parts = [
        render_table(
            [{"name": p.name, **p.counts, "note": p.note or None} for p in profiles],
            WORKLOAD_COUNTS,
        )
    ]
    for m in workload.METRICS:
        columns = [
            Column("name", "source"),
            Column("jobs", "jobs"),
            Column("mean", f"mean {m.unit}", digits=2, per=m.per, missing="n/a"),
            *(
                Column(q, f"{q} {m.unit}", digits=m.digits, per=m.per, missing="n/a")
                for q in map(workload.quantile_name, workload.QUANTILES)
            ),
            *(
                percent(f"<={label}", f"<={label}", missing="n/a")
                for label in map(workload.point_label, [m] * len(m.points), m.points)
            ),
        ]
        rows = []
        for p in profiles:
            row = p.stats.filter(pl.col("metric") == m.key).to_dicts()[0]
            at = p.at_points.filter(pl.col("metric") == m.key)
            points = zip(at["point"], at["share"], strict=True)
            shares = {f"<={workload.point_label(m, v)}": s for v, s in points}
            rows.append({"name": p.name, **row, **shares})
        population = "finished" if m.key == "run_s" else "started"
        parts.append(f"{m.title} (GPU jobs that {population})\n{render_table(rows, columns)}")
    for scale in workload.SCALES:
        rows = {}
        for p in profiles:
            load = p.load.filter(pl.col("scale") == scale) if p.load is not None else None
            for slot in workload.slots(scale):
                row = rows.setdefault(slot, {"slot": workload.slot_label(scale, slot)})
                found = (
                    load.filter(pl.col("slot") == slot).to_dicts()[0] if load is not None else {}
                )
                for kind in ("offered", "running"):
                    row[f"{kind}:{p.name}"] = found.get(f"{kind}_share")
        columns = [
            Column("slot", "hour (UTC)" if scale == "hour" else "weekday (UTC)"),
            *(
                percent(f"{kind}:{p.name}", f"{p.name} {kind}", missing="n/a")
                for p in profiles
                for kind in ("offered", "running")
            ),
        ]
        parts.append(
            f"GPU-hours by {scale}: share of each source's total (offered: by submit time; "
            f"running: as held)\n{render_table(list(rows.values()), columns)}"
        )
    return "\n\n".join(parts)


def cmd_job(args: argparse.Namespace, config: Config) -> int:
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    job = job_report(
        wh.connect(),
        args.job_id,
        config.thresholds,
        site_notes(config),
        now=report_now(wh, args.now),
        cluster=args.cluster,
        needs=site_coverage(config),
        running_accounting=running_accounting_for(config, args.job_id),
    )
    if args.json:
        tables.print_json([job])
    else:
        print(render(job))
    return 0
