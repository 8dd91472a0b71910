"""The waste policies' audit trail as the dashboards show it: pending warnings, what was done.

Everything comes from `policy_events` (policy/audit.py), read like `dashboards.data` reads the
other tables: cached, each call on a fresh warehouse snapshot, pages never build SQL.

A warning is *pending* while its deadline lies ahead and nothing ended its ladder: the newest
warning per (cluster, job, rule) that went out (or was decided, in a dry run), with a deadline
after `now` and no later successful cancellation, "left alone", recovery, end or change of the
job. `now` is the end of the data, as everywhere in the dashboards.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from dashboards.data import cached, connect
from policy.audit import ACTION, MESSAGE, events

# A warning's detail carries what the user was told (the engine records it with the message).
SEEN, CANCEL_COMMAND = "seen", "cancel_command"

_PENDING_SQL = """
WITH warned AS (
    SELECT cluster, job_id, rule, max(ts) AS warned_at, arg_max(deadline, ts) AS deadline,
           arg_max("user", ts) AS "user", arg_max(account, ts) AS account,
           arg_max(dry_run, ts) AS dry_run, arg_max(detail, ts) AS detail
    FROM policy_events
    WHERE event = 'message' AND outcome = 'warn' AND (ok OR channel IS NULL)
      AND job_id IS NOT NULL AND rule IS NOT NULL
      AND ($user IS NULL OR "user" = $user) AND ($job IS NULL OR job_id = $job)
    GROUP BY ALL
),
closed AS (
    SELECT cluster, job_id, rule, max(ts) AS closed_at
    FROM policy_events
    WHERE (event = 'action' AND (outcome = 'left_alone' OR (outcome = 'cancel' AND ok)))
       OR (event = 'evaluation' AND outcome IN ('recovered', 'ended', 'changed'))
    GROUP BY ALL
),
seen AS (  -- the figures of the newest violating verdict before each warning
    SELECT e.cluster, e.job_id, e.rule, arg_max(e.detail, e.ts) AS evidence
    FROM policy_events e JOIN warned w USING (cluster, job_id, rule)
    WHERE e.event = 'evaluation' AND e.outcome = 'violating' AND e.ts <= w.warned_at
    GROUP BY ALL
)
SELECT w.cluster, w.job_id, w."user", w.account, w.rule, w.warned_at, w.deadline, w.dry_run,
       w.detail ->> $seen AS seen, w.detail ->> $command AS cancel_command, s.evidence
FROM warned w
LEFT JOIN closed c USING (cluster, job_id, rule)
LEFT JOIN seen s USING (cluster, job_id, rule)
WHERE w.deadline > $now AND (c.closed_at IS NULL OR c.closed_at < w.warned_at)
ORDER BY w.deadline, w.cluster, w.job_id, w.rule
"""


@cached
def pending_warnings(
    root: str, now: datetime, user: str | None = None, job_id: str | None = None
) -> pl.DataFrame:
    """Warnings whose deadline is still ahead at `now`, soonest first; only `user`'s jobs, or
    only job `job_id`, when given. `evidence` is the verdict's figures (JSON)."""
    return (
        connect(root)
        .sql(
            _PENDING_SQL,
            params={
                "now": now,
                "user": user,
                "job": job_id,
                "seen": f"$.{SEEN}",
                "command": f"$.{CANCEL_COMMAND}",
            },
        )
        .pl()
    )


@cached
def trail(root: str, since: datetime, until: datetime) -> pl.DataFrame:
    """Every message and action of [since, until), newest first."""
    return events(connect(root), since, kinds=(MESSAGE, ACTION)).filter(pl.col("ts") < until)


@cached
def counts_per_rule(root: str, since: datetime, until: datetime) -> pl.DataFrame:
    """Per rule and mode (dry run or real) over [since, until): jobs found violating,
    notified, warned, cancelled and left alone (each job once per column), and failed sends
    or cancellations."""
    frame = events(connect(root), since).filter(pl.col("ts") < until, pl.col("rule").is_not_null())
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
