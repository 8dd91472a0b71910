"""Golden aggregates: the few numbers a user recomputes to check their copy of a trace.

The same query runs when a trace is written (stored as aggregates.json) and when it is validated
or summarised, so a copy that lost, duplicated or altered rows disagrees with its own file.
GPU figures follow the public trace summaries (Helios, AcmeTrace): run and queue statistics are
over GPU jobs (num_gpus > 0) that have the figure. GPU-seconds count a share of one GPU as its
fraction (`gpu_request`, format 1.2; releases without it: `num_gpus`).
"""

from __future__ import annotations

import math

import pyarrow as pa

from sing.traces import sql

AGGREGATES_SQL = """
SELECT
    count(*) AS jobs,
    count(*) FILTER (WHERE num_gpus > 0) AS gpu_jobs,
    count(DISTINCT "user") AS users,
    count(*) FILTER (WHERE censored) AS censored_jobs,
    coalesce(sum(run_s * coalesce(gpu_request, num_gpus)), 0)::DOUBLE AS gpu_seconds,
    coalesce(sum(run_s * coalesce(gpu_request, num_gpus)), 0)::DOUBLE / 3600 AS gpu_hours,
    avg(run_s) FILTER (WHERE num_gpus > 0) AS mean_run_s,
    median(run_s) FILTER (WHERE num_gpus > 0) AS median_run_s,
    avg(queue_s) FILTER (WHERE num_gpus > 0) AS mean_queue_s,
    median(queue_s) FILTER (WHERE num_gpus > 0) AS median_queue_s,
    avg(num_gpus) FILTER (WHERE num_gpus > 0) AS mean_gpus,
    max(end_s) AS last_end_s
FROM jobs
"""

STATES_SQL = "SELECT state, count(*) AS n FROM jobs GROUP BY state ORDER BY state"


def compute(jobs: pa.Table, timeseries: pa.Table | None = None) -> dict:
    """Aggregates of a jobs table (and the row count of its timeseries, if any)."""
    con = sql.connect()
    con.register("jobs", _with_defaults(jobs))
    cursor = con.execute(AGGREGATES_SQL)
    names = [d[0] for d in cursor.description]
    out: dict = dict(zip(names, cursor.fetchone(), strict=True))
    out["jobs_by_state"] = dict(con.execute(STATES_SQL).fetchall())
    if timeseries is not None:
        out["timeseries_rows"] = timeseries.num_rows
    return {k: _plain(v) for k, v in out.items()}


def differences(expected: dict, actual: dict, rel_tol: float = 1e-9) -> list[str]:
    """Human-readable mismatches between stored and recomputed aggregates."""
    problems = []
    for key in sorted(set(expected) | set(actual)):
        a, b = expected.get(key), actual.get(key)
        same = (
            math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)
            if isinstance(a, float | int) and isinstance(b, float | int)
            else a == b
        )
        if not same:
            problems.append(f"aggregate {key}: file says {a!r}, data gives {b!r}")
    return problems


def _with_defaults(jobs: pa.Table) -> pa.Table:
    """A release may drop optional fields; the query still needs them (as nulls)."""
    for name, dtype in (
        ("user", pa.string()),
        ("num_gpus", pa.int64()),
        ("gpu_request", pa.float64()),
        ("queue_s", pa.float64()),
        ("end_s", pa.float64()),
    ):
        if name not in jobs.column_names:
            jobs = jobs.append_column(name, pa.nulls(jobs.num_rows, dtype))
    return jobs


def _plain(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
