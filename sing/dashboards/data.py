"""Every query the dashboards run, cached: pages call these and never build SQL.

Each function opens a fresh warehouse connection (a snapshot of the files live at that moment,
so the collector keeps writing meanwhile) and caches its result for `TTL_S` seconds, shared by
all sessions: on a year of data the first visitor pays, the next ones read memory. The warehouse
root is the first argument of every function, so it is part of each cache key.

Times: "now" is the end of the data (the newest GPU sample), not the wall clock, so a warehouse
that stopped receiving data (a demo, a copy) still shows its last week rather than an empty one.
Running jobs count up to that time.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
import streamlit as st

from sing.accounting import statement
from sing.accounting.settings import AccountingSettings
from sing.accounting.statement import Statement
from sing.config import Config, Thresholds
from sing.executors.base import running_accounting_for
from sing.jobids import job_order_sql
from sing.policy.settings import site_coverage
from sing.scheduler.metrics import summarize
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import replay
from sing.scheduler.workload import Workload, read_trace
from sing.traces import workload
from sing.traces.export import build_release, write_release
from sing.traces.linkage import public_view
from sing.traces.package import DATAPACKAGE, zip_trace
from sing.traces.settings import TraceSettings, load_key
from sing.warehouse import analytics
from sing.warehouse.coverage import DEFAULT_NEEDS, CoverageNeeds
from sing.warehouse.job_report import job_report, site_notes
from sing.warehouse.store import Warehouse

TTL_S = 60
# Downsampled time series have at most this many points per line.
MAX_POINTS = 400
# The heat map's "last interval": samples this long before the end of the data.
LAST_INTERVAL = timedelta(minutes=5)


def config_key(config: Config) -> tuple[str, str]:
    """A site config as part of a cache key: its file and what it says (an edited file is a
    new key)."""
    return str(config.path), repr(config.data)


cached = st.cache_data(
    ttl=TTL_S, show_spinner=False, max_entries=256, hash_funcs={Config: config_key}
)


def connect(root: str) -> duckdb.DuckDBPyConnection:
    return Warehouse(root).connect()


def first_row(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple | None:
    """The first row of a query, with the result consumed so the connection is free again."""
    rows = con.execute(sql, params).fetchall()
    return rows[0] if rows else None


@dataclass(frozen=True)
class Span:
    """The time the warehouse covers: first job submission to newest GPU sample."""

    first: datetime
    last: datetime


@cached
def span(root: str) -> Span | None:
    """None when the warehouse holds no jobs yet."""
    wh = Warehouse(root)
    first, last_job = first_row(
        wh.connect(),
        "SELECT min(submit_time), max(greatest(submit_time, start_time, end_time)) FROM jobs",
    )
    if first is None:
        return None
    return Span(first, wh.newest_time("gpu_samples") or last_job)


# ---- cluster ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterOverview:
    """Everything the Cluster page shows, from one warehouse snapshot (opening one costs a
    directory listing per day, ~0.5 s on a year, so the page opens one, not five)."""

    usage: pl.DataFrame  # analytics.cluster_usage
    by_nodes: pl.DataFrame  # analytics.utilization_by_node_count
    nodes: int  # in the node inventory at the end of the data; 0: no inventory (unknown)
    gpus: int
    grid: pl.DataFrame  # every GPU in the last interval: node, gpu_index, util, job_id, user


@cached
def cluster_overview(
    root: str, since: datetime, until: datetime, bucket: str, at: datetime
) -> ClusterOverview:
    con = connect(root)
    nodes, gpus = _capacity(con, at)
    return ClusterOverview(
        analytics.cluster_usage(con, since, until, bucket, now=until),
        analytics.utilization_by_node_count(con, since, until, now=until),
        nodes,
        gpus,
        _gpu_grid(con, at),
    )


@cached
def capacity(root: str) -> tuple[int, int]:
    """(nodes, GPUs) of the cluster in its newest node versions; (0, 0) without an inventory."""
    return _capacity(connect(root), None)


# The node versions in force at $at (the newest ones when $at is NULL) that have GPUs.
_CURRENT_NODES = f"""
    SELECT * FROM ({analytics.NODE_VERSIONS_SQL})
    WHERE gpus > 0 AND CASE WHEN $at IS NULL THEN valid_until = 'infinity'::TIMESTAMPTZ
                            ELSE valid_from <= $at AND $at < valid_until END
"""


def _capacity(con: duckdb.DuckDBPyConnection, at: datetime | None) -> tuple[int, int]:
    nodes, gpus = first_row(con, f"SELECT count(*), sum(gpus) FROM ({_CURRENT_NODES})", {"at": at})
    return int(nodes), int(gpus or 0)


def _gpu_grid(con: duckdb.DuckDBPyConnection, at: datetime) -> pl.DataFrame:
    """Every GPU of every node in the inventory at `at`, for the interval before it: mean util
    and the job holding it (jobs matched by cluster and id)."""
    return con.sql(
        f"""
        WITH grid AS (
            SELECT cluster, node, unnest(range(gpus))::SMALLINT AS gpu_index
            FROM ({_CURRENT_NODES})
        ),
        recent AS (
            SELECT coalesce(cluster, {analytics.HOME_CLUSTER}) AS cluster, node, gpu_index,
                   avg(util) AS util, arg_max(job_id, ts) AS job_id
            FROM gpu_samples WHERE ts > $since AND ts <= $at GROUP BY ALL
        )
        SELECT g.node, g.gpu_index, r.util, r.job_id, j.user
        FROM grid g
        LEFT JOIN recent r USING (cluster, node, gpu_index)
        LEFT JOIN jobs j ON j.cluster = r.cluster AND j.job_id = r.job_id
        ORDER BY g.node, g.gpu_index
        """,
        params={"since": at - LAST_INTERVAL, "at": at},
    ).pl()


# ---- jobs ------------------------------------------------------------------------------


@cached
def partitions(root: str) -> list[str]:
    rows = connect(root).execute("SELECT DISTINCT partition FROM jobs ORDER BY 1").fetchall()
    return [r[0] for r in rows if r[0] is not None]


@cached
def users(root: str) -> list[str]:
    rows = connect(root).execute('SELECT DISTINCT "user" FROM jobs ORDER BY 1').fetchall()
    return [r[0] for r in rows if r[0] is not None]


@cached
def job_usage(
    root: str,
    since: datetime,
    until: datetime,
    user: str | None,
    needs: CoverageNeeds = DEFAULT_NEEDS,
) -> pl.DataFrame:
    """Per-job efficiency, with its coverage, for jobs overlapping the window; only `user`'s
    jobs when given."""
    frame = analytics.job_usage(connect(root), since, until, now=until, needs=needs)
    return frame if user is None else frame.filter(pl.col("user") == user)


@cached
def job_host(root: str, now: datetime) -> pl.DataFrame:
    """Each job's CPU efficiency and host memory peak against its request (`sing job`'s)."""
    return analytics.job_host(connect(root), now)


def efficiency_trend(jobs: pl.DataFrame, every: str = "1d") -> pl.DataFrame:
    """GPU-hour-weighted mean utilisation of the jobs started in each period."""
    return (
        jobs.filter(pl.col("mean_util").is_not_null())
        .sort("start_time")
        .group_by_dynamic("start_time", every=every)
        .agg(
            gpu_hours=pl.col("gpu_hours").sum(),
            util=(pl.col("mean_util") * pl.col("gpu_hours")).sum() / pl.col("gpu_hours").sum(),
            jobs=pl.len(),
        )
    )


@cached
def by_node_count(
    root: str, since: datetime, until: datetime, partition: str | None
) -> pl.DataFrame:
    return analytics.utilization_by_node_count(connect(root), since, until, partition, now=until)


@cached
def idle_jobs(
    root: str,
    since: datetime,
    until: datetime,
    util_below: float,
    thresholds: Thresholds,
    running_only: bool,
) -> pl.DataFrame:
    """Jobs of any size under the utilisation threshold, by wasted GPU-hours."""
    return analytics.idle_multinode_jobs(
        connect(root),
        since,
        until,
        util_threshold=util_below,
        rdma_threshold=thresholds.low_rdma_bytes_per_node_hour,
        min_nodes=1,
        min_hours=thresholds.idle_job_min_hours,
        running_only=running_only,
        now=until,
    )


@cached
def job_details(
    root: str,
    job_id: str,
    owner: str | None,
    now: datetime,
    config: Config,
    cluster: str | None = None,
) -> dict | None:
    """`sing job`'s report of one job, with the site's thresholds, notes and coverage bar, and
    for a running job of this cluster Slurm's figures so far (sstat, asked as `sing job` asks:
    through the executor, a failure said in the notes); None when the job is missing or not
    `owner`'s. An id that `owner` may see in several clusters needs `cluster` (a UserError
    names them).

    sstat is asked only once the owner filter found the job: it runs as the dashboard's user,
    whom slurmd may answer for anybody's job (root, SlurmUser), so it must not be the way to
    read another user's. Cached like every query (a page rerun does not ask slurmd again)."""
    con = connect(root)
    found = con.execute(
        "SELECT DISTINCT cluster FROM jobs WHERE job_id = $job AND ($cluster IS NULL OR "
        'cluster = $cluster) AND ($owner IS NULL OR "user" = $owner)',
        {"job": job_id, "cluster": cluster, "owner": owner},
    ).fetchall()
    if not found:
        return None
    return job_report(
        con,
        job_id,
        config.thresholds,
        site_notes(config),
        now=now,
        cluster=found[0][0] if len(found) == 1 else None,
        needs=site_coverage(config),
        running_accounting=running_accounting_for(config, job_id),
    )


@cached
def job_series(
    root: str,
    job_id: str,
    cluster: str,
    nodes: tuple[str, ...],
    start: datetime,
    end: datetime,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-GPU util/memory/power, per-node RDMA bytes/s) over the job's life, downsampled to
    at most MAX_POINTS buckets, from the raw samples of the job's nodes (of its cluster) and
    time window. A bucket with an unknown RDMA counter has no rate (a gap, not a dip)."""
    step = max(15.0, (end - start).total_seconds() / MAX_POINTS)
    params = {"nodes": list(nodes), "start": start, "end": end, "step": step, "cluster": cluster}
    in_job = f"""
        ts >= $start AND ts <= $end AND node IN (SELECT unnest($nodes))
        AND coalesce(cluster, {analytics.HOME_CLUSTER}) = $cluster
    """
    con = connect(root)
    gpus = con.sql(
        f"""
        SELECT time_bucket(to_microseconds(($step * 1e6)::BIGINT), ts, $start) AS ts,
               node, gpu_index, node || ':' || gpu_index AS gpu,
               avg(util) AS util, avg(mem_used_bytes) AS mem_used_bytes, avg(power_w) AS power_w
        FROM gpu_samples WHERE {in_job} AND job_id = $job
        GROUP BY ALL ORDER BY ts, node, gpu_index
        """,
        params={**params, "job": job_id},
    ).pl()
    rdma = con.sql(
        f"""
        SELECT time_bucket(to_microseconds(($step * 1e6)::BIGINT), ts, $start) AS ts, node,
               CASE WHEN count(tx_bytes) = count(*) THEN sum(tx_delta_bytes) / $step END
                   AS tx_bytes_s,
               CASE WHEN count(rx_bytes) = count(*) THEN sum(rx_delta_bytes) / $step END
                   AS rx_bytes_s
        FROM rdma_samples WHERE {in_job}
        GROUP BY ALL ORDER BY ts, node
        """,
        params=params,
    ).pl()
    return gpus, rdma


# ---- accounting ------------------------------------------------------------------------


@cached
def statements(
    root: str, period: str, settings: AccountingSettings, now: datetime
) -> list[Statement]:
    """Every account's statement of `period` (sing.accounting.statement): the page shows the ones
    the viewer may see."""
    return statement.statements(connect(root), period, settings, now=now)


# ---- fairness --------------------------------------------------------------------------


@cached
def fairness(root: str, since: datetime, until: datetime) -> tuple[pl.DataFrame, float]:
    return analytics.fairness(connect(root), since, until, now=until)


@cached
def jain_over_time(root: str, since: datetime, until: datetime, bucket: str) -> pl.DataFrame:
    """Jain's index of per-user GPU-hours within each day or week (jobs clipped to it)."""
    step = {"day": "1 day", "week": "7 days"}[bucket]
    return (
        connect(root)
        .sql(
            f"""
        WITH pieces AS (
            SELECT b AS bucket, "user",
                   num_gpus * epoch(least(coalesce(end_time, $until), b + INTERVAL '{step}')
                                    - greatest(start_time, b)) / 3600 AS gpu_hours
            FROM jobs, unnest(generate_series(date_trunc('{bucket}', greatest(start_time, $since)),
                                              least(coalesce(end_time, $until), $until),
                                              INTERVAL '{step}')) AS t(b)
            WHERE start_time IS NOT NULL AND start_time < $until
              AND coalesce(end_time, $until) > $since
        ),
        per_user AS (
            SELECT bucket, "user", sum(gpu_hours) AS h FROM pieces
            WHERE gpu_hours > 0 AND bucket < $until GROUP BY ALL
        )
        SELECT bucket, count(*) AS users, sum(h) AS gpu_hours,
               sum(h) * sum(h) / (count(*) * sum(h * h)) AS jain
        FROM per_user GROUP BY bucket ORDER BY bucket
        """,
            params={"since": since, "until": until},
        )
        .pl()
    )


# ---- traces ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRelease:
    jobs: pl.DataFrame
    suppressed_jobs: int
    zip_bytes: bytes  # empty when refused
    refused: str | None = None  # why it may not be published (`Release.refusal`)


@cached
def trace_release(
    root: str, since: datetime, until: datetime, settings: TraceSettings
) -> TraceRelease:
    """The anonymized release of [since, until): its jobs for a preview and the same release
    zipped (Parquet/CSV + datapackage.json, the datasheet with its privacy report), so what is
    previewed is what is downloaded."""
    wh = Warehouse(root)
    public = public_view(wh, since, until)
    release = build_release(wh, since, until, load_key(settings.key_file), settings, public=public)
    jobs = pl.from_arrow(release.jobs)
    if refused := release.refusal(settings):
        return TraceRelease(jobs, release.suppressed_jobs, b"", refused)
    with tempfile.TemporaryDirectory(prefix="sing-trace-") as tmp:
        path = write_release(Path(tmp) / "trace", release, settings)
        archive = zip_trace(path)
    return TraceRelease(jobs, release.suppressed_jobs, archive)


# ---- simulator -------------------------------------------------------------------------

WAREHOUSE_SOURCE = "warehouse"


def _warehouse_workload(root: str, since: datetime, until: datetime) -> Workload:
    """The jobs submitted in the window that ran, as the simulator replays them."""
    rows = (
        connect(root)
        .execute(
            f"""
        SELECT job_id, "user", epoch(submit_time), epoch(end_time - start_time),
               num_gpus, num_nodes, time_limit_s::DOUBLE
        FROM jobs
        WHERE submit_time >= $since AND submit_time < $until
          AND start_time IS NOT NULL AND end_time IS NOT NULL AND num_gpus > 0
        ORDER BY submit_time, {job_order_sql()}
        """,
            {"since": since, "until": until},
        )
        .fetchall()
    )
    return Workload(*(list(column) for column in zip(*rows, strict=True)) if rows else [[]] * 7)


@st.cache_resource(show_spinner=False)
def trace_file(path: str) -> Workload:
    """A trace file, read once per process (the Philly file has 82 k jobs)."""
    return read_trace(path)


def trace_file_span(path: str) -> Span:
    submit = trace_file(path).submit
    return Span(datetime.fromtimestamp(min(submit), UTC), datetime.fromtimestamp(max(submit), UTC))


@cached
def compare_policies(
    root: str,
    source: str,
    since: datetime,
    until: datetime,
    nodes: int,
    gpus_per_node: int,
    policies: tuple[str, ...],
    settings: SchedulerSettings,
) -> pl.DataFrame:
    """Replay the jobs submitted in [since, until) under each policy; one summary row each
    (sing.scheduler.metrics). `source` is WAREHOUSE_SOURCE or a trace file path."""
    if source == WAREHOUSE_SOURCE:
        workload = _warehouse_workload(root, since, until)
    else:
        workload = trace_file(source).window(since.timestamp(), until.timestamp())
    if not len(workload):
        return pl.DataFrame()
    rows = [
        summarize(replay(workload, nodes, gpus_per_node, settings, policy), settings.starvation_s)
        for policy in policies
    ]
    return pl.DataFrame(rows)


# ---- workload --------------------------------------------------------------------------


def trace_releases(directory: str) -> list[str]:
    """The releases right under `directory` (those with a datapackage.json), by name."""
    found = Path(directory).glob(f"*/{DATAPACKAGE}") if directory else ()
    return sorted(str(p.parent) for p in found)


@cached
def cluster_workload(
    root: str, since: datetime, until: datetime, now: datetime, name: str
) -> workload.Profile:
    """The warehouse's jobs submitted in [since, until) (sing.traces.workload)."""
    return workload.from_warehouse(Warehouse(root), since, until, now, name)


@cached
def trace_workload(path: str) -> workload.Profile:
    """A release's workload; a release does not change once written."""
    return workload.from_trace(path)
