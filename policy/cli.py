"""`sing policy check|run|log`: what the rules would do now, one round, and the audit trail."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import polars as pl

from executors.base import make_executor
from policy import audit
from policy.engine import Engine, Round
from policy.ladder import Decision
from policy.postman import make_postman
from policy.reports import send_digests, send_job_end_reports
from policy.settings import PolicySettings
from sing.config import Config
from sing.errors import UserError
from warehouse.store import Warehouse


def register(subparsers: argparse._SubParsersAction) -> None:
    policy = subparsers.add_parser("policy", help="waste policies: check, run a round, the log")
    sub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="what each rule would do now (sends and cancels nothing)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=cmd_check)
    run = sub.add_parser("run", help="one round: evaluate, message, cancel (dry run by default)")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.set_defaults(func=cmd_run)
    log = sub.add_parser("log", help="the audit trail of verdicts, messages and actions")
    log.add_argument("--since", help="from this time (ISO 8601, UTC) or '24h', '7d' ago")
    log.add_argument("--user", help="only this user's jobs and messages")
    log.add_argument("--json", action="store_true", help="machine-readable output")
    log.set_defaults(func=cmd_log)
    digest = sub.add_parser("digest", help="send the last week's or month's usage digests")
    period = digest.add_mutually_exclusive_group(required=True)
    for name, help_text in (
        ("weekly", "per user, the last complete week (Monday to Sunday)"),
        ("monthly", "per account with a contact, the last complete month"),
    ):
        period.add_argument(
            f"--{name}", dest="period", action="store_const", const=name, help=help_text
        )
    digest.add_argument("--dry-run", action="store_true", help="record what would go; send nothing")
    digest.add_argument(
        "--now",
        type=datetime.fromisoformat,
        help="the period before this time (ISO 8601, UTC unless it says)",
    )
    digest.add_argument("--json", action="store_true", help="machine-readable output")
    digest.set_defaults(func=cmd_digest)


def make_engine(config: Config, warehouse: Warehouse, command: str) -> Engine:
    """The engine as the site configured it: its executor, its postman."""
    settings = config.section("policy", PolicySettings)
    postman = make_postman(config)
    return Engine(settings, warehouse, make_executor(config), postman, audit.actor(command))


def policy_job(config: Config, warehouse: Warehouse) -> tuple[Callable[[], Round], float] | None:
    """The collector's scheduled policy round and its interval; None with nothing to do (no
    rule, no job-end reports) or `[policy] interval_s = 0`. A bad rule is an error now, when
    the collector starts."""
    settings = config.section("policy", PolicySettings)
    if settings.interval_s <= 0:
        return None
    engine = make_engine(config, warehouse, "sing collector")
    if not engine.rules and not settings.job_end_reports:
        return None
    return lambda: full_round(engine, config), settings.interval_s


def full_round(engine: Engine, config: Config) -> Round:
    """A round of the rules, then the reports of jobs that ended (when the site sends them)."""
    result = engine.run()
    now = datetime.now(UTC)
    send_job_end_reports(engine.warehouse, config, engine.postman, now, actor=engine.actor)
    return result


def cmd_check(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    decisions = make_engine(config, warehouse, "sing policy check").decide()
    frame = decisions_frame(decisions)
    return _print(frame if args.json else for_people(frame), args.json, NO_JOBS)


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    result = full_round(make_engine(config, warehouse, "sing policy run"), config)
    frame = decisions_frame(result.decisions)
    if args.json:
        return _print(frame, True, "")
    _print(for_people(frame), False, NO_JOBS)
    print(f"{len(result.events)} event(s) recorded in the audit trail")
    return 0


def cmd_log(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    con = warehouse.connect({"policy_events": since.date() if since else None})
    try:
        frame = audit.events(con, since=since, user=args.user)
    finally:
        con.close()
    return _print(frame, args.json, "the audit trail has no events in this window")


def cmd_digest(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("policy", PolicySettings)
    switch = "weekly_digests" if args.period == "weekly" else "monthly_account_digests"
    if not getattr(settings, switch):
        raise UserError(f"{args.period} digests are off: set [policy] {switch} = true")
    now = args.now or datetime.now(UTC)
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    actor = audit.actor("sing policy digest")
    sent = send_digests(
        warehouse, config, make_postman(config), args.period, now, args.dry_run, actor
    )
    rows = [
        {
            "cluster": e.cluster,
            "user": e.user,
            "account": e.account,
            "channel": e.channel,
            "recipient": e.recipient,
            "ok": e.ok,
            "dry_run": e.dry_run,
            "note": e.detail.get("error") or e.detail.get("held"),
        }
        for e in sent
    ]
    frame = pl.DataFrame(rows, schema=DIGEST_COLUMNS)
    return _print(frame, args.json, f"no {args.period} digest is due (each goes out once)")


DIGEST_COLUMNS = {
    "cluster": pl.String,
    "user": pl.String,
    "account": pl.String,
    "channel": pl.String,
    "recipient": pl.String,
    "ok": pl.Boolean,
    "dry_run": pl.Boolean,
    "note": pl.String,
}


def parse_since(text: str, now: datetime) -> datetime:
    """'24h', '7d', '30m' ago, or an ISO 8601 time (UTC when it names no zone)."""
    units = {"m": "minutes", "h": "hours", "d": "days"}
    if text[:-1].isdigit() and text[-1:] in units:
        return now - timedelta(**{units[text[-1]]: int(text[:-1])})
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--since {text!r}: use an ISO 8601 time or 30m, 24h, 7d") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


NO_JOBS = "no running job is judged by a rule"
DECISION_COLUMNS = {
    "cluster": pl.String,
    "job_id": pl.String,
    "user": pl.String,
    "rule": pl.String,
    "verdict": pl.String,
    "action": pl.String,
    "held": pl.String,
    "deadline": pl.Datetime("us", "UTC"),
    "dry_run": pl.Boolean,
    "mean_util": pl.Float64,
    "idle_gpus": pl.Int64,
    "gpus_sampled": pl.Int64,
    "rdma_bytes_per_node_hour": pl.Float64,
}


def decisions_frame(decisions: list[Decision]) -> pl.DataFrame:
    """One row per job and rule: the verdict, the step taken now, the deadline, the figures."""
    rows = [
        {
            "cluster": d.job["cluster"],
            "job_id": d.job["job_id"],
            "user": d.job.get("user"),
            "rule": d.rule.name,
            "verdict": d.verdict,
            "action": d.action,
            "held": f"{d.hold[0]} ({d.hold[1]})" if d.hold else None,
            "deadline": d.deadline,
            "dry_run": d.dry_run,
            "mean_util": d.evidence.get("mean_util"),
            "idle_gpus": d.evidence.get("idle_gpus"),
            "gpus_sampled": d.evidence.get("gpus_sampled"),
            "rdma_bytes_per_node_hour": d.evidence.get("rdma_bytes_per_node_hour"),
        }
        for d in decisions
    ]
    return pl.DataFrame(rows, schema=DECISION_COLUMNS)


def for_people(frame: pl.DataFrame) -> pl.DataFrame:
    """The decisions with units: utilisation in %, RDMA traffic in GB per node-hour."""
    return frame.with_columns(
        (pl.col("mean_util") * 100).round(1).alias("mean_util_%"),
        (pl.col("rdma_bytes_per_node_hour") / 1e9).round(2).alias("rdma_GB_per_node_h"),
    ).drop("mean_util", "rdma_bytes_per_node_hour")


def _print(frame: pl.DataFrame, as_json: bool, empty: str) -> int:
    if as_json:
        json.dump(frame.to_dicts(), sys.stdout, default=str)
        print()
    elif frame.is_empty():
        print(empty)
    else:
        with pl.Config(tbl_rows=200, tbl_cols=20, fmt_str_lengths=40, tbl_width_chars=200):
            print(frame)
    return 0
