"""From exporter metric names to warehouse columns, in SI units.

Three exporters are understood, so a site that already runs one needs no new agent:
- sing's own (`sing exporter`, docs/exporter.md), already SI;
- NVIDIA dcgm-exporter (percent, MiB, millijoules; the job in an `hpc_job` label), under the
  names of every DCGM version (sing/collector/dcgm_fields.py);
- node_exporter's InfiniBand collector (bytes already, `device`/`port` labels), its 32-bit and
  `legacy_*` 64-bit copies of a counter resolved by sing/infiniband.py's rule, as sing's
  exporter resolves the sysfs files themselves;
- cgroup_exporter's per-job series, as sing's exporter also serves them (sing/collector/jobhost.py).
A node's samples become one `NodeReading`: per GPU index its columns, job and model, per RDMA port
its counters (None where the exporter says a counter is unknown), its health readings
(sing/collector/health.py) and per Slurm job its CPU, memory and I/O there. Everything else in a
payload is ignored.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sing.collector.dcgm_fields import names as dcgm_names
from sing.collector.health import HEALTH_METRICS, HealthValues, add_health
from sing.collector.jobhost import HOST_WANTED, HostSeries, JobHostValues
from sing.collector.promtext import ParseError, Sample
from sing.infiniband import TRAFFIC, TrafficCounter, traffic_value
from sing.jobids import lowest_job
from sing.signals import GPU_SIGNALS

# name -> (gpu_samples column, factor to SI). Columns starting with "_" are helpers.
GPU_METRICS: dict[str, tuple[str, float]] = {
    "sing_gpu_utilization_ratio": ("util", 1.0),
    "sing_gpu_sm_active_ratio": ("sm_active", 1.0),
    "sing_gpu_memory_used_bytes": ("mem_used_bytes", 1.0),
    "sing_gpu_memory_total_bytes": ("mem_total_bytes", 1.0),
    "sing_gpu_power_watts": ("power_w", 1.0),
    "sing_gpu_energy_joules_total": ("energy_j", 1.0),
    "sing_gpu_temperature_celsius": ("temp_c", 1.0),
    # the registered signals (sing/signals.py), already SI
    **{s.metric: (s.key, 1.0) for s in GPU_SIGNALS},
    # dcgm-exporter's, under every name DCGM 3.x to 4.6 gives them (sing/collector/dcgm_fields.py)
    **{name: (f.target, f.factor) for name, f in dcgm_names("column").items()},
}

# A GPU in MIG mode: dcgm-exporter sends every field once per instance (label GPU_I_ID). These
# are the whole card's (each instance repeats them), so they make the physical GPU's row; the
# others (utilisation, SM activity, memory) are one instance's share and are left out.
MIG_DEVICE_COLUMNS = frozenset({"power_w", "energy_j", "temp_c"})

# name -> rdma_samples column, for sing's exporter (it applied the InfiniBand rule already).
RDMA_METRICS: dict[str, str] = {
    "sing_rdma_transmit_bytes_total": "tx_bytes",
    "sing_rdma_receive_bytes_total": "rx_bytes",
    "sing_rdma_transmit_packets_total": "tx_packets",
    "sing_rdma_receive_packets_total": "rx_packets",
}
# node_exporter's name -> (counter, True for its counters_ext/ `legacy_*` copy).
NODE_EXPORTER_RDMA: dict[str, tuple[TrafficCounter, bool]] = {
    **{c.node_exporter: (c, False) for c in TRAFFIC},
    **{c.node_exporter_legacy: (c, True) for c in TRAFFIC},
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
SATURATED_COUNTERS: dict[str, str] = {c.counter: c.column for c in TRAFFIC}

WANTED = (
    frozenset(GPU_METRICS)
    | frozenset(RDMA_METRICS)
    | frozenset(NODE_EXPORTER_RDMA)
    | HEALTH_METRICS
    | HOST_WANTED
    | {
        JOB_INFO,
        JOB_MAPPING,
        GPU_INFO,
        RDMA_SATURATED,
    }
)
# What a page is read for when its health lines are as on the target's last page.
WANTED_BESIDE_HEALTH = WANTED - HEALTH_METRICS

INTEGER_COLUMNS = {"mem_used_bytes", "mem_total_bytes"} | {
    s.key for s in GPU_SIGNALS if s.arrow_type.startswith(("int", "uint"))
}


@dataclass
class NodeReading:
    """What one node's payload says, keyed like the warehouse rows."""

    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[int, str] = field(default_factory=dict)  # GPU index -> job id
    models: dict[int, str] = field(default_factory=dict)  # GPU index -> model name
    ports: dict[tuple[str, int], dict[str, int | None]] = field(default_factory=dict)
    jobs_complete: bool = False  # `jobs` is the node's whole attribution (JOB_MAPPING)
    # None: as on the target's last page, not read again (sing/collector/scrape.py `read_page`);
    # only a node read from one target has it, and `merge` refuses it.
    health: HealthValues | None = field(default_factory=dict)
    host: JobHostValues = field(default_factory=dict)  # job id -> its job_host_samples columns

    def merge(self, other: NodeReading) -> None:
        """Add another exporter's reading of the same node (e.g. dcgm- plus node_exporter).
        Both must have read their health lines: one page's skipped lines would read as none."""
        if self.health is None or other.health is None:
            raise ValueError("a reading whose health lines were not read cannot be merged")
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
        for job, values in other.host.items():
            self.host.setdefault(job, {}).update(values)

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
    # (port, counter) -> [counters/ value, counters_ext/ value] from node_exporter
    copies: dict[tuple[tuple[str, int], TrafficCounter], list[int | None]] = {}
    host = HostSeries()
    for s in samples:
        # The name sets are disjoint; health series, the most numerous, are tried first.
        if s.name in HEALTH_METRICS:
            add_health(reading.health, s)
        elif s.name in GPU_METRICS:
            _add_gpu_value(reading, s)
        elif s.name in RDMA_METRICS:
            if math.isfinite(s.value):
                reading.ports.setdefault(_port(s), {})[RDMA_METRICS[s.name]] = int(s.value)
        elif s.name in NODE_EXPORTER_RDMA:
            counter, legacy = NODE_EXPORTER_RDMA[s.name]
            if math.isfinite(s.value):
                copies.setdefault((_port(s), counter), [None, None])[legacy] = int(s.value)
        elif s.name in HOST_WANTED:
            host.add(s)
        elif s.name == JOB_MAPPING:
            reading.jobs_complete = s.value == 1
        elif s.name == RDMA_SATURATED and s.value == 1:
            column = SATURATED_COUNTERS.get(_label(s, "counter"))
            if column:
                unknown.append((_port(s), column))
        elif s.name == JOB_INFO and s.value == 1 and s.labels.get("job_id"):
            _stamp_job(reading, _int_label(s, "gpu"), s.labels["job_id"])
        elif s.name == GPU_INFO and s.labels.get("name"):
            reading.models[_int_label(s, "gpu")] = s.labels["name"]
    for (key, counter), (plain, extended) in copies.items():
        reading.ports.setdefault(key, {})[counter.column] = traffic_value(counter, plain, extended)
    for key, column in unknown:  # unknown wins over any value of the same counter
        reading.ports.setdefault(key, {})[column] = None
    for row in reading.gpus.values():
        _finish_memory(row)
    reading.host = host.values()
    return reading


def _add_gpu_value(reading: NodeReading, s: Sample) -> None:
    column, factor = GPU_METRICS[s.name]
    if s.labels.get("GPU_I_ID") and column not in MIG_DEVICE_COLUMNS:
        return  # one MIG instance's share: rows are per physical GPU, and shares are not summed
    index = _int_label(s, "gpu")
    row = reading.gpus.setdefault(index, {})
    uuid = s.labels.get("uuid") or s.labels.get("UUID")
    if uuid:
        row["gpu_uuid"] = uuid
    if s.labels.get("hpc_job"):  # a shared GPU has one series per job
        _stamp_job(reading, index, s.labels["hpc_job"])
    if s.labels.get("modelName"):  # dcgm-exporter
        reading.models.setdefault(index, s.labels["modelName"])
    if not math.isfinite(s.value):
        return
    value = s.value * factor
    row[column] = int(value) if column in INTEGER_COLUMNS or column.startswith("_") else value


def _stamp_job(reading: NodeReading, index: int, job: str) -> None:
    """A GPU shared by several jobs is stamped with the lowest id (compared as numbers), in
    whatever order the exporter lists them."""
    reading.jobs[index] = lowest_job({job, reading.jobs.get(index, job)})


def _finish_memory(row: dict[str, Any]) -> None:
    """dcgm-exporter reports used and free (and reserved) MiB, not the card's size."""
    free = row.pop("_mem_free_bytes", None)
    reserved = row.pop("_mem_reserved_bytes", 0)
    if "mem_total_bytes" not in row and free is not None and "mem_used_bytes" in row:
        row["mem_total_bytes"] = row["mem_used_bytes"] + free + reserved


def _port(s: Sample) -> tuple[str, int]:
    return _label(s, "device"), _int_label(s, "port")


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
