"""Failure metrics per period: why jobs ended, what failures cost, how often hardware breaks.

Every finished job gets one failure class from its state (docs/health.md, "Failure metrics"):
- success: COMPLETED;
- user_error: FAILED (a non-zero exit) or OUT_OF_MEMORY;
- timeout: TIMEOUT (or DEADLINE);
- node_failure: NODE_FAIL or BOOT_FAIL, or FAILED on a node while a hardware incident was open
  there (the job's nodes hold the incident's node and it ended between opened_at and
  closed_at, or now while open): the hardware, not the user, ended it;
- preemption: PREEMPTED or REQUEUED;
- cancelled: CANCELLED (by anybody).
Jobs still running or pending, or in a state none of these names, have none (NULL). A requeued
job's earlier runs (`job_runs` rows other than the run in `jobs`) count as well, each by its own
state: a run that ended NODE_FAIL and was requeued is a node failure, one requeued by hand or
by preemption (REQUEUED, PREEMPTED) a preemption.

Over a window [since, until), counting the jobs that ended in it: jobs and GPU-hours by class
(GPU-hours lost = the allocated GPU-hours, GPUs x run time, of user_error, timeout,
node_failure and preemption jobs); hardware incidents (every class but service_request) opened
in it, the mean time between them per node (node-hours of the inventory in the window /
incidents) and per GPU-hour (GPU-hours of the inventory / incidents); service requests per job;
incidents opened, closed, open at the end, and the mean time to close. Incidents are read from
the `incidents` table with SQL (its newest record per incident wins).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb

from sing.errors import UserError
from sing.health.incidents import ENDED_DURING_SQL
from sing.warehouse.analytics import NODE_VERSIONS_SQL
from sing.warehouse.store import Warehouse

FAILURE_CLASSES = ("success", "user_error", "timeout", "node_failure", "preemption", "cancelled")
# The classes whose GPU-hours count as lost: the job did not end as its owner meant it to.
LOST = ("user_error", "timeout", "node_failure", "preemption")
SERVICE_REQUEST = "service_request"
# Without --since, a report covers this long before its end.
DEFAULT_SPAN = timedelta(days=30)


def failure_class_sql(state: str, on_incident: str) -> str:
    """SQL: the failure class (FAILURE_CLASSES, or NULL) of a job in `state`; `on_incident` is a
    boolean expression, true when the job ended on a node during a hardware incident."""
    s = f"upper(split_part(trim({state}), ' ', 1))"  # "CANCELLED by 1001" -> CANCELLED
    return f"""CASE
        WHEN {s} = 'COMPLETED' THEN 'success'
        WHEN {s} IN ('NODE_FAIL', 'BOOT_FAIL') THEN 'node_failure'
        WHEN {s} = 'FAILED' AND {on_incident} THEN 'node_failure'
        WHEN {s} IN ('FAILED', 'OUT_OF_MEMORY') THEN 'user_error'
        WHEN {s} IN ('TIMEOUT', 'DEADLINE') THEN 'timeout'
        WHEN {s} IN ('PREEMPTED', 'REQUEUED') THEN 'preemption'
        WHEN {s} = 'CANCELLED' THEN 'cancelled'
    END"""


def classified_sql(jobs: str, now: str = "$now") -> str:
    """SQL: every row of relation `jobs` (job columns, any extra ones kept) with its
    `failure_class`; an incident still open counts as open until the SQL expression `now`, and
    for at most `sing.health.incidents.LINK_HOURS` after it opened."""
    return f"""
SELECT j.*, {failure_class_sql("j.state", "h.job_id IS NOT NULL")} AS failure_class
FROM {jobs} j
LEFT JOIN (
    SELECT DISTINCT f.cluster, f.job_id
    FROM {jobs} f JOIN incidents i
      ON i.cluster = f.cluster AND list_contains(f.nodes, i.node)
     AND {ENDED_DURING_SQL.format(j="f", i="i", now=now)}
    WHERE i.class <> '{SERVICE_REQUEST}' AND upper(trim(f.state)) = 'FAILED'
) h ON h.cluster = j.cluster AND h.job_id = j.job_id
"""


# A requeued job's earlier runs, each as a job row with the run's own state, times, nodes and
# GPUs (the run in `jobs` is left out: it is the job's row).
EARLIER_RUNS_SQL = """
SELECT j.* REPLACE (r.state AS state, r.start_time AS start_time, r.end_time AS end_time,
                    r.nodes AS nodes, r.num_gpus AS num_gpus, r.exit_code AS exit_code)
FROM job_runs r JOIN jobs j ON j.cluster = r.cluster AND j.job_id = r.job_id
WHERE r.start_time IS DISTINCT FROM j.start_time
"""

# The jobs and earlier runs that ended in [$since, $until), classified, with their allocated
# GPU-hours.
ENDED_SQL = f"""
WITH ended AS (
    SELECT * FROM (SELECT * FROM jobs UNION ALL BY NAME {EARLIER_RUNS_SQL})
    WHERE end_time >= $since AND end_time < $until
)
SELECT cluster, job_id, "user", account, state, nodes, end_time, failure_class,
       coalesce(num_gpus, 0) * coalesce(epoch(end_time - start_time), 0) / 3600 AS gpu_hours
FROM ({classified_sql("ended")})
"""

# Node-hours and GPU-hours of the GPU nodes in the inventory over [$since, min($until, $now)).
CAPACITY_SQL = f"""
SELECT sum(s) / 3600 AS node_hours, sum(s * gpus) / 3600 AS gpu_hours
FROM (
    SELECT gpus, greatest(epoch(least(valid_until, $until, $now)
                                - greatest(valid_from, $since)), 0) AS s
    FROM ({NODE_VERSIONS_SQL}) WHERE gpus > 0
)
"""

INCIDENTS_SQL = f"""
SELECT count(*) FILTER (WHERE opened_at >= $since AND opened_at < $until
                        AND class <> '{SERVICE_REQUEST}') AS hardware,
       count(*) FILTER (WHERE opened_at >= $since AND opened_at < $until
                        AND class = '{SERVICE_REQUEST}') AS service_requests,
       count(*) FILTER (WHERE opened_at >= $since AND opened_at < $until) AS opened,
       count(*) FILTER (WHERE closed_at >= $since AND closed_at < $until) AS closed,
       count(*) FILTER (WHERE opened_at < $until
                        AND (closed_at IS NULL OR closed_at >= $until)) AS open_at_end,
       avg(epoch(closed_at - opened_at))
           FILTER (WHERE closed_at >= $since AND closed_at < $until) AS mean_time_to_close_s
FROM incidents
"""

# Per node: hardware incidents opened in the window, and those open at its end.
PER_NODE_SQL = f"""
SELECT cluster, node,
       count(*) FILTER (WHERE opened_at >= $since) AS incidents,
       count(*) FILTER (WHERE closed_at IS NULL OR closed_at >= $until) AS open_at_end,
       list(DISTINCT class ORDER BY class) AS classes
FROM incidents
WHERE class <> '{SERVICE_REQUEST}' AND opened_at < $until
  AND (opened_at >= $since OR closed_at IS NULL OR closed_at >= $since)
GROUP BY ALL
ORDER BY incidents DESC, open_at_end DESC, cluster, node
"""

OVER_TIME_SQL = f"""
SELECT date_trunc($bucket, end_time) AS bucket, failure_class,
       count(*) AS jobs, sum(gpu_hours) AS gpu_hours
FROM ({ENDED_SQL})
WHERE failure_class IS NOT NULL
GROUP BY ALL ORDER BY bucket, failure_class
"""

OPEN_SQL = """
SELECT incident_id, cluster, node, device, class, source, signal, opened_at, opened_by, jobs
FROM incidents WHERE closed_at IS NULL AND opened_at <= $now
ORDER BY opened_at, cluster, incident_id
"""


def snapshot(warehouse: Warehouse) -> duckdb.DuckDBPyConnection:
    """A connection holding only the tables the metrics read (not the samples, whose views
    would list every day's files)."""
    return warehouse.connect(dict.fromkeys(("jobs", "job_runs", "incidents", "nodes")))


def window(since: datetime | None, until: datetime | None, now: datetime) -> dict[str, datetime]:
    """The query parameters of a report: [since, until) (default: the DEFAULT_SPAN up to now)."""
    end = until or now
    start = since or end - DEFAULT_SPAN
    if end <= start:
        raise UserError(f"--until {end.isoformat()} must be after --since {start.isoformat()}")
    return {"since": start, "until": end, "now": now}


def report(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None,
    until: datetime | None,
    now: datetime,
) -> dict:
    """The failure metrics of [since, until) (see the module's docstring), as one JSON-ready
    dict: `window`, `jobs`, `causes` (one row per class), `gpu_hours_lost`, `incidents`,
    `mtbf`, `service_requests_per_job`, `nodes` (per node: incidents in the window)."""
    params = window(since, until, now)
    causes = causes_of(con, params)
    jobs = sum(row["jobs"] for row in causes)
    incidents = _one(con, INCIDENTS_SQL, params)
    capacity = _one(con, CAPACITY_SQL, params)
    hardware = incidents["hardware"]
    node_hours, gpu_hours = capacity["node_hours"], capacity["gpu_hours"]
    return {
        "window": params,
        "jobs": jobs,
        "causes": causes,
        "gpu_hours_lost": sum(row["gpu_hours"] for row in causes if row["failure_class"] in LOST),
        "incidents": incidents,
        "mtbf": {
            "node_hours": node_hours,
            "gpu_hours": gpu_hours,
            # None: no incident in the window (or no inventory), so no mean to tell
            "node_hours_between": node_hours / hardware if hardware and node_hours else None,
            "gpu_hours_between": gpu_hours / hardware if hardware and gpu_hours else None,
        },
        "service_requests_per_job": incidents["service_requests"] / jobs if jobs else None,
        "nodes": _rows(con, PER_NODE_SQL, params),
    }


def causes_of(con: duckdb.DuckDBPyConnection, params: dict) -> list[dict]:
    """Jobs, GPU-hours and share of jobs per failure class (every class, zeros included)."""
    found = {
        row["failure_class"]: row
        for row in _rows(
            con,
            f"SELECT failure_class, count(*) AS jobs, sum(gpu_hours) AS gpu_hours "
            f"FROM ({ENDED_SQL}) WHERE failure_class IS NOT NULL GROUP BY ALL",
            params,
        )
    }
    total = sum(row["jobs"] for row in found.values())
    return [
        {
            "failure_class": name,
            "jobs": found.get(name, {}).get("jobs", 0),
            "gpu_hours": found.get(name, {}).get("gpu_hours") or 0.0,
            "share": found.get(name, {}).get("jobs", 0) / total if total else None,
        }
        for name in FAILURE_CLASSES
    ]


def over_time(
    con: duckdb.DuckDBPyConnection,
    since: datetime,
    until: datetime,
    now: datetime,
    bucket: str = "day",
) -> list[dict]:
    """Per `bucket` (day or week) of end time and failure class: jobs and GPU-hours."""
    if bucket not in ("day", "week"):
        raise UserError(f"bucket {bucket!r}: use day or week")
    return _rows(con, OVER_TIME_SQL, {**window(since, until, now), "bucket": bucket})


def open_incidents(con: duckdb.DuckDBPyConnection, now: datetime) -> list[dict]:
    """Incidents open at `now`, oldest first."""
    return _rows(con, OPEN_SQL, {"now": now})


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> list[dict]:
    used = {k: v for k, v in params.items() if f"${k}" in sql}
    result = con.execute(sql, used)
    names = [d[0] for d in result.description]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> dict:
    (row,) = _rows(con, sql, params)
    return row
