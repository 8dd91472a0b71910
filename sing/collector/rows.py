"""One round's warehouse rows: GPU samples stamped with their job and energy delta, RDMA samples
with deltas, each Slurm job's cgroup readings per node with their CPU and I/O deltas, health
readings that changed (sing/collector/health.py), node inventory versions, and one `scrapes` row
per target.

Stamping the job at ingest is what keeps per-job reports fast (a GROUP BY instead of a range
join of samples against allocations, see docs/warehouse.md). The job of a GPU comes from the
node's own attribution (`sing_gpu_job_info`, or dcgm-exporter's `hpc_job` label); failing that,
from the allocations the last job sync found running, keyed by (cluster, node, GPU), unless the
node's exporter reads the prolog's mapping (`sing_gpu_job_mapping_present` 1): then a GPU it
names no job for is free, since a sync's allocations outlive a job by up to a sync. A node's
RDMA traffic belongs to the job holding most of its GPUs (ties: the lowest job id, compared as
numbers). Every sample row carries its node's cluster.

One target's page cannot lose another's rows: `fit_reading` drops each value that fits no
warehouse column (an integer beyond int64, such as old dcgm-exporter's 2^64-1 sentinels, a
`gpu="70000"` label beyond int16, a float beyond float32) from that target's reading, counted by
reason for its `scrapes` row and `sing_collector_samples_dropped_total`; the rest of the page is
kept. Should rows still fail to convert, they are converted node by node (`_arrow`), dropping only
the rows of the nodes that fail, noted on those nodes' `scrapes` rows.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections import Counter
from collections.abc import Hashable
from datetime import datetime
from typing import Any

import pyarrow as pa

from sing.collector.convert import Hardware, NodeReading
from sing.collector.counters import CounterDeltas
from sing.collector.health import LastValues, health_rows
from sing.collector.inventory import Inventory, NodeKey
from sing.collector.jobhost import JobHostValues
from sing.executors.records import NodeRecord
from sing.jobids import job_order
from sing.schema import TABLES

log = logging.getLogger(__name__)

# (cluster, node, gpu index) -> job id, for GPUs whose exporter does not say who holds them.
Allocations = dict[tuple[str, str, int], str]
# Why values of a page were dropped -> how many (a GPU or port whose key fits no column: 1).
Drops = Counter[str]
# What pyarrow raises for a value that does not fit its column.
ARROW_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError)
# The largest finite float of each width: a NaN or an infinity fits no column.
FLOAT_MAX = {32: 3.4028234663852886e38, 64: sys.float_info.max}
# A numeric column's Python types, lowest and highest value.
Range = tuple[type | tuple[type, ...], float, float]
# A sample table's rows are turned into Arrow every this many: a round's first readings of
# every health series (some 150 per node) would otherwise sit as dicts, 100 MB at 1,000 nodes.
CHUNK_ROWS = 10_000
# The tables built node by node; `nodes` and `scrapes` are built whole (drops are noted on
# `scrapes` rows until the round's end).
SAMPLE_TABLES = ("gpu_samples", "rdma_samples", "job_host_samples", "health_samples")
# job_host_samples counters -> their delta columns
HOST_COUNTERS = {
    "cpu_s": "cpu_delta_s",
    "io_read_bytes": "io_read_delta_bytes",
    "io_write_bytes": "io_write_delta_bytes",
}


class RoundRows:
    """Accumulates rows of one round (scrape or pull steps); `tables()` gives one batch each."""

    def __init__(
        self,
        deltas: CounterDeltas,
        allocations: Allocations | None = None,
        inventory: Inventory | None = None,
        health: LastValues | None = None,
    ) -> None:
        self._deltas = deltas
        self._allocations = allocations or {}
        self._inventory = inventory or Inventory()
        self._health = health or LastValues()
        self._hardware: dict[NodeKey, Hardware] = {}
        # target -> values dropped from its page this round (the self-metric's counts)
        self.drops: dict[str, Drops] = {}
        # Written in this order: `scrapes` last, so a stored scrapes row means its round is.
        self._rows: dict[str, list[dict[str, Any]]] = {
            "gpu_samples": [],
            "rdma_samples": [],
            "job_host_samples": [],
            "health_samples": [],
            "nodes": [],
            "scrapes": [],
        }
        # table -> its rows already turned into Arrow, CHUNK_ROWS at a time
        self._chunks: dict[str, list[pa.Table]] = {name: [] for name in SAMPLE_TABLES}

    def add_node(self, ts: datetime, cluster: str, node: str, reading: NodeReading) -> None:
        jobs: dict[int, str] = {}
        for index, values in sorted(reading.gpus.items()):
            job = reading.jobs.get(index)
            if job is None and not reading.jobs_complete:
                job = self._allocations.get((cluster, node, index))
            if job:
                jobs[index] = job
            gpu = values.get("gpu_uuid") or index
            energy = self._deltas.delta((cluster, node, gpu, "energy"), values.get("energy_j"))
            self._rows["gpu_samples"].append(
                {"ts": ts, "cluster": cluster, "node": node, "gpu_index": index, "job_id": job}
                | values
                | {"energy_delta_j": energy}
            )
        node_job = _majority_job(jobs)
        for (device, port), counters in sorted(reading.ports.items()):
            tx, rx = counters.get("tx_bytes"), counters.get("rx_bytes")
            self._rows["rdma_samples"].append(
                {
                    "ts": ts,
                    "cluster": cluster,
                    "node": node,
                    "device": device,
                    "port": port,
                    **counters,
                    "tx_delta_bytes": self._deltas.delta((cluster, node, device, port, "tx"), tx),
                    "rx_delta_bytes": self._deltas.delta((cluster, node, device, port, "rx"), rx),
                    "job_id": node_job,
                }
            )
        self._add_host(ts, cluster, node, reading.host)
        if reading.health is not None:  # None: as last time, so no series changed
            health = health_rows(self._health, ts, cluster, node, reading.health)
            self._rows["health_samples"] += health
        hardware = reading.hardware()
        if hardware is not None:
            self._hardware[(cluster, node)] = hardware
        for name in SAMPLE_TABLES:
            if len(self._rows[name]) >= CHUNK_ROWS:
                self._chunks[name].append(self._arrow(name, self._rows[name]))
                self._rows[name] = []

    def _add_host(self, ts: datetime, cluster: str, node: str, host: JobHostValues) -> None:
        """Each job's cgroup on the node, its counters' deltas keyed by job and node (a
        requeued run's new cgroup reads as a reset); the node's jobs that are gone are
        forgotten."""
        seen: set[Hashable] = set()
        for job, values in sorted(host.items()):
            row = {"ts": ts, "cluster": cluster, "node": node, "job_id": job, **values}
            for column, delta in HOST_COUNTERS.items():
                key = (cluster, node, job, column)
                seen.add(key)
                row[delta] = self._deltas.delta(key, values.get(column), (cluster, node))
            self._rows["job_host_samples"].append(row)
        self._deltas.retain((cluster, node), seen)

    def add_inventory(self, ts: datetime, listed: dict[NodeKey, NodeRecord] | None) -> None:
        """Close a step: node versions from the hardware its nodes reported and the executor's
        node list (None: no executor inventory)."""
        self._rows["nodes"] += self._inventory.versions(ts, self._hardware, listed)
        self._hardware = {}

    def add_scrape(
        self,
        ts: datetime,
        target: str,
        node: str,
        duration_s: float | None,
        samples: int,
        error: str | None,
        dropped: Drops | None = None,
    ) -> None:
        """A target's scrape, with the values `fit_reading` dropped from its page."""
        self._rows["scrapes"].append(
            {
                "ts": ts,
                "target": target,
                "node": node,
                "up": error is None,
                "duration_s": duration_s,
                "samples": samples,
                "error": error,
                "dropped": 0 if error is None else None,
            }
        )
        if dropped:
            self._note_drops(self._rows["scrapes"][-1], dropped)

    def _note_drops(self, scrape: dict[str, Any], dropped: Drops) -> None:
        drops = self.drops.setdefault(scrape["target"], Counter())
        drops.update(dropped)
        scrape["dropped"] = drops.total()
        scrape["dropped_reasons"] = ", ".join(f"{k}={n}" for k, n in sorted(drops.items()))

    def tables(self) -> dict[str, pa.Table]:
        """The non-empty batches, typed exactly as sing/schema.py says."""
        out = {}
        for name, rows in self._rows.items():
            chunks = [*self._chunks.get(name, ()), *([self._arrow(name, rows)] if rows else ())]
            if chunks:
                out[name] = chunks[0] if len(chunks) == 1 else pa.concat_tables(chunks)
        return out

    def _arrow(self, name: str, rows: list[dict[str, Any]]) -> pa.Table:
        """Rows as a table; rows that do not convert are converted node by node, without the
        nodes whose rows do not."""
        schema = TABLES[name].schema
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except ARROW_ERRORS:
            return self._without_bad_nodes(name, rows, schema)

    def _without_bad_nodes(
        self, name: str, rows: list[dict[str, Any]], schema: pa.Schema
    ) -> pa.Table:
        by_node: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_node.setdefault(row["node"], []).append(row)
        kept = []
        for node, node_rows in by_node.items():
            try:
                kept.append(pa.Table.from_pylist(node_rows, schema=schema))
            except ARROW_ERRORS as err:
                log.error("%s rows of node %s dropped, they fit no column: %s", name, node, err)
                reason = Counter({f"unconvertible_{name}": len(node_rows)})
                for scrape in self._rows["scrapes"] if name != "scrapes" else ():
                    if scrape["node"] == node:
                        self._note_drops(scrape, reason)
        return pa.concat_tables(kept) if kept else schema.empty_table()


def fit_reading(reading: NodeReading) -> Drops:
    """Drop from one target's reading each value that fits no warehouse column; the counts by
    reason. A GPU or port whose index fits no column goes whole (its rows have no key)."""
    drops: Drops = Counter()
    gpu_ranges = _ranges("gpu_samples")
    for index in sorted(reading.gpus.keys() | reading.jobs.keys() | reading.models.keys()):
        if not _fits(gpu_ranges["gpu_index"], index):
            drops["gpu_index_out_of_range"] += 1
            for values in (reading.gpus, reading.jobs, reading.models):
                values.pop(index, None)
    for values in reading.gpus.values():
        _drop_unfit(values, gpu_ranges, drops)
    rdma_ranges = _ranges("rdma_samples")
    for device, port in list(reading.ports):
        if not _fits(rdma_ranges["port"], port):
            drops["port_out_of_range"] += 1
            del reading.ports[(device, port)]
    for counters in reading.ports.values():
        _drop_unfit(counters, rdma_ranges, drops)
    host_ranges = _ranges("job_host_samples")
    for values in reading.host.values():
        _drop_unfit(values, host_ranges, drops)
    return drops


def _drop_unfit(values: dict[str, Any], ranges: dict[str, Range], drops: Drops) -> None:
    unfit = [c for c, v in values.items() if c in ranges and not _fits(ranges[c], v)]
    for column in unfit:
        del values[column]
        drops[f"{column}_out_of_range"] += 1


@functools.cache
def _ranges(name: str) -> dict[str, Range]:
    """The numeric columns of a table, each with the Python types and range it stores."""
    ranges: dict[str, Range] = {}
    for f in TABLES[name].schema:
        if pa.types.is_integer(f.type):
            bits = f.type.bit_width
            if pa.types.is_unsigned_integer(f.type):
                ranges[f.name] = (int, 0, (1 << bits) - 1)
            else:
                ranges[f.name] = (int, -(1 << bits - 1), (1 << bits - 1) - 1)
        elif pa.types.is_floating(f.type):
            high = FLOAT_MAX[f.type.bit_width]
            ranges[f.name] = ((int, float), -high, high)
    return ranges


def _fits(column: Range, value: Any) -> bool:
    """Whether `value` is stored as itself in the column (None always is; NaN and the
    infinities never are: they lie outside every finite range)."""
    types, low, high = column
    return value is None or (isinstance(value, types) and low <= value <= high)


def _majority_job(jobs: dict[int, str]) -> str | None:
    if not jobs:
        return None
    counts = Counter(jobs.values())
    return min(counts, key=lambda job: (-counts[job], job_order(job)))
