"""`sing health report` (failure metrics of a period) and `sing health drain` (nodes to drain).

Tables with units for people, `--json` for scripts; the figures are `sing.health.failures.report`
and `sing.policy.drain.candidates` (docs/health.md).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

from sing.accounting.periods import FORMS
from sing.cli.reports import NOW_HELP, report_now, report_window
from sing.config import Config
from sing.health import failures
from sing.health.settings import HealthSettings
from sing.policy import drain
from sing.tables import Column, percent, print_json, render
from sing.times import time_option
from sing.warehouse.store import Warehouse


def register(subparsers: argparse._SubParsersAction) -> None:
    health = subparsers.add_parser("health")
    sub = health.add_subparsers(dest="health_command", metavar="ACTION", required=True)
    report = sub.add_parser("report", help="job failures by cause, GPU-hours lost, MTBF")
    report.add_argument("--since", type=time_option, help="window start (ISO 8601, UTC)")
    report.add_argument("--until", type=time_option, help="window end (ISO 8601, UTC)")
    report.add_argument("--period", help=f"a whole period instead of --since/--until: {FORMS}")
    report.add_argument("--now", type=time_option, help=NOW_HELP)
    report.add_argument("--json", action="store_true", help="machine-readable output")
    report.set_defaults(func=cmd_report)
    act = sub.add_parser(
        "drain", help="nodes whose readings cross the [health] drain limits, and the command"
    )
    act.add_argument(
        "--dry-run", action="store_true", help="only list them, whatever [health] allows"
    )
    act.add_argument(
        "--now",
        type=time_option,
        help="judge the readings as of this time (lists only: drains nothing)",
    )
    act.add_argument("--json", action="store_true", help="machine-readable output")
    act.set_defaults(func=cmd_drain)


CAUSE_COLUMNS = (
    Column("failure_class", "cause"),
    Column("jobs", "jobs"),
    percent("share", "share of jobs", missing="n/a"),
    Column("gpu_hours", "GPU-h", digits=1),
)
NODE_COLUMNS = (
    Column("cluster", "cluster"),
    Column("node", "node"),
    Column("incidents", "incidents opened"),
    Column("open_at_end", "open at end"),
    Column("classes", "classes"),
)
SUMMARY_COLUMNS = (Column("figure", "figure"), Column("value", "value"))


def cmd_report(args: argparse.Namespace, config: Config) -> int:
    since, until = report_window(args)
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    found = failures.report(failures.snapshot(wh), since, until, report_now(wh, args.now))
    if args.json:
        print_json(found.pop("causes"), **found)
        return 0
    w = found["window"]
    print(f"Jobs that ended {w['since']:%Y-%m-%d %H:%M} to {w['until']:%Y-%m-%d %H:%M} UTC")
    print(render(found["causes"], CAUSE_COLUMNS))
    print()
    print(render(summary(found), SUMMARY_COLUMNS))
    if found["nodes"]:
        print()
        print(render(found["nodes"], NODE_COLUMNS))
    return 0


def summary(found: dict) -> list[dict]:
    """The report's single figures as (figure, value) rows, units in the words."""
    incidents, mtbf = found["incidents"], found["mtbf"]
    per_job = found["service_requests_per_job"]
    ttc = incidents["mean_time_to_close_s"]
    rows = [
        ("jobs ended", found["jobs"]),
        ("GPU-hours lost to failed jobs", found["gpu_hours_lost"]),
        ("hardware incidents opened", incidents["hardware"]),
        ("mean time between incidents per node (h)", mtbf["node_hours_between"]),
        ("GPU-hours between incidents", mtbf["gpu_hours_between"]),
        ("service requests", incidents["service_requests"]),
        ("jobs per service request", 1 / per_job if per_job else None),
        ("incidents opened / closed", f"{incidents['opened']} / {incidents['closed']}"),
        ("incidents open at the end", incidents["open_at_end"]),
        ("mean time to close (h)", ttc / 3600 if ttc is not None else None),
    ]
    return [{"figure": name, "value": _shown(value)} for name, value in rows]


def _shown(value: float | int | str | None) -> str:
    """A figure as text: counts as they are, other numbers to 0.1; n/a where there is none."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else value


DRAIN_COLUMNS = (
    Column("cluster", "cluster"),
    Column("node", "node"),
    Column("reason", "evidence", width=80),
    Column("done", "done"),
)


def nothing_to_drain(wh: Warehouse, config: Config, now: datetime | None) -> str:
    """Why no node is listed: no readings at all or only old ones judge nothing, so they are
    not said the way healthy nodes are ("no node crosses the limits")."""
    now = now or datetime.now(UTC)
    window_h = config.section("health", HealthSettings).drain_window_hours
    readings = wh.newest_time("health_samples")
    if readings is None:
        return (
            "No health readings in the warehouse, so no node can be judged: the collector "
            "records them from each node's exporter (check one with: sing doctor node HOST)."
        )
    polled = max(t for t in (readings, wh.newest_time("scrapes")) if t is not None)
    if polled < now - timedelta(hours=window_h):
        return (
            f"Health readings are stale: the newest is from {polled:%Y-%m-%d %H:%M} UTC, over "
            f"[health] drain_window_hours ({window_h:g} h) before {now:%Y-%m-%d %H:%M} UTC, so "
            "no node is judged on today's state. Is the collector running (sing doctor head)?"
        )
    return "No node crosses the [health] drain limits."


def cmd_drain(args: argparse.Namespace, config: Config) -> int:
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    outcome = drain.run(wh, config, force_dry_run=args.dry_run, now=args.now)
    unsettled = any(r["done"] == drain.UNSETTLED for r in outcome["reconciled"])
    status = 0 if all(row["ok"] for row in outcome["nodes"]) and not unsettled else 1
    if args.json:
        print_json(outcome.pop("nodes"), **outcome)
        return status
    for settled in outcome["reconciled"]:
        print(
            f"An earlier drain of {settled['node']} ({settled['intent_at']:%Y-%m-%d %H:%M} UTC) "
            f"went unrecorded: {settled['done']}"
            + (f"; {settled['error']}" if settled["error"] else "")
        )
    if not outcome["nodes"]:
        print(nothing_to_drain(wh, config, args.now))
        return status
    print(render(outcome["nodes"], DRAIN_COLUMNS))
    print()
    for row in outcome["nodes"]:
        print(row["command"])
        if row["done"] == "blocked":  # the breaker's doing, not a failure: say why, plainly
            print(f"  blocked: {row['error']}")
        elif row["error"]:
            print(f"  failed: {row['error']}", file=sys.stderr)
    print()
    print(outcome["mode"])
    return status
