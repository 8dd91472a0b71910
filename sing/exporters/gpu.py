"""GPU metrics from NVML: read each GPU into plain values, then turn those into metric families.

Reading and rendering are split so that one reading serves both the `/metrics` page and a
`--record` frame, and so that the fake backend (sing/testing/fake_nvml.py) exercises exactly the
same unit conversions as a real GPU: this module is the only place that knows NVML's units.

`nvml` is anything with pynvml's function names: the `pynvml` module itself or a `FakeNvml`.
Every call may fail; a failed reading is left out for that GPU and counted, never raised.

Utilisation and GPM activity cover a fixed trailing window (ACTIVITY_WINDOW_S) on the
exporter's own clock, never "since the last scrape": Prometheus and sing's collector may both
scrape one exporter, and each must see the same value, not a share of the interval.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sing.exporters.errors import ErrorCounter, nvml_error_kind
from sing.signals import GPU_SIGNALS, GpuSignal

log = logging.getLogger(__name__)

# Which member of NVML's value union holds a value of each NVML_VALUE_TYPE_*.
_UNION_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# Utilisation and GPM activity are means over this trailing window: the collector's default
# scrape interval, so its consecutive samples neither overlap nor leave gaps.
ACTIVITY_WINDOW_S = 15.0
# GPM samples are taken this often (by the sampling thread, else by the next read).
GPM_PERIOD_S = 5.0
_GPM_KEPT = round(ACTIVITY_WINDOW_S / GPM_PERIOD_S) + 1  # samples spanning one window

# GPM metrics (Hopper and newer; they do not lock out profilers as DCGM's profiling fields do).
GPM_METRICS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
}

# Field-value byte counters of the whole GPU: (field id, value key), in bytes.
PCIE_COUNTERS = (
    (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_tx_bytes"),
    (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, "pcie_rx_bytes"),
)
# NVLink throughput fields count KiB per link, the link id given as the field's scopeId
# (nvml.h, "NVLink throughput counters field values"); the exporter sums every active link.
NVLINK_COUNTERS = (
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "nvlink_tx_bytes"),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "nvlink_rx_bytes"),
)
NVLINK_UNIT_BYTES = 1024
# NVLink error counters, each NVML's own total over the GPU's links (one field, scope 0): one
# batched request instead of nvmlDeviceGetNvLinkErrorCounter per link and kind (54 calls per
# H100), which would cost more than every other reading together. Asked only of NVLinked GPUs.
NVLINK_ERROR_COUNTERS = (
    (pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "nvlink_crc_errors"),
    (pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, "nvlink_replay_errors"),
    (pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "nvlink_recovery_errors"),
)
ECC_ERROR_TYPES = {
    "corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
}
RETIREMENT_CAUSES = {
    "sbe": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    "dbe": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
}

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
    """What the source keeps per GPU: its field requests and its recent GPM samples."""

    index: int
    handle: Any
    uuid: str | None = None  # the last UUID read: a GPU that falls off the bus keeps it
    nvlinks: list[int] = dataclasses.field(default_factory=list)  # active link ids
    fields: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (field, scope)
    field_keys: list[str] = dataclasses.field(default_factory=list)  # value key per field
    gpm: collections.deque[tuple[float, Any]] | None = None  # (time, sample), oldest first
    gpm_free: list[Any] = dataclasses.field(default_factory=list)  # allocated, not in `gpm`
    gpm_now: Any = None  # for "from the only sample so far to now"
    event_set: Any = None
    xid_counts: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    # The slow health readings (ECC aggregate, retired pages, row remapping), reused between
    # refreshes: values, errors, and when they were read (monotonic seconds).
    slow_values: dict[str, Any] = dataclasses.field(default_factory=dict)
    slow_errors: dict[str, str] = dataclasses.field(default_factory=dict)
    slow_read_at: float | None = None


class GpuSource:
    """Reads every GPU on the node through one NVML initialised once per process.

    `clock` is wall-clock seconds, the time base of NVML's sample timestamps. `health` adds the
    health readings (ECC aggregate, retired pages, row remapping, throttle reasons, PCIe
    replays, NVLink errors; `[exporter] health`); XIDs are always read. The slow ones, counts the
    GPU keeps in its InfoROM that change a few times in its life, are read again only every
    `health_refresh_s` seconds (`[exporter] health_refresh_s`; 0: every reading).
    """

    def __init__(
        self,
        nvml: Any,
        errors: ErrorCounter,
        clock: Callable[[], float] = time.time,
        health: bool = True,
        health_refresh_s: float = 60.0,
    ) -> None:
        self.nvml = nvml
        self.errors = errors
        self.clock = clock
        self.health = health
        self.health_refresh_s = health_refresh_s
        self._readers = _READERS + _HEALTH_READERS if health else _READERS
        self._devices: list[_Device] | None = None
        self._lock = threading.Lock()  # reads and the sampling thread share the GPM samples
        self._next_gpm: float | None = None

    def read(self) -> NodeReading:
        with self._lock:
            if self._devices is None and not self._start():
                return NodeReading(None, [])
            self._sample_gpm_if_due(self.clock())
            driver = self._try("driver", self.nvml.nvmlSystemGetDriverVersion)
            gpus = [reading for d in self._devices or [] if (reading := self._read_device(d))]
            return NodeReading(driver, gpus)

    def sample_activity(self) -> float:
        """Take the GPM samples now due; the seconds until the next are due (for the thread)."""
        with self._lock:
            now = self.clock()
            if self._devices is not None:
                self._sample_gpm_if_due(now)
            return GPM_PERIOD_S if self._next_gpm is None else max(0.0, self._next_gpm - now)

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
            self._start_fields(device)
            self._start_gpm(device)
            self._start_events(device)
        self._devices = devices
        return True

    def _start_fields(self, d: _Device) -> None:
        """The field values one scrape asks for: PCIe, and NVLink bytes per active link."""
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self.nvml.nvmlDeviceGetNvLinkState(d.handle, link)
            except pynvml.NVMLError:
                break  # past the last link, or no NVLink at all: a capability, not an error
            if state == pynvml.NVML_FEATURE_ENABLED:
                d.nvlinks.append(link)
        requests = [(field, 0, key) for field, key in PCIE_COUNTERS]
        requests += [(field, link, key) for field, key in NVLINK_COUNTERS for link in d.nvlinks]
        d.fields = [(field, scope) for field, scope, _ in requests]
        d.field_keys = [key for _, _, key in requests]

    def _start_gpm(self, d: _Device) -> None:
        try:
            if not self.nvml.nvmlGpmQueryDeviceSupport(d.handle).isSupportedDevice:
                return  # not Hopper or newer: a capability, not an error
            d.gpm_free = [self.nvml.nvmlGpmSampleAlloc() for _ in range(_GPM_KEPT)]
            d.gpm_now = self.nvml.nvmlGpmSampleAlloc()
            d.gpm = collections.deque()
        except pynvml.NVMLError as err:
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

    def _sample_gpm_if_due(self, now: float) -> None:
        """Every GPM_PERIOD_S on a fixed grid, whoever calls; a clock stepped back restarts it."""
        due = self._next_gpm
        if due is not None and due - GPM_PERIOD_S <= now < due:
            return
        for d in self._devices or []:
            if d.gpm is not None:
                self._take_gpm_sample(d, now)
        if due is None or now < due:
            self._next_gpm = now + GPM_PERIOD_S
        else:
            self._next_gpm = due + GPM_PERIOD_S * (math.floor((now - due) / GPM_PERIOD_S) + 1)

    def _take_gpm_sample(self, d: _Device, now: float) -> None:
        ring = d.gpm
        assert ring is not None
        if ring and now < ring[-1][0]:  # the wall clock stepped back: start the window again
            d.gpm_free += [sample for _, sample in ring]
            ring.clear()
        if len(ring) == _GPM_KEPT:
            d.gpm_free.append(ring.popleft()[1])
        sample = d.gpm_free.pop()
        try:
            self.nvml.nvmlGpmSampleGet(d.handle, sample)
        except pynvml.NVMLError as err:
            d.gpm_free.append(sample)
            self.errors.count("nvml", nvml_error_kind(err))
            return
        ring.append((now, sample))

    def _try(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except pynvml.NVMLError as err:
            self.errors.count("nvml", nvml_error_kind(err))
            log.debug("NVML %s failed: %s", what, err)
            return None

    def _read_device(self, d: _Device) -> GpuReading | None:
        uuid = self._try("uuid", self.nvml.nvmlDeviceGetUUID, d.handle)
        if uuid is None:  # lost: only its XIDs (79: fallen off the bus), under its last UUID
            if d.uuid is None:
                return None
            reading = GpuReading(d.index, d.uuid)
            self._read_into(reading.values, reading.errors, d, (("xids", GpuSource._xids),))
            return reading if reading.values.get("xids") else None
        d.uuid = uuid
        reading = GpuReading(d.index, uuid)
        lost = self._read_into(reading.values, reading.errors, d, self._readers)
        if self.health and not lost:
            now = time.monotonic()
            if d.slow_read_at is None or now - d.slow_read_at >= self.health_refresh_s:
                d.slow_values, d.slow_errors = {}, {}
                self._read_into(d.slow_values, d.slow_errors, d, _SLOW_HEALTH_READERS)
                d.slow_read_at = now
            reading.values.update(d.slow_values)
            reading.errors.update(d.slow_errors)
        return reading

    def _read_into(
        self,
        values: dict[str, Any],
        errors: dict[str, str],
        d: _Device,
        readers: tuple[tuple[str, Callable[[GpuSource, _Device], dict[str, Any]]], ...],
    ) -> bool:
        """Run `readers` on the GPU into `values`, a failed one's error kind into `errors`;
        True when the GPU is lost (the remaining readers are not tried)."""
        for name, reader in readers:
            try:
                values.update(reader(self, d))
            except pynvml.NVMLError as err:
                kind = nvml_error_kind(err)
                errors[name] = kind
                self.errors.count("nvml", kind)
                if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    return True
        return False

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
        """Mean of the driver's utilisation samples over the trailing window, else the instant.

        The driver keeps a buffer of samples (one per 1/6 s to 1 s, by product) stamped in
        wall-clock microseconds; asking for those after now - window needs no state.
        """
        percent = self._window_mean(d, pynvml.NVML_GPU_UTILIZATION_SAMPLES)
        if percent is None:
            percent = self.nvml.nvmlDeviceGetUtilizationRates(d.handle).gpu
        return {"util": percent / 100}

    def _window_mean(self, d: _Device, kind: int) -> float | None:
        """The mean of the driver's samples of `kind` (NVML_*_SAMPLES) over the trailing
        window, in NVML's unit; None when the driver has none."""
        since_us = int((self.clock() - ACTIVITY_WINDOW_S) * 1e6)
        try:
            value_type, samples = self.nvml.nvmlDeviceGetSamples(d.handle, kind, since_us)
        except pynvml.NVMLError as err:
            if err.value not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED):
                raise
            return None
        values = [union_value(s.sampleValue, value_type) for s in samples if s.timeStamp > since_us]
        return sum(values) / len(values) if values else None

    def _signal(self, d: _Device, signal: GpuSignal) -> dict[str, Any]:
        """A registered signal (sing/signals.py): the window's mean of its samples where the
        driver keeps them, else its NVML call's answer; in SI units."""
        value = None
        if signal.nvml_samples:
            value = self._window_mean(d, getattr(pynvml, signal.nvml_samples))
        if value is None:
            answer = getattr(self.nvml, signal.nvml_call)(d.handle)
            value = getattr(answer, signal.nvml_field, None) if signal.nvml_field else answer
        return {} if value is None else {signal.key: value * signal.nvml_to_si}

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
        """ECC errors since the driver loaded (volatile)."""
        return self._ecc_totals(d, pynvml.NVML_VOLATILE_ECC, "")

    def _ecc_aggregate(self, d: _Device) -> dict[str, Any]:
        """ECC errors over the GPU's life (aggregate, kept in its InfoROM across reloads)."""
        return self._ecc_totals(d, pynvml.NVML_AGGREGATE_ECC, "_aggregate")

    def _ecc_totals(self, d: _Device, counter: int, suffix: str) -> dict[str, Any]:
        return {
            f"ecc_{kind}{suffix}": self.nvml.nvmlDeviceGetTotalEccErrors(d.handle, code, counter)
            for kind, code in ECC_ERROR_TYPES.items()
        }

    def _retired_pages(self, d: _Device) -> dict[str, Any]:
        """Pages retired for ECC errors, by cause, and whether a retirement awaits a reset.

        Before Ampere; newer GPUs remap rows instead and answer NOT_SUPPORTED.
        """
        values = {
            f"retired_pages_{cause}": len(self.nvml.nvmlDeviceGetRetiredPages(d.handle, code))
            for cause, code in RETIREMENT_CAUSES.items()
        }
        pending = self.nvml.nvmlDeviceGetRetiredPagesPendingStatus(d.handle)
        values["retired_pages_pending"] = int(pending == pynvml.NVML_FEATURE_ENABLED)
        return values

    def _row_remap(self, d: _Device) -> dict[str, Any]:
        """Rows remapped for correctable and uncorrectable errors (Ampere and newer); a pending
        remap needs a GPU reset, a failed one means the GPU is out of spare rows."""
        correctable, uncorrectable, pending, failed = self.nvml.nvmlDeviceGetRemappedRows(d.handle)
        return {
            "row_remap_correctable": correctable,
            "row_remap_uncorrectable": uncorrectable,
            "row_remap_pending": int(bool(pending)),
            "row_remap_failed": int(bool(failed)),
        }

    def _throttle(self, d: _Device) -> dict[str, Any]:
        """The clock event (throttle) reasons, NVML's bitmask as it is: one series per GPU,
        where a flag per reason would cost a series each (the collector splits out the bits
        that mean hardware trouble). Drivers before 535 only have the older name of the call."""
        try:
            reasons = self.nvml.nvmlDeviceGetCurrentClocksEventReasons(d.handle)
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            reasons = self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(d.handle)
        return {"clock_event_reasons": int(reasons)}

    def _pcie_replays(self, d: _Device) -> dict[str, Any]:
        return {"pcie_replays": self.nvml.nvmlDeviceGetPcieReplayCounter(d.handle)}

    def _nvlink_errors(self, d: _Device) -> dict[str, Any]:
        """NVLink error totals over the GPU's links, NVML's own sums (one field each, scope 0),
        asked only of a GPU with NVLinks; a failed field is left out and counted."""
        if not d.nvlinks:
            return {}
        requests = [(field, 0) for field, _ in NVLINK_ERROR_COUNTERS]
        values: dict[str, Any] = {}
        fields = self.nvml.nvmlDeviceGetFieldValues(d.handle, requests)
        for field, (_, key) in zip(fields, NVLINK_ERROR_COUNTERS, strict=True):
            if field.nvmlReturn == pynvml.NVML_SUCCESS:
                values[key] = union_value(field.value, field.valueType)
            else:
                self.errors.count("nvml", nvml_error_kind(pynvml.NVMLError(field.nvmlReturn)))
        return values

    def _field_counters(self, d: _Device) -> dict[str, Any]:
        """PCIe and NVLink byte counters (and NVLink error totals) in one call, NVLink bytes
        summed over the active links.

        Each field can fail on its own; a total missing any of its links is left out rather
        than reported short (a counter that dips reads as a reset downstream).
        """
        fields = self.nvml.nvmlDeviceGetFieldValues(d.handle, d.fields)
        totals: dict[str, float] = {}
        failed: set[str] = set()
        for field, key in zip(fields, d.field_keys, strict=True):
            if field.nvmlReturn == pynvml.NVML_SUCCESS:
                totals[key] = totals.get(key, 0) + union_value(field.value, field.valueType)
            else:
                failed.add(key)
                self.errors.count("nvml", nvml_error_kind(pynvml.NVMLError(field.nvmlReturn)))
        values: dict[str, Any] = {k: v for k, v in totals.items() if k not in failed}
        for _, key in NVLINK_COUNTERS:
            if key in values:
                values[key] *= NVLINK_UNIT_BYTES
        if d.nvlinks:
            values["nvlinks"] = len(d.nvlinks)
        return values

    def _gpm(self, d: _Device) -> dict[str, Any]:
        """SM and tensor activity over the window ending at the newest GPM sample.

        Samples are taken every GPM_PERIOD_S, so the window's ends are the exporter's, not the
        scrapers'. Until a window's worth exists, activity since the first sample; with only
        that one, from it to now.
        """
        if not d.gpm:
            return {}
        newest_at, newest = d.gpm[-1]
        start = newest_at - ACTIVITY_WINDOW_S + GPM_PERIOD_S / 2  # tolerates a late thread
        first = next((s for t, s in reversed(d.gpm) if t <= start), d.gpm[0][1])
        if first is newest:
            newest = self.nvml.nvmlGpmSampleGet(d.handle, d.gpm_now)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = first, newest
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
    # the registered signals (sing/signals.py), one reading each
    *((s.key, functools.partial(GpuSource._signal, signal=s)) for s in GPU_SIGNALS),
)
# Read only with health readings on, every scrape: the clocks' state now.
_HEALTH_READERS: tuple[tuple[str, Callable[[GpuSource, _Device], dict[str, Any]]], ...] = (
    ("throttle", GpuSource._throttle),
)
# Health counts that move a few times in a GPU's life (the first three kept in its InfoROM),
# read every `health_refresh_s` rather than every scrape.
_SLOW_HEALTH_READERS: tuple[tuple[str, Callable[[GpuSource, _Device], dict[str, Any]]], ...] = (
    ("ecc_aggregate", GpuSource._ecc_aggregate),
    ("retired_pages", GpuSource._retired_pages),
    ("row_remap", GpuSource._row_remap),
    ("pcie_replays", GpuSource._pcie_replays),
    ("nvlink_errors", GpuSource._nvlink_errors),
)

# value key -> (metric name, help); gauges then counters, all labelled gpu and uuid.
GAUGES = {
    "util": ("sing_gpu_utilization_ratio", "Share of the last 15 s a kernel was running."),
    "sm_active": ("sing_gpu_sm_active_ratio", "Share of SMs busy over 15 s (GPM)."),
    "sm_occupancy": ("sing_gpu_sm_occupancy_ratio", "Resident warps over the maximum, 15 s (GPM)."),
    "tensor_active": ("sing_gpu_tensor_active_ratio", "Share of 15 s tensor cores ran (GPM)."),
    "memory_used": ("sing_gpu_memory_used_bytes", "Device memory in use."),
    "memory_total": ("sing_gpu_memory_total_bytes", "Device memory size."),
    "power_w": ("sing_gpu_power_watts", "Power draw."),
    "temperature_c": ("sing_gpu_temperature_celsius", "GPU die temperature."),
    "sm_clock_hz": ("sing_gpu_sm_clock_hertz", "SM clock frequency."),
    "mig_mode": ("sing_gpu_mig_mode", "1 when MIG mode is enabled, else 0."),
    "nvlinks": ("sing_gpu_nvlink_links", "Active NVLinks, summed in the NVLink byte counters."),
    "retired_pages_pending": (
        "sing_gpu_retired_pages_pending",
        "1 when a page retirement awaits a GPU reset, else 0.",
    ),
    "row_remap_pending": (
        "sing_gpu_row_remap_pending",
        "1 when a row remapping awaits a GPU reset, else 0.",
    ),
    "row_remap_failed": (
        "sing_gpu_row_remap_failed",
        "1 when a row remapping ever failed (no spare rows left: replace the GPU), else 0.",
    ),
    "clock_event_reasons": (
        "sing_gpu_clock_event_reasons",
        "Why the clocks are held down now, NVML's bitmask (nvmlClocksEventReason*: 0x1 idle, "
        "0x4 power cap, 0x8 hw slowdown, 0x20 sw thermal, 0x40 hw thermal, 0x80 power brake).",
    ),
    **{s.key: (s.metric, s.help) for s in GPU_SIGNALS},  # sing/signals.py
}
COUNTERS = {
    "energy_j": ("sing_gpu_energy_joules", "Energy used since the driver loaded."),
    "pcie_tx_bytes": ("sing_gpu_pcie_transmit_bytes", "Bytes sent over PCIe."),
    "pcie_rx_bytes": ("sing_gpu_pcie_receive_bytes", "Bytes received over PCIe."),
    "nvlink_tx_bytes": ("sing_gpu_nvlink_transmit_bytes", "Bytes sent over all NVLinks."),
    "nvlink_rx_bytes": ("sing_gpu_nvlink_receive_bytes", "Bytes received over all NVLinks."),
    "pcie_replays": ("sing_gpu_pcie_replays", "PCIe packets replayed since the driver loaded."),
}
# Families with one extra label: key -> (metric, help, counter?, label, {label value: value key}).
LABELLED: dict[str, tuple[str, str, bool, str, dict[str, str]]] = {
    "retired_pages": (
        "sing_gpu_retired_pages",
        "Memory pages retired, by cause (sbe: repeated single-bit, dbe: double-bit errors).",
        False,
        "type",
        {cause: f"retired_pages_{cause}" for cause in RETIREMENT_CAUSES},
    ),
    "row_remap_rows": (
        "sing_gpu_row_remap_rows",
        "Memory rows remapped to spares, by the kind of error that caused it.",
        False,
        "type",
        {kind: f"row_remap_{kind}" for kind in ("correctable", "uncorrectable")},
    ),
    "nvlink_errors": (
        "sing_gpu_nvlink_errors",
        "NVLink errors over all links since the driver loaded (crc: flit CRC, replay, recovery).",
        True,
        "type",
        {kind: f"nvlink_{kind}_errors" for kind in ("crc", "replay", "recovery")},
    ),
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
    labelled = {
        key: (
            (CounterMetricFamily if counter else GaugeMetricFamily)(
                name, help, labels=[*GPU_LABELS, label]
            ),
            keys,
        )
        for key, (name, help, counter, label, keys) in LABELLED.items()
    }
    ecc = CounterMetricFamily(
        "sing_gpu_ecc_errors",
        "Memory ECC errors: since the driver loaded (counter=volatile) or over the GPU's life "
        "(counter=aggregate).",
        labels=[*GPU_LABELS, "type", "counter"],
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
        for kind in ECC_ERROR_TYPES:
            for counter, suffix in (("volatile", ""), ("aggregate", "_aggregate")):
                if f"ecc_{kind}{suffix}" in v:
                    ecc.add_metric([*key, kind, counter], v[f"ecc_{kind}{suffix}"])
        for family, keys in labelled.values():
            for label, value_key in keys.items():
                if value_key in v:
                    family.add_metric([*key, label], v[value_key])
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
        *(family for family, _ in labelled.values()),
        xid,
        processes,
        mig_used,
        mig_total,
    ]
