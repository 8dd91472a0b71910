"""Usage by user, account, partition or GPU model over a window: GPU-hours, charges, energy,
carbon and what is left of each account's allocation (docs/accounting.md has the method).

Every figure counts only the part of a job inside [since, until) (running jobs up to `now`):
- allocated GPU-hours: the job's GPUs x its hours in the window;
- used / idle GPU-hours: allocated x the mean utilisation / the idle-sample share of the job's
  samples in the window, from the per-day `job_gpu_usage` rollup (a day the window cuts counts
  in proportion to the job's allocated time in the window that day); a job without samples
  there has them unknown and its allocation shows in `unmeasured_gpu_hours`;
- charge units: allocated GPU-hours x the weight of the GPU model (`[accounting] gpu_weights`);
- energy: the GPUs' counter deltas (resets handled by the writer) in the window, plus the job's
  share of its nodes' host power if configured, x PUE; carbon: energy x grid intensity by the
  hour of use (`sing.accounting.carbon`).
The GPU model is the node's inventory version in force at the job's start; a job that started
before its node's first version (running when sing was installed, or synced from before it) takes
that first version, since the hardware did not change, and the report says how many jobs and
GPU-hours were priced so (`later_inventory_*`). A job spanning nodes of several models is split
between them by its GPUs on each node.
"""

from __future__ import annotations

from datetime import datetime

import duckdb
import polars as pl

from sing.accounting import carbon
from sing.accounting.periods import period_window
from sing.accounting.settings import AccountingSettings
from sing.errors import UserError
from sing.warehouse.analytics import HOME_CLUSTER, MARKED_VERSIONS_SQL, _window
from sing.warehouse.store import Warehouse

GROUPS = ("user", "account", "partition", "model")
J_PER_KWH = 3.6e6
# The summed figures of a group, in the order of the contract's columns.
FIGURES = (
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "charge_units",
    "energy_kwh",
    "carbon_kg",
)
# Jobs and GPU-hours whose GPU model came from a node inventory version recorded after they
# started (the node's first: the jobs running when sing was installed).
LATER_INVENTORY = ("later_inventory_jobs", "later_inventory_gpu_hours")

# The jobs that overlap the window (of the cluster and account asked for, if any).
IN_WINDOW = """
    start_time IS NOT NULL AND start_time < $until AND coalesce(end_time, $now) > $since
    AND ($cluster IS NULL OR cluster = $cluster) AND ($account IS NULL OR account = $account)
"""
# The first day any job of the window can have samples (its earliest start), so the rollup's
# other days are never read.
FIRST_DAY_SQL = f"SELECT min(start_time)::DATE FROM jobs WHERE {IN_WINDOW}"
# The rollups `usage` reads: per job and GPU by day, and per GPU by hour (the carbon series).
ROLLUPS_READ = ("job_gpu_usage", "gpu_hourly")

# One row per job overlapping the window and GPU model it ran on, with its figures inside the
# window.
JOB_WINDOW_SQL = f"""
WITH j AS (
    SELECT cluster, job_id, user, account, partition, num_gpus, nodes, start_time,
           coalesce(end_time, $now) AS end_at,
           greatest(start_time, $since) AS w_start,
           least(coalesce(end_time, $now), $until) AS w_end,
           epoch(start_time - submit_time) AS wait_s
    FROM jobs
    WHERE {IN_WINDOW}
), rows AS (
    -- The window's jobs' rows of the GPU rollup, each with the share `f` of its day inside
    -- the window: 1 for a day the window covers whole; for the (at most two) days it cuts, the
    -- job's allocated time in the window that day over its allocated time that day.
    SELECT r.cluster, r.job_id, r.node, r.gpu_index, r.first_ts, r.samples, r.util_sum,
           r.idle_samples,
           CASE WHEN r.energy_delta_samples > 0 THEN r.energy_delta_sum_j
                ELSE r.energy_max_j - r.energy_min_j END AS energy_j,
           CASE WHEN r.energy_delta_samples > 0 THEN r.first_energy_delta_j END AS first_delta_j,
           r.day >= date_trunc('day', $since) AND r.day < $until AS in_window,
           CASE WHEN r.day >= $since AND r.day + INTERVAL 1 DAY <= $until THEN 1
                ELSE coalesce(greatest(epoch(least(j.w_end, r.day + INTERVAL 1 DAY)
                                             - greatest(j.w_start, r.day::TIMESTAMPTZ)), 0)
                              / nullif(epoch(least(j.end_at, r.day + INTERVAL 1 DAY)
                                             - greatest(j.start_time, r.day::TIMESTAMPTZ)), 0),
                              0) END AS f
    FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM job_gpu_usage
          -- literal day bounds: only a constant prunes the day partitions
          WHERE day >= {{first_day}} AND day <= {{last_day}}) r
    JOIN j USING (cluster, job_id)
), gpus AS (
    -- Per job and GPU, its days in the window. The GPU's first sample in the job has a delta
    -- that reaches back before the job, so it is left out, on the GPU's first day in the job
    -- whatever the window (a grouping, where a window function over every row was most of a
    -- year's report; one grouping per GPU, then one per job, where groupings per job and cut
    -- day and a lateral join back to the jobs took a quarter more CPU).
    SELECT cluster, job_id,
           sum(f * samples) FILTER (in_window) AS samples,
           sum(f * util_sum) FILTER (in_window) AS util_sum,
           sum(f * idle_samples) FILTER (in_window) AS idle_samples,
           sum(f * energy_j) FILTER (in_window)
               - arg_min_null(CASE WHEN in_window THEN f * coalesce(first_delta_j, 0) ELSE 0 END,
                              first_ts) AS energy_j
    FROM rows GROUP BY cluster, job_id, node, gpu_index
), measured AS (
    SELECT cluster, job_id,
           sum(util_sum) / nullif(sum(samples), 0) AS mean_util,
           sum(idle_samples) / nullif(sum(samples), 0) AS idle_share,
           sum(energy_j) AS gpu_energy_j
    FROM gpus GROUP BY ALL
), versions AS ({MARKED_VERSIONS_SQL}), on_nodes AS (
    SELECT cluster, job_id, start_time, w_start, w_end, num_gpus, unnest(nodes) AS node,
           len(nodes) AS n
    FROM j WHERE len(nodes) > 0
    UNION ALL
    SELECT cluster, job_id, start_time, w_start, w_end, num_gpus, NULL, 1
    FROM j WHERE coalesce(len(nodes), 0) = 0
), models AS (
    -- Per job and GPU model: the job's share (its nodes of that model over all its nodes;
    -- Slurm gives every node of a job the same GPUs) and GPU-seconds there x the share of each
    -- node's GPUs held, for the host power. A job that started before its node's first
    -- version takes that version (`later_inventory`). A job without a node list or inventory
    -- has model NULL.
    SELECT o.cluster, o.job_id, v.gpu_model AS model, sum(1 / o.n) AS share,
           sum(least(o.num_gpus / o.n / nullif(v.gpus, 0), 1) * epoch(o.w_end - o.w_start))
               AS host_s,
           coalesce(bool_or(o.start_time < v.valid_from), false) AS later_inventory
    FROM on_nodes o
    LEFT JOIN versions v ON v.cluster = o.cluster AND v.node = o.node
     AND (v.valid_from <= o.start_time OR v.first_version) AND o.start_time < v.valid_until
    GROUP BY ALL
)
SELECT j.cluster, j.job_id, j.user, j.account, j.partition, j.w_start, j.w_end, j.wait_s,
       j.num_gpus * epoch(j.w_end - j.w_start) / 3600 AS allocated_gpu_hours,
       m.mean_util, m.idle_share, m.gpu_energy_j, md.model, md.share, md.host_s,
       coalesce(md.later_inventory, false) AS later_inventory
FROM j LEFT JOIN measured m USING (cluster, job_id) LEFT JOIN models md USING (cluster, job_id)
"""


def snapshot(
    warehouse: Warehouse,
    since: datetime | None,
    until: datetime | None,
    now: datetime | None = None,
    carbon_series: bool = True,
) -> duckdb.DuckDBPyConnection:
    """A connection holding only what `usage` reads: the job, GPU and node records, and the
    GPU rollups from the first day a job of the window started (opening every table's files
    was most of a month's report; a view of the raw samples, never read here, a third of a
    year's snapshot). The job records are opened first, to find that day. The hourly rollup
    only serves a carbon intensity series (`carbon_series`: the settings have one)."""
    params = {**_window(since, until, now), "cluster": None, "account": None}
    con = warehouse.connect({"jobs": None})
    try:
        ((first,),) = con.sql(FIRST_DAY_SQL, params=params).fetchall()
        warehouse.add_views(con, {"job_gpus": None, "nodes": None})
        rollups = ROLLUPS_READ if carbon_series else ROLLUPS_READ[:1]
        warehouse.add_rollup_views(con, rollups, first or params["since"].date())
    except BaseException:
        con.close()
        raise
    return con


def usage(
    con: duckdb.DuckDBPyConnection,
    by: str | tuple[str, ...],
    since: datetime | None,
    until: datetime | None,
    settings: AccountingSettings,
    now: datetime | None = None,
    cluster: str | None = None,
    account: str | None = None,
) -> pl.DataFrame:
    """One row per group (user, account, partition or GPU model) with the window's figures;
    `by` may name several (("account", "user"): each user's use of each account); `cluster`
    and `account` keep only that cluster's or account's jobs (one account's statement)."""
    keys = (by,) if isinstance(by, str) else tuple(by)
    if not keys or any(key not in GROUPS for key in keys):
        raise UserError(f"usage by {by!r}: choose one of {', '.join(GROUPS)}")
    params = {**_window(since, until, now), "cluster": cluster, "account": account}
    jobs = con.sql(_job_window_sql(con, params), params=params).pl()
    rows = _weighted(jobs, settings).join(
        _intensity(con, jobs, settings, params), on=["cluster", "job_id"], how="left"
    )
    grouped = _aggregate(_figures(rows, settings), list(keys), settings)
    if keys == ("account",) and settings.allocations:
        grouped = _with_allocations(grouped, settings, params["since"], params["until"], account)
    columns = [
        *keys,
        "jobs",
        *FIGURES[:3],
        "unmeasured_gpu_hours",
        "mean_wait_s",
        *FIGURES[3:],
        *LATER_INVENTORY,
    ]
    extra = [c for c in ("allocation_units", "remaining_units") if c in grouped.columns]
    return grouped.select(*columns, *extra).sort(
        ["allocated_gpu_hours", *keys], descending=[True] + [False] * len(keys), nulls_last=True
    )


def _job_window_sql(con: duckdb.DuckDBPyConnection, params: dict) -> str:
    """JOB_WINDOW_SQL with the window's days as date literals (from dates, never user text)."""
    ((first,),) = con.sql(FIRST_DAY_SQL, params=params).fetchall()
    first = first or params["since"].date()
    last = params["until"].date()
    return JOB_WINDOW_SQL.format(first_day=f"DATE '{first}'", last_day=f"DATE '{last}'")


def _weighted(jobs: pl.DataFrame, settings: AccountingSettings) -> pl.DataFrame:
    """Each job's rows per GPU model with the model's weight and host power."""
    names = jobs["model"].drop_nulls().unique().to_list()
    weights = {m: settings.weight(m) for m in names}
    power = {m: settings.node_power(m) for m in names}
    return jobs.with_columns(
        share=pl.col("share").fill_null(1.0),
        weight=pl.col("model").replace_strict(weights, default=settings.default_weight),
        node_power_w=pl.col("model").replace_strict(power, default=settings.node_power_w),
    )


def _intensity(
    con: duckdb.DuckDBPyConnection, jobs: pl.DataFrame, settings: AccountingSettings, params: dict
) -> pl.DataFrame:
    """(cluster, job_id, g_per_kwh): by the hour of use from the series, else the constant;
    one row per job of `jobs` (which has one per job and GPU model)."""
    jobs = jobs.select("cluster", "job_id", "w_start", "w_end").unique(["cluster", "job_id"])
    if settings.carbon_intensity_file:
        series = carbon.load_series(settings.carbon_intensity_file)
        return carbon.job_intensity(con, jobs, series, params)
    value = settings.carbon_intensity if settings.has_carbon else None
    return jobs.select("cluster", "job_id", g_per_kwh=pl.lit(value, dtype=pl.Float64))


def _figures(rows: pl.DataFrame, settings: AccountingSettings) -> pl.DataFrame:
    """Per job and model: the job's figures times its share of that model."""
    allocated = pl.col("allocated_gpu_hours") * pl.col("share")
    energy_j = (
        pl.col("gpu_energy_j").fill_null(0) * pl.col("share")
        + pl.col("host_s").fill_null(0) * pl.col("node_power_w")
    ) * settings.pue
    return rows.with_columns(
        allocated_gpu_hours=allocated,
        used_gpu_hours=allocated * pl.col("mean_util"),
        idle_gpu_hours=allocated * pl.col("idle_share"),
        unmeasured_gpu_hours=pl.when(pl.col("mean_util").is_null()).then(allocated).otherwise(0.0),
        later_inventory_gpu_hours=pl.when(pl.col("later_inventory")).then(allocated).otherwise(0.0),
        charge_units=allocated * pl.col("weight"),
        energy_kwh=energy_j / J_PER_KWH,
        carbon_kg=energy_j / J_PER_KWH * pl.col("g_per_kwh") / 1000,
        # an hour of use the intensity series does not cover: the group's carbon is unknown
        carbon_unknown=pl.col("g_per_kwh").is_null(),
    )


def _aggregate(rows: pl.DataFrame, by: list[str], settings: AccountingSettings) -> pl.DataFrame:
    sums = [pl.col(c).sum() for c in (*FIGURES[:5], "unmeasured_gpu_hours", LATER_INVENTORY[1])]
    carbon_kg = pl.col("carbon_kg").sum()
    if settings.has_carbon:
        carbon_kg = pl.when(pl.col("carbon_unknown").any()).then(None).otherwise(carbon_kg)
    else:
        carbon_kg = pl.lit(None, dtype=pl.Float64)
    return rows.group_by(by).agg(
        *sums,
        jobs=pl.struct("cluster", "job_id").n_unique().cast(pl.Int64),
        later_inventory_jobs=pl.struct("cluster", "job_id")
        .filter(pl.col("later_inventory"))
        .n_unique()
        .cast(pl.Int64),
        # a job split between models waits in each by its share
        mean_wait_s=(pl.col("wait_s") * pl.col("share")).sum()
        / pl.col("share").filter(pl.col("wait_s").is_not_null()).sum(),
        carbon_kg=carbon_kg.cast(pl.Float64),
    )


def _with_allocations(
    grouped: pl.DataFrame,
    settings: AccountingSettings,
    since: datetime,
    until: datetime,
    only: str | None,
) -> pl.DataFrame:
    """Allocation units of the periods inside the window, and what the window's charges left.

    Accounts with an allocation but no jobs get a row of zeros, so a statement lists them."""
    inside = {
        account: [
            units
            for period, units in periods.items()
            if since <= period_window(period)[0] and period_window(period)[1] <= until
        ]
        for account, periods in settings.allocations.items()
        if only is None or account == only
    }
    granted = {account: sum(units) for account, units in inside.items() if units}
    idle = [a for a in granted if a not in set(grouped["account"].to_list())]
    if idle:
        unknown = {"mean_wait_s"} | (set() if settings.has_carbon else {"carbon_kg"})
        zeros = pl.DataFrame({"account": idle}).with_columns(
            pl.lit(None if c in unknown else 0, dtype=grouped.schema[c]).alias(c)
            for c in grouped.columns
            if c != "account"
        )
        grouped = pl.concat([grouped, zeros.select(grouped.columns)])
    allocation = pl.col("account").replace_strict(granted, default=None, return_dtype=pl.Float64)
    return grouped.with_columns(
        allocation_units=allocation, remaining_units=allocation - pl.col("charge_units")
    )


def method(settings: AccountingSettings) -> dict[str, str]:
    """What each figure includes, in words: the `method` of --json and the table's footnotes."""
    weights = ", ".join(f"{m} {w:g}" for m, w in sorted(settings.gpu_weights.items()))
    host = "no host power"
    if settings.node_power_w or settings.node_power_w_by_model:
        by_model = ", ".join(
            f"{m} {w:g} W" for m, w in sorted(settings.node_power_w_by_model.items())
        )
        host = (
            f"the job's share of its nodes' host power ({settings.node_power_w:g} W per node"
            + (f"; {by_model}" if by_model else "")
            + ") by its GPUs there"
        )
    if settings.carbon_intensity_file:
        carbon_note = (
            "energy x hourly grid intensity by hour of use (weighted by the job's GPU power), "
            f"from {settings.carbon_intensity_file}; unknown where the series has no value"
        )
    elif settings.has_carbon:
        carbon_note = f"energy x a constant {settings.carbon_intensity:g} g CO2e/kWh"
    else:
        carbon_note = "unknown: no carbon intensity configured ([accounting] carbon_intensity)"
    return {
        "window": "the part of each job inside [since, until); running jobs up to now",
        "allocated": "GPUs allocated x hours (as Slurm's AllocTRES gres/gpu)",
        "used_idle": "allocated x mean utilisation / idle-sample share of the job's samples in "
        "the window; jobs without samples count in unmeasured_gpu_hours only",
        "charge": "allocated GPU-hours x weight per GPU model ("
        + (f"{weights}; " if weights else "")
        + f"others {settings.default_weight:g})",
        "energy": "GPU energy counters (deltas, resets handled) in the window + "
        + host
        + f", x PUE {settings.pue:g}",
        "carbon": carbon_note,
        "model": "GPU model of the node inventory at the job's start (a job that started before "
        "its node's first inventory version takes that version: later_inventory_*); a job "
        "spanning models is split by its GPUs on each",
    }


def footnotes(frame: pl.DataFrame) -> list[str]:
    """Footnotes on the rows of `usage` that a reader must not miss: how much was priced from a
    node inventory recorded after the jobs started (the model assumed, not known at the time)."""
    jobs, gpu_hours = (frame[c].sum() for c in LATER_INVENTORY)
    if not jobs:
        return []
    return [
        f"inventory: {jobs} job(s), {gpu_hours:.1f} GPU-h started before their nodes' first "
        "inventory version and are priced by it (the same hardware assumed); see "
        "later_inventory_jobs / later_inventory_gpu_hours in --json or --csv"
    ]
