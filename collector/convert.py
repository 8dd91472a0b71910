"""From exporter metric names to warehouse columns, in SI units.

Three exporters are understood, so a site that already runs one needs no new agent:
- sing's own (`sing exporter`, docs/exporter.md), already SI;
- NVIDIA dcgm-exporter (percent, MiB, millijoules; the job in an `hpc_job` label);
- node_exporter's InfiniBand collector (bytes already, `device`/`port` labels).
A node's samples become one `NodeReading`: per GPU index its columns, job and model, per RDMA port
its counters (None where the exporter says a counter is unknown), and its health readings
(collector/health.py). Everything else in a payload is ignored.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from collector.health import HEALTH_METRICS, HealthValues, add_health
from collector.jobids import lowest_job
from collector.promtext import ParseError, Sample

MIB = 1024 * 1024

# name -> (gpu_samples column, factor to SI). Columns starting with "_" are helpers.
GPU_METRICS: dict[str, tuple[str, float]] = {
    "sing_gpu_utilization_ratio": ("util", 1.0),
    "sing_gpu_sm_active_ratio": ("sm_active", 1.0),
    "sing_gpu_memory_used_bytes": ("mem_used_bytes", 1.0),
    "sing_gpu_memory_total_bytes": ("mem_total_bytes", 1.0),
    "sing_gpu_power_watts": ("power_w", 1.0),
    "sing_gpu_energy_joules_total": ("energy_j", 1.0),
    "sing_gpu_temperature_celsius": ("temp_c", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("util", 0.01),  # percent
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("_mem_free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("_mem_reserved_bytes", MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),  # millijoules
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
}

# name -> rdma_samples column (all counters, all already in bytes or packets).
RDMA_METRICS: dict[str, str] = {
    "sing_rdma_transmit_bytes_total": "tx_bytes",
    "sing_rdma_receive_bytes_total": "rx_bytes",
    "sing_rdma_transmit_packets_total": "tx_packets",
    "sing_rdma_receive_packets_total": "rx_packets",
    "node_infiniband_port_data_transmitted_bytes_total": "tx_bytes",
    "node_infiniband_port_data_received_bytes_total": "rx_bytes",
    "node_infiniband_port_packets_transmitted_total": "tx_packets",
    "node_infiniband_port_packets_received_total": "rx_packets",
}

# An info series `{gpu, uuid, job_id, user} 1`: the job holding the GPU (docs/exporter.md).
JOB_INFO = "sing_gpu_job_info"
# 1 when the node's exporter reads the prolog's GPU-to-job mapping: its JOB_INFO series are then
# the whole truth, and a GPU without one is free (not to be filled in from a job sync's allocations,
# which lag a job's end by up to a sync interval).
JOB_MAPPING = "sing_gpu_job_mapping_present"
# An info series `{gpu, uuid, name, ...} 1`: the GPU's model, for the node inventory.
GPU_INFO = "sing_gpu_info"
# `{device, port, counter} 1`: the exporter does not know this counter (a 32-bit InfiniBand
# counter stuck at its maximum), so it exports this instead of the counter's series.
RDMA_SATURATED = "sing_rdma_counter_saturated"
# The `counter` label of RDMA_SATURATED (the sysfs file name) -> rdma_samples column.
SATURATED_COUNTERS: dict[str, str] = {
    "port_xmit_data": "tx_bytes",
    "port_rcv_data": "rx_bytes",
    "port_xmit_packets": "tx_packets",
    "port_rcv_packets": "rx_packets",
}

WANTED = (
    frozenset(GPU_METRICS)
    | frozenset(RDMA_METRICS)
    | HEALTH_METRICS
    | {
        JOB_INFO,
        JOB_MAPPING,
        GPU_INFO,
        RDMA_SATURATED,
    }
)

INTEGER_COLUMNS = {"mem_used_bytes", "mem_total_bytes"}


@dataclass
class NodeReading:
    """What one node's payload says, keyed like the warehouse rows."""

    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[int, str] = field(default_factory=dict)  # GPU index -> job id
    models: dict[int, str] = field(default_factory=dict)  # GPU index -> model name
    ports: dict[tuple[str, int], dict[str, int | None]] = field(default_factory=dict)
    jobs_complete: bool = False  # `jobs` is the node's whole attribution (JOB_MAPPING)
    health: HealthValues = field(default_factory=dict)

    def merge(self, other: NodeReading) -> None:
        """Add another exporter's reading of the same node (e.g. dcgm- plus node_exporter)."""
        for index, values in other.gpus.items():
            self.gpus.setdefault(index, {}).update(values)
        for index, job in other.jobs.items():
            self.jobs.setdefault(index, job)
        self.jobs_complete = self.jobs_complete or other.jobs_complete
        for index, model in other.models.items():
            self.models.setdefault(index, model)
        for key, counters in other.ports.items():
            self.ports.setdefault(key, {}).update(counters)
        self.health.update(other.health)

    def hardware(self) -> Hardware | None:
        """What the payload says about the node's GPUs; None when it has no GPU series at all
        (a node_exporter payload says nothing about GPUs, not that there are none)."""
        indices = self.gpus.keys() | self.models.keys()
        if not indices:
            return None
        models = Counter(self.models.values())
        model = min(models, key=lambda m: (-models[m], m)) if models else None
        memory = [g["mem_total_bytes"] for g in self.gpus.values() if "mem_total_bytes" in g]
        return Hardware(len(indices), model, max(memory) if memory else None)


@dataclass(frozen=True)
class Hardware:
    """A node's GPUs as its exporter reports them: count, most common model, largest memory."""

    gpus: int
    model: str | None
    memory_bytes: int | None


def read_node(samples: Iterable[Sample]) -> NodeReading:
    """Fold one node's samples into a NodeReading; a wanted metric without its key labels
    raises ParseError (the payload is not what its metric names promise)."""
    reading = NodeReading()
    unknown: list[tuple[tuple[str, int], str]] = []
    for s in samples:
        if s.name in GPU_METRICS:
            _add_gpu_value(reading, s)
        elif s.name in RDMA_METRICS:
            key = (_label(s, "device"), _int_label(s, "port"))
            if math.isfinite(s.value):
                reading.ports.setdefault(key, {})[RDMA_METRICS[s.name]] = int(s.value)
        elif s.name in HEALTH_METRICS:
            add_health(reading.health, s)
        elif s.name == JOB_MAPPING:
            reading.jobs_complete = s.value == 1
        elif s.name == RDMA_SATURATED and s.value == 1:
            column = SATURATED_COUNTERS.get(_label(s, "counter"))
            if column:
                unknown.append(((_label(s, "device"), _int_label(s, "port")), column))
        elif s.name == JOB_INFO and s.value == 1 and s.labels.get("job_id"):
            index = _int_label(s, "gpu")
            # A GPU shared by several jobs is stamped with the lowest id, compared as numbers.
            job = s.labels["job_id"]
            reading.jobs[index] = lowest_job({job, reading.jobs.get(index, job)})
        elif s.name == GPU_INFO and s.labels.get("name"):
            reading.models[_int_label(s, "gpu")] = s.labels["name"]
    for key, column in unknown:  # unknown wins over any value of the same counter
        reading.ports.setdefault(key, {})[column] = None
    for row in reading.gpus.values():
        _finish_memory(row)
    return reading


def _add_gpu_value(reading: NodeReading, s: Sample) -> None:
    if s.labels.get("GPU_I_ID"):
        return  # a MIG instance of dcgm-exporter; rows are per physical GPU
    index = _int_label(s, "gpu")
    row = reading.gpus.setdefault(index, {})
    uuid = s.labels.get("uuid") or s.labels.get("UUID")
    if uuid:
        row["gpu_uuid"] = uuid
    if s.labels.get("hpc_job"):
        reading.jobs.setdefault(index, s.labels["hpc_job"])
    if s.labels.get("modelName"):  # dcgm-exporter
        reading.models.setdefault(index, s.labels["modelName"])
    column, factor = GPU_METRICS[s.name]
    if not math.isfinite(s.value):
        return
    value = s.value * factor
    row[column] = int(value) if column in INTEGER_COLUMNS or column.startswith("_") else value


def _finish_memory(row: dict[str, Any]) -> None:
    """dcgm-exporter reports used and free (and reserved) MiB, not the card's size."""
    free = row.pop("_mem_free_bytes", None)
    reserved = row.pop("_mem_reserved_bytes", 0)
    if "mem_total_bytes" not in row and free is not None and "mem_used_bytes" in row:
        row["mem_total_bytes"] = row["mem_used_bytes"] + free + reserved


def _int_label(s: Sample, name: str) -> int:
    text = _label(s, name)
    try:
        return int(text)
    except ValueError:
        raise ParseError(f"{s.name}: {name} label {text!r} is not a number") from None


def _label(s: Sample, name: str) -> str:
    try:
        return s.labels[name]
    except KeyError:
        raise ParseError(f"{s.name} has no {name!r} label") from None
