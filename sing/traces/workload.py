"""Workload characterisation, as in the SING paper's usage analysis: how long jobs run and wait,
how many GPUs and nodes they take, and when in the day and week the load comes.

It answers the same questions for the warehouse's own jobs and for any trace release in the open
format, so a site sets its cluster beside public traces. Each source is first brought to one
relation of jobs (`JOB_COLUMNS`: epoch seconds, so hours and weekdays are plain arithmetic in
UTC); the same SQL then computes every figure from it.

Which jobs count: GPU jobs (GPUs > 0) submitted in the window. Run time is over those that
finished (a job still running, or cut by a release's end, has no run time yet); queue time, GPUs
and nodes over those that started. Quantiles are nearest-rank (DuckDB's quantile_disc: the
smallest value with at least that share of jobs at or below it), so they are values jobs had.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl

from sing.errors import UserError
from sing.times import parse_time
from sing.traces import sql
from sing.traces.format import JOBS, conform
from sing.traces.read import read_package, read_table
from sing.warehouse.store import Warehouse


@dataclass(frozen=True)
class Metric:
    """One distribution: the job column, its printed unit (`per` stored units, seconds or
    GPUs, in one printed unit), the values the CDF is read at (stored units) and the decimals
    its quantiles print with (nodes are whole; a GPU share is not)."""

    key: str
    title: str
    unit: str
    per: float
    points: tuple[float, ...]
    digits: int


METRICS = (
    Metric("run_s", "run time", "h", 3600, (60, 600, 3600, 36_000, 86_400, 604_800), 2),
    Metric("queue_s", "queue time", "min", 60, (0, 60, 600, 3600, 36_000, 86_400), 1),
    Metric("gpus", "GPUs per job", "GPUs", 1, (1, 2, 4, 8, 16, 32, 64), 2),
    Metric("nodes", "nodes per job", "nodes", 1, (1, 2, 4, 8, 16), 0),
)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
CURVE_STEPS = 100  # the CDF curve: the value at every 1 % of jobs
# Load slots: hour of the day (0-23, UTC) and ISO weekday (1 = Monday ... 7 = Sunday).
SCALES = {"hour": 24, "weekday": 7}
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

# The relation every source is brought to. Times are epoch seconds (UTC); `in_window`: submitted
# in the window (the distributions and the offered load); `ran`: started (`start` may still be
# unknown where a trace records only a duration); `end` of a running job is `now`.
JOB_COLUMNS = ("submit", "start", "end", "run_s", "queue_s", "gpus", "nodes", "ran", "in_window")

WAREHOUSE_JOBS_SQL = """
SELECT epoch(submit_time) AS submit, epoch(start_time) AS start,
       epoch(coalesce(end_time, greatest($now, start_time))) AS "end",
       CASE WHEN end_time IS NOT NULL THEN epoch(end_time - start_time) END AS run_s,
       epoch(start_time - submit_time) AS queue_s,
       num_gpus::DOUBLE AS gpus, nullif(num_nodes, 0)::BIGINT AS nodes,
       start_time IS NOT NULL AS ran,
       $since IS NULL OR submit_time >= $since AS in_window
FROM jobs
WHERE ($until IS NULL OR submit_time < $until)
  AND ($since IS NULL OR submit_time >= $since OR coalesce(end_time, $now) > $since)
  AND ($cluster IS NULL OR cluster = $cluster)
"""


def trace_jobs_sql(columns: list[str]) -> str:
    """The relation over a release's jobs table `trace` (times from `$origin`, epoch seconds).
    GPUs are the fractional request where the release has one (format 1.2), else the count."""
    gpus = "coalesce(gpu_request, num_gpus)" if "gpu_request" in columns else "num_gpus"
    return f"""
SELECT $origin + submit_s AS submit, $origin + start_s AS start,
       $origin + coalesce(end_s, start_s + run_s) AS "end",
       CASE WHEN NOT coalesce(censored, false) THEN run_s END AS run_s,
       coalesce(queue_s, start_s - submit_s) AS queue_s,
       {gpus}::DOUBLE AS gpus, nullif(num_nodes, 0)::BIGINT AS nodes,
       start_s IS NOT NULL OR run_s IS NOT NULL AS ran,
       true AS in_window
FROM trace
"""


@dataclass(frozen=True)
class Profile:
    """One source's workload.

    `counts`: jobs submitted in the window, of which GPU jobs, CPU-only, never started.
    `stats`: one row per metric: jobs, mean, p10 ... p99 (stored units).
    `at_points`: metric, point, share of jobs at or below the point (the CDF read at it).
    `curve`: metric, share, value: the CDF as CURVE_STEPS + 1 points, for charts.
    `load`: scale ("hour" or "weekday"), slot, offered and running GPU-hours and their shares of
    the scale's total; offered = GPU x run hours of the jobs submitted in the slot, running =
    GPU-hours held in the slot (clipped to the window). None where the source's clock is not
    real (a release from a secret time origin); running figures are None where it has no start
    times. `note` says why a figure is missing.
    """

    name: str
    counts: dict[str, int]
    stats: pl.DataFrame
    at_points: pl.DataFrame
    curve: pl.DataFrame
    load: pl.DataFrame | None
    note: str = ""

    def as_dict(self) -> dict:
        """The profile for `--json` (stored units: seconds, GPUs, nodes, GPU-hours)."""
        return {
            "name": self.name,
            "counts": self.counts,
            "note": self.note,
            "stats": self.stats.to_dicts(),
            "at_points": self.at_points.to_dicts(),
            "curve": self.curve.to_dicts(),
            "load": None if self.load is None else self.load.to_dicts(),
        }


def from_warehouse(
    wh: Warehouse,
    since: datetime | None,
    until: datetime | None,
    now: datetime,
    name: str,
    cluster: str | None = None,
) -> Profile:
    """The warehouse's jobs submitted in [since, until) (either end open), of `cluster` only
    where given; the running load counts GPU-hours held inside the window, running jobs up to
    `now`."""
    con = wh.connect({"jobs": None})
    con.execute(
        f"CREATE TEMP TABLE workload_jobs AS {WAREHOUSE_JOBS_SQL}",
        {"since": since, "until": until, "now": now, "cluster": cluster},
    )
    clip = (since.timestamp() if since else None, until.timestamp() if until else None)
    return profile(con, name, clip)


def from_trace(path: str | Path, name: str | None = None) -> Profile:
    """A release's jobs (all of them: a release is its own window)."""
    package = read_package(path)
    jobs = conform(JOBS, read_table(path))  # fields a release left out ([trace] drop): empty
    con = sql.connect()
    con.register("trace", jobs)
    origin = release_start(package, path).timestamp()
    con.execute(
        f"CREATE TEMP TABLE workload_jobs AS {trace_jobs_sql(jobs.column_names)}",
        {"origin": origin},
    )
    secret = (package.get("anonymization") or {}).get("time_origin") == "secret"
    starts = jobs.num_rows - jobs.column("start_s").null_count
    note = ""
    if secret:
        note = "times count from a secret origin: no hour of day or weekday"
    elif not starts:
        note = "no start times: the running load is unknown"
    name = name or Path(path).resolve().name
    return profile(con, name, (None, None), timed=not secret, note=note)


def release_start(package: dict, path: str | Path) -> datetime:
    """The release's time origin (UTC where it names no zone)."""
    try:
        return parse_time(str(package.get("release_start")), "release_start")
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def profile(
    con: duckdb.DuckDBPyConnection,
    name: str,
    clip: tuple[float | None, float | None],
    timed: bool = True,
    note: str = "",
) -> Profile:
    """Every figure of the `workload_jobs` table on `con`; `clip` bounds the running load."""
    counts = con.sql(
        """SELECT count(*) AS jobs, count(*) FILTER (gpus > 0) AS gpu_jobs,
                  count(*) FILTER (coalesce(gpus, 0) = 0) AS cpu_only,
                  count(*) FILTER (gpus > 0 AND NOT ran) AS never_started
           FROM workload_jobs WHERE in_window"""
    ).pl()
    stats, at_points, curve = _distributions(con)
    return Profile(
        name,
        counts.to_dicts()[0],
        stats,
        at_points,
        curve,
        _load(con, clip) if timed else None,
        note,
    )


def _population(metric: Metric) -> str:
    """The jobs a metric is over (see the module docstring)."""
    return "gpus > 0 AND in_window" + ("" if metric.key == "run_s" else " AND ran")


def _distributions(con: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, ...]:
    curve_at = [i / CURVE_STEPS for i in range(CURVE_STEPS + 1)]
    parts = [
        f"""SELECT '{m.key}' AS metric, count({m.key}) AS jobs, avg({m.key}) AS mean,
                   quantile_disc({m.key}, {list(QUANTILES)}) AS q,
                   [{", ".join(f"avg(({m.key} <= {p})::DOUBLE)" for p in m.points)}] AS at,
                   quantile_disc({m.key}, {curve_at}) AS curve
            FROM workload_jobs WHERE {_population(m)}"""
        for m in METRICS
    ]
    rows = con.sql(" UNION ALL ".join(parts)).pl()
    stats = rows.select(
        "metric",
        "jobs",
        "mean",
        *(pl.col("q").list.get(i).alias(quantile_name(q)) for i, q in enumerate(QUANTILES)),
    )
    at_points = pl.concat(
        pl.DataFrame(
            {"metric": m.key, "point": [float(p) for p in m.points], "share": row["at"]},
            schema={"metric": pl.String, "point": pl.Float64, "share": pl.Float64},
        )
        for m, row in zip(METRICS, rows.iter_rows(named=True), strict=True)
    )
    curve = (
        rows.filter(pl.col("curve").is_not_null())  # no job had the figure: no curve
        .select("metric", "curve", share=pl.lit(curve_at, pl.List(pl.Float64)))
        .explode("curve", "share")
        .rename({"curve": "value"})
        .select("metric", "share", pl.col("value").cast(pl.Float64))
    )
    return stats, at_points, curve


def quantile_name(q: float) -> str:
    return f"p{round(q * 100)}"


# Hour (of the day) and ISO weekday of epoch seconds: epoch day 0 (1970-01-01) was a Thursday.
def _slots(t: str) -> str:
    hour = f"floor({t} / 3600)::BIGINT"
    day = f"floor({t} / 86400)::BIGINT"
    return f"(({hour} % 24) + 24) % 24 AS hour, ((({day} + 3) % 7) + 7) % 7 + 1 AS weekday"


def _load(con: duckdb.DuckDBPyConnection, clip: tuple[float | None, float | None]) -> pl.DataFrame:
    """GPU-hours offered (at submit) and running (hour by hour) per hour of day and weekday."""
    has_start = con.execute("SELECT count(start) > 0 FROM workload_jobs").fetchall()[0][0]
    params = {"since": clip[0], "until": clip[1]}
    # Each job's time held, clipped to the window, cut at every hour it spans.
    running = f"""
        WITH held AS (
            SELECT gpus, greatest(start, coalesce($since, start)) AS s,
                   least("end", coalesce($until, "end")) AS e
            FROM workload_jobs WHERE gpus > 0 AND start IS NOT NULL AND "end" > start
        ), hours AS (
            SELECT gpus, s, e, unnest(range(floor(s / 3600)::BIGINT, ceil(e / 3600)::BIGINT)) AS h
            FROM held WHERE e > s
        )
        SELECT {_slots("h * 3600")},
               gpus * (least(e, (h + 1) * 3600) - greatest(s, h * 3600)) / 3600 AS gpu_hours
        FROM hours
    """
    offered = f"""
        SELECT {_slots("submit")}, gpus * coalesce(run_s, "end" - start) / 3600 AS gpu_hours
        FROM workload_jobs WHERE gpus > 0 AND in_window AND ran
    """
    # Both scales from one pass: GPU-hours per hour of the week (weekday x hour).
    week = con.sql(
        f"""
        WITH o AS (SELECT weekday, hour, sum(gpu_hours) AS gh FROM ({offered}) GROUP BY ALL),
             r AS (SELECT weekday, hour, sum(gpu_hours) AS gh FROM ({running}) GROUP BY ALL)
        SELECT weekday, hour, coalesce(o.gh, 0) AS offered, coalesce(r.gh, 0) AS running
        FROM (SELECT * FROM range(1, 8) d(weekday) CROSS JOIN range(0, 24) t(hour)) slots
        LEFT JOIN o USING (weekday, hour) LEFT JOIN r USING (weekday, hour)
        """,
        params=params,
    ).pl()
    load = pl.concat(
        week.group_by(pl.col(scale).alias("slot"))
        .agg(
            pl.lit(scale).alias("scale"),
            pl.col("offered").sum().alias("offered_gpu_hours"),
            pl.col("running").sum().alias("running_gpu_hours"),
        )
        .sort("slot")
        for scale in SCALES
    ).select("scale", "slot", "offered_gpu_hours", "running_gpu_hours")
    if not has_start:  # no start times: when jobs ran is unknown, not never
        load = load.with_columns(running_gpu_hours=pl.lit(None, pl.Float64))
    return load.with_columns(
        (pl.col(c) / pl.col(c).sum().over("scale")).alias(c.replace("gpu_hours", "share"))
        for c in ("offered_gpu_hours", "running_gpu_hours")
    )


def slots(scale: str) -> range:
    """The slots of a load scale: hours 0-23, weekdays 1-7."""
    first = 1 if scale == "weekday" else 0
    return range(first, first + SCALES[scale])


def point_label(metric: Metric, value: float) -> str:
    """A CDF point as people read it: "10 min", "1 d", "8" (GPUs)."""
    if metric.unit not in ("h", "min"):
        return f"{value:g}"
    if value == 0:
        return f"0 {metric.unit}"
    for size, unit in ((604_800, "wk"), (86_400, "d"), (3600, "h"), (60, "min")):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} s"


def slot_label(scale: str, slot: int) -> str:
    """ "03:00" for an hour of the day, "Mon" for a weekday."""
    return f"{slot:02d}:00" if scale == "hour" else WEEKDAYS[slot - 1]


def unique_names(profiles: list[Profile]) -> list[Profile]:
    """The profiles with distinct names (a second "philly" becomes "philly (2)")."""
    seen: dict[str, int] = {}
    out = []
    for p in profiles:
        seen[p.name] = seen.get(p.name, 0) + 1
        out.append(p if seen[p.name] == 1 else replace(p, name=f"{p.name} ({seen[p.name]})"))
    return out
