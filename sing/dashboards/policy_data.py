"""The waste policies' audit trail as the dashboards show it: pending warnings, what was done.

Everything comes from `policy_events` (sing/warehouse/audit.py), read like `sing.dashboards.data`
reads the other tables: cached, each call on a fresh warehouse snapshot, pages never build SQL.

A warning is *pending* while its deadline lies ahead and nothing ended its ladder: the newest
warning per (cluster, job, rule) that went out (or was decided, in a dry run) with a deadline
after `now` (or none: a rule that warns without cancelling), and no later successful
cancellation, "left alone", recovery, end or change of the job. `now` is the end of the data,
as everywhere in the dashboards. (An older warning with a later deadline than the newest cannot
hide behind it: a new warning follows only a "left alone", which closes the older one.)
"""

from __future__ import annotations

from datetime import date, datetime

import duckdb
import polars as pl

from sing.dashboards.data import cached
from sing.warehouse.audit import ACTION, MESSAGE, events
from sing.warehouse.store import Warehouse


def connect(root: str, first_day: date | None = None) -> duckdb.DuckDBPyConnection:
    """A snapshot of `policy_events` alone (from `first_day` on): the other tables' files are
    not even listed."""
    return Warehouse(root).connect({"policy_events": first_day})


# A warning's detail carries what the user was told (the engine records it with the message).
SEEN, CANCEL_COMMAND = "seen", "cancel_command"

_PENDING_SQL = """
WITH warned AS (
    SELECT cluster, job_id, rule, max(ts) AS warned_at, arg_max(deadline, ts) AS deadline,
           arg_max("user", ts) AS "user", arg_max(account, ts) AS account,
           arg_max(dry_run, ts) AS dry_run, arg_max(detail, ts) AS detail
    FROM policy_events
    WHERE event = 'message' AND outcome = 'warn' AND (ok OR channel IS NULL)
      AND (deadline > $now OR deadline IS NULL)
      AND job_id IS NOT NULL AND rule IS NOT NULL
    GROUP BY ALL
),
since AS MATERIALIZED (  -- those jobs' ends of a ladder, and their verdicts
    SELECT cluster, job_id, rule, ts, event, outcome, ok, detail
    FROM policy_events SEMI JOIN warned USING (cluster, job_id, rule)
    WHERE outcome IN ('left_alone', 'cancel', 'recovered', 'ended', 'changed', 'violating')
),
closed AS (
    SELECT cluster, job_id, rule, max(ts) AS closed_at FROM since
    WHERE (event = 'action' AND (outcome = 'left_alone' OR (outcome = 'cancel' AND ok)))
       OR (event = 'evaluation' AND outcome IN ('recovered', 'ended', 'changed'))
    GROUP BY ALL
),
seen AS (  -- the figures of the newest violating verdict before each warning
    SELECT s.cluster, s.job_id, s.rule, arg_max(s.detail, s.ts) AS evidence
    FROM since s JOIN warned w USING (cluster, job_id, rule)
    WHERE s.event = 'evaluation' AND s.outcome = 'violating' AND s.ts <= w.warned_at
    GROUP BY ALL
)
SELECT w.cluster, w.job_id, w."user", w.account, w.rule, w.warned_at, w.deadline, w.dry_run,
       w.detail ->> $seen AS seen, w.detail ->> $command AS cancel_command, s.evidence
FROM warned w
LEFT JOIN closed c USING (cluster, job_id, rule)
LEFT JOIN seen s USING (cluster, job_id, rule)
WHERE c.closed_at IS NULL OR c.closed_at < w.warned_at
ORDER BY w.deadline NULLS LAST, w.cluster, w.job_id, w.rule
"""


@cached
def pending_warnings(root: str, now: datetime) -> pl.DataFrame:
    """Warnings whose deadline is still ahead at `now` (soonest first; those without one
    last), of every job (one
    query shared by all visitors; pages pick their user's or job's rows). `evidence` is the
    verdict's figures (JSON)."""
    params = {"now": now, "seen": f"$.{SEEN}", "command": f"$.{CANCEL_COMMAND}"}
    return connect(root).sql(_PENDING_SQL, params=params).pl()


@cached
def trail(root: str, since: datetime, until: datetime) -> pl.DataFrame:
    """Every message and action of [since, until), newest first."""
    con = connect(root, since.date())
    return events(con, since, kinds=(MESSAGE, ACTION)).filter(pl.col("ts") < until)


@cached
def counts_per_rule(root: str, since: datetime, until: datetime) -> pl.DataFrame:
    """Per rule and mode (dry run or real) over [since, until): jobs found violating,
    notified, warned, cancelled and left alone (each job once per column), and failed sends
    or cancellations."""
    frame = events(connect(root, since.date()), since).filter(
        pl.col("ts") < until, pl.col("rule").is_not_null()
    )
    job = pl.struct("cluster", "job_id")

    def jobs(event: str, outcome: str) -> pl.Expr:
        picked = (pl.col("event") == event) & (pl.col("outcome") == outcome) & pl.col("ok")
        return job.filter(picked).n_unique().alias(outcome)

    return (
        frame.group_by("rule", "dry_run")
        .agg(
            jobs("evaluation", "violating"),
            jobs("message", "notify"),
            jobs("message", "warn"),
            jobs("action", "cancel"),
            jobs("action", "left_alone"),
            failed=(~pl.col("ok")).sum(),
        )
        .sort("rule", "dry_run")
    )
