"""`sing policy check|run|log`: what the rules would do now, one round, and the audit trail."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sing.collector.settings import CollectorSettings
from sing.config import Config
from sing.errors import UserError
from sing.executors.base import make_executor
from sing.policy import breaker
from sing.policy.engine import Engine, Round
from sing.policy.evaluate import EXEMPT, INCOMPLETE, OK, STALE, UNKNOWN, VIOLATING
from sing.policy.ladder import CHANGED, ENDED, Decision
from sing.policy.postman import make_postman, unreached_owners
from sing.policy.replay import hit_rows, replay, totals
from sing.policy.reports import PERIODS, send_digests, send_job_end_reports
from sing.policy.rules import EXCESS_MEMORY, HOST_KINDS, load_rules
from sing.policy.settings import PolicySettings
from sing.tables import Column, percent, print_json, render
from sing.times import time_option
from sing.warehouse import audit
from sing.warehouse.store import Warehouse


def register(subparsers: argparse._SubParsersAction) -> None:
    policy = subparsers.add_parser("policy")
    sub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="what each rule would do now (sends and cancels nothing)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=cmd_check)
    run = sub.add_parser("run", help="one round: evaluate, message, cancel (dry run by default)")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.set_defaults(func=cmd_run)
    resume = sub.add_parser("resume", help="clear a tripped circuit breaker: cancels may go on")
    resume.add_argument("--note", required=True, help="what was checked (kept in the trail)")
    resume.set_defaults(func=cmd_resume)
    log = sub.add_parser("log", help="the audit trail of verdicts, messages and actions")
    log.add_argument(
        "--since", type=time_option, help="from this time (ISO 8601, UTC) or '24h', '7d' ago"
    )
    log.add_argument("--user", help="only this user's jobs and messages")
    log.add_argument("--json", action="store_true", help="machine-readable output")
    log.set_defaults(func=cmd_log)
    replaying = sub.add_parser(
        "replay", help="the rules applied to the history as if live (sends and cancels nothing)"
    )
    replaying.add_argument(
        "--since", type=time_option, default="30d", help="from this time (as log's; default 30d)"
    )
    replaying.add_argument(
        "--until", type=time_option, help="to this time (as --since; default now)"
    )
    replaying.add_argument("--json", action="store_true", help="machine-readable output")
    replaying.set_defaults(func=cmd_replay)
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
        type=time_option,
        help="the period before this time (ISO 8601, UTC unless it says)",
    )
    digest.add_argument("--json", action="store_true", help="machine-readable output")
    digest.set_defaults(func=cmd_digest)


def make_engine(config: Config, warehouse: Warehouse, command: str) -> Engine:
    """The engine as the site configured it: its executor, its postman."""
    settings = config.section("policy", PolicySettings)
    postman = make_postman(config)
    interval_s = config.section("collector", CollectorSettings).interval_s
    return Engine(
        settings, warehouse, make_executor(config), postman, audit.actor(command), interval_s
    )


def policy_job(config: Config, warehouse: Warehouse) -> tuple[Callable[[], Round], float] | None:
    """The collector's scheduled policy round and its interval; None with nothing to do (no
    rule, no job-end reports, no digests) or `[policy] interval_s = 0`. A bad rule is an error
    now, when the collector starts."""
    settings = config.section("policy", PolicySettings)
    if not settings.has_work():
        return None
    engine = make_engine(config, warehouse, "sing collector")
    require_reach(settings)
    if not engine.rules and not settings.sends_reports:
        return None
    return lambda: full_round(engine, config), settings.interval_s


def full_round(engine: Engine, config: Config, now: datetime | None = None) -> Round:
    """A round of the rules, then the reports of jobs that ended and the digests that are due
    (each is sent once, so every round may try). Like the ladder's notices, reports and digests
    wait while quiet hours last: a later round sends them."""
    now = now or datetime.now(UTC)
    result = engine.run(now)
    if now not in engine.quiet:
        send_job_end_reports(engine.warehouse, config, engine.postman, now, actor=engine.actor)
        for period in PERIODS:
            send_digests(engine.warehouse, config, engine.postman, period, now, actor=engine.actor)
    return result


def cmd_check(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    decisions = make_engine(config, warehouse, "sing policy check").decide()
    _print(decision_rows(decisions), DECISION_TABLE, args.json, NO_JOBS)
    if decisions and not args.json:
        print(judged_line(decisions) + "; a round (sing policy run) leaves out the ok ones")
    return 0


def require_reach(settings: PolicySettings) -> None:
    """A real ladder starts only when every step it takes can reach the job's owner."""
    problem = unreached_owners(settings)
    if problem:
        raise UserError(problem)


def cmd_resume(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    cluster = config.site.cluster
    who = audit.actor("sing policy resume")
    if not breaker.resume(warehouse, cluster, datetime.now(UTC), who, args.note):
        print(f"the circuit breaker of {cluster} is not tripped: nothing to resume")
        return 0
    print(f"circuit breaker of {cluster} cleared: cancels and drains resume at the next round")
    return 0


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    require_reach(config.section("policy", PolicySettings))
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    result = full_round(make_engine(config, warehouse, "sing policy run"), config)
    _print(decision_rows(result.decisions), DECISION_TABLE, args.json, NO_JOBS)
    if not args.json:
        if result.decisions:
            print(judged_line(result.decisions) + " (jobs found ok and not remembered left out)")
        print(f"{len(result.events)} event(s) recorded in the audit trail")
    return 0


def cmd_log(args: argparse.Namespace, config: Config) -> int:
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    since = args.since
    con = warehouse.connect({"policy_events": since.date() if since else None})
    try:
        rows = audit.events(con, since=since, user=args.user).to_dicts()
    finally:
        con.close()
    return _print(rows, LOG_TABLE, args.json, "the audit trail has no events in this window")


def cmd_replay(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("policy", PolicySettings)
    now = datetime.now(UTC)
    since, until = args.since, args.until or now
    if until <= since:
        raise UserError(
            f"--until {until:%Y-%m-%d %H:%M} is not after --since {since:%Y-%m-%d %H:%M}"
        )
    warehouse = Warehouse(config.warehouse_dir(args.warehouse))
    interval_s = config.section("collector", CollectorSettings).interval_s
    result = replay(warehouse, settings, load_rules(settings), since, until, interval_s)
    rows = hit_rows(result)
    if args.json:
        extra = {"totals": totals(result), "unjudged": result.unjudged}
        print_json(rows, **extra, messages=result.messages)
        return 0
    print(
        f"Replay {since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC, {result.steps} rounds "
        f"{settings.interval_s:g} s apart; every rule judged as if real (dry_run ignored), every "
        "message delivered and every cancel done. Nothing was sent or written."
    )
    print(render(rows, REPLAY_TABLE) if rows else "no job would have been notified")
    print(render([totals(result)], REPLAY_TOTALS))
    if result.unjudged:
        print("Verdicts the rules could not judge (nothing acts on them):")
        print(render(result.unjudged, UNJUDGED_TABLE))
    return 0


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
    return _print(
        rows, DIGEST_TABLE, args.json, f"no {args.period} digest is due (each goes out once)"
    )


NO_JOBS = "no running job is judged by a rule"
DECISION_TABLE = (
    Column("cluster", "cluster"),
    Column("job_id", "job"),
    Column("user", "user"),
    Column("rule", "rule"),
    Column("verdict", "verdict"),
    Column("action", "action now"),
    Column("held", "held", missing=""),
    Column("deadline", "deadline (UTC)", missing=""),
    Column("dry_run", "dry run"),
    percent("mean_util", "mean util"),
    Column("idle_gpus", "idle GPUs"),
    Column("gpus_sampled", "GPUs"),
    Column("rdma_bytes_per_node_hour", "RDMA GB/node-h", digits=2, per=1e9),
    Column("reason", "reason"),
)
REPLAY_TABLE = (
    Column("cluster", "cluster"),
    Column("job_id", "job"),
    Column("user", "user"),
    Column("rule", "rule"),
    Column("notify_at", "notify at (UTC)", missing=""),
    Column("warn_at", "warn at (UTC)", missing=""),
    Column("cancel_at", "cancel at (UTC)", missing=""),
    Column("gpu_hours_freed", "GPU-h freed", digits=1),
    percent("mean_util", "mean util"),
    percent("coverage", "coverage"),
    Column("ended", "ended", missing=""),
)
REPLAY_TOTALS = (
    Column("jobs_notified", "jobs notified"),
    Column("jobs_warned", "warned"),
    Column("jobs_cancelled", "cancelled"),
    Column("messages", "messages"),
    Column("gpu_hours_freed", "GPU-h freed", digits=1),
    Column("stale_verdicts", "stale (job, round)s"),
    Column("incomplete_verdicts", "incomplete (job, round)s"),
)
UNJUDGED_TABLE = (
    Column("cluster", "cluster"),
    Column("job_id", "job"),
    Column("user", "user"),
    Column("rule", "rule"),
    Column("outcome", "why"),
    Column("steps", "rounds"),
    Column("first_step", "first (UTC)"),
    Column("last_step", "last (UTC)"),
    percent("min_coverage", "min coverage"),
)
LOG_TABLE = (
    Column("ts", "time (UTC)"),
    Column("cluster", "cluster"),
    Column("job_id", "job", missing=""),
    Column("user", "user", missing=""),
    Column("rule", "rule", missing=""),
    Column("event", "event"),
    Column("outcome", "outcome"),
    Column("deadline", "deadline (UTC)", missing=""),
    Column("channel", "channel", missing=""),
    Column("recipient", "recipient", missing=""),
    Column("dry_run", "dry run"),
    Column("ok", "ok"),
    Column("actor", "by"),
)
DIGEST_TABLE = (
    Column("cluster", "cluster"),
    Column("user", "user", missing=""),
    Column("account", "account", missing=""),
    Column("channel", "channel", missing=""),
    Column("recipient", "recipient", missing=""),
    Column("ok", "ok"),
    Column("dry_run", "dry run"),
    Column("note", "note", missing=""),
)


def decision_rows(decisions: list[Decision]) -> list[dict[str, Any]]:
    """One row per job and rule: the verdict, the step taken now, the deadline, the figures."""
    return [
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
            "reason": verdict_reason(d),
        }
        for d in decisions
    ]


def verdict_reason(d: Decision) -> str:
    """Why the rule judged the job so, in words: a stale or incomplete verdict is data sing
    lacks, not a job found fine, and a reader must see which."""
    e = d.evidence
    host = d.rule.kind in HOST_KINDS  # judged on the cgroups' samples, one per node
    if d.verdict == STALE:
        heard = e.get("last_heard")
        if heard is None and host:
            return (
                "no cgroup sample of the job in the rule's window: waits for data (does the "
                "node's exporter read the jobs' cgroups?)"
            )
        if heard is None:
            return "no GPU sample of the job in the rule's window: waits for data (collector?)"
        return (
            f"a {'node' if host else 'GPU'} last heard {heard:%Y-%m-%d %H:%M} UTC, over "
            "[policy] max_data_age_s ago: waits for fresh data (is the collector running?)"
        )
    if d.verdict == INCOMPLETE:
        return (
            f"{e.get('coverage') or 0:.0%} of the expected samples, under [policy] "
            "min_coverage: waits for fuller data"
        )
    if d.verdict == UNKNOWN:
        if d.rule.kind == EXCESS_MEMORY:
            return (
                "requested or peak memory unknown (no ReqMem in the job's record nor a cgroup "
                "memory limit, or a node without memory readings): not judged"
            )
        return (
            "allocated cores or CPU time unknown (no AllocCPUS nor cpuset, or a node without "
            "CPU readings): not judged"
        )
    if d.verdict == VIOLATING and d.rule.kind == EXCESS_MEMORY:
        return (
            f"peak host memory {e['host_mem_peak_bytes'] / GIB:.1f} GiB of "
            f"{e['host_mem_req_bytes'] / GIB:.1f} GiB requested; about "
            f"{e['suggested_mem_bytes'] / GIB:.0f} GiB per node would do"
        )
    if d.verdict == VIOLATING and host:
        return (
            f"{e['mean_cores_used']:.1f} of {e['alloc_cores']} CPU cores in use "
            f"({e['cpu_efficiency']:.0%}) for {d.job['num_gpus']} GPU(s)"
        )
    return VERDICT_REASONS.get(d.verdict, d.verdict)


GIB = 2**30


VERDICT_REASONS = {
    VIOLATING: "crosses the rule's limit",
    OK: "within the rule (or younger than its minutes)",
    EXEMPT: "exempt by the rule (user, account, partition, QoS, name or interactive)",
    ENDED: "the job ended: the rule's ladder closes",
    CHANGED: "the rule changed since the last round: its ladder starts over",
}


def judged_line(decisions: list[Decision]) -> str:
    """How many running jobs the rules judged and how, so `check` and `run` can be compared
    at a glance (a round lists only the jobs it has something to say about)."""
    jobs = {(d.job["cluster"], d.job["job_id"]) for d in decisions}
    counts: dict[str, int] = {}
    for d in decisions:
        counts[d.verdict] = counts.get(d.verdict, 0) + 1
    verdicts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))
    return f"{len(jobs)} job(s) judged ({verdicts})"


def _print(rows: list[dict[str, Any]], table: tuple[Column, ...], as_json: bool, empty: str) -> int:
    """Rows as JSON for scripts, or as a table for people (`empty` when there are none)."""
    if as_json:
        print_json(rows)
    elif not rows:
        print(empty)
    else:
        print(render(rows, table))
    return 0
