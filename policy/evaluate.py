"""A rule's verdict on every running job: SQL over the window's samples, one row per job.

Only what a round needs is opened: the `jobs` records, and the sample days from the earliest
window (or the earliest running job's start, for since-start rules) on, through
`Warehouse.connect(days_from=...)`. Sliding windows read raw `gpu_samples` / `rdma_samples`;
since-start figures come from the per-day rollups (`job_gpu_usage`, `job_rdma_usage`), which are
small for closed days and live for today.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import duckdb

from policy.rules import (
    IDLE_GPUS,
    MULTINODE_IDLE,
    SINCE_START,
    UNDER_REQUEST,
    UNTOUCHED_GPUS,
    Rule,
)
from warehouse.analytics import HOME_CLUSTER, numeric_job_order
from warehouse.rollups import IDLE_SAMPLE_UTIL
from warehouse.store import Warehouse

VIOLATING, OK, EXEMPT, STALE = "violating", "ok", "exempt", "stale"

# Jobs holding resources now: the newest record of each job has no end.
RUNNING_SQL = """
SELECT job_id, cluster, "user", account, partition, name, qos, start_time, num_nodes,
       num_gpus, time_limit_s, interactive
FROM jobs
WHERE end_time IS NULL AND start_time IS NOT NULL AND start_time <= $now
"""


def _per_gpu_sql(since_start: bool) -> str:
    """Per job and GPU over the rule's span: mean and peak utilisation, samples, newest."""
    if since_start:
        return f"""
        SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id, node, gpu_index,
               sum(util_sum) / nullif(sum(samples), 0) AS mean_util, max(util_max) AS max_util,
               sum(samples) AS samples, sum(idle_samples) AS idle_samples, max(last_ts) AS newest
        FROM job_gpu_usage WHERE job_id IN (SELECT job_id FROM running) GROUP BY ALL"""
    return f"""
        SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id, node, gpu_index,
               avg(util) AS mean_util, max(util) AS max_util, count(*) AS samples,
               count(*) FILTER (WHERE util < {IDLE_SAMPLE_UTIL}) AS idle_samples, max(ts) AS newest
        FROM gpu_samples
        WHERE ts > $window_from AND ts <= $now AND job_id IN (SELECT job_id FROM running)
        GROUP BY ALL"""


def _rdma_sql(since_start: bool) -> str:
    """Per job: RDMA bytes both ways over the span; NULL when any counter was unknown."""
    if since_start:
        return f"""
        SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id,
               CASE WHEN sum(tx_unknown_samples + rx_unknown_samples) = 0
                    THEN coalesce(sum(tx_bytes), 0) + coalesce(sum(rx_bytes), 0)
               END::DOUBLE AS bytes
        FROM job_rdma_usage WHERE job_id IN (SELECT job_id FROM running) GROUP BY ALL"""
    return f"""
        SELECT coalesce(cluster, {HOME_CLUSTER}) AS cluster, job_id,
               CASE WHEN count(*) = count(tx_delta_bytes) AND count(*) = count(rx_delta_bytes)
                    THEN sum(tx_delta_bytes) + sum(rx_delta_bytes) END::DOUBLE AS bytes
        FROM rdma_samples
        WHERE ts > $window_from AND ts <= $now AND job_id IN (SELECT job_id FROM running)
        GROUP BY ALL"""


def figures_sql(gpu: str, rdma: str) -> str:
    """One row per running job: its record and its figures over a span, from the span's
    per-GPU table `gpu` and per-job RDMA table `rdma`."""
    return f"""
WITH per_node AS (
    SELECT cluster, job_id, node, bool_and(mean_util < $threshold) AS idle
    FROM {gpu} GROUP BY ALL
),
per_job AS (
    SELECT cluster, job_id, count(*) AS gpus_sampled,
           count(*) FILTER (WHERE mean_util < $threshold) AS idle_gpus,
           count(*) FILTER (WHERE max_util < {IDLE_SAMPLE_UTIL}) AS gpus_never_used,
           sum(mean_util * samples) / nullif(sum(samples), 0) AS mean_util,
           sum(idle_samples) / nullif(sum(samples), 0) AS idle_share,
           max(newest) AS newest_sample
    FROM {gpu} GROUP BY ALL
),
nodes AS (
    SELECT cluster, job_id, count(*) AS nodes_sampled, count(*) FILTER (WHERE idle) AS idle_nodes
    FROM per_node GROUP BY ALL
)
SELECT r.*, epoch($now - r.start_time) AS run_s,
       p.gpus_sampled, p.idle_gpus, p.gpus_never_used, p.mean_util, p.idle_share,
       p.newest_sample,
       n.nodes_sampled, n.idle_nodes, d.bytes AS rdma_bytes
FROM running r
LEFT JOIN per_job p ON p.cluster = r.cluster AND p.job_id = r.job_id
LEFT JOIN nodes n ON n.cluster = r.cluster AND n.job_id = r.job_id
LEFT JOIN {rdma} d ON d.cluster = r.cluster AND d.job_id = r.job_id
ORDER BY {numeric_job_order("r.job_id")}, r.cluster
"""


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


def open_round(
    warehouse: Warehouse, rules: list[Rule], now: datetime, history_from: date
) -> duckdb.DuckDBPyConnection:
    """A connection with `jobs`, the samples the rules read, and `policy_events` from
    `history_from` (the ladder's memory), nothing older."""
    probe = warehouse.connect({"jobs": None})
    try:
        (first_start,) = probe.execute(
            f"SELECT min(start_time) FROM ({RUNNING_SQL})", {"now": now}
        ).fetchone()
    finally:
        probe.close()
    first_start = first_start or now
    starts = [
        first_start
        if rule.window == SINCE_START or rule.kind == UNTOUCHED_GPUS
        else rule.window_start(now)
        for rule in rules
    ]
    samples_from = min(starts, default=now).astimezone(UTC).date()
    return warehouse.connect(
        {
            "jobs": None,
            "gpu_samples": samples_from,
            "rdma_samples": samples_from,
            "policy_events": min(history_from, first_start.astimezone(UTC).date()),
        }
    )


class Evaluator:
    """Rules' verdicts over one round's connection. The running jobs, and each distinct span's
    per-GPU and RDMA figures, are computed once and shared by the rules that read them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, now: datetime, max_data_age_s: float):
        self.con = con
        self.now = now
        self.max_data_age_s = max_data_age_s
        self._spans: dict[datetime | None, tuple[str, str]] = {}
        con.execute(f"CREATE TEMP TABLE running AS {RUNNING_SQL}", {"now": now})

    def verdicts(self, rule: Rule) -> list[Verdict]:
        """The rule's verdict on each running job it applies to."""
        since_start = rule.window == SINCE_START or rule.kind == UNTOUCHED_GPUS
        gpu, rdma = self._span(None if since_start else rule.window_start(self.now))
        params = {"now": self.now, "threshold": rule.threshold}
        rows = self.con.sql(figures_sql(gpu, rdma), params=params).to_arrow_table().to_pylist()
        span_h = None if since_start else rule.minutes / 60
        verdicts = []
        for job in rows:
            if not _applies(rule, job):
                continue
            evidence = _evidence(job, span_h)
            outcome = _outcome(rule, job, evidence, self.now, self.max_data_age_s)
            verdicts.append(Verdict(rule, job, outcome, evidence))
        return verdicts

    def _span(self, window_from: datetime | None) -> tuple[str, str]:
        """Temp tables of per-GPU and per-job RDMA figures from `window_from` (None: each
        job's start) to now."""
        if window_from not in self._spans:
            gpu, rdma = f"gpu_{len(self._spans)}", f"rdma_{len(self._spans)}"
            since_start = window_from is None
            params = {} if since_start else {"now": self.now, "window_from": window_from}
            self.con.execute(f"CREATE TEMP TABLE {gpu} AS {_per_gpu_sql(since_start)}", params)
            self.con.execute(f"CREATE TEMP TABLE {rdma} AS {_rdma_sql(since_start)}", params)
            self._spans[window_from] = (gpu, rdma)
        return self._spans[window_from]


def _applies(rule: Rule, job: dict[str, Any]) -> bool:
    if not job["num_gpus"]:
        return False
    return rule.kind != MULTINODE_IDLE or (job["num_nodes"] or 1) >= 2


def _evidence(job: dict[str, Any], span_h: float | None) -> dict[str, Any]:
    hours = min(span_h, job["run_s"] / 3600) if span_h is not None else job["run_s"] / 3600
    nodes = job["num_nodes"] or 1
    rdma = job["rdma_bytes"]
    return {
        "mean_util": job["mean_util"],
        "idle_share": job["idle_share"],  # of the samples (the messages' efficiency table)
        "gpus_sampled": job["gpus_sampled"] or 0,
        "idle_gpus": job["idle_gpus"] or 0,
        "gpus_never_used": job["gpus_never_used"] or 0,
        "nodes_sampled": job["nodes_sampled"] or 0,
        "idle_nodes": job["idle_nodes"] or 0,
        "rdma_bytes_per_node_hour": rdma / (nodes * hours) if rdma is not None and hours else None,
        "hours": hours,
        "newest_sample": job["newest_sample"],
    }


def _outcome(
    rule: Rule, job: dict[str, Any], ev: dict[str, Any], now: datetime, max_age_s: float
) -> str:
    if rule.exemption(job, now):
        return EXEMPT
    needed_s = rule.min_run_hours * 3600 if rule.kind == UNDER_REQUEST else rule.minutes * 60
    if job["run_s"] < needed_s:
        return OK  # too young to judge
    newest = ev["newest_sample"]
    if newest is None or (now - newest) > timedelta(seconds=max_age_s):
        return STALE
    return VIOLATING if _violates(rule, ev, job) else OK


def _violates(rule: Rule, ev: dict[str, Any], job: dict[str, Any]) -> bool:
    sampled, share = ev["gpus_sampled"], rule.idle_gpu_share
    if rule.kind == IDLE_GPUS:
        if share is None:
            return ev["idle_gpus"] == sampled
        return ev["idle_gpus"] > share * sampled
    if rule.kind == UNTOUCHED_GPUS:
        return ev["gpus_never_used"] > (share or 0.0) * sampled
    if rule.kind == MULTINODE_IDLE:
        idle_nodes = ev["idle_nodes"] > (share or 0.0) * ev["nodes_sampled"]
        rdma = ev["rdma_bytes_per_node_hour"]
        return idle_nodes or (rdma is not None and rdma < rule.min_rdma_bytes_per_node_hour)
    # UNDER_REQUEST: utilisation, or the share of the requested GPUs doing anything
    used = (sampled - ev["idle_gpus"]) / job["num_gpus"]
    return (ev["mean_util"] or 0.0) < rule.request_share or used < rule.request_share
