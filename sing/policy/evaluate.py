"""A rule's verdict on every running job: SQL over the window's samples, one row per job.

Only what a round needs is opened: the `jobs` records, and the sample days from the earliest
window (or the earliest running job's start, for since-start rules) on, through
`Warehouse.connect(days_from=...)`. Today's raw `gpu_samples` are read in one pass that serves
both the sliding windows starting today and the since-start figures; earlier days come from
their stored rollups (`job_gpu_usage`, only the columns a verdict reads). RDMA figures read
`rdma_samples` (sliding) and `job_rdma_usage` (since start); the host kinds' CPU and memory read
`job_host_samples` through the job report's own `job_host_sql`. Verdicts and exemptions are SQL too,
so a round hands Python only the jobs that need a decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import duckdb

from sing.jobids import job_order_sql
from sing.policy.rules import (
    EXCESS_CORES_PER_GPU,
    EXCESS_MEMORY,
    HOST_KINDS,
    IDLE_GPUS,
    MULTINODE_IDLE,
    SINCE_START,
    UNDER_REQUEST,
    UNTOUCHED_GPUS,
    Rule,
)
from sing.schema import table
from sing.warehouse.analytics import HOME_CLUSTER, job_host_node_sql, job_host_sql
from sing.warehouse.coverage import coverage_sql
from sing.warehouse.delta import LiveFile
from sing.warehouse.rollups import IDLE_SAMPLE_UTIL, ROLLUPS
from sing.warehouse.sql import source_sql, sql_list
from sing.warehouse.store import Warehouse

VIOLATING, OK, EXEMPT, STALE = "violating", "ok", "exempt", "stale"
INCOMPLETE = "incomplete"  # coverage under [policy] min_coverage (sing/warehouse/coverage.py)
UNKNOWN = "unknown"  # a host kind's job whose request (or CPU time) is not known: not judged
GIB = 2**30

# Jobs holding resources now: the newest record of each job has no end.
RUNNING_SQL = """
SELECT job_id, cluster, "user", account, partition, name, qos, start_time, num_nodes,
       num_gpus, time_limit_s, interactive
FROM jobs
WHERE end_time IS NULL AND start_time IS NOT NULL AND start_time <= $now
"""


# Per-GPU figures over a span; `parts` is rows of (cluster, job_id, node, gpu_index, util_sum,
# util_max, samples, idle_samples, newest) that add up to the span.
PER_GPU_SQL = """
SELECT cluster, job_id, node, gpu_index,
       sum(util_sum) / nullif(sum(samples), 0) AS mean_util, max(util_max) AS max_util,
       sum(samples) AS samples, sum(idle_samples) AS idle_samples, max(newest) AS newest
FROM ({parts}) GROUP BY ALL"""


RUNNING_ONLY = "job_id IN (SELECT job_id FROM running)"
# Per GPU: the sums a span's figures add up from (as the `job_gpu_usage` rollup keeps them).
GPU_SUMS = f"""sum(util) AS util_sum, max(util) AS util_max, count(*) AS samples,
    count(*) FILTER (WHERE util < {IDLE_SAMPLE_UTIL}) AS idle_samples, max(ts) AS newest"""
# A part's columns, NULL clusters read as the warehouse's only one (after the grouping).
PARTS_COLUMNS = f"""coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id, node, gpu_index,
    util_sum, util_max, samples, idle_samples, newest"""


def _samples_sql(edges: int) -> str:
    """One pass over the jobs' raw GPU samples from `$from` on, per GPU and `part` (readers keep
    the running jobs': a join per group, not per sample):
    -1 after `$now`, else how many of the ascending window starts `$w0`..`$w{edges-1}` the sample
    is newer than, so a sliding window's figures are the parts at or above its index + 1, and
    the since-start figures all of them."""
    newer = " + ".join(f"(ts > $w{i})::INT" for i in range(edges)) or "0"
    return f"""
        SELECT cluster, job_id, node, gpu_index,
               CASE WHEN ts > $now THEN -1 ELSE {newer} END AS part, {GPU_SUMS}
        FROM gpu_samples
        WHERE ts >= $from AND job_id IS NOT NULL
        GROUP BY ALL"""


def _earlier_days(
    warehouse: Warehouse,
    con: duckdb.DuckDBPyConnection,
    samples: list[LiveFile],
    first: date,
    today: date,
) -> None:
    """View `earlier_gpu_usage`: the per-GPU sums of the days from `first` to before `today`,
    from their stored rollups, or their raw samples (of the live `samples` files) where a day
    is not rolled up yet. Today's samples are the round's own pass (`_samples_sql`), so they
    are never aggregated twice."""
    rollup = ROLLUPS["job_gpu_usage"]
    stored: list[Path] = []
    hot: list[Path] = []
    if first < today:
        raw = [f for f in samples if f.day and first <= f.day < today]
        rolled, live = warehouse.rollup_sources(rollup, raw)
        stored = [f.path for f in rolled if f.day and first <= f.day < today]
        hot = [f.path for f in live]
    samples = source_sql(con, table(rollup.source), hot)
    query = f"""SELECT cluster, job_id, node, gpu_index, {GPU_SUMS}
        FROM {samples} WHERE job_id IS NOT NULL GROUP BY ALL"""
    if stored:
        query = f"""SELECT cluster, job_id, node, gpu_index, util_sum, util_max, samples,
               idle_samples, last_ts AS newest FROM read_parquet({sql_list(stored)})
        UNION ALL {query}"""
    con.execute(f"CREATE VIEW earlier_gpu_usage AS {query}")


# The since-start figures of the days before today.
EARLIER_DAYS_SQL = f"SELECT {PARTS_COLUMNS} FROM earlier_gpu_usage WHERE {RUNNING_ONLY}"


def _rdma_sql(since_start: bool) -> str:
    """Per job: RDMA bytes both ways over the span (NULL when any counter was unknown) and the
    nodes heard from: a node with no RDMA sample must not read as a quiet one."""
    if since_start:
        return f"""
        SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id,
               CASE WHEN sum(tx_unknown_samples + rx_unknown_samples) = 0
                    THEN coalesce(sum(tx_bytes), 0) + coalesce(sum(rx_bytes), 0)
               END::DOUBLE AS bytes,
               count(DISTINCT node) AS nodes
        FROM job_rdma_usage WHERE job_id IN (SELECT job_id FROM running) GROUP BY ALL"""
    return f"""
        SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id,
               CASE WHEN count(*) = count(tx_delta_bytes) AND count(*) = count(rx_delta_bytes)
                    THEN sum(tx_delta_bytes) + sum(rx_delta_bytes) END::DOUBLE AS bytes,
               count(DISTINCT node) AS nodes
        FROM rdma_samples
        WHERE ts > $window_from AND ts <= $now AND job_id IN (SELECT job_id FROM running)
        GROUP BY ALL"""


# A node's cgroup figures over a sliding window of its samples (the replay's buckets too).
HOST_WINDOW_FIGURES = """count(*) AS samples, max(ts) AS newest, sum(cpu_delta_s) AS cpu_s,
       max(cpuset_cpus) AS cpuset_cpus,
       max(greatest(mem_peak_bytes, mem_used_bytes)) AS mem_peak_bytes,
       max(mem_limit_bytes) AS mem_limit_bytes"""


def _host_nodes_sql(since_start: bool) -> str:
    """Per running job and node: its cgroup's figures over the span, in `job_host_node_sql`'s
    columns. Since the start: the job report's counting over the run's samples. A sliding
    window: the CPU seconds of the deltas inside it. Memory is the kernel's peak since the
    cgroup was made where it keeps one, so a window never reads less than the job used."""
    samples = f"""(SELECT s.* REPLACE (coalesce(s.cluster, {HOME_CLUSTER}) AS cluster)
        FROM job_host_samples s WHERE s.ts <= $now AND s.job_id IN (SELECT job_id FROM running))"""
    if since_start:
        run = f"""(SELECT s.* FROM {samples} s JOIN running r
            ON r.cluster = s.cluster AND r.job_id = s.job_id WHERE s.ts >= r.start_time)"""
        per_day = ROLLUPS["job_host_usage"].select.replace("FROM src", f"FROM {run}")
        return job_host_node_sql(f"({per_day})")
    return f"""
        SELECT cluster, job_id, node, {HOST_WINDOW_FIGURES},
               NULL::BIGINT AS io_read_bytes, NULL::BIGINT AS io_write_bytes
        FROM {samples} WHERE ts > $window_from GROUP BY ALL"""


# A span's host figures per job (the job report's, over the span's per-node table), and the
# samples and freshness the coverage rule reads; NULL in figures_sql without a host table.
JOB_HOST_FIGURES = (
    "cpu_core_s",
    "alloc_cores",
    "host_mem_peak_bytes",
    "node_mem_peak_bytes",
    "host_mem_req_bytes",
    "node_mem_req_bytes",
    "suggested_mem_bytes",
)
HOST_FIGURES = (*JOB_HOST_FIGURES, "host_samples", "host_last_heard")


def host_sql(nodes: str, step: str | None = None) -> str:
    """One row per job (and `step`, a replay's column of `nodes`) with host samples in the
    per-node table `nodes`: HOST_FIGURES."""
    at = f", f.{step}" if step else ""
    same_step = f" AND n.{step} = f.{step}" if step else ""
    return f"""
SELECT f.cluster, f.job_id{at}, {", ".join(f"f.{c}" for c in JOB_HOST_FIGURES)},
       n.host_samples, n.host_last_heard
FROM ({job_host_sql(nodes=f"SELECT * FROM {nodes}", step=step)}) f
JOIN (SELECT cluster, job_id{f", {step}" if step else ""}, sum(samples) AS host_samples,
             min(newest) AS host_last_heard
      FROM {nodes} GROUP BY ALL) n ON n.cluster = f.cluster AND n.job_id = f.job_id{same_step}"""


def figures_sql(gpu: str, rdma: str, step: str | None = None, host: str | None = None) -> str:
    """One row per running job: its record and its figures over a span, from the span's
    per-GPU table `gpu` and per-job RDMA table `rdma`. `step`: the column of `running`, `gpu`
    and `rdma` holding each row's evaluation time, so one query judges many rounds (the
    replay's); None: one round at `$now`. `host`: the span's per-job HOST_FIGURES (None:
    NULL, for the rules that do not read them)."""
    keys = "cluster, job_id" + (f", {step}" if step else "")
    same_step = f"AND {{t}}.{step} = r.{step}" if step else ""
    now = f"r.{step}" if step else "$now"
    if host is None:
        host_columns = ", ".join(f"NULL AS {c}" for c in HOST_FIGURES)
        host_join = ""
    else:
        host_columns = ", ".join(f"h.{c}" for c in HOST_FIGURES)
        host_join = (
            f"LEFT JOIN {host} h ON h.cluster = r.cluster AND h.job_id = r.job_id "
            + same_step.format(t="h")
        )
    return f"""
WITH per_node AS (
    SELECT {keys}, node, bool_and(mean_util < $threshold) AS idle
    FROM {gpu} GROUP BY ALL
),
per_job AS (
    SELECT {keys}, count(*) AS gpus_sampled,
           count(*) FILTER (WHERE mean_util < $threshold) AS idle_gpus,
           count(*) FILTER (WHERE max_util < {IDLE_SAMPLE_UTIL}) AS gpus_never_used,
           sum(mean_util * samples) / nullif(sum(samples), 0) AS mean_util,
           sum(idle_samples) / nullif(sum(samples), 0) AS idle_share,
           sum(samples) AS samples, max(newest) AS newest_sample,
           -- the GPU heard from least recently: one silent GPU makes the job's data stale
           min(newest) AS last_heard
    FROM {gpu} GROUP BY ALL
),
nodes AS (
    SELECT {keys}, count(*) AS nodes_sampled, count(*) FILTER (WHERE idle) AS idle_nodes
    FROM per_node GROUP BY ALL
)
SELECT r.*, epoch({now} - r.start_time) AS run_s,
       p.gpus_sampled, p.idle_gpus, p.gpus_never_used, p.mean_util, p.idle_share,
       p.samples, p.newest_sample, p.last_heard,
       n.nodes_sampled, n.idle_nodes, d.bytes AS rdma_bytes, d.nodes AS rdma_nodes,
       {host_columns}
FROM running r
LEFT JOIN per_job p ON p.cluster = r.cluster AND p.job_id = r.job_id {same_step.format(t="p")}
LEFT JOIN nodes n ON n.cluster = r.cluster AND n.job_id = r.job_id {same_step.format(t="n")}
LEFT JOIN {rdma} d ON d.cluster = r.cluster AND d.job_id = r.job_id {same_step.format(t="d")}
{host_join}
ORDER BY {job_order_sql("r.job_id")}, r.cluster
"""


@dataclass(frozen=True)
class DataNeeds:
    """What data a verdict needs: fresh enough, and enough of it."""

    max_age_s: float  # [policy] max_data_age_s: the least recently heard GPU is this fresh
    min_coverage: float  # [policy] min_coverage: the share of expected samples present
    sample_interval_s: float  # [collector] interval_s: one sample per GPU this often


@dataclass(frozen=True)
class Verdict:
    """A rule's judgement of one running job, with the figures behind it."""

    rule: Rule
    job: dict[str, Any]  # the `jobs` row plus run_s and the span's figures
    outcome: str  # violating, ok, exempt or stale
    evidence: dict[str, Any]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.job["cluster"], self.job["job_id"], self.rule.name)


# The figures a verdict rests on (a message's evidence), computed next to the verdict.
EVIDENCE = (
    "mean_util",
    "idle_share",  # of the samples (the messages' efficiency table)
    "gpus_sampled",
    "idle_gpus",
    "gpus_never_used",
    "nodes_sampled",
    "idle_nodes",
    "rdma_bytes_per_node_hour",
    "hours",
    "newest_sample",
    "last_heard",  # the newest sample of the GPU heard from least recently
    "samples",
    "coverage",  # of the samples expected for the allocated GPUs (sing/warehouse/coverage.py)
)
# The host kinds' figures besides (over the rule's span; the memory suggestion is the job
# report's: the largest node's peak and a quarter, up to a power of two GiB).
HOST_EVIDENCE = (
    "cpu_efficiency",
    "mean_cores_used",
    "alloc_cores",
    "host_mem_peak_bytes",
    "host_mem_req_bytes",
    "node_mem_peak_bytes",
    "node_mem_req_bytes",
    "suggested_mem_bytes",
)


def evidence_of(rule: Rule, job: dict[str, Any]) -> dict[str, Any]:
    """The figures a verdict of `rule` rests on, from its `verdict_sql` row."""
    keys = EVIDENCE + HOST_EVIDENCE if rule.kind in HOST_KINDS else EVIDENCE
    return {k: job[k] for k in keys}


def verdict_sql(figures: str, now: str = "$now") -> str:
    """Each job's evidence and outcome under one rule, from `figures_sql`'s rows.

    Fail closed: a GPU the span has no sample of never counts as idle or unused (the rules
    compare against the GPUs and nodes *allocated*), a job whose least recently heard GPU is
    older than `$max_age_s` is stale, and one whose coverage is under `$min_coverage` is
    incomplete; neither is ever fine or violating. The host kinds (`$host`) ask the same of
    the job's cgroup samples (one per node per interval), and a job whose request or CPU time
    they cannot know is `unknown`, never judged.

    `$remembered_only`: leave out the jobs the rule finds fine unless the trail remembers the
    (job, rule): a round needs no word about them, `check` lists them all. `now`: the
    evaluation time, a parameter or a column of the figures (`figures_sql`'s `step`)."""
    units = "CASE WHEN $host THEN nodes_held ELSE num_gpus END"  # what gives one sample each
    coverage = coverage_sql("samples", units, "span_hours * 3600", "$interval_s::DOUBLE")
    return f"""
WITH figures AS ({figures}),
evidence AS (
    SELECT * REPLACE (CASE WHEN $host THEN host_last_heard ELSE last_heard END AS last_heard,
                      CASE WHEN $host THEN host_samples ELSE samples END AS samples),
           coalesce(gpus_sampled, 0) AS gpus_n, coalesce(idle_gpus, 0) AS idle_n,
           coalesce(gpus_never_used, 0) AS never_n, coalesce(nodes_sampled, 0) AS nodes_n,
           coalesce(idle_nodes, 0) AS idle_nodes_n, coalesce(num_nodes, 1) AS nodes_held,
           CASE WHEN $span_h::DOUBLE IS NULL THEN run_s / 3600
                ELSE least($span_h::DOUBLE, run_s / 3600) END AS span_hours
    FROM figures
    WHERE (num_gpus > 0 OR $kind = '{EXCESS_MEMORY}')
      AND (NOT $multinode OR coalesce(num_nodes, 1) >= 2)
),
judged AS (
    SELECT *,
           {coverage} AS coverage,
           -- per node-hour over the nodes held, only when every node was heard from
           CASE WHEN rdma_bytes IS NOT NULL AND span_hours <> 0
                     AND coalesce(rdma_nodes, 0) >= nodes_held
                THEN rdma_bytes / (nodes_held * span_hours) END AS rdma_bph,
           cpu_core_s / nullif(alloc_cores * span_hours * 3600, 0) AS cpu_efficiency,
           cpu_core_s / nullif(span_hours * 3600, 0) AS mean_cores_used
    FROM evidence
),
verdicts AS (
    SELECT *,
           CASE
           WHEN list_contains($exempt_users::VARCHAR[], "user")
             OR list_contains($exempt_accounts::VARCHAR[], account)
             OR list_contains($exempt_partitions::VARCHAR[], partition)
             OR list_contains($exempt_qos::VARCHAR[], qos)
             OR list_contains($exempt_names::VARCHAR[], coalesce(name, ''))
             OR (coalesce(interactive, false) AND $interactive_s > 0
                 AND time_limit_s < $interactive_s)
               THEN '{EXEMPT}'
           WHEN run_s < $needed_s THEN '{OK}'  -- too young to judge
           WHEN last_heard IS NULL OR epoch({now} - last_heard) > $max_age_s
               THEN '{STALE}'
           WHEN coverage < $min_coverage THEN '{INCOMPLETE}'
           WHEN CASE $kind
                WHEN '{EXCESS_MEMORY}' THEN host_mem_req_bytes IS NULL
                                            OR host_mem_peak_bytes IS NULL
                WHEN '{EXCESS_CORES_PER_GPU}' THEN alloc_cores IS NULL OR cpu_core_s IS NULL
                ELSE false END
               THEN '{UNKNOWN}'
           WHEN CASE $kind
                WHEN '{IDLE_GPUS}' THEN CASE WHEN $share::DOUBLE IS NULL THEN idle_n >= num_gpus
                                             ELSE idle_n > $share::DOUBLE * num_gpus END
                WHEN '{UNTOUCHED_GPUS}' THEN never_n > coalesce($share::DOUBLE, 0.0) * num_gpus
                WHEN '{MULTINODE_IDLE}' THEN
                    idle_nodes_n > coalesce($share::DOUBLE, 0.0) * nodes_held
                    OR (rdma_bph IS NOT NULL AND rdma_bph < $min_rdma)
                WHEN '{EXCESS_MEMORY}' THEN host_mem_req_bytes >= $min_request_bytes
                    AND host_mem_peak_bytes < $request_share * host_mem_req_bytes
                WHEN '{EXCESS_CORES_PER_GPU}' THEN alloc_cores > $max_cores_per_gpu * num_gpus
                    AND cpu_efficiency < $request_share
                -- under_request: utilisation, or the share of the requested GPUs doing anything
                -- (a GPU without samples counts as doing something: no evidence of waste)
                ELSE coalesce(mean_util, 0.0) < $request_share
                    OR (num_gpus - idle_n) / num_gpus < $request_share
                END
               THEN '{VIOLATING}'
           ELSE '{OK}'
           END AS outcome
    FROM judged
)
SELECT * EXCLUDE (gpus_sampled, idle_gpus, gpus_never_used, nodes_sampled, idle_nodes,
                  gpus_n, idle_n, never_n, nodes_n, idle_nodes_n, nodes_held, span_hours,
                  rdma_bph),
       gpus_n AS gpus_sampled, idle_n AS idle_gpus, never_n AS gpus_never_used,
       nodes_n AS nodes_sampled, idle_nodes_n AS idle_nodes, span_hours AS hours,
       rdma_bph AS rdma_bytes_per_node_hour
FROM verdicts
WHERE NOT $remembered_only OR outcome <> '{OK}'
   OR EXISTS (SELECT 1 FROM remembered m
              WHERE m.cluster = verdicts.cluster AND m.job_id = verdicts.job_id AND m.rule = $rule)
"""


def open_round(
    warehouse: Warehouse, rules: list[Rule], now: datetime, history_from: date
) -> duckdb.DuckDBPyConnection:
    """A connection with `jobs`, the samples the rules read, and `policy_events` from
    `history_from` (the ladder's memory), nothing older. One connection: the running jobs'
    earliest start, read from `jobs` first, says which sample days the others need."""
    con = warehouse.connect({"jobs": None})
    try:
        ((first_start,),) = con.execute(
            f"SELECT min(start_time) FROM ({RUNNING_SQL})", {"now": now}
        ).fetchall()  # all: the connection takes more views next
        first_start = first_start or now
        starts = [
            first_start
            if rule.window == SINCE_START or rule.kind == UNTOUCHED_GPUS
            else rule.window_start(now)
            for rule in rules
        ]
        samples_from = min(starts, default=now).astimezone(UTC).date()
        views = {
            "gpu_samples": samples_from,
            "rdma_samples": samples_from,
            "policy_events": min(history_from, first_start.astimezone(UTC).date()),
        }
        if any(rule.kind in HOST_KINDS for rule in rules):  # a listing only where read
            views["job_host_samples"] = samples_from
        live = warehouse.add_views(
            con,
            views,
            rollups=("job_rdma_usage",),  # the GPU figures' own view: `_earlier_days`
        )
        _earlier_days(warehouse, con, live["gpu_samples"], samples_from, now.astimezone(UTC).date())
    except BaseException:
        con.close()
        raise
    return con


class Evaluator:
    """Rules' verdicts over one round's connection. The running jobs, and each distinct span's
    per-GPU and RDMA figures, are computed once and shared by the rules that read them; the
    verdicts are SQL, so Python only meets the jobs it is handed.

    Today's raw GPU samples are read once: that pass serves the since-start figures (with the
    earlier days' rollups) and every sliding window of `rules` that begins today. A window
    reaching into an earlier day, or of a rule not given here, reads the raw samples itself."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        now: datetime,
        needs: DataNeeds,
        rules: list[Rule] | tuple[Rule, ...] = (),
    ):
        self.con = con
        self.now = now
        self.needs = needs
        self.today = datetime.combine(now.astimezone(UTC).date(), time(), UTC)
        starts = {rule.window_start(now) for rule in rules if not _since_start(rule)}
        self.windows = sorted(start for start in starts if start >= self.today)
        self._spans: dict[datetime | None, tuple[str, str]] = {}
        self._figure_tables: dict[tuple[datetime | None, float, bool], str] = {}
        self._hosts: dict[datetime | None, str] = {}
        self._today_pass: str | None = None
        con.execute(f"CREATE TEMP TABLE running AS {RUNNING_SQL}", {"now": now})
        # (job, rule) pairs the trail remembers: their ladders may need a step while fine
        con.execute(
            """CREATE TEMP TABLE remembered AS SELECT DISTINCT cluster, job_id, rule
            FROM policy_events WHERE rule IS NOT NULL AND job_id IN (SELECT job_id FROM running)"""
        )

    def verdicts(self, rule: Rule, remembered_only: bool = False) -> list[Verdict]:
        """The rule's verdict on each running job it applies to; with `remembered_only`, only
        on those it does not find fine or whose (job, rule) the trail remembers."""
        since_start = _since_start(rule)
        figures = self._figures(None if since_start else rule.window_start(self.now), rule)
        sql = verdict_sql(f"FROM {figures}")  # the table keeps figures_sql's order
        rel = self.con.sql(sql, params=self._params(rule, remembered_only))
        verdicts = []
        for job in rel.to_arrow_table().to_pylist():
            evidence = evidence_of(rule, job)
            verdicts.append(Verdict(rule, job, job.pop("outcome"), evidence))
        return verdicts

    def _params(self, rule: Rule, remembered_only: bool) -> dict[str, Any]:
        names = self._names_matching(rule.exempt_names)
        return {"now": self.now} | rule_params(rule, self.needs, names, remembered_only)

    def _names_matching(self, patterns: list[str]) -> list[str]:
        """The running jobs' names that match a pattern (fnmatch, as users write them)."""
        if not patterns:
            return []
        names = [
            n
            for (n,) in self.con.execute(
                "SELECT DISTINCT coalesce(name, '') FROM running"
            ).fetchall()
        ]
        return [n for n in names if any(fnmatchcase(n, p) for p in patterns)]

    def _figures(self, window_from: datetime | None, rule: Rule) -> str:
        """Temp table of the running jobs' figures from `window_from` (None: each job's start)
        under the rule's threshold, made once for the rules that share both."""
        host = rule.kind in HOST_KINDS
        key = (window_from, rule.threshold, host)
        if key not in self._figure_tables:
            name = f"figures_{len(self._figure_tables)}"
            gpu, rdma = self._span(window_from)
            sql = figures_sql(gpu, rdma, host=self._host(window_from) if host else None)
            params = {"now": self.now, "threshold": rule.threshold}
            self.con.execute(f"CREATE TEMP TABLE {name} AS {sql}", params)
            self._figure_tables[key] = name
        return self._figure_tables[key]

    def _host(self, window_from: datetime | None) -> str:
        """Temp table of the running jobs' HOST_FIGURES from `window_from` (None: each job's
        start) to now, made once for the host rules that share the span."""
        if window_from not in self._hosts:
            nodes, name = f"host_nodes_{len(self._hosts)}", f"host_{len(self._hosts)}"
            since_start = window_from is None
            params = {"now": self.now} | ({} if since_start else {"window_from": window_from})
            self.con.execute(f"CREATE TEMP TABLE {nodes} AS {_host_nodes_sql(since_start)}", params)
            self.con.execute(f"CREATE TEMP TABLE {name} AS {host_sql(nodes)}", {"now": self.now})
            self._hosts[window_from] = name
        return self._hosts[window_from]

    def _span(self, window_from: datetime | None) -> tuple[str, str]:
        """Temp tables of per-GPU and per-job RDMA figures from `window_from` (None: each
        job's start) to now."""
        if window_from not in self._spans:
            gpu, rdma = f"gpu_{len(self._spans)}", f"rdma_{len(self._spans)}"
            since_start = window_from is None
            params = {} if since_start else {"now": self.now, "window_from": window_from}
            sql, gpu_params = self._per_gpu(window_from)
            self.con.execute(f"CREATE TEMP TABLE {gpu} AS {sql}", gpu_params)
            self.con.execute(f"CREATE TEMP TABLE {rdma} AS {_rdma_sql(since_start)}", params)
            self._spans[window_from] = (gpu, rdma)
        return self._spans[window_from]

    def _per_gpu(self, window_from: datetime | None) -> tuple[str, dict[str, Any]]:
        """The per-GPU figures' SQL of a span and its parameters, from today's pass where
        that covers the span."""
        if window_from is None:
            today = f"SELECT {PARTS_COLUMNS} FROM {self._today()} WHERE {RUNNING_ONLY}"
            parts = f"{EARLIER_DAYS_SQL} UNION ALL {today}"
            return PER_GPU_SQL.format(parts=parts), {}
        if window_from in self.windows:
            part = self.windows.index(window_from) + 1
            parts = f"SELECT {PARTS_COLUMNS} FROM {self._today()} WHERE {RUNNING_ONLY}"
            parts += f" AND part >= {part}"
            return PER_GPU_SQL.format(parts=parts), {}
        parts = f"SELECT {PARTS_COLUMNS} FROM ({_samples_sql(1)}) WHERE {RUNNING_ONLY} AND part = 1"
        params = {"now": self.now, "from": window_from, "w0": window_from}
        return PER_GPU_SQL.format(parts=parts), params

    def _today(self) -> str:
        """The temp table of today's one pass over the raw samples (made on first use)."""
        if self._today_pass is None:
            params = {"now": self.now, "from": self.today}
            params |= {f"w{i}": start for i, start in enumerate(self.windows)}
            sql = _samples_sql(len(self.windows))
            self.con.execute(f"CREATE TEMP TABLE today_samples AS {sql}", params)
            self._today_pass = "today_samples"
        return self._today_pass


def rule_params(
    rule: Rule, needs: DataNeeds, exempt_names: list[str], remembered_only: bool
) -> dict[str, Any]:
    """`verdict_sql`'s parameters for one rule, but `$now` (a round's, or the replay's steps);
    `exempt_names`: the judged jobs' names that match the rule's patterns."""
    needed_s = rule.min_run_hours * 3600 if rule.kind == UNDER_REQUEST else rule.minutes * 60
    interactive_s = rule.exempt_interactive_hours * 3600
    return {
        "rule": rule.name,
        "kind": rule.kind,
        "multinode": rule.kind == MULTINODE_IDLE,
        "span_h": None if _since_start(rule) else rule.minutes / 60,
        "needed_s": needed_s,
        "max_age_s": needs.max_age_s,
        "min_coverage": needs.min_coverage,
        "interval_s": needs.sample_interval_s,
        "share": rule.idle_gpu_share,
        "min_rdma": rule.min_rdma_bytes_per_node_hour,
        "request_share": rule.request_share,
        "host": rule.kind in HOST_KINDS,
        "min_request_bytes": rule.min_request_gib * GIB,
        "max_cores_per_gpu": rule.max_cores_per_gpu,
        "exempt_users": rule.exempt_users,
        "exempt_accounts": rule.exempt_accounts,
        "exempt_partitions": rule.exempt_partitions,
        "exempt_qos": rule.exempt_qos,
        "exempt_names": exempt_names,
        "interactive_s": interactive_s,
        "remembered_only": remembered_only,
    }


def _since_start(rule: Rule) -> bool:
    return rule.window == SINCE_START or rule.kind == UNTOUCHED_GPUS
