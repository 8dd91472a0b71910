"""Export a window of the warehouse as an anonymized trace release.

All in one DuckDB connection: the jobs submitted in [since, until) and their per-job rollups
(never the raw samples) are staged once with their times, the k-anonymity policy
(`sing.traces.anonymize`) gives each job the precision it is released at (or leaves it out)
from a few narrow columns, and one query assembles their coarsened times and telemetry
summaries in release order; keyed pseudonyms then replace ids over whole
columns. Real names leave this module only as pseudonyms: job names, commands, paths, hosts and
IPs are never selected; nodes get aliases ([trace] node_aliases). `sing.traces.linkage` measures
what the policy leaves an attacker who can see every job's owner."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sing.errors import UserError
from sing.health.failures import classified_sql
from sing.traces.anonymize import (
    OTHER,
    apply_k_anonymity,
    duration_bucket,
    gpus_class,
    pseudonymize,
)
from sing.traces.format import (
    INCIDENTS,
    JOBS,
    NODES,
    TIMESERIES,
    conform,
    exit_class_sql,
    state_sql,
)
from sing.traces.linkage import public_view
from sing.traces.package import AGGREGATES, ReleaseInfo, write_trace, zip_trace
from sing.traces.privacy import PrivacyReport, assess
from sing.traces.settings import (
    ANY,
    GPUS_CLASS_EDGES,
    MAX_SHIFT_S,
    TraceSettings,
    ladder,
    load_key,
)
from sing.warehouse.analytics import (
    HOME_CLUSTER,
    first_node_version_join,
    job_gpu_sql,
    job_rdma_sql,
)
from sing.warehouse.store import Warehouse

# Each job's times in release coordinates (seconds since $origin), exact. A job cut by the
# window end is censored: its run ends at $until. Parameters: $origin, $until.
TIMES_SQL = """
SELECT r,
       (epoch_us(submit_time) - epoch_us($origin)) / 1e6 AS submit,
       CASE WHEN start_time < $until
            THEN (epoch_us(start_time) - epoch_us(submit_time)) / 1e6 END AS queue,
       CASE WHEN start_time < $until
            THEN (epoch_us(least(coalesce(end_time, $until), $until))
                  - epoch_us(start_time)) / 1e6 END AS run,
       end_time IS NULL OR end_time > $until AS censored
FROM sel
"""

# A hidden shape's GPU count class is [EDGES[class], EDGES[class + 1] - 1] (GPUS_CLASS_EDGES).
EDGES = f"{list(GPUS_CLASS_EDGES)}"


def _placed(x: str, ratio: str, u: str) -> str:
    """SQL: a duration inside the bucket of `x` at the keyed fraction `u` (log-uniform)."""
    bucket = duration_bucket(x, ratio)
    return f"CASE WHEN {ratio} > 1 AND {x} >= 1 THEN pow({ratio}, {bucket} + {u}) ELSE {x} END"


# The released times and size of each kept job. The jobs released together with equal
# published bins (submit bin, run and queue bucket, GPU-count class: a pool where the times are
# quasi-identifiers, as by default) shuffle their submit, queue and run times and GPU count
# by a keyed random permutation (two independent keyed orders: the row in place p shows the
# values drawn to place p): each row shows some member's exact values, which lie in the same
# bins, so their values are published exactly (GPU-hours conserved, distributions unbent) and
# none says which member it is. (Not a cycle: were a row never its own, seeing whose values
# it shows would rule that job out and lift the top user above half.) A job alone in its bins
# gets values placed at keyed random inside them; a job released exactly keeps its own.
# `scale`, released over true GPU-time, scales what grows with run time and GPUs (energy, RDMA
# bytes), so that their rate is exact and they tell no more than run_s and num_gpus do. Reads
# timed, kept and sel.
# Parameters: $salt, $queue_shown (the queue bucket is published, so binds too).
RELEASED_SQL = f"""
members AS (
    SELECT t.r, t.submit, t.queue, t.run, t.censored, s.num_gpus, k.rung, k.pool,
           k.resolution_s, k.ratio, k.outcome_hidden, k.shape_hidden,
           k.resolution_s = 0 AND k.ratio <= 1 AND NOT k.shape_hidden AS exact,
           hash(s.job_id || $salt || 'row') AS row_draw,
           hash(s.job_id || $salt || 'values') AS values_draw,
           [(hash(s.job_id || $salt || i) % 1000000) / 1e6 FOR i IN ['s', 'r', 'q']] AS u,
           CASE WHEN k.resolution_s > 0 THEN floor(t.submit / k.resolution_s) END AS sbin,
           {duration_bucket("t.run", "k.ratio")} AS rbin,
           CASE WHEN $queue_shown THEN {duration_bucket("t.queue", "k.ratio")} END AS qbin,
           CASE WHEN k.shape_hidden THEN {gpus_class("s.num_gpus")} END AS gclass
    FROM timed t JOIN kept k USING (r) JOIN sel s USING (r)
),
placed AS (
    SELECT *, row_number() OVER (cell ORDER BY row_draw) AS place,
           row_number() OVER (cell ORDER BY values_draw) AS values_place,
           count(*) OVER cell AS size
    FROM members
    WINDOW cell AS (PARTITION BY rung, pool, sbin, rbin, qbin, gclass)
),
released AS (
    SELECT a.r, a.censored, a.queue, a.resolution_s, a.ratio, a.outcome_hidden, a.shape_hidden,
           {EDGES}[a.gclass] AS gpus_min, {EDGES}[a.gclass + 1] - 1 AS gpus_max, v.*,
           CASE WHEN a.run > 0 AND a.num_gpus > 0 AND v.run_s IS NOT NULL
                THEN (v.run_s * v.released_gpus) / (a.run * a.num_gpus) ELSE 1 END AS scale
    FROM placed a JOIN placed b
      ON b.rung = a.rung AND b.pool = a.pool
     AND b.sbin IS NOT DISTINCT FROM a.sbin AND b.rbin IS NOT DISTINCT FROM a.rbin
     AND b.qbin IS NOT DISTINCT FROM a.qbin AND b.gclass IS NOT DISTINCT FROM a.gclass
     AND CASE WHEN a.exact OR a.size = 1 THEN b.r = a.r ELSE b.values_place = a.place END,
    LATERAL (
        SELECT CASE WHEN a.size > 1 OR a.resolution_s = 0 THEN b.submit
                    ELSE (a.sbin + a.u[1]) * a.resolution_s END AS submit_s,
               CASE WHEN a.size > 1 THEN b.run ELSE {_placed("a.run", "a.ratio", "a.u[2]")} END
                   AS run_s,
               CASE WHEN a.size > 1 THEN b.queue
                    ELSE {_placed("a.queue", "a.ratio", "a.u[3]")} END AS queue_s,
               b.num_gpus AS released_gpus
    ) v
)"""

# Staged once into temporary tables, since each is read several times: the jobs submitted in
# the window (`sel`, real ids, the job name never selected, with their failure class: an
# incident open at the window end counts as open), numbered `r` so that every later join and
# group is on one integer rather than on job id text, with their times (`timed`); then their
# per-GPU and per-node rollups and the incidents open during the window (`inc`); `people`
# holds the columns the k-anonymity policy looks at. Parameters: $since, $until (and
# TIMES_SQL's).
IN_WINDOW = "(SELECT * FROM jobs WHERE submit_time >= $since AND submit_time < $until)"
WINDOW_SQL = f"""
CREATE TEMP TABLE sel AS
    SELECT row_number() OVER () AS r, * EXCLUDE (name)
    FROM ({classified_sql(IN_WINDOW, now="$until")});
CREATE TEMP TABLE timed AS {TIMES_SQL};
"""
STAGE_SQL = f"""{WINDOW_SQL}
CREATE TEMP TABLE inc AS
    SELECT node, class, greatest(opened_at, $since) AS opened_at,
           CASE WHEN closed_at < $until THEN closed_at END AS closed_at
    FROM incidents
    WHERE opened_at < $until AND (closed_at IS NULL OR closed_at >= $since);
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
"""


# The columns the k-anonymity policy looks at, one row per job; dependencies as released
# (`deps`: raw -> cleaned text).
def outcome_sql(t: str, hidden: str = "FALSE") -> str:
    """SQL: a job's released state, exit and failure class, from relation `t` (sel joined to
    timed); an ended job's are unknown where `hidden` (the k rule's last rung)."""
    ended = f"NOT {t}.censored AND NOT {hidden}"
    return f"""CASE WHEN {t}.censored AND {t}.queue IS NOT NULL THEN 'running'
            WHEN {t}.censored THEN 'pending'
            WHEN {hidden} THEN 'unknown'
            ELSE {state_sql(f"{t}.state")} END AS state,
       CASE WHEN {ended} THEN {exit_class_sql(f"{t}.exit_code")} END AS exit_class,
       CASE WHEN {ended} THEN {t}.failure_class END AS failure_class"""


PEOPLE_SQL = f"""
CREATE TEMP TABLE people AS
    SELECT r, "user", account AS "group", num_nodes, gpus_per_node, m.gpu_model, t.partition,
           time_limit_s, submit, run, queue, d.clean AS dependencies,
           {outcome_sql("t")}
    FROM (SELECT * FROM sel JOIN timed USING (r)) t
    LEFT JOIN deps d ON d.raw = t.dependencies
    {first_node_version_join("t")}
"""

# The window's jobs and GPU-hours (to the window end), and the GPU-hours of those kept.
# Parameters: $until.
KEPT_SHARE_SQL = """
SELECT count(*), coalesce(sum(h), 0.0), coalesce(sum(h) FILTER (WHERE kept), 0.0)
FROM (
    SELECT r IN (SELECT r FROM kept) AS kept,
           CASE WHEN start_time < $until THEN num_gpus * (
               epoch(least(coalesce(end_time, $until), $until)) - epoch(start_time)) / 3600 END AS h
    FROM sel
)
"""

# Every node the selected jobs touched, renamed n001, n002, ... in name order, or in the order
# of a keyed hash of the name (random aliases). Parameters: $width, $salt.
NODE_MAP_SQL = """
CREATE TEMP TABLE node_map AS
SELECT node, printf('n%0' || $width || 'd', row_number() OVER (ORDER BY {order})) AS alias
FROM (
    SELECT unnest(nodes) AS node FROM sel
    UNION SELECT node FROM gpu
    UNION SELECT node FROM rdma
    UNION SELECT node FROM inc
) WHERE node IS NOT NULL
"""
NODE_ORDER = {"name_order": "node", "random": "sha256($salt || node)"}

# The cluster's inventory in the window: per node (by name, as node_map), its latest version in
# force during [since, until) that had GPUs. Parameters: $since, $until.
INVENTORY_SQL = """
CREATE TEMP TABLE inventory AS
WITH v AS (
    SELECT node, gpus, gpu_model, coalesce(valid_from, TIMESTAMPTZ '0001-01-01') AS valid_from,
           lead(valid_from) OVER (PARTITION BY cluster, node ORDER BY valid_from NULLS FIRST)
               AS valid_to
    FROM nodes
)
SELECT node, arg_max(gpus, valid_from)::BIGINT AS gpus, arg_max(gpu_model, valid_from) AS gpu_model
FROM v
WHERE valid_from < $until AND (valid_to IS NULL OR valid_to > $since) AND gpus > 0
GROUP BY node
"""
# The released `nodes` resource, per kind of job aliases. Per-node aliases (random, name_order):
# the nodes of node_map under the jobs' aliases, then the other nodes of the inventory numbered
# on in the same order; a node on which a released job's GPU model was generalised shows
# 'other' too (`hidden`), so the inventory does not undo the k rule. Per-job aliases: the
# inventory alone, numbered by model, size and a keyed hash: it names no job's node.
# Parameters: $width, $salt.
NODES_SQL = {
    "global": """
WITH extra AS (
    SELECT node, printf('n%0' || $width || 'd', (SELECT count(*) FROM node_map)
                        + row_number() OVER (ORDER BY {order})) AS alias
    FROM inventory ANTI JOIN node_map USING (node)
),
named AS (SELECT node, alias FROM node_map UNION ALL SELECT node, alias FROM extra)
SELECT a.alias AS node, i.gpus,
       CASE WHEN a.alias IN (SELECT alias FROM hidden) THEN 'other' ELSE i.gpu_model END
           AS gpu_model
FROM named a LEFT JOIN inventory i USING (node)
ORDER BY a.alias
""",
    "per_job": """
SELECT printf('n%0' || $width || 'd',
              row_number() OVER (ORDER BY gpu_model, gpus, sha256($salt || node))) AS node,
       gpus, gpu_model
FROM inventory ORDER BY node
""",
}

# How a job's nodes are named in the jobs query: from `node_map`, or by their place in the
# job's own list (per_job). Each: a one-node job's list and join, a longer list's entry and join.
NODE_ALIASES = {
    "global": (
        "[m.alias]",
        "JOIN node_map m ON m.node = s.nodes[1]",
        "m.alias",
        "JOIN node_map m USING (node)",
    ),
    "per_job": ("['n1']", "", "'n' || jn.i", ""),
}
# The same for the timeseries, whose rows carry the staged job's number `r` and node.
SERIES_NODE_MAP = {
    "global": "node_map m USING (node)",
    "per_job": """(SELECT r, unnest(nodes) AS node,
                   'n' || generate_subscripts(nodes, 1) AS alias FROM sel) m
                  USING (r, node)""",
}


def jobs_sql(aliases: str) -> str:
    """The kept jobs (`kept`: r, group and GPU model after the k-anonymity policy), with their
    coarsened times, in release order; nodes named as NODE_ALIASES[aliases] says."""
    one_alias, one_join, entry_alias, entry_join = NODE_ALIASES[aliases]
    return f"""
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
    SELECT s.r, {one_alias} AS nodes, [d.tx] AS node_rdma_tx_bytes, [d.rx] AS node_rdma_rx_bytes
    FROM sel s
    {one_join}
    LEFT JOIN rdma d ON d.r = s.r AND d.node = s.nodes[1]
    WHERE len(s.nodes) = 1 AND s.nodes[1] IS NOT NULL
),
job_nodes AS (
    SELECT r, unnest(nodes) AS node, generate_subscripts(nodes, 1) AS i
    FROM sel WHERE len(nodes) > 1
),
node_entries AS (
    SELECT jn.r, list_sort(list({{'i': jn.i, 'node': {entry_alias}, 'tx': d.tx, 'rx': d.rx}})) AS l
    FROM job_nodes jn {entry_join} LEFT JOIN rdma d USING (r, node)
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
{RELEASED_SQL},
times AS (
    SELECT * EXCLUDE (num_nodes, gpus_per_node, num_gpus, nodes),
           CASE WHEN NOT c.shape_hidden THEN num_nodes END AS num_nodes,
           CASE WHEN NOT c.shape_hidden THEN gpus_per_node END AS gpus_per_node,
           c.released_gpus AS num_gpus,
           c.submit_s + c.queue_s AS start_s, c.submit_s + c.queue_s + c.run_s AS end_s
    FROM sel JOIN released c USING (r)
)
SELECT t.job_id, t."user", k."group", t.submit_s, t.start_s, t.end_s, t.run_s, t.queue_s,
       t.resolution_s AS submit_bin_s, t.ratio AS run_bin_ratio, t.gpus_min, t.gpus_max,
       {outcome_sql("t", "t.outcome_hidden")},
       t.partition, t.num_nodes, t.gpus_per_node, t.num_gpus, k.gpu_model,
       t.num_gpus::DOUBLE AS gpu_request, t.time_limit_s, t.interactive, t.censored,
       d.clean AS dependencies,
       CASE WHEN NOT t.shape_hidden THEN nl.nodes END AS nodes, g.gpu_util_mean,
       CASE WHEN g.gpus = 1 THEN g.gpu_util_mean ELSE p.gpu_util_p50 END AS gpu_util_p50,
       g.gpu_util_max, g.sm_active_mean,
       CASE WHEN g.gpus = 1 THEN g.sm_active_mean ELSE p.sm_active_p50 END AS sm_active_p50,
       g.gpu_mem_peak_bytes, g.energy_j * t.scale AS energy_j,
       (rj.rdma_tx_bytes * t.scale)::BIGINT AS rdma_tx_bytes,
       (rj.rdma_rx_bytes * t.scale)::BIGINT AS rdma_rx_bytes,
       CASE WHEN NOT t.shape_hidden
            THEN list_transform(nl.node_rdma_tx_bytes, lambda b: (b * t.scale)::BIGINT)
            END AS node_rdma_tx_bytes,
       CASE WHEN NOT t.shape_hidden
            THEN list_transform(nl.node_rdma_rx_bytes, lambda b: (b * t.scale)::BIGINT)
            END AS node_rdma_rx_bytes
FROM times t
JOIN kept k USING (r)
LEFT JOIN deps d ON d.raw = t.dependencies
LEFT JOIN gpu_job g USING (r)
LEFT JOIN gpu_p50 p USING (r)
LEFT JOIN node_lists nl USING (r)
LEFT JOIN rdma_job rj USING (r)
ORDER BY t.submit_s, t.job_id  -- the release order
"""


# Per job, node, minute from the raw samples of the kept jobs; minutes count from $origin.
# Samples belong to a job by (cluster, job_id), as everywhere: job ids repeat across clusters,
# and another cluster's job of the same id must never be published under a kept job's
# pseudonym. Rows without a cluster are the only cluster's (HOME_CLUSTER).
TIMESERIES_SQL = f"""
WITH kept_jobs AS (SELECT r, cluster, job_id FROM sel SEMI JOIN kept USING (r)),
per_gpu AS (
    SELECT k.r, s.node, s.gpu_index, date_trunc('minute', s.ts) AS minute,
           avg(s.util) AS util, avg(s.sm_active) AS sm, max(s.mem_used_bytes) AS mem,
           avg(s.power_w) AS power
    FROM gpu_samples s
    JOIN kept_jobs k ON k.job_id = s.job_id AND k.cluster = coalesce(s.cluster, {HOME_CLUSTER})
    WHERE s.ts >= $since AND s.ts < $until
    GROUP BY ALL
),
g AS (
    SELECT r, node, minute, count(*) AS gpus, avg(util) AS gpu_util, avg(sm) AS sm_active,
           sum(mem) AS gpu_mem_used_bytes, sum(power) AS gpu_power_w
    FROM per_gpu GROUP BY ALL
),
net AS (
    SELECT k.r, s.node, date_trunc('minute', s.ts) AS minute,
           sum(s.tx_delta_bytes) AS rdma_tx_bytes, sum(s.rx_delta_bytes) AS rdma_rx_bytes
    FROM rdma_samples s
    JOIN kept_jobs k ON k.job_id = s.job_id AND k.cluster = coalesce(s.cluster, {HOME_CLUSTER})
    WHERE s.ts >= $since AND s.ts < $until
    GROUP BY ALL
)
SELECT k.job_id, m.alias AS node,
       (epoch_us(minute) - epoch_us($origin)) // 1000000 AS minute_s,
       gpus, gpu_util, sm_active, gpu_mem_used_bytes, gpu_power_w, rdma_tx_bytes, rdma_rx_bytes
FROM g FULL JOIN net USING (r, node, minute) JOIN kept_jobs k USING (r) JOIN {{node_map}}
ORDER BY k.job_id, node, minute_s
"""


def _binned(column: str) -> str:
    """SQL: seconds from $origin to `column`, floored to the start of its $res bin."""
    x = f"(epoch_us({column}) - epoch_us($origin)) / 1e6"
    return f"CASE WHEN $res > 0 THEN floor({x} / $res) * $res ELSE {x} END"


# The incidents open during the window, numbered as opened; times from $origin, floored to
# their $res bin (no finer than the jobs' submit times); nodes by alias or (per_job) none.
INCIDENTS_SQL = f"""
SELECT 'i' || row_number() OVER (ORDER BY opened_at, node, class) AS incident,
       {{alias}} AS node, class,
       {_binned("opened_at")} AS opened_s, {_binned("closed_at")} AS closed_s
FROM inc {{join}}
ORDER BY opened_s, incident
"""
INCIDENT_NODES = {
    "global": ("m.alias", "LEFT JOIN node_map m USING (node)"),
    "per_job": ("NULL", ""),
}

PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!~-]{0,63}$")
IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")  # looks like a version, is an address
# The released fields that show each quasi-identifier: dropping all of them hides it.
SHOWN_BY = {
    "queue": ("queue_s", "start_s", "end_s"),
    "time_limit": ("time_limit_s",),
    "partition": ("partition",),
    "group": ("group",),
    "dependencies": ("dependencies",),
}
# release_start of a release whose times count from a secret origin: not a real date (as PAI).
SECRET_ORIGIN = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class Release:
    """An anonymized release in memory: what `export_trace` writes, or a dashboard previews."""

    jobs: pa.Table
    timeseries: pa.Table | None
    info: ReleaseInfo
    suppressed_jobs: int
    incidents: pa.Table
    nodes: pa.Table | None = None  # the cluster's inventory (format 1.2)
    # What the window held, against which the release's share is judged (exact, not coarsened).
    window_jobs: int = 0
    window_gpu_hours: float = 0.0
    kept_gpu_hours: float = 0.0
    privacy: PrivacyReport | None = None  # when built with the public view to attack it

    def refusal(self, settings: TraceSettings) -> str | None:
        """Why this release must not be published, or None: it keeps none of the window's
        jobs, or less than `[trace] min_kept_share` of them or of their GPU-hours. A release
        that keeps nothing says nothing about the cluster and would pass for one that did."""
        if not self.window_jobs:
            return None  # an empty window: the release is as empty, and says so
        kept = self.jobs.num_rows
        jobs = kept / self.window_jobs
        hours = self.kept_gpu_hours / self.window_gpu_hours if self.window_gpu_hours else 1.0
        if kept and min(jobs, hours) >= settings.min_kept_share:
            return None
        return (
            f"the release would keep {kept:,} of the window's {self.window_jobs:,} jobs "
            f"({jobs:.0%}) and {hours:.0%} of their GPU-hours, under [trace] min_kept_share "
            f"= {settings.min_kept_share:g} (or none at all): the k={settings.k} rule over "
            f"{', '.join(_quasi_identifiers(settings))} left the rest out; nothing written "
            '(widen the window, or coarsen: rare_shapes = "generalize", a lower k or fewer '
            "quasi_identifiers)"
        )


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
    public: pa.Table | None = None,
) -> Release:
    """Select, summarise and anonymize the jobs submitted in [since, until); with `public`
    (`linkage.public_view` of the window), attack the result for its privacy report."""
    since, until = _utc(since), _utc(until)
    if until <= since:
        raise UserError(f"--until {until.isoformat()} must be after --since {since.isoformat()}")
    wh = warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)
    con = wh.connect()
    shift = _secret_shift(key, settings.time_resolution_s) if settings.time_shift else 0
    origin = since - timedelta(seconds=shift)
    params = {
        "since": since,
        "until": until,
        "origin": origin,
        "res": settings.time_resolution_s,
        "salt": _secret(key, "salt").hex(),
        "queue_shown": not {"queue_s", "start_s", "end_s"} <= set(settings.drop),
    }
    for statement in filter(str.strip, STAGE_SQL.split(";")):
        con.execute(statement, _used(params, statement))
    raw = con.sql("SELECT DISTINCT dependencies FROM sel").to_arrow_table()["dependencies"]
    deps = pa.table({"raw": raw, "clean": _clean_dependencies(raw, settings.packages)})
    con.register("deps", deps)
    con.execute(PEOPLE_SQL)
    nodes = con.execute(
        "SELECT count(*) FROM (SELECT unnest(nodes) FROM sel UNION SELECT node FROM gpu "
        "UNION SELECT node FROM rdma UNION SELECT node FROM inc)"
    ).fetchone()[0]
    aliases = "per_job" if settings.node_aliases == "per_job" else "global"
    if aliases == "global":
        statement = NODE_MAP_SQL.format(order=NODE_ORDER[settings.node_aliases])
        con.execute(statement, _used(params | {"width": max(3, len(str(nodes)))}, statement))
    suppressed = apply_k_anonymity(
        con,
        settings.k,
        settings.rare_shapes,
        _quasi_identifiers(settings),
        ladder(settings, _span_s(since, until, settings)),
        _secret(key, "cover"),
    )
    statement = jobs_sql(aliases)
    kept = con.sql(statement, params=_used(params, statement)).to_arrow_table()
    series = None
    if timeseries:
        statement = TIMESERIES_SQL.format(node_map=SERIES_NODE_MAP[aliases])
        series = con.sql(statement, params=_used(params, statement)).to_arrow_table()
        series = series.set_column(0, "job_id", pseudonymize(series["job_id"], key, "j"))
        series = conform(TIMESERIES, series)
    inventory = _inventory(con, params, aliases, settings, kept)
    jobs = _pseudonymize_jobs(kept, key, settings)
    jobs = conform(JOBS, jobs, dropped=settings.drop)
    alias, join = INCIDENT_NODES[aliases]
    statement = INCIDENTS_SQL.format(alias=alias, join=join)
    incidents = conform(
        INCIDENTS, con.sql(statement, params=_used(params, statement)).to_arrow_table()
    )
    ((window_jobs, window_hours, kept_hours),) = con.execute(
        KEPT_SHARE_SQL, _used(params, KEPT_SHARE_SQL)
    ).fetchall()
    policy = _policy(settings)
    release_start = SECRET_ORIGIN if settings.time_shift else since
    report = None
    if public is not None:
        report = assess(
            jobs,
            {"release_start": release_start.isoformat(), "anonymization": policy},
            public,
            key,
            origin.timestamp(),
            con.sql("SELECT * FROM pool_stats").to_arrow_table(),
            (window_jobs, jobs.num_rows, kept_hours / window_hours if window_hours else 1.0),
            _quasi_identifiers(settings),
            settings.k,
        )
    info = ReleaseInfo(
        title=settings.title,
        release_start=release_start,
        release_end=None if settings.time_shift else until,
        source="sing export",
        collection=_collection_text(settings),
        anonymization=_anonymization_lines(settings, suppressed, nodes)
        + ([INVENTORY_LINE[aliases]] if inventory is not None else []),
        biases=BIASES,
        threat_model=THREAT_MODEL,
        policy=policy,
        privacy=report.lines() if report else [],
        privacy_figures=report.as_dict() if report else None,
    )
    return Release(
        jobs,
        series,
        info,
        suppressed,
        incidents,
        inventory,
        window_jobs,
        window_hours,
        kept_hours,
        report,
    )


# The window's jobs as the site recorded them, for its own use and never released: real ids
# and users, exact times (seconds from $since: TIMES_SQL with $origin = $since, a job cut by
# $until censored as in a release), and the GPU model of each job's first node in the
# window's inventory, the cluster a replay runs on. Parameters: none beyond the staged tables.
RECORD_SQL = f"""
SELECT t.job_id, t."user", t.account AS "group", t.submit AS submit_s,
       t.submit + t.queue AS start_s, t.run AS run_s, t.queue AS queue_s, {outcome_sql("t")},
       t.partition, t.num_nodes, t.gpus_per_node, t.num_gpus, i.gpu_model,
       t.num_gpus::DOUBLE AS gpu_request, t.time_limit_s, t.censored
FROM (SELECT * FROM sel JOIN timed USING (r)) t
LEFT JOIN inventory i ON i.node = t.nodes[1]
ORDER BY t.submit, t.job_id
"""
# GPU jobs submitted before $since that still held or waited for GPUs at $since.
IN_FLIGHT_SQL = """
SELECT count(*) FROM jobs
WHERE submit_time < $since AND coalesce(end_time, $until) > $since AND num_gpus > 0
"""


@dataclass
class SiteRecord:
    """What the warehouse recorded of [since, until): the jobs (a release's jobs columns, not
    anonymized) and the node inventory (node, gpus, gpu_model; None when it knows none)."""

    jobs: pa.Table
    nodes: pa.Table | None
    since: datetime
    until: datetime
    in_flight: int  # jobs from before `since` running or waiting at it: not in `jobs`


def site_record(warehouse: Warehouse, since: datetime | None, until: datetime | None) -> SiteRecord:
    """The jobs submitted in [since, until) and the inventory then, staged as a release of the
    window is (the same window, times and censoring), without anonymizing: `sing simulate
    --from-warehouse` replays the site's own record. `since` None: the first submit; `until`
    None: the last job sync (the newest `recorded_at`; what ran after it is not known yet),
    else now."""
    con = warehouse.connect()
    first, synced = con.execute("SELECT min(submit_time), max(recorded_at) FROM jobs").fetchone()
    if first is None:
        raise UserError(f"{warehouse.root}: the warehouse holds no jobs")
    since = _utc(since or first)
    until = _utc(until or synced or datetime.now(UTC))
    if until <= since:
        raise UserError(f"--until {until.isoformat()} must be after --since {since.isoformat()}")
    params = {"since": since, "until": until, "origin": since, "salt": ""}
    for statement in filter(str.strip, WINDOW_SQL.split(";")):
        con.execute(statement, _used(params, statement))
    con.execute(INVENTORY_SQL, _used(params, INVENTORY_SQL))
    jobs = con.sql(RECORD_SQL).to_arrow_table()
    nodes = con.sql("SELECT node, gpus, gpu_model FROM inventory ORDER BY node").to_arrow_table()
    (in_flight,) = con.execute(IN_FLIGHT_SQL, _used(params, IN_FLIGHT_SQL)).fetchone()
    return SiteRecord(jobs, nodes if nodes.num_rows else None, since, until, in_flight)


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
    wh = warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)
    public = public_view(wh, _utc(since), _utc(until))
    release = build_release(wh, since, until, key, settings, timeseries, public)
    path = write_release(out_dir, release, settings)
    figures = json.loads((path / AGGREGATES).read_text())  # computed once, by write_trace
    return ExportResult(path, release.jobs.num_rows, release.suppressed_jobs, figures)


def write_release(out_dir: str | Path, release: Release, settings: TraceSettings) -> Path:
    """Write a release built in memory as a trace directory (atomically), every resource;
    refused with the reason (UserError) when it keeps too little to publish."""
    if refusal := release.refusal(settings):
        raise UserError(refusal)
    return write_trace(
        out_dir,
        release.jobs,
        release.info,
        release.timeseries,
        settings.write_csv,
        nodes=release.nodes,
        incidents=release.incidents,
    )


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


def _inventory(
    con, params: dict, aliases: str, settings: TraceSettings, kept: pa.Table
) -> pa.Table | None:
    """The `nodes` resource (NODES_SQL), or None when the warehouse knows no node. Aliases are
    as wide as node_map's (per node) or as the inventory needs (per job)."""
    con.execute(INVENTORY_SQL, _used(params, INVENTORY_SQL))
    con.register("released", kept.select(["nodes", "gpu_model"]))
    con.execute(
        "CREATE TEMP VIEW hidden AS SELECT DISTINCT unnest(nodes) AS alias FROM released "
        "WHERE gpu_model = 'other'"
    )
    named = "node_map" if aliases == "global" else "inventory"
    [(count,)] = con.execute(f"SELECT count(*) FROM {named}").fetchall()
    width = max(3, len(str(count)))
    statement = NODES_SQL[aliases].format(order=NODE_ORDER.get(settings.node_aliases, ""))
    table = con.sql(statement, params=_used(params | {"width": width}, statement)).to_arrow_table()
    return conform(NODES, table) if table.num_rows else None


def _used(params: dict, statement: str) -> dict:
    """The parameters a statement names (DuckDB rejects unused ones)."""
    return {k: v for k, v in params.items() if f"${k}" in statement}


def _secret(key: bytes, purpose: str) -> bytes:
    """A secret derived from the release key for one purpose (shift, jitter, aliases)."""
    return hmac.new(key, f"release-{purpose}".encode(), hashlib.sha256).digest()


def _secret_shift(key: bytes, resolution_s: int) -> int:
    """Seconds between the secret time origin and --since: under a week, and a whole number of
    time bins, so that the bins the k rule counted are the bins a reader sees."""
    steps = MAX_SHIFT_S // resolution_s if resolution_s > 0 else MAX_SHIFT_S
    return int.from_bytes(_secret(key, "shift")[:8]) % steps * max(resolution_s, 1)


def _span_s(since: datetime, until: datetime, settings: TraceSettings) -> int:
    """Whole days from the earliest possible secret origin to the window's end: one submit
    bin of this width from the origin holds every job of the window, whatever the shift."""
    shift = MAX_SHIFT_S if settings.time_shift else 0
    return -(-(shift + int((until - since).total_seconds())) // 86_400) * 86_400


def _quasi_identifiers(settings: TraceSettings) -> tuple[str, ...]:
    """The k rule's cell: the configured quasi-identifiers, less those the release does not
    show (a dropped column, a per-job group pseudonym that says nothing)."""
    hidden = {q for q, fields in SHOWN_BY.items() if set(fields) <= set(settings.drop)}
    if settings.linkage == "none":
        hidden.add("group")
    return tuple(q for q in settings.quasi_identifiers if q not in hidden)


def _pseudonymize_jobs(jobs: pa.Table, key: bytes, settings: TraceSettings) -> pa.Table:
    """Pseudonyms over whole columns. A user or group pseudonym made per job is the job's own
    (u_/g_ + its hex digits): distinct per job and saying nothing the job id does not, with no
    second million HMACs."""
    group = jobs["group"]
    merged = pc.equal(group, OTHER)
    job_ids = pseudonymize(jobs["job_id"], key, "j", distinct=True)
    jobs = jobs.set_column(0, "job_id", job_ids)
    users = jobs.column_names.index("user")
    if settings.linkage == "user":
        user = pseudonymize(jobs["user"], key, "u")
    else:
        user = pc.utf8_replace_slice(job_ids, 0, 1, "u")
    jobs = jobs.set_column(users, "user", user)
    groups = jobs.column_names.index("group")
    if settings.linkage == "none":
        pseudo = pc.utf8_replace_slice(job_ids, 0, 1, "g")
    else:
        pseudo = pc.if_else(merged, OTHER, pseudonymize(group, key, "g"))
    jobs = jobs.set_column(groups, "group", pseudo)
    partitions = jobs.column_names.index("partition")
    jobs = jobs.set_column(
        partitions, "partition", _partitions(jobs["partition"], key, settings.partitions)
    )
    return jobs


def _partitions(column: pa.ChunkedArray, key: bytes, raw: tuple[str, ...]) -> pa.Array:
    """Partition names on the allow-list (or all, for ["*"]) stay; others become pseudonyms."""
    if ANY in raw:
        return column.combine_chunks()
    listed = pc.is_in(column, pa.array(raw, pa.string()))
    return pc.if_else(listed, column, pseudonymize(column, key, "p"))


def _clean_dependencies(column: pa.ChunkedArray | pa.Array, packages: tuple[str, ...]) -> pa.Array:
    """Keep only package-name -> version pairs, of the listed packages (["*"]: any name that
    looks like a package): a path, URL, free text or a lab's private package never leaves."""
    listed = None if ANY in packages else {p.lower() for p in packages}
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
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
            and (listed is None or name.lower() in listed)
            and isinstance(version, str)
            and VERSION.match(version)
            and not IPV4.match(version)
        }
        cleaned.append(json.dumps(kept, sort_keys=True))
    return pc.take(pa.array(cleaned, pa.string()), encoded.indices)


def _policy(settings: TraceSettings) -> dict:
    """The anonymization settings a reader needs to interpret the times, for datapackage.json."""
    return {
        "time_origin": "secret" if settings.time_shift else "release_start",
        "time_resolution_s": settings.time_resolution_s,
        "duration_ratio": settings.duration_ratio,
        "node_aliases": settings.node_aliases,
        "linkage": settings.linkage,
        "k": settings.k,
        "quasi_identifiers": list(_quasi_identifiers(settings)),
    }


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
    linkage = {
        "none": "every job has its own user and group pseudonym: nothing links two jobs of "
        "one person or lab",
        "group": "one pseudonym per group, and every job its own user pseudonym",
        "user": "one pseudonym per user and per group: a user's jobs are linked",
    }[settings.linkage]
    aliases = {
        "per_job": "a job's nodes are n1, n2, ... in its own list (count and order only)",
        "random": f"the {nodes} nodes have one secret random alias each for this release",
        "name_order": f"the {nodes} nodes are renamed n001, n002, ... in name order "
        "(reversible by anyone who can list the node names)",
    }[settings.node_aliases]
    origin = (
        "a secret origin, a whole number of time bins up to a week before the window start "
        "(release_start 1970-01-01 is not a real date)"
        if settings.time_shift
        else "the window start (release_start)"
    )
    res = settings.time_resolution_s
    ratio = settings.duration_ratio
    return [
        "Users, groups and job ids are HMAC-SHA256 pseudonyms under a secret per-release key "
        f"(not a bare hash); {linkage}.",
        f"Job names, commands, working directories, paths, hostnames and IPs are not included; "
        f"{aliases}.",
        f"Times are seconds since {origin}. "
        + (f"Submit times are known to {res} s bins" if res else "Submit times are exact")
        + (f", run and queue times to buckets growing by x{ratio:g}" if ratio > 1 else "")
        + " at best; each job's own precision is in submit_bin_s, run_bin_ratio and "
        "gpus_min/gpus_max. The jobs released together with equal bins shuffle their exact "
        "times and GPU counts by a secret random permutation (so a row's times and size are "
        "some job's of its pool, inside the same bins, and the pool's distributions and "
        "GPU-hours are exact); a job alone in its bins gets values placed at random inside "
        "them. Energy and RDMA bytes are scaled with the released run time and GPU count, so "
        "their rates are the job's own and they say no more of either.",
        "Partition names: "
        + (
            "all raw"
            if ANY in settings.partitions
            else "pseudonyms except " + _listed(settings.partitions)
        )
        + "; dependencies: "
        + ("any package name" if ANY in settings.packages else "only listed public packages")
        + ".",
        f"Groups with fewer than k={settings.k} users are merged into group 'other'; rare "
        f"resource shapes: policy '{settings.rare_shapes}'. A job is released among jobs "
        f"with the same {', '.join(_quasi_identifiers(settings)) or 'nothing'} that hold at "
        f"least k={settings.k} users, none with more than half of them"
        + (
            ": where its own do not, at the first coarser precision where they do (submit "
            "bins up to the whole window, run buckets up to x"
            f"{settings.max_duration_ratio:g}, then the GPU model, the outcome and the "
            "size hidden), with jobs of other users published at that precision too as cover"
            if settings.rare_shapes == "generalize"
            else ""
        )
        + f"; {suppressed} jobs left out.",
        "Fields left out: " + (", ".join(settings.drop) or "none") + ".",
    ]


# What the datasheet says of the nodes resource, per kind of job aliases.
INVENTORY_LINE = {
    "per_job": "nodes.csv is the cluster's inventory (GPUs and model per node, as `sinfo` shows "
    "every user) under aliases of its own, numbered by model and size: they name no job's node.",
    "global": "nodes.csv gives each node's GPUs and model under the jobs' node aliases; a node "
    "that ran a job whose GPU model was generalised shows 'other'.",
}


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


THREAT_MODEL = (
    "The release is assumed to reach anyone, including users of the same cluster, who can "
    "list every job's owner, account, partition, submit/start/end time, size and nodes "
    "(`sacct -a`) and each node's GPU model (`sinfo`). Such a person matches released jobs to "
    "jobs they can see, by time, size and duration, to learn whose GPU efficiency a job or a "
    "pseudonym shows. `sing trace attack` plays that person against this policy before "
    "publication; the policy above is meant to leave them no job they can attribute with "
    "better than even odds. Not covered: someone who knows a job's telemetry from elsewhere, "
    "and job-level timeseries (`--timeseries`), which show run times to the minute."
)

BIASES = [
    "Telemetry of a censored job covers samples up to the end of the release's last day.",
    "Jobs whose shape or cell was rare were released at a coarser precision (or, rarely, left "
    "out), so the largest, most unusual and most bursty jobs (one user's many similar jobs) "
    "are known less precisely; the privacy report says how many at each precision.",
    "GPU utilisation is the driver's coarse 'any kernel running' ratio; SM activity is the "
    "better measure of how busy a GPU was.",
    "Jobs without samples (e.g. CPU-only, or before monitoring started) have empty telemetry.",
]
