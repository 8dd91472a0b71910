"""One round's warehouse rows: GPU samples stamped with their job and energy delta, RDMA samples
with deltas, health readings that changed (collector/health.py), node inventory versions, and one
`scrapes` row per target.

Stamping the job at ingest is what keeps per-job reports fast (a GROUP BY instead of a range
join of samples against allocations, see docs/warehouse.md). The job of a GPU comes from the
node's own attribution (`sing_gpu_job_info`, or dcgm-exporter's `hpc_job` label); failing that,
from the allocations the last job sync found running, keyed by (cluster, node, GPU), unless the
node's exporter reads the prolog's mapping (`sing_gpu_job_mapping_present` 1): then a GPU it
names no job for is free, since a sync's allocations outlive a job by up to a sync. A node's
RDMA traffic belongs to the job holding most of its GPUs (ties: the lowest job id, compared as
numbers). Every sample row carries its node's cluster.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

import pyarrow as pa

from collector.convert import Hardware, NodeReading
from collector.counters import CounterDeltas
from collector.health import LastValues, health_rows
from collector.inventory import Inventory, NodeKey
from collector.jobids import job_order
from executors.records import NodeRecord
from warehouse.schema import TABLES

# (cluster, node, gpu index) -> job id, for GPUs whose exporter does not say who holds them.
Allocations = dict[tuple[str, str, int], str]


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
        # Written in this order: `scrapes` last, so a stored scrapes row means its round is.
        self._rows: dict[str, list[dict[str, Any]]] = {
            "gpu_samples": [],
            "rdma_samples": [],
            "health_samples": [],
            "nodes": [],
            "scrapes": [],
        }

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
        self._rows["health_samples"] += health_rows(self._health, ts, cluster, node, reading.health)
        hardware = reading.hardware()
        if hardware is not None:
            self._hardware[(cluster, node)] = hardware

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
    ) -> None:
        self._rows["scrapes"].append(
            {
                "ts": ts,
                "target": target,
                "node": node,
                "up": error is None,
                "duration_s": duration_s,
                "samples": samples,
                "error": error,
            }
        )

    def tables(self) -> dict[str, pa.Table]:
        """The non-empty batches, typed exactly as warehouse/schema.py says."""
        return {
            name: pa.Table.from_pylist(rows, schema=TABLES[name].schema)
            for name, rows in self._rows.items()
            if rows
        }


def _majority_job(jobs: dict[int, str]) -> str | None:
    if not jobs:
        return None
    counts = Counter(jobs.values())
    return min(counts, key=lambda job: (-counts[job], job_order(job)))
