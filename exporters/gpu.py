"""GPU metrics from NVML: read each GPU into plain values, then turn those into metric families.

Reading and rendering are split so that one reading serves both the `/metrics` page and a
`--record` frame, and so that the fake backend (exporters/fake_nvml.py) exercises exactly the
same unit conversions as a real GPU: this module is the only place that knows NVML's units.

`nvml` is anything with pynvml's function names: the `pynvml` module itself or a `FakeNvml`.
Every call may fail; a failed reading is left out for that GPU and counted, never raised.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pynvml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporters.errors import ErrorCounter, nvml_error_kind

log = logging.getLogger(__name__)

# Which member of NVML's value union holds a value of each NVML_VALUE_TYPE_*.
_UNION_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# GPM metrics (Hopper and newer; they do not lock out profilers as DCGM's profiling fields do).
GPM_METRICS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
}

# Field-value counters: (field id, value key, multiplier to bytes).
FIELD_COUNTERS = (
    (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_tx_bytes", 1),
    (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, "pcie_rx_bytes", 1),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "nvlink_tx_bytes", 1024),  # KiB
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "nvlink_rx_bytes", 1024),
)

MAX_EVENTS_PER_READ = 1000  # bounds the work one scrape does after an XID storm


def union_value(value: Any, value_type: int) -> float:
    """The number in an NVML value union, read through the member its type names."""
    return getattr(value, _UNION_MEMBER[value_type])


@dataclasses.dataclass
class GpuReading:
    """One GPU's state at one moment, in SI units, keyed by the names the fake also uses."""

    index: int
    uuid: str
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # reading -> error kind


@dataclasses.dataclass
class NodeReading:
    driver_version: str | None
    gpus: list[GpuReading]


@dataclasses.dataclass
class _Device:
    """What the source keeps per GPU between scrapes to report intervals rather than instants."""

    index: int
    handle: Any
    last_sample_us: int = 0
    gpm_samples: list[Any] | None = None  # two samples, alternating previous/current
    event_set: Any = None
    xid_counts: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)


class GpuSource:
    """Reads every GPU on the node through one NVML initialised once per process."""

    def __init__(self, nvml: Any, errors: ErrorCounter) -> None:
        self.nvml = nvml
        self.errors = errors
        self._devices: list[_Device] | None = None

    def read(self) -> NodeReading:
        if self._devices is None and not self._start():
            return NodeReading(None, [])
        driver = self._try("driver", self.nvml.nvmlSystemGetDriverVersion)
        gpus = [reading for d in self._devices or [] if (reading := self._read_device(d))]
        return NodeReading(driver, gpus)

    def _start(self) -> bool:
        """Initialise NVML and per-GPU state; on failure (no driver) try again next scrape."""
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            self.errors.count("nvml", nvml_error_kind(err))
            return False
        devices = []
        for index in range(count):
            handle = self._try("handle", self.nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is not None:
                devices.append(_Device(index, handle))
        for device in devices:
            self._start_gpm(device)
            self._start_events(device)
        self._devices = devices
        return True

    def _start_gpm(self, d: _Device) -> None:
        try:
            if not self.nvml.nvmlGpmQueryDeviceSupport(d.handle).isSupportedDevice:
                return  # not Hopper or newer: a capability, not an error
            d.gpm_samples = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
            self.nvml.nvmlGpmSampleGet(d.handle, d.gpm_samples[0])  # so scrape 1 has an interval
        except pynvml.NVMLError as err:
            d.gpm_samples = None
            self.errors.count("nvml", nvml_error_kind(err))

    def _start_events(self, d: _Device) -> None:
        try:
            d.event_set = self.nvml.nvmlEventSetCreate()
            self.nvml.nvmlDeviceRegisterEvents(
                d.handle, pynvml.nvmlEventTypeXidCriticalError, d.event_set
            )
        except pynvml.NVMLError as err:
            d.event_set = None
            self.errors.count("nvml", nvml_error_kind(err))

    def _try(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except pynvml.NVMLError as err:
            self.errors.count("nvml", nvml_error_kind(err))
            log.debug("NVML %s failed: %s", what, err)
            return None

    def _read_device(self, d: _Device) -> GpuReading | None:
        uuid = self._try("uuid", self.nvml.nvmlDeviceGetUUID, d.handle)
        if uuid is None:  # without its UUID a GPU has no key; a lost GPU stops here
            return None
        reading = GpuReading(d.index, uuid)
        for name, reader in _READERS:
            try:
                reading.values.update(reader(self, d))
            except pynvml.NVMLError as err:
                kind = nvml_error_kind(err)
                reading.errors[name] = kind
                self.errors.count("nvml", kind)
                if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    break
        return reading

    # One reader per NVML query; each returns values in SI units.

    def _inventory(self, d: _Device) -> dict[str, Any]:
        bus_id = self.nvml.nvmlDeviceGetPciInfo(d.handle).busId
        return {
            "name": self.nvml.nvmlDeviceGetName(d.handle),
            "pci_bus_id": bus_id.decode() if isinstance(bus_id, bytes) else bus_id,
        }

    def _minor(self, d: _Device) -> dict[str, Any]:
        return {"minor": self.nvml.nvmlDeviceGetMinorNumber(d.handle)}

    def _utilization(self, d: _Device) -> dict[str, Any]:
        """Mean of the driver's utilisation samples since the last scrape, else the instant."""
        try:
            value_type, samples = self.nvml.nvmlDeviceGetSamples(
                d.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, d.last_sample_us
            )
            samples = [s for s in samples if s.timeStamp > d.last_sample_us]
        except pynvml.NVMLError as err:
            if err.value not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED):
                raise
            samples = []
        if samples:
            d.last_sample_us = max(s.timeStamp for s in samples)
            percent = sum(union_value(s.sampleValue, value_type) for s in samples) / len(samples)
        else:
            percent = self.nvml.nvmlDeviceGetUtilizationRates(d.handle).gpu
        return {"util": percent / 100}

    def _memory(self, d: _Device) -> dict[str, Any]:
        info = self.nvml.nvmlDeviceGetMemoryInfo(d.handle)
        return {"memory_used": info.used, "memory_total": info.total}

    def _power(self, d: _Device) -> dict[str, Any]:
        return {"power_w": self.nvml.nvmlDeviceGetPowerUsage(d.handle) / 1000}  # mW

    def _energy(self, d: _Device) -> dict[str, Any]:
        return {"energy_j": self.nvml.nvmlDeviceGetTotalEnergyConsumption(d.handle) / 1000}  # mJ

    def _temperature(self, d: _Device) -> dict[str, Any]:
        temp = self.nvml.nvmlDeviceGetTemperature(d.handle, pynvml.NVML_TEMPERATURE_GPU)
        return {"temperature_c": temp}

    def _sm_clock(self, d: _Device) -> dict[str, Any]:
        return {
            "sm_clock_hz": self.nvml.nvmlDeviceGetClockInfo(d.handle, pynvml.NVML_CLOCK_SM) * 1e6
        }

    def _ecc(self, d: _Device) -> dict[str, Any]:
        def total(error_type: int) -> int:
            return self.nvml.nvmlDeviceGetTotalEccErrors(
                d.handle, error_type, pynvml.NVML_VOLATILE_ECC
            )

        return {
            "ecc_corrected": total(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            "ecc_uncorrected": total(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        }

    def _field_counters(self, d: _Device) -> dict[str, Any]:
        """PCIe and NVLink byte counters in one call; each field can fail on its own."""
        fields = self.nvml.nvmlDeviceGetFieldValues(d.handle, [f for f, _, _ in FIELD_COUNTERS])
        values = {}
        for field, (_, key, scale) in zip(fields, FIELD_COUNTERS, strict=True):
            if field.nvmlReturn == pynvml.NVML_SUCCESS:
                values[key] = union_value(field.value, field.valueType) * scale
            else:
                self.errors.count("nvml", nvml_error_kind(pynvml.NVMLError(field.nvmlReturn)))
        return values

    def _gpm(self, d: _Device) -> dict[str, Any]:
        """SM and tensor activity over the interval between this scrape's sample and the last."""
        if d.gpm_samples is None:
            return {}
        previous, current = d.gpm_samples
        self.nvml.nvmlGpmSampleGet(d.handle, current)
        d.gpm_samples = [current, previous]
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = previous, current
        for i, metric_id in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        self.nvml.nvmlGpmMetricsGet(request)
        values = {}
        for i, key in enumerate(GPM_METRICS.values()):
            metric = request.metrics[i]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                values[key] = metric.value / 100  # percent
            else:
                self.errors.count("nvml", nvml_error_kind(pynvml.NVMLError(metric.nvmlReturn)))
        return values

    def _mig(self, d: _Device) -> dict[str, Any]:
        current, _pending = self.nvml.nvmlDeviceGetMigMode(d.handle)
        instances = []
        if current == pynvml.NVML_DEVICE_MIG_ENABLE:
            for i in range(self.nvml.nvmlDeviceGetMaxMigDeviceCount(d.handle)):
                try:
                    mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(d.handle, i)
                except pynvml.NVMLError as err:
                    if err.value == pynvml.NVML_ERROR_NOT_FOUND:
                        continue  # an empty slot
                    raise
                memory = self.nvml.nvmlDeviceGetMemoryInfo(mig)
                instances.append(
                    {
                        "uuid": self.nvml.nvmlDeviceGetUUID(mig),
                        "gpu_instance": self.nvml.nvmlDeviceGetGpuInstanceId(mig),
                        "compute_instance": self.nvml.nvmlDeviceGetComputeInstanceId(mig),
                        "memory_used": memory.used,
                        "memory_total": memory.total,
                    }
                )
        return {"mig_mode": current, "mig": instances}

    def _processes(self, d: _Device) -> dict[str, Any]:
        procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(d.handle)
        return {"processes": [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs]}

    def _xids(self, d: _Device) -> dict[str, Any]:
        """Drain the XID events that arrived since the last scrape into running counts."""
        if d.event_set is None:
            return {}
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = self.nvml.nvmlEventSetWait_v2(d.event_set, 0)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_TIMEOUT:
                    break
                raise
            if event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                d.xid_counts[int(event.eventData)] += 1
        return {"xids": dict(sorted(d.xid_counts.items()))}


_READERS: tuple[tuple[str, Callable[[GpuSource, _Device], dict[str, Any]]], ...] = (
    ("inventory", GpuSource._inventory),
    ("minor", GpuSource._minor),
    ("util", GpuSource._utilization),
    ("memory", GpuSource._memory),
    ("power", GpuSource._power),
    ("energy", GpuSource._energy),
    ("temperature", GpuSource._temperature),
    ("sm_clock", GpuSource._sm_clock),
    ("ecc", GpuSource._ecc),
    ("field_counters", GpuSource._field_counters),
    ("gpm", GpuSource._gpm),
    ("mig", GpuSource._mig),
    ("processes", GpuSource._processes),
    ("xids", GpuSource._xids),
)

# value key -> (metric name, help); gauges then counters, all labelled gpu and uuid.
GAUGES = {
    "util": ("sing_gpu_utilization_ratio", "Share of the scrape interval a kernel was running."),
    "sm_active": ("sing_gpu_sm_active_ratio", "Share of SMs busy over the interval (GPM)."),
    "sm_occupancy": ("sing_gpu_sm_occupancy_ratio", "Resident warps over the maximum (GPM)."),
    "tensor_active": ("sing_gpu_tensor_active_ratio", "Share of time tensor cores ran (GPM)."),
    "memory_used": ("sing_gpu_memory_used_bytes", "Device memory in use."),
    "memory_total": ("sing_gpu_memory_total_bytes", "Device memory size."),
    "power_w": ("sing_gpu_power_watts", "Power draw."),
    "temperature_c": ("sing_gpu_temperature_celsius", "GPU die temperature."),
    "sm_clock_hz": ("sing_gpu_sm_clock_hertz", "SM clock frequency."),
    "mig_mode": ("sing_gpu_mig_mode", "1 when MIG mode is enabled, else 0."),
}
COUNTERS = {
    "energy_j": ("sing_gpu_energy_joules", "Energy used since the driver loaded."),
    "pcie_tx_bytes": ("sing_gpu_pcie_transmit_bytes", "Bytes sent over PCIe."),
    "pcie_rx_bytes": ("sing_gpu_pcie_receive_bytes", "Bytes received over PCIe."),
    "nvlink_tx_bytes": ("sing_gpu_nvlink_transmit_bytes", "Bytes sent over all NVLinks."),
    "nvlink_rx_bytes": ("sing_gpu_nvlink_receive_bytes", "Bytes received over all NVLinks."),
}
GPU_LABELS = ["gpu", "uuid"]
MIG_LABELS = [*GPU_LABELS, "mig_uuid", "gpu_instance", "compute_instance"]


def gpu_metrics(node: NodeReading) -> list[Metric]:
    """Metric families for one node reading; series whose reading failed are simply absent."""
    info = GaugeMetricFamily(
        "sing_gpu_info",
        "GPU inventory; index and minor number can differ.",
        labels=["gpu", "uuid", "name", "minor", "pci_bus_id"],
    )
    driver = GaugeMetricFamily("sing_gpu_driver_info", "NVIDIA driver version.", labels=["version"])
    if node.driver_version:
        driver.add_metric([node.driver_version], 1)
    gauges = {k: GaugeMetricFamily(n, h, labels=GPU_LABELS) for k, (n, h) in GAUGES.items()}
    counters = {k: CounterMetricFamily(n, h, labels=GPU_LABELS) for k, (n, h) in COUNTERS.items()}
    ecc = CounterMetricFamily(
        "sing_gpu_ecc_errors",
        "Memory ECC errors since the driver loaded.",
        labels=[*GPU_LABELS, "type"],
    )
    xid = CounterMetricFamily(
        "sing_gpu_xid_errors",
        "XID critical errors seen by this exporter.",
        labels=[*GPU_LABELS, "xid"],
    )
    processes = GaugeMetricFamily(
        "sing_gpu_compute_processes", "Compute processes running on the GPU.", labels=GPU_LABELS
    )
    mig_used = GaugeMetricFamily(
        "sing_gpu_mig_memory_used_bytes", "Memory in use in a MIG instance.", labels=MIG_LABELS
    )
    mig_total = GaugeMetricFamily(
        "sing_gpu_mig_memory_total_bytes", "Memory size of a MIG instance.", labels=MIG_LABELS
    )
    for gpu in node.gpus:
        v = gpu.values
        key = [str(gpu.index), gpu.uuid]
        if "name" in v:
            minor = str(v["minor"]) if "minor" in v else ""
            info.add_metric([*key, v["name"], minor, v["pci_bus_id"]], 1)
        for name, family in [*gauges.items(), *counters.items()]:
            if name in v:
                family.add_metric(key, v[name])
        for kind in ("corrected", "uncorrected"):
            if f"ecc_{kind}" in v:
                ecc.add_metric([*key, kind], v[f"ecc_{kind}"])
        for code, n in v.get("xids", {}).items():
            xid.add_metric([*key, str(code)], n)
        if "processes" in v:
            processes.add_metric(key, len(v["processes"]))
        for mig in v.get("mig", []):
            labels = [*key, mig["uuid"], str(mig["gpu_instance"]), str(mig["compute_instance"])]
            mig_used.add_metric(labels, mig["memory_used"])
            mig_total.add_metric(labels, mig["memory_total"])
    return [
        info,
        driver,
        *gauges.values(),
        *counters.values(),
        ecc,
        xid,
        processes,
        mig_used,
        mig_total,
    ]
