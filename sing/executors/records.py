"""The job record every executor produces, and its mapping onto the warehouse tables.

One shape for Slurm and local jobs, so `sing jobs sync` and the collector never care where a job
ran. The fields are the `jobs` table's columns plus the per-node GPU indices that become
`job_gpus` rows. Times are UTC-aware datetimes.

Exit codes: the process's own code, or 128 + signal for a job ended by a signal (the shell's
convention), so "cancelled by SIGTERM" reads as 143 everywhere.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from sing.schema import table

# Slurm's job state names are the vocabulary; the local executor uses the same words.
RUNNING = "RUNNING"
PENDING = "PENDING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
ACTIVE_STATES = frozenset({PENDING, RUNNING, "CONFIGURING", "COMPLETING", "SUSPENDED"})


@dataclasses.dataclass(frozen=True)
class JobRecord:
    job_id: str
    cluster: str
    state: str
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    name: str | None = None
    qos: str | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    num_gpus: int = 0
    # GPU indices per node, where known (Slurm accounts only counts once a job has ended).
    gpus: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    time_limit_s: int | None = None
    interactive: bool | None = None
    # The profile's declared software, e.g. {"python": "3.11", "torch": "2.3.0"}.
    dependencies: dict[str, str | None] | None = None
    # The scheduler's base state where `state` says more (CANCELLED for a job still COMPLETING:
    # it holds its GPUs until its epilog ends); not a warehouse column.
    base_state: str | None = None
    # Slurm 26.05+: the current run's SLUID; a requeued job keeps its id and gets a new one.
    sluid: str | None = None
    # Slurm's accounting, SI units, None where unknown (the `jobs` columns of the same names).
    alloc_cpus: int | None = None
    req_mem_bytes: int | None = None  # the job's total, however it was asked (per node, per CPU)
    slurm_cpu_s: float | None = None  # ended jobs: user + system CPU time of all steps
    slurm_max_rss_bytes: int | None = None  # ended jobs: seff's "Memory Utilized"

    @property
    def gpus_per_node(self) -> int | None:
        return self.num_gpus // len(self.nodes) if self.nodes else None

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE_STATES

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the local executor's state files)."""
        out = dataclasses.asdict(self)
        for key in ("submit_time", "start_time", "end_time"):
            out[key] = out[key].isoformat() if out[key] else None
        out["gpus"] = {node: list(idx) for node, idx in self.gpus.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        values = dict(data)
        for key in ("submit_time", "start_time", "end_time"):
            values[key] = datetime.fromisoformat(values[key]) if values.get(key) else None
        values["nodes"] = tuple(values.get("nodes") or ())
        values["gpus"] = {node: tuple(idx) for node, idx in (values.get("gpus") or {}).items()}
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class JobUsage:
    """A running job's CPU time and memory so far, from the scheduler's own accounting (Slurm:
    `sstat`), asked for one job at a time; None where it has no figure."""

    cpu_s: float | None
    # The largest over running steps of what is known of their tasks' summed RSS peaks: equal
    # to seff's figure for a step of one task, a lower bound for a step of several.
    max_rss_bytes: int | None


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """A node as the executor knows it, for the collector's node inventory (`nodes`)."""

    node: str
    gpus: int
    gpu_model: str | None = None  # the scheduler's GPU type, e.g. "a100" from gpu:a100:8
    partition: str | None = None  # several partitions are listed comma-separated, sorted


def exit_code_from(code: int, signal: int) -> int:
    """One number for 'exited with code' and 'killed by signal' (128 + signal)."""
    return 128 + signal if signal else code


def utc(epoch_s: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch_s, UTC) if epoch_s is not None else None


def to_tables(records: list[JobRecord], recorded_at: datetime) -> tuple[pa.Table, pa.Table]:
    """Arrow tables for the warehouse's `jobs` and `job_gpus` tables (one row per job / GPU)."""
    jobs = [
        {
            "job_id": r.job_id,
            "cluster": r.cluster,
            "user": r.user,
            "account": r.account,
            "partition": r.partition,
            "name": r.name,
            "qos": r.qos,
            "submit_time": r.submit_time,
            "start_time": r.start_time,
            "end_time": r.end_time,
            "state": r.state,
            "exit_code": r.exit_code,
            "num_nodes": len(r.nodes) if r.nodes else None,
            "gpus_per_node": r.gpus_per_node,
            "num_gpus": r.num_gpus,
            "time_limit_s": r.time_limit_s,
            "nodes": list(r.nodes),
            "interactive": r.interactive,
            "dependencies": json.dumps(r.dependencies, sort_keys=True)
            if r.dependencies is not None
            else None,
            "sluid": r.sluid,
            "alloc_cpus": r.alloc_cpus,
            "req_mem_bytes": r.req_mem_bytes,
            "slurm_cpu_s": r.slurm_cpu_s,
            "slurm_max_rss_bytes": r.slurm_max_rss_bytes,
            "recorded_at": recorded_at,
        }
        for r in records
    ]
    gpus = [
        {
            "job_id": r.job_id,
            "cluster": r.cluster,
            "node": node,
            "gpu_index": index,
            "start_time": r.start_time,
            "end_time": r.end_time,
            "recorded_at": recorded_at,
        }
        for r in records
        for node, indices in r.gpus.items()
        for index in indices
    ]
    return (
        pa.Table.from_pylist(jobs, schema=table("jobs").schema),
        pa.Table.from_pylist(gpus, schema=table("job_gpus").schema),
    )


def runs_table(records: list[JobRecord], recorded_at: datetime) -> pa.Table:
    """An Arrow table for `job_runs`: one row per record of a run that started (a job cancelled
    while pending had no run)."""
    runs = [
        {
            "job_id": r.job_id,
            "cluster": r.cluster,
            "start_time": r.start_time,
            "sluid": r.sluid,
            "submit_time": r.submit_time,
            "end_time": r.end_time,
            "state": r.state,
            "exit_code": r.exit_code,
            "nodes": list(r.nodes),
            "num_gpus": r.num_gpus,
            "recorded_at": recorded_at,
        }
        for r in records
        if r.start_time is not None
    ]
    return pa.Table.from_pylist(runs, schema=table("job_runs").schema)
