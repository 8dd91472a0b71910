"""Export a window of the warehouse as an anonymized trace release.

All in one DuckDB connection: the jobs submitted in [since, until) and their per-job rollups
(never the raw samples) are staged once, the k-anonymity policy (`traces.anonymize`) picks the
kept jobs from a few narrow columns, and one query assembles their telemetry summaries in
release order; keyed pseudonyms then replace ids over whole columns. Real names leave this
module only as pseudonyms: job names, commands, paths, hosts and IPs are never selected; nodes
become n001, n002, ... in name order."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sing.errors import UserError
from traces.anonymize import OTHER, apply_k_anonymity, pseudonymize
from traces.format import JOBS, TIMESERIES, conform, state_sql
from traces.package import AGGREGATES, ReleaseInfo, write_trace, zip_trace
from traces.settings import TraceSettings, load_key
from warehouse.analytics import job_gpu_sql, job_rdma_sql
from warehouse.store import Warehouse

# Staged once into temporary tables, since each is read several times: the jobs submitted in
# the window (`sel`, real ids, the job name never selected), numbered `r` so that every later
# join and group is on one integer rather than on job id text, and their per-GPU and per-node
# rollups; `people` holds the columns the k-anonymity policy looks at. Parameters: $since, $until.
STAGE_SQL = f"""
CREATE TEMP TABLE sel AS
    SELECT row_number() OVER () AS r, * EXCLUDE (name)
    FROM jobs WHERE submit_time >= $since AND submit_time < $until;
CREATE TEMP TABLE gpu_days AS
    SELECT * FROM job_gpu_usage
    WHERE day <= $until::DATE AND job_id IN (SELECT job_id FROM sel);
CREATE TEMP TABLE gpu AS
    SELECT s.r, g.node, g.gpu_index, g.samples AS n, g.util_sum, g.util_max, g.sm_sum,
           g.sm_samples AS sm_n, g.mem_peak_bytes AS mem_peak, g.energy_j AS energy
    FROM ({job_gpu_sql("gpu_days")}) g
    JOIN sel s ON s.cluster = g.cluster AND s.job_id = g.job_id;
CREATE TEMP TABLE rdma_days AS
    SELECT * FROM job_rdma_usage
    WHERE day <= $until::DATE AND job_id IN (SELECT job_id FROM sel);
CREATE TEMP TABLE rdma AS
    SELECT s.r, d.node, d.tx_bytes AS tx, d.rx_bytes AS rx
    FROM ({job_rdma_sql("rdma_days")}) d
    JOIN sel s ON s.cluster = d.cluster AND s.job_id = d.job_id;
CREATE TEMP VIEW people AS
    SELECT r, "user", account AS "group", num_nodes, gpus_per_node, m.gpu_model
    FROM sel LEFT JOIN (SELECT cluster, node, any_value(gpu_model) AS gpu_model
                        FROM nodes GROUP BY ALL) m
         ON m.cluster = sel.cluster AND m.node = sel.nodes[1];
"""

# Every node the selected jobs touched, renamed in name order.
NODE_MAP_SQL = """
CREATE TEMP TABLE node_map AS
SELECT node, printf('n%0' || $width || 'd', row_number() OVER (ORDER BY node)) AS alias
FROM (
    SELECT unnest(nodes) AS node FROM sel
    UNION SELECT node FROM gpu
    UNION SELECT node FROM rdma
) WHERE node IS NOT NULL
"""

# The kept jobs (`kept`: r, group and GPU model after the k-anonymity policy), in release order.
JOBS_SQL = f"""
WITH gpu_job AS (
    SELECT r, count(*) AS gpus,
           sum(util_sum) / nullif(sum(n), 0) AS gpu_util_mean,
           max(util_max) AS gpu_util_max,
           sum(sm_sum) / nullif(sum(sm_n), 0) AS sm_active_mean,
           max(mem_peak) AS gpu_mem_peak_bytes,
           sum(energy) AS energy_j
    FROM gpu GROUP BY r
),
gpu_p50 AS (  -- the median over a job's GPUs; of one GPU that is the job's mean (most jobs)
    SELECT r, median(util_sum / nullif(n, 0)) AS gpu_util_p50,
           median(sm_sum / nullif(sm_n, 0)) AS sm_active_p50
    FROM gpu WHERE r IN (SELECT r FROM gpu_job WHERE gpus > 1)
    GROUP BY r
),
-- Each job's nodes renamed, with the job's RDMA bytes on each. Most jobs hold one node, which
-- two plain joins name; longer lists are unnested, joined and put back in list order (sorting
-- each small list beats an ordered aggregate, list(... ORDER BY i)).
one_node AS (
    SELECT s.r, [m.alias] AS nodes, [d.tx] AS node_rdma_tx_bytes, [d.rx] AS node_rdma_rx_bytes
    FROM sel s
    JOIN node_map m ON m.node = s.nodes[1]
    LEFT JOIN rdma d ON d.r = s.r AND d.node = s.nodes[1]
    WHERE len(s.nodes) = 1
),
job_nodes AS (
    SELECT r, unnest(nodes) AS node, generate_subscripts(nodes, 1) AS i
    FROM sel WHERE len(nodes) > 1
),
node_entries AS (
    SELECT jn.r, list_sort(list({{'i': jn.i, 'node': m.alias, 'tx': d.tx, 'rx': d.rx}})) AS l
    FROM job_nodes jn JOIN node_map m USING (node) LEFT JOIN rdma d USING (r, node)
    GROUP BY jn.r
),
node_lists AS (
    SELECT r,
           list_transform(l, lambda e: e.node) AS nodes,
           list_transform(l, lambda e: e.tx) AS node_rdma_tx_bytes,
           list_transform(l, lambda e: e.rx) AS node_rdma_rx_bytes
    FROM node_entries
    UNION ALL
    SELECT * FROM one_node
),
rdma_job AS (
    -- unknown on any node (a saturated counter) leaves the job's total unknown, not too small
    SELECT r, CASE WHEN count(tx) = count(*) THEN sum(tx) END::BIGINT AS rdma_tx_bytes,
           CASE WHEN count(rx) = count(*) THEN sum(rx) END::BIGINT AS rdma_rx_bytes
    FROM rdma GROUP BY r
),
times AS (
    SELECT *,
           CASE WHEN start_time < $until THEN start_time END AS t_start,
           CASE WHEN start_time < $until
                THEN least(coalesce(end_time, $until), $until) END AS t_end,
           end_time IS NULL OR end_time > $until AS censored
    FROM sel
)
SELECT t.job_id, t."user", k."group",
       (epoch_us(t.submit_time) - epoch_us($since)) / 1e6 AS submit_s,
       (epoch_us(t.t_start) - epoch_us($since)) / 1e6 AS start_s,
       (epoch_us(t.t_end) - epoch_us($since)) / 1e6 AS end_s,
       (epoch_us(t.t_end) - epoch_us(t.t_start)) / 1e6 AS run_s,
       (epoch_us(t.t_start) - epoch_us(t.submit_time)) / 1e6 AS queue_s,
       CASE WHEN t.censored AND t.t_start IS NOT NULL THEN 'running'
            WHEN t.censored THEN 'pending'
            ELSE {state_sql("t.state")} END AS state,
       CASE WHEN t.censored OR t.exit_code IS NULL THEN NULL
            WHEN t.exit_code = 0 THEN 'success'
            WHEN t.exit_code >= 128 THEN 'signal' ELSE 'error' END AS exit_class,
       t.partition, t.num_nodes, t.gpus_per_node, t.num_gpus, k.gpu_model,
       t.time_limit_s, t.interactive, t.censored, t.dependencies,
       nl.nodes, g.gpu_util_mean,
       CASE WHEN g.gpus = 1 THEN g.gpu_util_mean ELSE p.gpu_util_p50 END AS gpu_util_p50,
       g.gpu_util_max, g.sm_active_mean,
       CASE WHEN g.gpus = 1 THEN g.sm_active_mean ELSE p.sm_active_p50 END AS sm_active_p50,
       g.gpu_mem_peak_bytes, g.energy_j, rj.rdma_tx_bytes, rj.rdma_rx_bytes,
       nl.node_rdma_tx_bytes, nl.node_rdma_rx_bytes
FROM times t
JOIN kept k USING (r)
LEFT JOIN gpu_job g USING (r)
LEFT JOIN gpu_p50 p USING (r)
LEFT JOIN node_lists nl USING (r)
LEFT JOIN rdma_job rj USING (r)
ORDER BY t.submit_time, t.job_id  -- the release order
"""

# Per job, node, minute from the raw samples of the kept jobs.
TIMESERIES_SQL = """
WITH kept_ids AS (SELECT job_id FROM sel SEMI JOIN kept USING (r)),
per_gpu AS (
    SELECT job_id, node, gpu_index, date_trunc('minute', ts) AS minute,
           avg(util) AS util, avg(sm_active) AS sm, max(mem_used_bytes) AS mem,
           avg(power_w) AS power
    FROM gpu_samples
    WHERE job_id IN (SELECT job_id FROM kept_ids) AND ts >= $since AND ts < $until
    GROUP BY ALL
),
g AS (
    SELECT job_id, node, minute, count(*) AS gpus, avg(util) AS gpu_util, avg(sm) AS sm_active,
           sum(mem) AS gpu_mem_used_bytes, sum(power) AS gpu_power_w
    FROM per_gpu GROUP BY ALL
),
r AS (
    SELECT job_id, node, date_trunc('minute', ts) AS minute,
           sum(tx_delta_bytes) AS rdma_tx_bytes, sum(rx_delta_bytes) AS rdma_rx_bytes
    FROM rdma_samples
    WHERE job_id IN (SELECT job_id FROM kept_ids) AND ts >= $since AND ts < $until
    GROUP BY ALL
)
SELECT job_id, m.alias AS node,
       (epoch_us(minute) - epoch_us($since)) // 1000000 AS minute_s,
       gpus, gpu_util, sm_active, gpu_mem_used_bytes, gpu_power_w, rdma_tx_bytes, rdma_rx_bytes
FROM g FULL JOIN r USING (job_id, node, minute) JOIN node_map m USING (node)
ORDER BY job_id, node, minute_s
"""

PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!~-]{0,63}$")
IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")  # looks like a version, is an address


@dataclass
class Release:
    """An anonymized release in memory: what `export_trace` writes, or a dashboard previews."""

    jobs: pa.Table
    timeseries: pa.Table | None
    info: ReleaseInfo
    suppressed_jobs: int


@dataclass
class ExportResult:
    path: Path
    jobs: int
    suppressed_jobs: int
    aggregates: dict


def build_release(
    warehouse: Warehouse | str | Path,
    since: datetime,
    until: datetime,
    key: bytes,
    settings: TraceSettings = TraceSettings(),  # noqa: B008 (frozen dataclass)
    timeseries: bool = False,
) -> Release:
    """Select, summarise and anonymize the jobs submitted in [since, until)."""
    since, until = _utc(since), _utc(until)
    if until <= since:
        raise UserError(f"--until {until.isoformat()} must be after --since {since.isoformat()}")
    wh = warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)
    con = wh.connect()
    params = {"since": since, "until": until}
    for statement in filter(str.strip, STAGE_SQL.split(";")):
        con.execute(statement, {k: v for k, v in params.items() if f"${k}" in statement})
    nodes = con.execute(
        "SELECT count(*) FROM (SELECT unnest(nodes) FROM sel UNION SELECT node FROM gpu "
        "UNION SELECT node FROM rdma)"
    ).fetchone()[0]
    con.execute(NODE_MAP_SQL, {"width": max(3, len(str(nodes)))})
    suppressed = apply_k_anonymity(con, settings.k, settings.rare_shapes)
    kept = con.sql(JOBS_SQL, params=params).to_arrow_table()
    series = None
    if timeseries:
        series = con.sql(TIMESERIES_SQL, params=params).to_arrow_table()
        series = series.set_column(0, "job_id", pseudonymize(series["job_id"], key, "j"))
        series = conform(TIMESERIES, series)
    jobs = _pseudonymize_jobs(kept, key)
    jobs = conform(JOBS, jobs, dropped=settings.drop)
    info = ReleaseInfo(
        title=settings.title,
        release_start=since,
        release_end=until,
        source="sing export",
        collection=_collection_text(settings),
        anonymization=_anonymization_lines(settings, suppressed, nodes),
        biases=BIASES,
    )
    return Release(jobs, series, info, suppressed)


def export_trace(
    warehouse: Warehouse | str | Path,
    since: datetime,
    until: datetime,
    out_dir: str | Path,
    key: bytes | None = None,
    settings: TraceSettings = TraceSettings(),  # noqa: B008 (frozen dataclass)
    timeseries: bool = False,
) -> ExportResult:
    """Write an anonymized trace of [since, until) to `out_dir` (atomically).

    `key` is the release's HMAC key; None reads `settings.key_file` or makes a fresh one.
    """
    key = key if key is not None else load_key(settings.key_file)
    release = build_release(warehouse, since, until, key, settings, timeseries)
    path = write_trace(out_dir, release.jobs, release.info, release.timeseries, settings.write_csv)
    figures = json.loads((path / AGGREGATES).read_text())  # computed once, by write_trace
    return ExportResult(path, release.jobs.num_rows, release.suppressed_jobs, figures)


def export_zip(
    warehouse: Warehouse | str | Path,
    since: datetime,
    until: datetime,
    key: bytes | None = None,
    settings: TraceSettings = TraceSettings(),  # noqa: B008 (frozen dataclass)
    timeseries: bool = False,
) -> bytes:
    """The same release as a zip archive in memory (for a dashboard's download button)."""
    with tempfile.TemporaryDirectory(prefix="sing-trace-") as tmp:
        result = export_trace(
            warehouse, since, until, Path(tmp) / "trace", key, settings, timeseries
        )
        return zip_trace(result.path)


def _pseudonymize_jobs(jobs: pa.Table, key: bytes) -> pa.Table:
    group = jobs["group"]
    merged = pc.equal(group, OTHER)
    jobs = jobs.set_column(0, "job_id", pseudonymize(jobs["job_id"], key, "j", distinct=True))
    users = jobs.column_names.index("user")
    jobs = jobs.set_column(users, "user", pseudonymize(jobs["user"], key, "u"))
    groups = jobs.column_names.index("group")
    pseudo = pc.if_else(merged, OTHER, pseudonymize(group, key, "g"))
    jobs = jobs.set_column(groups, "group", pseudo)
    deps = jobs.column_names.index("dependencies")
    return jobs.set_column(deps, "dependencies", _clean_dependencies(jobs["dependencies"]))


def _clean_dependencies(column: pa.ChunkedArray) -> pa.Array:
    """Keep only package-name -> version pairs: a path, URL or free text never leaves."""
    encoded = pc.dictionary_encode(column.combine_chunks())
    cleaned = []
    for text in encoded.dictionary.to_pylist():
        try:
            declared = json.loads(text) if text else None
        except json.JSONDecodeError:
            declared = None
        if not isinstance(declared, dict):
            cleaned.append(None)
            continue
        kept = {
            name: version
            for name, version in declared.items()
            if PACKAGE_NAME.match(name)
            and isinstance(version, str)
            and VERSION.match(version)
            and not IPV4.match(version)
        }
        cleaned.append(json.dumps(kept, sort_keys=True))
    return pc.take(pa.array(cleaned, pa.string()), encoded.indices)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _collection_text(settings: TraceSettings) -> str:
    return (
        f"Exported by {settings.collected_by}. Jobs come from the scheduler's accounting "
        "records; GPU figures from per-GPU samples (NVML/DCGM, typically every 15 s) attributed "
        "to the job holding the GPU; RDMA bytes from per-port InfiniBand/RoCE counters of the "
        "job's nodes. Every job submitted in the window is included unless the policy below "
        "left it out."
    )


def _anonymization_lines(settings: TraceSettings, suppressed: int, nodes: int) -> list[str]:
    return [
        "Users, groups and job ids are HMAC-SHA256 pseudonyms under a secret per-release key "
        "(not a bare hash); the same key was reused only if the publisher chose to.",
        "Job names, commands, working directories, paths, hostnames and IPs are not included; "
        f"the {nodes} nodes are renamed n001, n002, ... in name order.",
        "Times are seconds since the release start; dependencies keep only package names and "
        "versions.",
        f"Groups with fewer than k={settings.k} users are merged into group 'other'.",
        f"Rare resource shapes (fewer than k={settings.k} users): policy '{settings.rare_shapes}'; "
        f"{suppressed} jobs left out.",
        "Fields left out: " + (", ".join(settings.drop) or "none") + ".",
    ]


BIASES = [
    "Telemetry of a censored job covers samples up to the end of the release's last day.",
    "Jobs whose shape was rare were generalised or left out, so the largest and most unusual "
    "jobs are under-represented.",
    "GPU utilisation is the driver's coarse 'any kernel running' ratio; SM activity is the "
    "better measure of how busy a GPU was.",
    "Jobs without samples (e.g. CPU-only, or before monitoring started) have empty telemetry.",
]
