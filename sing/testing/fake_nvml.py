"""A fake NVML with pynvml's function names, so the whole exporter runs without a GPU.

The device state comes from three layers, later ones winning, per GPU:

1. a device description (YAML, see sing/testing/default_node.yaml and docs/exporter.md): model,
   count, memory, per-GPU values or patterns (sine, square, ramp, or following utilisation),
   and errors to inject; or a `--record` recording (JSON lines) replayed frame by frame;
2. a runtime state file (`--fake-state`, JSON or YAML), re-read when its mtime changes, so a
   demo can set utilisation, memory, power and jobs while the exporter runs.

Values use the same keys and SI units as a GpuReading (sing/exporters/gpu.py); this module converts
them to NVML's raw units (mW, mJ, percent, MHz, KiB per NVLink), so the real unit conversions are
exercised. It models NVML on its own, from pynvml's constants, and imports nothing of the
exporter it checks. A value that is absent makes its NVML call fail with NOT_SUPPORTED, as on a
GPU that lacks it; `errors: {reading: kind}` makes a reading fail with any NVML error (`all` for
every call).

Like a driver, the fake samples utilisation and SM activity on its own clock (once a second,
evaluating patterns at each sample's time) and keeps the recent samples: nvmlDeviceGetSamples
returns them and a GPM interval is the mean of those it spans. Each NVLink is its own counter.
"""

from __future__ import annotations

import collections
import ctypes
import json
import math
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import yaml

from sing.errors import UserError
from sing.exporters.errors import NVML_ERROR_CODES
from sing.exporters.recording import load_recording
from sing.signals import GPU_SIGNALS, GpuSignal

DEFAULT_DESCRIPTION = Path(__file__).with_name("default_node.yaml")
REFRESH_SECONDS = 0.1  # how stale an evaluated GPU state may be; bounds the cost per scrape
_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where installed
JOB_PID_BASE = 3_000_000  # the fake process of a job on GPU i has pid JOB_PID_BASE + i
# Counters the fake integrates from a rate: counter -> rate key.
RATES = {
    "energy_j": "power_w",
    "pcie_tx_bytes": "pcie_tx_bytes_per_s",
    "pcie_rx_bytes": "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes": "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes": "nvlink_rx_bytes_per_s",
}
PER_LINK = {"nvlink_tx_bytes", "nvlink_rx_bytes"}  # one counter per NVLink, `nvlinks` of them
# NVML field id -> (state key, bytes per unit NVML counts in).
FIELDS = {
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: ("pcie_tx_bytes", 1),
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: ("pcie_rx_bytes", 1),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: ("nvlink_tx_bytes", 1024),  # KiB per link
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: ("nvlink_rx_bytes", 1024),
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: ("nvlink_crc_errors", 1),
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: ("nvlink_replay_errors", 1),
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: ("nvlink_recovery_errors", 1),
}
# NVLink error counters: per link in the state (a list, or a number on link 0), one total field.
LINK_TOTALS = {"nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors"}
# Clock event reason flags in the state -> their bit in NVML's mask.
CLOCK_EVENT_BITS = {
    "throttle_hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "throttle_hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "throttle_sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "throttle_hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}
RETIREMENT_KEYS = {
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "retired_pages_sbe",
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "retired_pages_dbe",
}
GPM_KEYS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
}
# The driver's sample buffers (nvmlDeviceGetSamples): kind -> (state key, SI per NVML unit);
# a registered signal (sing/signals.py) that names one is sampled as utilisation is.
SAMPLED = {
    pynvml.NVML_GPU_UTILIZATION_SAMPLES: ("util", 0.01),
    **{
        getattr(pynvml, s.nvml_samples): (s.key, s.nvml_to_si)
        for s in GPU_SIGNALS
        if s.nvml_samples
    },
}
# NVML calls that read registered signals -> those signals (answered from the state, in NVML's
# units; the fake's own methods below add them to the answers they already give).
SIGNAL_CALLS: dict[str, list[GpuSignal]] = {}
for _signal in GPU_SIGNALS:
    SIGNAL_CALLS.setdefault(_signal.nvml_call, []).append(_signal)
# What the fake driver samples once a period.
ACTIVITY_KEYS = ("util", *GPM_KEYS.values(), *(key for key, _ in SAMPLED.values()))
SAMPLE_PERIOD_S = 1.0  # the fake driver's activity samples (a real one: 1/6 s to 1 s)
SAMPLES_KEPT = 120  # a driver keeps a bounded buffer of recent samples


@dataclass
class ActivitySample:
    """What the fake driver saw at one sample time."""

    t: float
    values: dict[str, float | None]  # util, GPM and sampled signals' values (SI)

    def sample(self, key: str, to_si: float) -> SimpleNamespace | None:
        """The value of `key` as nvmlDeviceGetSamples gives it (a double, so averages stay
        unrounded); None when the state has none."""
        value = self.values.get(key)
        if value is None:
            return None
        return SimpleNamespace(
            timeStamp=round(self.t * 1e6), sampleValue=SimpleNamespace(dVal=value / to_si)
        )


def load_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML (or JSON) mapping from a file, or a UserError naming the file.

    JSON is parsed by the json module first: the demo rewrites a state file of all its nodes
    every tick, and pure-Python YAML takes about 100 ms for it against about 1 ms.
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(f"{what} {path}: cannot read: {err.strerror}") from err
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.load(text, Loader=_YamlLoader)
        except yaml.YAMLError as err:
            raise UserError(f"{what} {path}: not valid YAML/JSON: {err}") from err
    if not isinstance(data, dict):
        raise UserError(f"{what} {path}: expected a mapping at the top level")
    return data


def load_description(path: str | Path | None) -> dict[str, Any]:
    """A device description; a `.jsonl` file is taken as a recording to replay."""
    if path is None or str(path) == "default":
        path = DEFAULT_DESCRIPTION
    path = Path(path)
    if path.suffix == ".jsonl":
        return {"replay": str(path)}
    description = load_yaml(path, "fake device description")
    check_description(description, f"fake device description {path}")
    if "replay" in description:
        description["replay"] = str(path.parent / description["replay"])
    return description


class StateFile:
    """A JSON/YAML file of runtime overrides, re-read whenever its mtime changes.

    A file caught half-written by the demo keeps the previous good state until the next change.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mtime: int | None = None
        self._data: dict[str, Any] = {}
        # One exporter serves many fake nodes from one file: scrapes of all of them arrive
        # together after a change, and the lock makes the first parse it and the rest reuse it.
        self._lock = threading.Lock()

    def data(self) -> dict[str, Any]:
        with self._lock:
            try:
                stat = os.stat(self.path)
            except FileNotFoundError:
                return self._data
            if stat.st_mtime_ns != self._mtime:
                try:
                    self._data = load_yaml(self.path, "fake state file")
                    self._mtime = stat.st_mtime_ns
                except UserError:
                    pass  # keep the last good state; the writer will finish
            return self._data

    def node(self, name: str | None) -> dict[str, Any]:
        """The part of the state for one node: `nodes.<name>`, else the top level."""
        data = self.data()
        nodes = data.get("nodes") or {}
        return nodes.get(name) or {k: v for k, v in data.items() if k != "nodes"}


def per_index(table: Any, index: int) -> dict[str, Any]:
    """Entry `index` of a per-GPU table given as a list or a mapping with int or str keys."""
    if isinstance(table, list):
        return table[index] if index < len(table) else {}
    if isinstance(table, dict):
        return table.get(index) or table.get(str(index)) or {}
    return {}


# Pattern shapes: fraction 0-1 of the way from min to max, at phase x (0-1) of the period.
SHAPES: dict[str, Callable[[float, float, dict[str, Any]], float]] = {
    "sine": lambda x, util, spec: 0.5 - 0.5 * math.cos(2 * math.pi * x),
    "square": lambda x, util, spec: 1.0 if x < spec.get("duty", 0.5) else 0.0,
    "ramp": lambda x, util, spec: x,
    "util": lambda x, util, spec: util,
}


def evaluate(spec: Any, t: float, util: float, stagger: float) -> Any:
    """A value at time t: a number as is, a pattern mapping (stagger: default phase, 0-1), or
    a list of either (per NVLink)."""
    if isinstance(spec, list):
        return [evaluate(item, t, util, stagger) for item in spec]
    if not isinstance(spec, dict) or "pattern" not in spec:
        return spec
    period = spec.get("period_s", 60.0)
    x = ((t + spec.get("phase_s", stagger * period)) % period) / period
    low, high = spec.get("min", 0.0), spec.get("max", 1.0)
    return low + (high - low) * SHAPES[spec["pattern"]](x, util, spec)


def per_link(value: Any, links: int, spread: bool) -> list[float]:
    """One number per link from a list (by link id) or from one number: spread evenly over the
    links (a rate for the whole GPU) or all on link 0 (a counter's start)."""
    if isinstance(value, list):
        return [float(v or 0) for v in value[:links]] + [0.0] * (links - len(value))
    if links == 0:
        return []
    if spread:
        return [float(value or 0) / links] * links
    return [float(value or 0)] + [0.0] * (links - 1)


def check_description(description: dict[str, Any], where: str) -> None:
    """Reject unknown patterns and error kinds when loading, not in the middle of a scrape."""
    count = description.get("count", 8)
    if not isinstance(count, int) or count < 0:
        raise UserError(f"{where}: count must be a number of GPUs, not {count!r}")
    tables = {"defaults": description.get("defaults") or {}}
    tables |= {f"gpus.{i}": per_index(description.get("gpus"), i) for i in range(count)}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise UserError(f"{where}: {name} must be a mapping")
        for key, spec in table.items():
            if isinstance(spec, dict) and spec.get("pattern", "sine") not in SHAPES:
                raise UserError(
                    f"{where}: {name}.{key}: unknown pattern "
                    f"{spec['pattern']!r} (known: {', '.join(SHAPES)})"
                )
        for reading, kind in (table.get("errors") or {}).items():
            if kind not in NVML_ERROR_CODES:
                raise UserError(
                    f"{where}: {name}.errors.{reading}: unknown NVML error "
                    f"{kind!r} (e.g. not_supported, gpu_is_lost, no_permission)"
                )


@dataclass
class FakeHandle:
    index: int
    mig: int | None = None


class FakeEventSet:
    def __init__(self) -> None:
        self.gpu: int | None = None
        self.delivered: dict[int, int] = {}


class FakeNvml:
    """pynvml's functions over a described, patterned, replayed or state-file-driven node."""

    def __init__(
        self,
        description: dict[str, Any],
        state: StateFile | None = None,
        node: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.description = description
        self.state = state
        self.node = node
        self.clock = clock
        self.start = clock()
        self.frames = load_recording(description["replay"]) if "replay" in description else None
        if self.frames:
            self.count = 1 + max(g["index"] for f in self.frames for g in f["gpus"])
        else:
            self.count = description.get("count", 8)
        self._snapshots: dict[int, tuple[float, dict[str, Any]]] = {}
        self._integrated: dict[int, dict[str, Any]] = {}
        self._activity: dict[int, collections.deque[ActivitySample]] = {}
        # GPM sample buffers by address: (the buffer, {"gpu": index, "t": time taken}).
        self._gpm_samples: dict[int, tuple[ctypes.Array[ctypes.c_char], dict[str, float]]] = {}

    # -- the state of one GPU, layered and evaluated -------------------------------------------

    def gpu_state(self, index: int) -> dict[str, Any]:
        now = self.clock()
        cached = self._snapshots.get(index)
        if cached and 0 <= now - cached[0] < REFRESH_SECONDS:
            return cached[1]
        overrides = self._overrides(index)
        if self.frames:
            state = {**self._replayed(index, now), **overrides}
        else:
            state = self._described(index, now, overrides)
        if state.get("job_id") and state.get("has_process", True):  # the job's own process
            job_process = {"pid": JOB_PID_BASE + index, "used_memory": state.get("memory_used")}
            state["processes"] = [*(state.get("processes") or []), job_process]
        self._snapshots[index] = (now, state)
        return state

    def _overrides(self, index: int) -> dict[str, Any]:
        return per_index(self.state.node(self.node).get("gpus"), index) if self.state else {}

    def _raw(self, index: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """GPU `index`'s description, unevaluated: built-in values, defaults, per GPU, state."""
        d = self.description
        return {
            "name": d.get("model", "NVIDIA H200"),
            "memory_total": d.get("memory_total", 143771 * 2**20),
            "minor": index,
            "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            "uuid": "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{self.node}/{index}")),
            **(d.get("defaults") or {}),
            **per_index(d.get("gpus"), index),
            **overrides,
        }

    def _described(self, index: int, now: float, overrides: dict[str, Any]) -> dict[str, Any]:
        raw = self._raw(index, overrides)
        t = now - self.start
        stagger = index / self.count  # GPUs run their patterns out of step unless phase_s is set
        util = evaluate(raw.get("util", 0.0), t, 0.0, stagger)
        state = {key: evaluate(spec, t, util, stagger) for key, spec in raw.items()}
        state["util"] = util
        self._integrate(index, state, now)
        return state

    def _integrate(self, index: int, state: dict[str, Any], now: float) -> None:
        """Counters grow from their described start by the rate in force since the last look.

        The rate seen at the previous evaluation applies up to now, so a state file that sets
        a rate means "from now on", as a real device's counters would behave. NVLink counters
        are one per link. A new `driver_loaded_at` that has passed resets the energy counter
        (mJ since the driver loaded) to what was used since then, as a driver reload does.
        """
        loaded_at = state.get("driver_loaded_at")
        known = loaded_at if loaded_at is not None and loaded_at <= now else None  # not a reload
        totals = self._integrated.setdefault(index, {"at": now, "loaded_at": known})
        dt = now - totals["at"]
        totals["at"] = now
        reloaded = loaded_at is not None and loaded_at != totals["loaded_at"] and loaded_at <= now
        if reloaded:
            totals["loaded_at"] = loaded_at
            totals["energy_from_zero"] = True
        links = int(state.get("nvlinks") or 0)
        for counter, rate in RATES.items():
            width = links if counter in PER_LINK else 1
            rates = per_link(totals.get(rate), width, spread=False)  # those in force until now
            if reloaded and counter == "energy_j":
                grown = [rates[0] * (now - loaded_at)]
            else:
                before = per_link(totals.get(counter), width, spread=False)
                grown = [g + r * dt for g, r in zip(before, rates, strict=True)]
            totals[counter] = grown
            totals[rate] = per_link(state.get(rate), width, spread=True)
            if state.get(rate) is None:
                continue
            from_zero = counter == "energy_j" and totals.get("energy_from_zero")
            start = per_link(0 if from_zero else state.get(counter), width, spread=False)
            values = [s + g for s, g in zip(start, grown, strict=True)]
            state[counter] = values if counter in PER_LINK else values[0]

    def _replayed(self, index: int, now: float) -> dict[str, Any]:
        """The recorded frame for this moment, looping; counters keep growing across loops."""
        frames = self.frames or []
        t0 = frames[0]["t"]
        step = (frames[-1]["t"] - t0) / max(len(frames) - 1, 1) or 1.0
        span = frames[-1]["t"] - t0 + step
        loops, offset = divmod(now - self.start, span)
        frame = next(f for f in reversed(frames) if f["t"] - t0 <= offset)
        gpu = next((g for g in frame["gpus"] if g["index"] == index), None)
        if gpu is None:
            return {"errors": {"all": "gpu_is_lost"}}
        state = dict(gpu)
        for counter in RATES:
            first = next((g.get(counter) for g in frames[0]["gpus"] if g["index"] == index), None)
            last = next((g.get(counter) for g in frames[-1]["gpus"] if g["index"] == index), None)
            if counter in state and first is not None and last is not None:
                state[counter] += loops * (last - first)
        return state

    def _sampled(self, index: int) -> collections.deque[ActivitySample]:
        """GPU `index`'s activity samples up to now, taking those due since the last look.

        Patterns (and replayed frames) are evaluated at each sample's own time; state-file
        values, which have no history, apply to every sample taken at this look.
        """
        now = self.clock()
        samples = self._activity.setdefault(index, collections.deque(maxlen=SAMPLES_KEPT))
        last = math.floor((now - self.start) / SAMPLE_PERIOD_S)
        first = math.floor((samples[-1].t - self.start) / SAMPLE_PERIOD_S) + 1 if samples else 0
        if first > last:
            return samples
        overrides = self._overrides(index)
        raw = None if self.frames else self._raw(index, overrides)
        stagger = index / self.count
        for k in range(max(first, last - SAMPLES_KEPT + 1), last + 1):
            t = self.start + k * SAMPLE_PERIOD_S
            if raw is None:
                state = {**self._replayed(index, t), **overrides}
                values = {key: state.get(key) for key in ACTIVITY_KEYS}
            else:
                util = evaluate(raw.get("util", 0.0), t - self.start, 0.0, stagger)
                values = {key: evaluate(raw.get(key), t - self.start, util, stagger)
                          for key in ACTIVITY_KEYS}  # fmt: skip
                values["util"] = util
            samples.append(ActivitySample(t, values))
        return samples

    def _value(self, handle: FakeHandle, key: str, reading: str) -> Any:
        """A value for an NVML call, raising the NVML error the state asks for."""
        state = self.gpu_state(handle.index)
        errors = state.get("errors") or {}
        kind = errors.get(reading) or errors.get("all")
        if kind:  # a state file's unknown kind must not break serving: report it as unknown
            raise pynvml.NVMLError(NVML_ERROR_CODES.get(kind, pynvml.NVML_ERROR_UNKNOWN))
        if handle.mig is not None:
            state = state["mig"][handle.mig]
        if state.get(key) is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return state[key]

    # -- pynvml's functions ---------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        if self.frames:
            return self.frames[0].get("driver_version") or ""
        return str(self.description.get("driver_version", "580.159.04"))

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:  # noqa: N802
        return self._value(h, "uuid", "uuid")

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:  # noqa: N802
        return self._value(h, "name", "inventory")

    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self._value(h, "pci_bus_id", "inventory").encode())

    def nvmlDeviceGetMinorNumber(self, h: FakeHandle) -> int:  # noqa: N802
        return self._value(h, "minor", "minor")

    def nvmlDeviceGetSamples(self, h: FakeHandle, kind: int, last_seen: int):  # noqa: N802
        """The kept samples of `kind` newer than `last_seen` (as doubles, so averages stay
        unrounded)."""
        if kind not in SAMPLED:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        key, to_si = SAMPLED[kind]
        self._value(h, key, key)  # raises the injected error, or NOT_SUPPORTED without a value
        found = [s.sample(key, to_si) for s in self._sampled(h.index)]
        samples = [s for s in found if s is not None and s.timeStamp > last_seen]
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_DOUBLE, samples

    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> SimpleNamespace:  # noqa: N802
        """GPU utilisation, and the registered signals read from this call (the memory's)."""
        gpu = round(self._value(h, "util", "util") * 100)
        return SimpleNamespace(gpu=gpu, **self._signal_members(h, "nvmlDeviceGetUtilizationRates"))

    def _signal_members(self, h: FakeHandle, call: str) -> dict[str, int]:
        """The members of `call`'s answer that registered signals read, in NVML's units; a
        signal the state has no value for is left out."""
        members = {}
        for signal in SIGNAL_CALLS.get(call, []):
            try:
                members[signal.nvml_field] = round(
                    self._value(h, signal.key, signal.key) / signal.nvml_to_si
                )
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
                    raise
        return members

    def __getattr__(self, name: str) -> Callable[[FakeHandle], Any]:
        """An NVML call that only registered signals read (sing/signals.py), answered from the
        state: the value itself, or an answer with the signals' members."""
        signals = SIGNAL_CALLS.get(name)
        if not signals:
            raise AttributeError(name)

        def call(h: FakeHandle) -> Any:
            if not signals[0].nvml_field:
                signal = signals[0]
                return round(self._value(h, signal.key, signal.key) / signal.nvml_to_si)
            return SimpleNamespace(**self._signal_members(h, name))

        return call

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle) -> SimpleNamespace:  # noqa: N802
        total = self._value(h, "memory_total", "memory")
        used = self._value(h, "memory_used", "memory")
        return SimpleNamespace(total=int(total), used=int(used), free=int(total - used))

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:  # noqa: N802
        return round(self._value(h, "power_w", "power") * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:  # noqa: N802
        return round(self._value(h, "energy_j", "energy") * 1000)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:  # noqa: N802
        return round(self._value(h, "temperature_c", "temperature"))

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock: int) -> int:  # noqa: N802
        return round(self._value(h, "sm_clock_hz", "sm_clock") / 1e6)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter: int) -> int:  # noqa: N802
        """Volatile counts are `ecc_<kind>`, aggregate ones `ecc_<kind>_aggregate`."""
        kind = (
            "corrected" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        )
        if counter == pynvml.NVML_AGGREGATE_ECC:
            return int(self._value(h, f"ecc_{kind}_aggregate", "ecc_aggregate"))
        return int(self._value(h, f"ecc_{kind}", "ecc"))

    def nvmlDeviceGetRetiredPages(self, h: FakeHandle, cause: int) -> list[int]:  # noqa: N802
        """As many page addresses as the state counts for this cause."""
        count = int(self._value(h, RETIREMENT_KEYS[cause], "retired_pages"))
        return [0x1000 * (page + 1) for page in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeHandle) -> int:  # noqa: N802
        pending = self._value(h, "retired_pages_pending", "retired_pages")
        return pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:  # noqa: N802
        keys = ("correctable", "uncorrectable", "pending", "failed")
        values = [int(self._value(h, f"row_remap_{key}", "row_remap")) for key in keys]
        return values[0], values[1], values[2], values[3]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:  # noqa: N802
        """`clock_event_reasons` (a whole mask, as recordings hold it), else the mask of the
        `throttle_*` flags set; `errors: {clocks_event_reasons: function_not_found}` models a
        driver before 535, which has only the older name."""
        self._value(h, "uuid", "clocks_event_reasons")
        return self.nvmlDeviceGetCurrentClocksThrottleReasons(h)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:  # noqa: N802
        self._value(h, "uuid", "throttle")  # raises the injected error, if any
        state = self.gpu_state(h.index)
        if state.get("clock_event_reasons") is not None:
            return int(state["clock_event_reasons"])
        if all(state.get(key) is None for key in CLOCK_EVENT_BITS):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return sum(bit for key, bit in CLOCK_EVENT_BITS.items() if state.get(key))

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeHandle) -> int:  # noqa: N802
        return int(self._value(h, "pcie_replays", "pcie_replays"))

    def nvmlDeviceGetNvLinkState(self, h: FakeHandle, link: int) -> int:  # noqa: N802
        """Links 0 to `nvlinks` - 1 are active; past them INVALID_ARGUMENT, as on a real GPU."""
        self._value(h, "uuid", "field_counters")
        links = int(self.gpu_state(h.index).get("nvlinks") or 0)
        if links == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, requests: list[Any]) -> list[Any]:  # noqa: N802
        """Each request is a field id or (field id, scopeId); NVLink byte fields count per link,
        NVLink error fields are the total over the links (scope 0)."""
        self._value(h, "uuid", "field_counters")  # raises the injected error, if any
        state = self.gpu_state(h.index)
        links = int(state.get("nvlinks") or 0)
        counts: dict[str, list[float]] = {}
        for key, _ in FIELDS.values():
            if state.get(key) is None:
                continue
            if key in PER_LINK:
                counts[key] = per_link(state[key], links, spread=False)
            elif key in LINK_TOTALS:
                counts[key] = [sum(per_link(state[key], links, spread=False))]
            else:
                counts[key] = [state[key]]
        values = []
        for request in requests:
            field, scope = request if isinstance(request, tuple) else (request, 0)
            key, unit = FIELDS[field]
            value = counts[key][scope] if scope < len(counts.get(key, ())) else None
            ok = value is not None
            values.append(
                SimpleNamespace(
                    fieldId=field,
                    scopeId=scope,
                    nvmlReturn=pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                    valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=SimpleNamespace(ullVal=int(value // unit) if ok else 0),
                )
            )
        return values

    def nvmlGpmQueryDeviceSupport(self, h: FakeHandle) -> SimpleNamespace:  # noqa: N802
        state = self.gpu_state(h.index)
        return SimpleNamespace(
            isSupportedDevice=int(any(state.get(k) is not None for k in GPM_KEYS.values()))
        )

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        buffer = ctypes.create_string_buffer(8)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        self._gpm_samples[ctypes.addressof(buffer)] = (buffer, {})
        return sample

    def nvmlGpmSampleGet(self, h: FakeHandle, sample: Any) -> Any:  # noqa: N802
        """A GPM sample is a moment: the metrics between two average the activity between."""
        self._value(h, "uuid", "gpm")
        stored = self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value][1]
        stored.update(gpu=h.index, t=self.clock())
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:  # noqa: N802
        """The mean activity over the samples after sample1 up to sample2; with none between
        them (two samples at one moment), the activity now."""
        first = self._gpm_samples[ctypes.cast(request.sample1, ctypes.c_void_p).value][1]
        last = self._gpm_samples[ctypes.cast(request.sample2, ctypes.c_void_p).value][1]
        index = int(last["gpu"])
        spanned = [s.values for s in self._sampled(index) if first["t"] < s.t <= last["t"]]
        state = self.gpu_state(index)
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            key = GPM_KEYS.get(metric.metricId)
            if key is None or state.get(key) is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            seen = [v[key] for v in spanned if v[key] is not None]
            metric.value = 100 * (sum(seen) / len(seen) if seen else state[key])
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return request

    def nvmlDeviceGetMigMode(self, h: FakeHandle) -> list[int]:  # noqa: N802
        mode = int(self._value(h, "mig_mode", "mig"))
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeHandle) -> int:  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeHandle, slot: int) -> FakeHandle:  # noqa: N802
        if slot >= len(self.gpu_state(h.index).get("mig") or []):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(h.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, h: FakeHandle) -> int:  # noqa: N802
        return self._value(h, "gpu_instance", "mig")

    def nvmlDeviceGetComputeInstanceId(self, h: FakeHandle) -> int:  # noqa: N802
        return self._value(h, "compute_instance", "mig")

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle) -> list[Any]:  # noqa: N802
        procs = self._value(h, "processes", "processes")
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used_memory")) for p in procs]

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802
        return FakeEventSet()

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, types: int, event_set: FakeEventSet):  # noqa: N802
        self._value(h, "uuid", "xids")
        event_set.gpu = h.index

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        """Deliver one XID the state counts but this event set has not delivered yet."""
        state = self.gpu_state(event_set.gpu or 0)
        for xid, count in (state.get("xids") or {}).items():
            xid = int(xid)
            if event_set.delivered.get(xid, 0) < count:
                event_set.delivered[xid] = event_set.delivered.get(xid, 0) + 1
                return SimpleNamespace(
                    eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
                )
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
