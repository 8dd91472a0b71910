"""A small scripted cluster for the policy tests: jobs and GPU samples written through
`Warehouse.append`, the policy settings as a site would write them, and a postman that keeps
what it was asked to deliver (no channel is under test here; test_policy_mail tests them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from sing.collector.convert import NodeReading
from sing.collector.counters import CounterDeltas
from sing.collector.rows import RoundRows
from sing.executors.local import LocalExecutor
from sing.policy.engine import Engine
from sing.policy.messages import Delivery, Message
from sing.policy.settings import PolicySettings
from sing.warehouse.store import Warehouse

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SAMPLE_S = 60


@dataclass
class RecordingPostman:
    """Delivers every message to one pretend mailbox and remembers it."""

    sent: list[Message] = field(default_factory=list)

    def send(self, message: Message) -> list[Delivery]:
        self.sent.append(message)
        return [Delivery("email", f"{message.user}@example.edu", True)]


def add_job(wh: Warehouse, job_id: str, start: datetime, **fields: Any) -> dict[str, Any]:
    """A running job record (end_time NULL unless given)."""
    row = {
        "job_id": job_id,
        "cluster": "campus",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "name": "train",
        "state": "RUNNING",
        "submit_time": start - timedelta(minutes=1),
        "start_time": start,
        "num_nodes": 1,
        "num_gpus": 2,
        "nodes": ["n1"],
        "interactive": False,
        **fields,
    }
    wh.append("jobs", pa.Table.from_pylist([row]))
    return row


def add_samples(
    wh: Warehouse,
    job_id: str,
    start: datetime,
    end: datetime,
    util: dict[tuple[str, int], float],
    cluster: str = "campus",
    rdma_bytes_per_sample: int | None = None,
) -> None:
    """One sample per GPU (node, index) every SAMPLE_S seconds in [start, end]."""
    rows, rdma = [], []
    ts = start
    while ts <= end:
        for (node, index), value in util.items():
            rows.append(
                {
                    "ts": ts,
                    "node": node,
                    "gpu_index": index,
                    "util": value,
                    "job_id": job_id,
                    "cluster": cluster,
                }
            )
        if rdma_bytes_per_sample is not None:
            for node in {n for n, _ in util}:
                rdma.append(
                    {
                        "ts": ts,
                        "node": node,
                        "device": "mlx5_0",
                        "port": 1,
                        "tx_delta_bytes": rdma_bytes_per_sample,
                        "rx_delta_bytes": 0,
                        "job_id": job_id,
                        "cluster": cluster,
                    }
                )
        ts += timedelta(seconds=SAMPLE_S)
    wh.append("gpu_samples", pa.Table.from_pylist(rows))
    if rdma:
        wh.append("rdma_samples", pa.Table.from_pylist(rdma))


def collect(wh: Warehouse, readings: list[tuple[datetime, str, NodeReading]]) -> None:
    """Nodes' readings (time, node, reading) through the collector's own rows, counter deltas
    as the collector computes them, into the sample tables."""
    deltas = CounterDeltas()
    parts: dict[str, list[pa.Table]] = {}
    for ts, node, reading in sorted(readings, key=lambda r: (r[0], r[1])):
        rows = RoundRows(deltas)
        rows.add_node(ts, "campus", node, reading)
        for name, batch in rows.tables().items():
            parts.setdefault(name, []).append(batch)
    for name in ("gpu_samples", "rdma_samples", "job_host_samples"):
        if name in parts:
            wh.append(name, pa.concat_tables(parts[name]))


def cgroup_readings(
    job_id: str,
    node: str,
    start: datetime,
    end: datetime,
    busy: list[tuple[datetime, float]],
    **values: int | None,
) -> list[tuple[datetime, str, NodeReading]]:
    """The job's cgroup on `node` every SAMPLE_S s in [start, end]: CPU seconds from zero at
    `start`, `busy` cores in use from each (time, cores) on; `values` (cpuset_cpus,
    mem_used_bytes, mem_peak_bytes, mem_limit_bytes) as read, None ones left out."""
    readings, cpu_s, ts = [], 0.0, start
    while ts <= end:
        if ts > start:
            cpu_s += SAMPLE_S * [cores for since, cores in busy if since < ts][-1]
        host = {"cpu_s": cpu_s} | {k: v for k, v in values.items() if v is not None}
        readings.append((ts, node, NodeReading(host={job_id: host})))
        ts += timedelta(seconds=SAMPLE_S)
    return readings


def settings(rules: dict[str, dict[str, Any]], **fields: Any) -> PolicySettings:
    return PolicySettings(rules=rules, **fields)


def engine(
    wh: Warehouse, policy: PolicySettings, executor: LocalExecutor, postman: RecordingPostman
) -> Engine:
    return Engine(policy, wh, executor, postman, "pytest@test", sample_interval_s=SAMPLE_S)
