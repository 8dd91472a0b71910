"""Grid carbon intensity by hour of use: a constant, or an hourly CSV series (time,g_per_kwh).

A job's intensity is the mean of the hours it ran inside the window, weighted by its GPUs' power
in each hour (the `gpu_hourly` rollup of the GPUs it held, from `job_gpus`); a job without power
samples is weighted by its allocated time per hour. A series row holds until the next row, and
the last row for one hour: an hour the series does not cover makes the job's carbon unknown
(NULL) rather than a guess.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from sing.errors import UserError
from sing.warehouse.analytics import HOME_CLUSTER


def load_series(path: str | Path) -> pl.DataFrame:
    """The CSV as (hour, g_per_kwh) sorted by hour; a clear error for anything else."""
    file = Path(path)
    try:
        frame = pl.read_csv(
            file, columns=["time", "g_per_kwh"], schema_overrides={"time": pl.String}
        )
    except (OSError, pl.exceptions.PolarsError) as err:
        raise UserError(f"carbon_intensity_file {file}: {err}") from err
    try:
        series = frame.select(
            hour=pl.col("time").str.to_datetime(time_zone="UTC", strict=True).dt.truncate("1h"),
            g_per_kwh=pl.col("g_per_kwh").cast(pl.Float64, strict=True),
        )
    except pl.exceptions.PolarsError as err:
        raise UserError(
            f"carbon_intensity_file {file}: times must be ISO 8601 and g_per_kwh numbers: {err}"
        ) from err
    bad = series.filter(
        pl.col("hour").is_null() | pl.col("g_per_kwh").is_null() | (pl.col("g_per_kwh") < 0)
    )
    if bad.height or series.height == 0:
        raise UserError(
            f"carbon_intensity_file {file}: every row needs a time and a g_per_kwh >= 0"
            + ("" if series.height else " (the file has no rows)")
        )
    if series["hour"].is_duplicated().any():
        raise UserError(f"carbon_intensity_file {file}: an hour appears twice")
    return series.sort("hour")


# Per job of `_jobs` (cluster, job_id, w_start, w_end): weights per hour, then the series.
JOB_INTENSITY_SQL = f"""
WITH held AS (
    -- the GPUs of the window's jobs only, before the hourly rows meet them
    SELECT jg.cluster, jg.job_id, jg.node, jg.gpu_index,
           greatest(jg.start_time, j.w_start) AS held_from,
           least(coalesce(jg.end_time, $now), j.w_end) AS held_until
    FROM job_gpus jg JOIN _jobs j ON j.cluster = jg.cluster AND j.job_id = jg.job_id
), held_hours AS (
    -- each hour a GPU was held, so the hourly rows meet them by equality (a range join of a
    -- year of hours against a year of allocations would compare billions of pairs)
    SELECT cluster, job_id, node, gpu_index,
           unnest(generate_series(date_trunc('hour', held_from),
                                  held_until - INTERVAL 1 MICROSECOND, INTERVAL 1 HOUR)) AS hour
    FROM held WHERE held_until > held_from
), powered AS MATERIALIZED (
    SELECT g.cluster, g.job_id, h.hour, sum(h.power_sum) AS w
    FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM gpu_hourly
          -- the day bounds first: `day` is the partition, so other days' files stay unread
          WHERE day >= {{first_day}} AND day <= {{last_day}}
            AND hour >= date_trunc('hour', $since) AND hour < $until AND power_sum > 0) h
    JOIN held_hours g USING (cluster, node, gpu_index, hour)
    GROUP BY ALL
), timed AS (
    SELECT j.cluster, j.job_id, t.hour,
           epoch(least(t.hour + INTERVAL 1 HOUR, j.w_end) - greatest(t.hour, j.w_start)) AS w
    FROM _jobs j ANTI JOIN powered p ON p.cluster = j.cluster AND p.job_id = j.job_id,
         unnest(generate_series(date_trunc('hour', j.w_start), j.w_end - INTERVAL 1 MICROSECOND,
                                INTERVAL 1 HOUR)) AS t(hour)
), series AS (
    SELECT hour, g_per_kwh,
           coalesce(lead(hour) OVER (ORDER BY hour), hour + INTERVAL 1 HOUR) AS until
    FROM _intensity
)
SELECT x.cluster, x.job_id,
       CASE WHEN count(*) FILTER (WHERE x.hour < s.until) = count(*)
            THEN sum(x.w * s.g_per_kwh) / sum(x.w) END AS g_per_kwh
FROM (FROM powered UNION ALL FROM timed) x
ASOF LEFT JOIN series s ON x.hour >= s.hour  -- the row in force at that hour, if still valid
GROUP BY ALL
"""


def job_intensity(
    con: duckdb.DuckDBPyConnection, jobs: pl.DataFrame, series: pl.DataFrame, params: dict
) -> pl.DataFrame:
    """(cluster, job_id, g_per_kwh) for each job of `jobs`, by its hours of use."""
    con.register("_jobs", jobs.select("cluster", "job_id", "w_start", "w_end").to_arrow())
    con.register("_intensity", series.to_arrow())
    try:
        window = {k: params[k] for k in ("since", "until", "now")}
        # date literals, from datetimes: a constant prunes the day partitions, a parameter not
        days = {"first_day": f"DATE '{window['since'].date()}'"}
        days["last_day"] = f"DATE '{window['until'].date()}'"
        return con.sql(JOB_INTENSITY_SQL.format(**days), params=window).pl()
    finally:
        con.unregister("_jobs")
        con.unregister("_intensity")
