"""Reports people receive without asking: each finished job's `sing job` report, a weekly digest
per user and a monthly digest per account.

Each is sent once: what went out is recorded in the audit trail (`policy_events`, event
"message") and read back, so a restarted service or a second round sends nothing twice. A
delivery that failed is not settled and goes out again next round; a dry run records what it
would have sent (dry_run=true) without settling the real send.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

import duckdb

from sing.accounting.periods import month_before, period_window
from sing.config import Config
from sing.policy.messages import (
    JOB_END,
    MONTHLY_DIGEST,
    NO_CHANNEL,
    WEEKLY_DIGEST,
    Message,
    Postman,
)
from sing.policy.settings import PolicySettings, site_coverage
from sing.warehouse import audit
from sing.warehouse.analytics import JOB_USAGE_SQL
from sing.warehouse.job_report import job_report, load_notes, render
from sing.warehouse.rollups import IDLE_SAMPLE_UTIL
from sing.warehouse.store import Warehouse

# Jobs that ended longer ago get no report (a site turning reports on, or a service that was
# down, does not flood users with old news).
JOB_END_LOOKBACK = timedelta(days=1)
ACTOR = "sing policy run"
PERIODS: tuple[Literal["weekly", "monthly"], ...] = ("weekly", "monthly")


def send_job_end_reports(
    warehouse: Warehouse,
    config: Config,
    postman: Postman,
    now: datetime,
    dry_run: bool = False,
    actor: str | None = None,
) -> list[audit.Event]:
    """Send each job that ended in the last day its report, once, unless its user opted out."""
    settings = config.section("policy", PolicySettings)
    if not settings.job_end_reports:
        return []
    dry = dry_run or settings.dry_run
    con = warehouse.connect()
    thresholds = config.thresholds
    notes = load_notes(
        config.resolve_path(thresholds.notes_file) if thresholds.notes_file else None
    )
    since = now - JOB_END_LOOKBACK  # a job's report is recorded after the job ended
    finished = con.execute(
        """
        SELECT cluster, job_id, "user", account FROM jobs
        WHERE start_time IS NOT NULL AND num_gpus > 0 AND end_time >= $since AND end_time < $now
          AND NOT list_contains($opted_out, "user")
        ORDER BY end_time, cluster, job_id
        """,
        {"since": since, "now": now, "opted_out": settings.job_end_opt_out},
    ).fetchall()
    settled = _settled(con, JOB_END, dry, since, lambda e: (e["cluster"], e["job_id"]))
    events: list[audit.Event] = []
    for cluster, job_id, user, account in finished:
        if (cluster, job_id) in settled:
            continue
        job = job_report(con, job_id, thresholds, notes, now, cluster, site_coverage(config))
        context = {"job": job, "report": render(job), "cluster": cluster, "dry_run": dry}
        message = Message(JOB_END, user, cluster, job_id, None, account, context)
        events += _deliver(postman, message, dry, now, actor, {})
    audit.record(warehouse, events)
    return events


def send_digests(
    warehouse: Warehouse,
    config: Config,
    postman: Postman,
    period: Literal["weekly", "monthly"],
    now: datetime,
    dry_run: bool = False,
    actor: str | None = None,
) -> list[audit.Event]:
    """Send the digests of the last complete week (per user) or month (per account with a
    contact), once each, when the site enables them."""
    settings = config.section("policy", PolicySettings)
    weekly = period == "weekly"
    if not (settings.weekly_digests if weekly else settings.monthly_account_digests):
        return []
    dry = dry_run or settings.dry_run
    start, end = last_period(period, now, settings.zone)
    con = warehouse.connect()
    who = "user" if weekly else "account"
    rows = digest_figures(con, who, start, end)
    kind = WEEKLY_DIGEST if weekly else MONTHLY_DIGEST
    tag = {"period": start.isoformat()}
    # A period's digests are recorded after it ends.
    settled = _settled(con, kind, dry, end, lambda e: (e["cluster"], e[who], e["detail"]["period"]))
    events: list[audit.Event] = []
    for row in rows:
        name = row[who]
        if (row["cluster"], name, tag["period"]) in settled:
            continue
        if not weekly and name not in settings.account_contacts:
            continue
        context = {
            "digest": row,
            "start": start,
            "end": end,
            "last_day": (end - timedelta(days=1)).date(),
            "cluster": row["cluster"],
            "dry_run": dry,
        }
        if not weekly:
            context["users"] = digest_figures(con, "user", start, end, account=name)
        user = name if weekly else ""
        message = Message(kind, user, row["cluster"], None, None, row.get("account"), context)
        events += _deliver(postman, message, dry, now, actor, tag)
    audit.record(warehouse, events)
    return events


def last_period(
    period: Literal["weekly", "monthly"], now: datetime, tz: ZoneInfo
) -> tuple[datetime, datetime]:
    """[start, end) of the last complete week (Monday to Monday, in the site's time zone: a
    user's week) or account month (UTC, the month of the account's statement)."""
    if period == "monthly":
        return period_window(month_before(now))
    local = now.astimezone(tz)
    monday = local.date() - timedelta(days=local.weekday())
    end = datetime(monday.year, monday.month, monday.day, tzinfo=tz)
    before = monday - timedelta(days=7)
    return datetime(before.year, before.month, before.day, tzinfo=tz), end


def digest_figures(
    con: duckdb.DuckDBPyConnection,
    who: Literal["user", "account"],
    start: datetime,
    end: datetime,
    account: str | None = None,
) -> list[dict[str, Any]]:
    """Per cluster and user (or account): GPU jobs that ended in [start, end), their GPU-hours,
    GPU-hour-weighted mean utilisation and idle GPU-hours, beside the cluster's mean and the
    rank by mean utilisation (1 = the most efficient; users without telemetry are not ranked)."""
    return (
        con.sql(
            f"""
            WITH j AS (
                SELECT * FROM ({JOB_USAGE_SQL})
                WHERE end_time >= $start AND end_time < $end AND num_gpus > 0
                  AND ($account IS NULL OR account = $account)
            ), per AS (
                SELECT cluster, "{who}", count(*) AS jobs, sum(gpu_hours) AS gpu_hours,
                       sum(mean_util * gpu_hours)
                           / nullif(sum(gpu_hours) FILTER (WHERE mean_util IS NOT NULL), 0)
                           AS mean_util,
                       sum(coalesce(idle_gpu_hours, 0)) AS idle_gpu_hours
                FROM j GROUP BY ALL
            ), whole AS (
                SELECT cluster,
                       sum(mean_util * gpu_hours)
                           / nullif(sum(gpu_hours) FILTER (WHERE mean_util IS NOT NULL), 0)
                           AS cluster_mean_util
                FROM j GROUP BY cluster
            )
            SELECT per.*, whole.cluster_mean_util,
                   CASE WHEN per.mean_util IS NOT NULL THEN rank() OVER (
                       PARTITION BY per.cluster ORDER BY per.mean_util DESC NULLS LAST) END
                       AS rank,
                   count(per.mean_util) OVER (PARTITION BY per.cluster) AS ranked
            FROM per JOIN whole USING (cluster)
            ORDER BY per.cluster, per.gpu_hours DESC, per."{who}"
            """,
            params={
                "start": start,
                "end": end,
                "since": datetime(1970, 1, 1, tzinfo=UTC),  # the WHERE above picks the jobs
                "until": end,
                "now": end,
                "idle_sample": IDLE_SAMPLE_UTIL,
                "account": account,
            },
        )
        .pl()
        .to_dicts()
    )


def _settled(
    con: duckdb.DuckDBPyConnection,
    kind: str,
    dry: bool,
    since: datetime,
    key: Callable[[dict[str, Any]], tuple],
) -> set[tuple]:
    """Keys of the messages of `kind` recorded since `since` and settled: sent for real, or
    undelivered for want of a channel (a retry finds none either), or, in a dry run, also
    already recorded by an earlier dry run."""
    trail = audit.events(con, since=since, kinds=(audit.MESSAGE,)).filter(outcome=kind)
    if not dry:
        trail = trail.filter(dry_run=False)
    events = ({**e, "detail": json.loads(e["detail"] or "{}")} for e in trail.to_dicts())
    return {key(e) for e in events if e["ok"] or e["detail"].get("error") == NO_CHANNEL}


def _deliver(
    postman: Postman,
    message: Message,
    dry: bool,
    now: datetime,
    actor: str | None,
    detail: dict[str, Any],
) -> list[audit.Event]:
    """Send `message` (unless a dry run) and the audit events saying what happened to it."""

    def event(channel: str | None, recipient: str | None, ok: bool, **more: Any) -> audit.Event:
        return audit.Event(
            ts=now.astimezone(UTC),
            cluster=message.cluster,
            event=audit.MESSAGE,
            outcome=message.kind,
            actor=actor or audit.actor(ACTOR),
            dry_run=dry,
            job_id=message.job_id,
            user=message.user or None,
            account=message.account,
            channel=channel,
            recipient=recipient,
            ok=ok,
            detail={**detail, **more},
        )

    if dry:
        return [event(None, None, True, held="dry run")]
    deliveries = postman.send(message)
    if not deliveries:
        return [event(None, None, False, error=NO_CHANNEL)]
    return [
        event(d.channel, d.recipient, d.ok, **({"error": d.error} if d.error else {}))
        for d in deliveries
    ]
