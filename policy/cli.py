"""`sing policy check|run|log`: what the rules would do now, one round, and the audit trail."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from executors.base import make_executor
from policy import audit
from policy.engine import Engine
from policy.ladder import Decision
from policy.messages import Postman
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


def make_engine(config: Config, warehouse: Warehouse, command: str) -> Engine:
    """The engine as the site configured it: its executor, its postman."""
    settings = config.section("policy", PolicySettings)
    return Engine(settings, warehouse, make_executor(config), postman(config), audit.actor(command))


def policy_job(config: Config, warehouse: Warehouse) -> tuple[Callable[[], object], float] | None:
    """The collector's scheduled policy round and its interval; None without rules (or with
    `[policy] interval_s = 0`). A bad rule is an error now, when the collector starts."""
    settings = config.section("policy", PolicySettings)
    if not settings.rules or settings.interval_s <= 0:
        return None
    engine = make_engine(config, warehouse, "sing collector")
    if not engine.rules:
        return None
    return engine.run, settings.interval_s


def postman(config: Config) -> Postman:
    """The site's postman (policy.postman), or one that delivers nothing where it is absent."""
    try:
        from policy.postman import make_postman
    except ModuleNotFoundError:
        return _NoChannels()
    return make_postman(config)


class _NoChannels:
    """No message channel in this installation: messages are decided and recorded only."""

    def send(self, message: Any) -> list:
        return []


def cmd_check(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    decisions = make_engine(config, warehouse, "sing policy check").decide()
    return _print(decisions_frame(decisions), args.json, "no running job is judged by a rule")


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    result = make_engine(config, warehouse, "sing policy run").run()
    frame = decisions_frame(result.decisions)
    if args.json:
        return _print(frame, True, "")
    _print(frame, False, "no running job is judged by a rule")
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
