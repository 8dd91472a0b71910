"""The questions admins, users and researchers ask, as SQL over the warehouse views.

Every function takes a connection from `Warehouse.connect()` and returns a polars DataFrame (or a
dict for one job), so the CLI prints it as JSON and the dashboards chart it. Per-job figures come
from the `job_gpu_usage` / `job_rdma_usage` rollups (samples carry their job id), never from
joining raw samples to allocation intervals at query time.

Windows: a job belongs to [since, until) when its allocation overlaps it; job figures are over
the whole job. Jobs still running count up to `now`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta

import duckdb
import polars as pl

from sing.jobids import job_order_sql
from sing.schema import TABLES
from sing.signals import GPU_SIGNALS, GpuSignal
from sing.warehouse.coverage import DEFAULT_NEEDS, CoverageNeeds, coverage_sql
from sing.warehouse.rollups import IDLE_SAMPLE_UTIL

# Samples, rollups and node records written before they carried a cluster have NULL there; they
# belong to the warehouse's only cluster (the one cluster its job records name). A warehouse that
# already holds several clusters has no such rows (every writer stamps the cluster since), so
# NULL stays NULL there and matches no job rather than a guessed one.
HOME_CLUSTER = "(SELECT CASE WHEN count(DISTINCT cluster) = 1 THEN min(cluster) END FROM jobs)"


# Per job and GPU over the job's whole life, from the per-day rollup. Energy: the sum of the
# GPU's counter deltas (resets handled by the writer) except its first sample in the job, whose
# delta reaches back before the job; days rolled up before deltas existed fall back to that
# day's counter max - min.
def job_gpu_sql(source: str = "job_gpu_usage") -> str:
    """JOB_GPU_SQL over another relation of `job_gpu_usage` rows (e.g. a window's days)."""
    return f"""
SELECT cluster, job_id, node, gpu_index,
       sum(samples) AS samples, sum(util_sum) AS util_sum, max(util_max) AS util_max,
       sum(sm_sum) AS sm_sum, sum(sm_samples) AS sm_samples,
       sum(idle_samples) AS idle_samples, max(mem_peak_bytes) AS mem_peak_bytes,
       max(mem_total_bytes) AS mem_total_bytes,
       sum(CASE WHEN energy_delta_samples > 0 THEN energy_delta_sum_j
                ELSE energy_max_j - energy_min_j END)
           - coalesce(arg_min_null(CASE WHEN energy_delta_samples > 0
                                        THEN first_energy_delta_j END, first_ts), 0)
           AS energy_j
FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM {source})
GROUP BY ALL
"""


JOB_GPU_SQL = job_gpu_sql()


# Per job and node: RDMA bytes each way, NULL (unknown) where any of the job's samples there had
# an unknown counter (a saturated 32-bit counter), rather than a total that is too small.
def job_rdma_sql(source: str = "job_rdma_usage") -> str:
    """JOB_RDMA_SQL over another relation of `job_rdma_usage` rows (e.g. a window's days)."""
    return f"""
SELECT cluster, job_id, node,
       CASE WHEN coalesce(sum(tx_unknown_samples), 0) = 0 THEN coalesce(sum(tx_bytes), 0) END
           ::BIGINT AS tx_bytes,
       CASE WHEN coalesce(sum(rx_unknown_samples), 0) = 0 THEN coalesce(sum(rx_bytes), 0) END
           ::BIGINT AS rx_bytes
FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM {source})
GROUP BY ALL
"""


JOB_RDMA_SQL = job_rdma_sql()


def _signal_figure(s: GpuSignal) -> str:
    if s.per_job == "max":
        return f"max({s.key}_max) AS {s.figure}"
    return f"sum({s.key}_sum) / nullif(sum({s.key}_samples), 0) AS {s.figure}"


# Per job: the registered signals' figures (sing/signals.py) over the job's whole life, a mean
# over all its GPUs' samples or the maximum; NULL where no sample had the signal.
JOB_SIGNALS_SQL = f"""
SELECT cluster, job_id{"".join(", " + _signal_figure(s) for s in GPU_SIGNALS)}
FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM job_gpu_signals)
GROUP BY ALL
"""


def _counter_sql(first: str, deltas: str, highest: str) -> str:
    """A job cgroup counter's total on a node over the per-day rollup rows: the first value
    plus the deltas (resets counted from zero), or the highest value where that is more (a gap
    in the deltas); NULL where no sample had it."""
    return (
        f"CASE WHEN max({highest}) IS NOT NULL THEN greatest(max({highest}), "
        f"coalesce(arg_min_null({first}, first_ts), 0) + coalesce(sum({deltas}), 0)) END"
    )


def job_host_node_sql(source: str = "job_host_usage") -> str:
    """Per job and node, over the job's whole life: CPU seconds, cpuset size, memory peak and
    limit, I/O bytes of its cgroup there (from `job_host_usage` rows or a relation like it)."""
    return f"""
SELECT cluster, job_id, node,
       sum(samples) AS samples, max(last_ts) AS newest,
       {_counter_sql("first_cpu_s", "cpu_delta_sum_s", "cpu_max_s")} AS cpu_s,
       max(cpuset_cpus) AS cpuset_cpus,
       max(mem_peak_bytes) AS mem_peak_bytes,
       max(mem_limit_bytes) AS mem_limit_bytes,
       ({_counter_sql("first_io_read_bytes", "io_read_delta_sum_bytes", "io_read_max_bytes")})
           ::BIGINT AS io_read_bytes,
       ({_counter_sql("first_io_write_bytes", "io_write_delta_sum_bytes", "io_write_max_bytes")})
           ::BIGINT AS io_write_bytes
FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM {source})
GROUP BY ALL
"""


JOB_HOST_NODE_SQL = job_host_node_sql()
JOBS_COLUMNS = frozenset(TABLES["jobs"].schema.names)


def job_host_sql(
    jobs_columns: Collection[str] = JOBS_COLUMNS,
    nodes: str = JOB_HOST_NODE_SQL,
    step: str | None = None,
) -> str:
    """Per job: CPU and host memory over its nodes, against what it was allocated; `nodes`:
    the per-node figures (JOB_HOST_NODE_SQL's columns; a policy rule's window gives its own).

    Allocated cores and requested memory come from the job record (`jobs.alloc_cpus`, the job's
    CPUs; `jobs.req_mem_bytes`, its memory over all its nodes: sacct's AllocCPUS and ReqMem)
    where the scheduler's records have them (`jobs_columns`), else from its cgroups (the cpusets'
    sizes and the memory limits summed over its nodes). A sum over the nodes is NULL (unknown)
    unless every one of the job's nodes reported it: a figure from half the nodes would be
    half the truth. `step`: the column of `nodes` holding each row's evaluation time (a policy
    replay's), one row per job and step, each run time up to its step; None: up to `$now`."""

    def record(column: str) -> str:
        return f"j.{column}" if column in jobs_columns else "NULL"

    def all_nodes(figure: str) -> str:
        every = "coalesce(any_value(j.num_nodes), 1)"
        return f"CASE WHEN count({figure}) >= {every} THEN sum({figure}) END"

    run_s = (
        f"epoch(h.{step} - j.start_time)"
        if step
        else "epoch(coalesce(j.end_time, $now) - j.start_time)"
    )
    at = f", h.{step}" if step else ""
    return f"""
WITH host AS (
    SELECT h.cluster, h.job_id{at},
           {all_nodes("h.cpu_s")} AS cpu_core_s,
           {all_nodes("h.cpuset_cpus")}::BIGINT AS cgroup_cpus,
           {all_nodes("h.mem_peak_bytes")}::BIGINT AS host_mem_peak_bytes,
           max(h.mem_peak_bytes) AS node_mem_peak_bytes,
           {all_nodes("h.mem_limit_bytes")}::BIGINT AS cgroup_mem_limit_bytes,
           {all_nodes("h.io_read_bytes")}::BIGINT AS io_read_bytes,
           {all_nodes("h.io_write_bytes")}::BIGINT AS io_write_bytes
    FROM ({nodes}) h
    JOIN jobs j ON j.cluster = h.cluster AND j.job_id = h.job_id
    GROUP BY h.cluster, h.job_id{at}
), figures AS (
    SELECT h.*,
           coalesce({record("alloc_cpus")}, h.cgroup_cpus) AS alloc_cores,
           coalesce({record("req_mem_bytes")}, h.cgroup_mem_limit_bytes) AS host_mem_req_bytes,
           {run_s} AS host_run_s,
           greatest(coalesce(j.num_nodes, 1), 1) AS host_nodes
    FROM host h JOIN jobs j ON j.cluster = h.cluster AND j.job_id = h.job_id
)
SELECT cluster, job_id{f", {step}" if step else ""}, cpu_core_s, alloc_cores,
       cpu_core_s / nullif(host_run_s, 0) AS mean_cores_used,
       cpu_core_s / nullif(alloc_cores * host_run_s, 0) AS cpu_efficiency,
       host_mem_peak_bytes, node_mem_peak_bytes, host_mem_req_bytes,
       host_mem_peak_bytes / nullif(host_mem_req_bytes, 0) AS host_mem_ratio,
       (host_mem_req_bytes / host_nodes)::BIGINT AS node_mem_req_bytes,
       -- per node: the peak with a quarter to spare, up to the next power of two GiB (>= 1 GiB)
       pow(2, ceil(log2(greatest(node_mem_peak_bytes * 1.25, pow(2, 30)))))::BIGINT
           AS suggested_mem_bytes,
       io_read_bytes, io_write_bytes
FROM figures
"""


JOB_HOST_SQL = job_host_sql()

# Versions of each node of the inventory: a version holds from `valid_from` (-infinity for rows
# without one: since the beginning) until the node's next version (+infinity for the newest);
# gpus = 0 means the node is gone (or has no GPU) in that span.
NODE_VERSIONS_SQL = f"""
SELECT cluster, node, gpus, gpu_model, gpu_memory_bytes, partition, source,
       coalesce(valid_from, '-infinity'::TIMESTAMPTZ) AS valid_from,
       coalesce(lead(valid_from) OVER (PARTITION BY cluster, node ORDER BY valid_from NULLS FIRST),
                'infinity'::TIMESTAMPTZ) AS valid_until
FROM (SELECT * REPLACE (coalesce(cluster, {HOME_CLUSTER}) AS cluster) FROM nodes)
"""

# The inventory versions, each marked whether it is its node's first: a job that started before
# a node's first version takes that version (the hardware did not change).
MARKED_VERSIONS_SQL = f"""
SELECT *, valid_from = min(valid_from) OVER (PARTITION BY cluster, node) AS first_version
FROM ({NODE_VERSIONS_SQL})
"""


def first_node_version_join(job: str, alias: str = "m") -> str:
    """SQL: LEFT JOIN `alias`, the inventory version of job `job`'s first node in force when the
    job started (submitted, if it never started). A job from before the node's first version
    takes that version (the hardware did not change), as accounting prices it. One version per
    job, so a node whose model changed gives every job the same answer on every read (an
    any_value over its versions gave a different model per evaluation)."""
    at = f"coalesce({job}.start_time, {job}.submit_time)"
    return f"""LEFT JOIN ({MARKED_VERSIONS_SQL}) {alias}
    ON {alias}.cluster = {job}.cluster AND {alias}.node = {job}.nodes[1]
   AND ({alias}.valid_from <= {at} OR {alias}.first_version) AND {at} < {alias}.valid_until"""


# Per-job usage over the job's whole life, one row per job (the base of most reports). Jobs are
# matched to their samples by (cluster, job_id): job ids repeat across clusters.
JOB_USAGE_SQL = f"""
WITH gpu AS ({JOB_GPU_SQL}),
usage AS (
    SELECT cluster, job_id,
           sum(util_sum) / nullif(sum(samples), 0) AS mean_util,
           sum(sm_sum) / nullif(sum(sm_samples), 0) AS mean_sm_active,
           sum(idle_samples) / nullif(sum(samples), 0) AS idle_share,
           count(*) FILTER (WHERE util_max < $idle_sample) AS gpus_never_used,
           count(*) AS gpus_sampled,
           sum(samples)::BIGINT AS samples,
           max(mem_peak_bytes) AS peak_mem_bytes,
           max(mem_total_bytes) AS gpu_mem_bytes,
           sum(energy_j) AS energy_j
    FROM gpu GROUP BY cluster, job_id
), rdma AS (
    -- A direction with any node's total unknown has an unknown job total (NULL).
    SELECT cluster, job_id,
           CASE WHEN count(tx_bytes) = count(*) THEN sum(tx_bytes) END::BIGINT AS rdma_tx_bytes,
           CASE WHEN count(rx_bytes) = count(*) THEN sum(rx_bytes) END::BIGINT AS rdma_rx_bytes,
           count(tx_bytes) < count(*) OR count(rx_bytes) < count(*) AS rdma_unknown
    FROM ({JOB_RDMA_SQL}) GROUP BY cluster, job_id
)
SELECT j.cluster, j.job_id, j.user, j.account, j.partition, j.name, j.state, j.exit_code,
       j.submit_time, j.start_time, j.end_time, j.num_nodes, j.num_gpus, j.gpus_per_node,
       j.nodes, j.time_limit_s,
       epoch(coalesce(j.end_time, $now) - j.start_time) AS run_s,
       epoch(j.start_time - j.submit_time) AS queue_s,
       j.num_gpus * epoch(coalesce(j.end_time, $now) - j.start_time) / 3600 AS gpu_hours,
       u.mean_util, u.mean_sm_active, u.idle_share,
       j.num_gpus * epoch(coalesce(j.end_time, $now) - j.start_time) / 3600 * u.idle_share
           AS idle_gpu_hours,
       u.gpus_never_used, u.gpus_sampled, u.samples, u.peak_mem_bytes, u.gpu_mem_bytes, u.energy_j,
       r.rdma_tx_bytes, r.rdma_rx_bytes,
       CASE WHEN NOT coalesce(r.rdma_unknown, false) THEN
           (coalesce(r.rdma_tx_bytes, 0) + coalesce(r.rdma_rx_bytes, 0))
           / nullif(j.num_nodes * epoch(coalesce(j.end_time, $now) - j.start_time) / 3600, 0)
       END AS rdma_bytes_per_node_hour
FROM jobs j
LEFT JOIN usage u ON u.cluster = j.cluster AND u.job_id = j.job_id
LEFT JOIN rdma r ON r.cluster = j.cluster AND r.job_id = j.job_id
WHERE j.start_time IS NOT NULL
  AND j.start_time < $until AND coalesce(j.end_time, $now) > $since
ORDER BY {job_order_sql("j.job_id")}, j.cluster
"""


# JOB_USAGE_SQL plus each job's coverage over its run (sing/warehouse/coverage.py): the share of the
# samples its GPUs should have given, one per GPU every `$interval_s`, that the warehouse holds.
JOB_COVERAGE_SQL = f"""
SELECT *, {coverage_sql("samples", "num_gpus", "run_s", "$interval_s::DOUBLE")} AS coverage
FROM ({JOB_USAGE_SQL})
ORDER BY {job_order_sql()}, cluster
"""


def _window(
    since: datetime | None, until: datetime | None, now: datetime | None
) -> dict[str, datetime]:
    now = now or datetime.now(UTC)
    return {
        "since": since or datetime(1970, 1, 1, tzinfo=UTC),
        "until": until or now + timedelta(days=1),
        "now": now,
    }


def job_usage(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
    needs: CoverageNeeds = DEFAULT_NEEDS,
) -> pl.DataFrame:
    """One row per job overlapping the window, with its efficiency figures and their coverage
    (sampled every `needs.interval_s`)."""
    params = {
        **_window(since, until, now),
        "idle_sample": IDLE_SAMPLE_UTIL,
        "interval_s": needs.interval_s,
    }
    return con.sql(JOB_COVERAGE_SQL, params=params).pl()


def job_host(con: duckdb.DuckDBPyConnection, now: datetime | None = None) -> pl.DataFrame:
    """Each job's CPU efficiency and host memory against its request, from its cgroups (a job
    none of whose cgroups was read has no row; one read on only some nodes has NULL sums)."""
    return con.sql(JOB_HOST_SQL, params={"now": now or datetime.now(UTC)}).pl()


def utilization_by_node_count(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None = None,
    until: datetime | None = None,
    partition: str | None = None,
    now: datetime | None = None,
) -> pl.DataFrame:
    """The paper's headline figure: GPU-hour-weighted utilisation by job node count.

    Node counts are grouped as 1, 2, 3-4, 5-8, ... (labelled by the power of two above).
    """
    usage = job_usage(con, since, until, now).filter(pl.col("mean_util").is_not_null())
    if partition:
        usage = usage.filter(pl.col("partition") == partition)
    con.register("_usage", usage.to_arrow())
    return con.sql(
        """
        SELECT CAST(pow(2, ceil(log2(greatest(num_nodes, 1)))) AS INTEGER) AS nodes,
               count(*) AS jobs,
               sum(gpu_hours) AS gpu_hours,
               sum(mean_util * gpu_hours) / nullif(sum(gpu_hours), 0) AS weighted_util,
               avg(mean_util) AS mean_job_util,
               quantile_cont(mean_util, 0.1) AS p10_util,
               quantile_cont(mean_util, 0.5) AS p50_util,
               quantile_cont(mean_util, 0.9) AS p90_util,
               sum(idle_gpu_hours) AS idle_gpu_hours
        FROM _usage GROUP BY 1 ORDER BY 1
        """
    ).pl()


def fairness(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> tuple[pl.DataFrame, float]:
    """Per-user GPU-hour share against an equal share, queueing delay, and Jain's index.

    Jain's index over per-user GPU-hours: 1 when every active user got the same, 1/n when
    one user got everything.
    """
    params = _window(since, until, now)
    users = con.sql(
        """
        WITH j AS (
            SELECT user,
                   num_gpus * epoch(least(coalesce(end_time, $now), $until)
                                    - greatest(start_time, $since)) / 3600 AS gpu_hours,
                   epoch(start_time - submit_time) / 3600 AS queue_h
            FROM jobs
            WHERE start_time IS NOT NULL
              AND start_time < $until AND coalesce(end_time, $now) > $since
        )
        SELECT user, count(*) AS jobs, sum(gpu_hours) AS gpu_hours,
               -- NULL, not NaN, when the window's jobs held no GPU time (CPU-only jobs)
               sum(gpu_hours) / nullif(sum(sum(gpu_hours)) OVER (), 0) AS share,
               1 / count(*) OVER () AS equal_share,
               avg(queue_h) AS mean_queue_h,
               quantile_cont(queue_h, 0.95) AS p95_queue_h
        FROM j GROUP BY user ORDER BY gpu_hours DESC
        """,
        params=params,
    ).pl()
    return users, jain_index(users["gpu_hours"].to_list())


def jain_index(values: list[float]) -> float:
    """(sum x)^2 / (n * sum x^2); 1.0 for an empty or all-zero list."""
    total, squares = sum(values), sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def idle_multinode_jobs(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None = None,
    until: datetime | None = None,
    util_threshold: float = 0.05,
    rdma_threshold: float = 1e9,
    min_nodes: int = 2,
    min_hours: float = 0.0,
    running_only: bool = False,
    now: datetime | None = None,
    needs: CoverageNeeds = DEFAULT_NEEDS,
) -> pl.DataFrame:
    """Jobs on >= `min_nodes` nodes, allocated for >= `min_hours`, whose mean GPU utilisation is
    under the threshold, ranked by wasted GPU-hours (allocated GPU-hours x the unused share; ties
    by numeric job id). `low_rdma` is NULL where the job's RDMA traffic is unknown.

    `partial_data`: the job's coverage is under `needs.min_coverage`, so its figures rest on
    part of its data and do not show it idle (a node never scraped reads as an idle one)."""
    usage = job_usage(con, since, until, now, needs)
    if running_only:
        usage = usage.filter(pl.col("end_time").is_null())
    return (
        usage.filter(
            (pl.col("num_nodes") >= min_nodes)
            & (pl.col("run_s") >= min_hours * 3600)
            & (pl.col("mean_util").fill_null(0.0) < util_threshold)
        )
        .with_columns(
            wasted_gpu_hours=pl.col("gpu_hours") * (1 - pl.col("mean_util").fill_null(0.0)),
            low_rdma=pl.col("rdma_bytes_per_node_hour") < rdma_threshold,
            partial_data=pl.col("coverage").fill_null(0.0) < needs.min_coverage,
        )
        .sort(
            pl.col("wasted_gpu_hours"),
            pl.col("job_id").cast(pl.Int64, strict=False),
            pl.col("job_id"),
            descending=[True, False, False],
            nulls_last=True,
        )
        .select(
            "cluster",
            "job_id",
            "user",
            "account",
            "state",
            "num_nodes",
            "num_gpus",
            "start_time",
            "end_time",
            "run_s",
            "gpu_hours",
            "mean_util",
            "coverage",
            "partial_data",
            "wasted_gpu_hours",
            "rdma_bytes_per_node_hour",
            "low_rdma",
            "nodes",
        )
    )


def cluster_usage(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None = None,
    until: datetime | None = None,
    bucket: str = "day",
    now: datetime | None = None,
) -> pl.DataFrame:
    """Per time bucket: GPU assignment rate (allocated GPU-time / capacity) and utilisation
    (mean over all GPUs of the cluster, busy or not).

    Capacity is the GPU-time of the node versions in force during the bucket (a node added
    mid-bucket counts from then; one with gpus = 0 counts nothing): NULL where no node version
    covers any of the bucket. Allocations are NULL while the warehouse has no job record at all
    (no job sync or import yet). The rate is NULL whenever either is unknown or capacity is 0,
    never a guess."""
    if bucket not in ("hour", "day", "week"):
        raise ValueError("bucket must be hour, day or week")
    params = _window(since, until, now)
    step = {"hour": "1 hour", "day": "1 day", "week": "7 days"}[bucket]
    return con.sql(
        f"""
        WITH versions AS ({NODE_VERSIONS_SQL}),
        alloc AS (
            SELECT date_trunc('{bucket}', b) AS bucket,
                   sum(num_gpus * epoch(least(coalesce(end_time, $now), b + INTERVAL '{step}',
                                              $until)
                                        - greatest(start_time, b, $since))) AS gpu_s
            FROM jobs,
                 unnest(generate_series(date_trunc('{bucket}', greatest(start_time, $since)),
                                        least(coalesce(end_time, $now), $until),
                                        INTERVAL '{step}')) AS t(b)
            WHERE start_time IS NOT NULL
              AND start_time < $until AND coalesce(end_time, $now) > $since
            GROUP BY 1
        ),
        used AS (
            SELECT date_trunc('{bucket}', hour) AS bucket,
                   sum(util_sum) / sum(samples) AS util,
                   sum(assigned_samples) / sum(samples) AS sampled_assignment
            -- hourly rollups: a window starting mid-hour takes that whole hour's samples
            FROM gpu_hourly
            WHERE hour >= date_trunc('hour', $since) AND hour < $until GROUP BY 1
        ),
        span AS (
            SELECT bucket, greatest(bucket, $since) AS b_start,
                   least(bucket + INTERVAL '{step}', $until, $now) AS b_end
            FROM (SELECT bucket FROM alloc UNION SELECT bucket FROM used)
        ),
        capacity AS (
            SELECT s.bucket,
                   sum(v.gpus * epoch(least(v.valid_until, s.b_end)
                                      - greatest(v.valid_from, s.b_start))) AS gpu_s
            FROM span s JOIN versions v ON v.valid_from < s.b_end AND v.valid_until > s.b_start
            GROUP BY 1
        ),
        rows AS (
            SELECT s.bucket, epoch(s.b_end - s.b_start) / 3600 AS bucket_hours,
                   CASE WHEN EXISTS (FROM jobs) THEN coalesce(a.gpu_s, 0) END AS alloc_s,
                   c.gpu_s AS capacity_s, u.util, u.sampled_assignment
            FROM span s LEFT JOIN alloc a USING (bucket) LEFT JOIN used u USING (bucket)
            LEFT JOIN capacity c USING (bucket)
            WHERE s.b_end > s.b_start
        )
        SELECT bucket, bucket_hours, alloc_s / 3600 AS allocated_gpu_hours,
               capacity_s / 3600 AS capacity_gpu_hours,
               -- above 1 only where capacity is known for part of the bucket: capped (least()
               -- alone would turn an unknown NULL into 1)
               CASE WHEN capacity_s > 0 AND alloc_s IS NOT NULL
                    THEN least(alloc_s / capacity_s, 1) END AS assignment_rate,
               util, sampled_assignment
        FROM rows
        ORDER BY bucket
        """,
        params=params,
    ).pl()


# NVIDIA's MIG profiles (MIG User Guide, "Supported MIG Profiles") of the models sing knows:
# (model, name in the inventory's gpu_model, the card's memory range as NVML reports it in GiB,
# its 1g, 2g, 3g slices). A slice has 1/7, 2/7, 3/7 of the SMs and 1/8, 2/8, 4/8 of the
# memory; its bytes are that share of the card's nominal GB (the profile's name: 1g.10gb).
MIG_MODELS = (
    ("A100-40GB", "A100", (30, 50), (("1g.5gb", 5e9), ("2g.10gb", 10e9), ("3g.20gb", 20e9))),
    ("A100-80GB", "A100", (70, 90), (("1g.10gb", 10e9), ("2g.20gb", 20e9), ("3g.40gb", 40e9))),
    ("H100-80GB", "H100", (70, 90), (("1g.10gb", 10e9), ("2g.20gb", 20e9), ("3g.40gb", 40e9))),
    ("H200-141GB", "H200", (120, 160),
     (("1g.18gb", 141e9 / 8), ("2g.35gb", 141e9 / 4), ("3g.71gb", 141e9 / 2))),
)  # fmt: skip
MIG_SLICES = ("1g", "2g", "3g")  # compute: 1/7, 2/7, 3/7 of the SMs
GIB = 2**30


def _mig_values() -> str:
    """MIG_MODELS as SQL rows (model, family, min and max card bytes, rank, memory, SM share)."""
    return ", ".join(
        f"('{model}', '{family}', {low * GIB}, {high * GIB}, {rank}, {memory}, {rank / 7})"
        for model, family, (low, high), slices in MIG_MODELS
        for rank, (_, memory) in enumerate(slices, start=1)
    )


RIGHTSIZE_GROUPS = ("user", "account")


def rightsize(
    con: duckdb.DuckDBPyConnection,
    by: str = "user",
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> pl.DataFrame:
    """Per user (or account), what its jobs in the window held and did not need, in hours
    inside the window: single-GPU GPU-hours whose peak GPU memory and mean SM activity would
    have fit a 1g, 2g or 3g MIG slice of their GPU model (the smallest that fits; NULL where
    the group ran no such job on a model of MIG_MODELS with both figures known), and the
    core-hours and GiB-hours of host memory allocated but unused (each job's CPU efficiency
    and peak over its life, from its cgroups: jobs without them count nowhere)."""
    if by not in RIGHTSIZE_GROUPS:
        raise ValueError(f"by must be one of {RIGHTSIZE_GROUPS}")
    params = _window(since, until, now) | {"idle_sample": IDLE_SAMPLE_UTIL}
    hours = (
        "epoch(least(coalesce(u.end_time, $now), $until) - greatest(u.start_time, $since)) / 3600"
    )
    fits = ",\n".join(
        f"""CASE WHEN count(*) FILTER (WHERE judged) > 0
             THEN coalesce(sum(hours) FILTER (WHERE fit_rank = {rank}), 0) END
             AS fit_{name}_gpu_hours"""
        for rank, name in enumerate(MIG_SLICES, start=1)
    )
    return con.sql(
        f"""
        WITH slices(model, family, min_bytes, max_bytes, rank, mem_bytes, sm_share) AS (
            VALUES {_mig_values()}
        ),
        usage AS ({JOB_USAGE_SQL}),
        jobs_in AS (
            SELECT u.cluster, u.job_id, u."user", u.account, u.num_gpus, {hours} AS hours,
                   u.peak_mem_bytes, u.mean_sm_active, h.alloc_cores, h.cpu_efficiency,
                   h.host_mem_req_bytes, h.host_mem_peak_bytes,
                   (SELECT min(model) FROM slices s
                    WHERE upper(m.gpu_model) LIKE '%' || s.family || '%'
                      AND coalesce(m.gpu_memory_bytes, u.gpu_mem_bytes) >= s.min_bytes
                      AND coalesce(m.gpu_memory_bytes, u.gpu_mem_bytes) < s.max_bytes)
                       AS mig_model
            FROM usage u
            JOIN jobs j ON j.cluster = u.cluster AND j.job_id = u.job_id
            {first_node_version_join("j")}
            LEFT JOIN ({JOB_HOST_SQL}) h ON h.cluster = u.cluster AND h.job_id = u.job_id
        ),
        judged AS (
            SELECT *, num_gpus = 1 AND mig_model IS NOT NULL AND peak_mem_bytes IS NOT NULL
                      AND mean_sm_active IS NOT NULL AS judged,
                   (SELECT min(rank) FROM slices s
                    WHERE s.model = mig_model AND peak_mem_bytes <= s.mem_bytes
                      AND mean_sm_active <= s.sm_share) AS fit_rank
            FROM jobs_in
        )
        SELECT "{by}", count(*) AS jobs,
               sum(hours * num_gpus) AS gpu_hours,
               sum(hours) FILTER (WHERE judged) AS mig_judged_gpu_hours,
               {fits},
               coalesce(sum(hours) FILTER (WHERE num_gpus = 1 AND NOT judged), 0)
                   AS mig_unjudged_gpu_hours,
               count(cpu_efficiency) AS host_jobs,
               sum(alloc_cores * hours) FILTER (WHERE cpu_efficiency IS NOT NULL) AS core_hours,
               sum(alloc_cores * hours * greatest(1 - cpu_efficiency, 0)) AS unused_core_hours,
               sum(host_mem_req_bytes * hours) FILTER (WHERE host_mem_peak_bytes IS NOT NULL)
                   / {GIB} AS mem_gib_hours,
               sum(greatest(host_mem_req_bytes - host_mem_peak_bytes, 0) * hours)
                   / {GIB} AS unused_mem_gib_hours
        FROM judged GROUP BY "{by}" ORDER BY gpu_hours DESC, "{by}"
        """,
        params=params,
    ).pl()
