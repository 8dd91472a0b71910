"""Health readings: exporter series -> `health_samples` signals, one row per change.

A health series (an XID count, an ECC counter, a row-remap flag, an InfiniBand port state...)
stays flat for months and then moves once; storing it every round would be millions of rows
that say nothing. So a series gets a row for its first reading after the collector starts
and then only when its value differs from the last one seen. Signal names are the contract of
docs/health.md ("Readings"); label values become part of a name only when known (an XID code is
digits), so a payload cannot invent signals.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from datetime import datetime
from sys import intern
from typing import Any, NamedTuple

from sing.collector.dcgm_fields import names as dcgm_names
from sing.collector.promtext import ParseError, Sample
from sing.digits import ascii_digits

# (component, device, gpu uuid or None, signal) -> value, for one node.
HealthValues = dict[tuple[str, str, str | None, str], float]

ECC_TYPES = {"corrected", "uncorrected"}
ECC_COUNTERS = {"volatile", "aggregate"}
RETIREMENT_CAUSES = {"sbe", "dbe"}
REMAP_TYPES = {"correctable", "uncorrectable"}
# The bits of NVML's clock event (throttle) reason mask that mean hardware trouble (nvml.h's
# nvmlClocksEventReason*); the others (idle, power cap, application clocks) are a healthy GPU's.
THROTTLE_BITS = {"hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}
NVLINK_ERRORS = {"crc", "replay", "recovery"}
# The InfiniBand error counters (sysfs file names) that are health signals.
PORT_ERRORS = {"link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors"}


Signal = Callable[[Sample], "str | None"]  # a sample's signal name; None: not a health signal


def _xid(s: Sample) -> str | None:
    code = _label(s, "xid")
    return f"xid_{code}" if ascii_digits(code) else None


def _windowed_xid(s: Sample) -> str | None:
    """dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: a GPU with no XID in the window has one series
    without an `xid` label (value 0), which names no signal."""
    return _xid(s) if "xid" in s.labels else None


def _ecc(s: Sample) -> str | None:
    kind = _label(s, "type")
    counter = s.labels.get("counter", "volatile")  # sing exporters before aggregate: volatile
    return f"ecc_{kind}_{counter}" if kind in ECC_TYPES and counter in ECC_COUNTERS else None


def _one_of(label: str, known: set[str], template: str) -> Signal:
    """The signal named by `template` with a label's value, when the value is a known one."""
    return lambda s: template.format(value) if (value := _label(s, label)) in known else None


def _fixed(name: str) -> Signal:
    return lambda s: name


# sing's exporter, then dcgm-exporter's fields (its DCGM_FI_DEV_XID_ERRORS is the last XID, not
# a count: not taken; DCGM_EXP_XID_ERRORS_COUNT is).
GPU_SIGNALS: dict[str, Signal] = {
    "sing_gpu_xid_errors_total": _xid,
    "sing_gpu_ecc_errors_total": _ecc,
    "sing_gpu_retired_pages": _one_of("type", RETIREMENT_CAUSES, "retired_pages_{}"),
    "sing_gpu_retired_pages_pending": _fixed("retired_pages_pending"),
    "sing_gpu_row_remap_rows": _one_of("type", REMAP_TYPES, "row_remap_{}"),
    "sing_gpu_row_remap_pending": _fixed("row_remap_pending"),
    "sing_gpu_row_remap_failed": _fixed("row_remap_failed"),
    "sing_gpu_pcie_replays_total": _fixed("pcie_replays"),
    "sing_gpu_nvlink_errors_total": _one_of("type", NVLINK_ERRORS, "nvlink_{}_errors"),
    # dcgm-exporter's, under every name DCGM 3.x to 4.6 gives them (sing/collector/dcgm_fields.py)
    **{name: _fixed(f.target) for name, f in dcgm_names("signal").items()},
    **{name: _windowed_xid for name in dcgm_names("xid_count")},
}
# sing's exporter, then node_exporter's InfiniBand collector.
RDMA_SIGNALS: dict[str, Signal] = {
    "sing_rdma_link_state": _fixed("link_state"),
    "sing_rdma_physical_state": _fixed("physical_state"),
    "sing_rdma_port_errors_total": _one_of("counter", PORT_ERRORS, "{}"),
    "node_infiniband_state_id": _fixed("link_state"),
    "node_infiniband_physical_state_id": _fixed("physical_state"),
    "node_infiniband_link_downed_total": _fixed("link_downed"),
    "node_infiniband_link_error_recovery_total": _fixed("link_error_recovery"),
    "node_infiniband_symbol_error_total": _fixed("symbol_error"),
    "node_infiniband_port_errors_received_total": _fixed("port_rcv_errors"),
}
# Bitmasks: one GPU series, a flag signal per bit.
THROTTLE_FLAGS = {f"throttle_{name}": bit for name, bit in THROTTLE_BITS.items()}
GPU_BITMASKS: dict[str, dict[str, int]] = {
    "sing_gpu_clock_event_reasons": THROTTLE_FLAGS,
    **{name: THROTTLE_FLAGS for name in dcgm_names("throttle_mask")},
}
HEALTH_METRICS = frozenset(GPU_SIGNALS) | frozenset(GPU_BITMASKS) | frozenset(RDMA_SIGNALS)


def add_health(values: HealthValues, s: Sample) -> None:
    """Fold one sample of a HEALTH_METRICS series into a node's health values. The key's
    strings are interned: the collector keeps every node's last values (`LastValues`), and a
    fleet's devices, UUIDs and signal names are each one string then, not one per series."""
    if not math.isfinite(s.value):
        return
    rdma_signal = RDMA_SIGNALS.get(s.name)
    key: tuple[str, str, str | None]
    if rdma_signal is not None:
        signal = rdma_signal(s)
        key = ("rdma", intern(f"{_label(s, 'device')}/{_label(s, 'port')}"), None)
    else:
        if s.labels.get("GPU_I_ID"):
            return  # a MIG instance of dcgm-exporter; health is per physical GPU
        gpu = _label(s, "gpu")
        if not ascii_digits(gpu):
            raise ParseError(f"{s.name}: gpu label {gpu!r} is not a number")
        uuid = s.labels.get("uuid") or s.labels.get("UUID")
        key = ("gpu", intern(str(int(gpu))), intern(uuid) if uuid else None)
        flags = GPU_BITMASKS.get(s.name)
        if flags is not None:
            mask = int(s.value)
            for name, bit in flags.items():
                values[(*key, name)] = float(bool(mask & bit))
            return
        signal = GPU_SIGNALS[s.name](s)
    if signal is not None:
        values[(*key, intern(signal))] = s.value


# (component, device, signal): a series' key without its GPU UUID, the same on every node
SeriesKey = tuple[str, str, str]


def _sort_key(key: tuple[str, str, str | None, str]) -> tuple[str, ...]:
    """A series' place in a node's order (None sorts as "")."""
    return tuple(part or "" for part in key)


class NodeSeries(NamedTuple):
    """One node's last health values, each series at the same position in the three tuples,
    in the order of their keys. `keys` is the same on every node with the same series, and
    the fleet shares one tuple of it (`LastValues`): at 1,000 8-GPU nodes of 152 series each
    (their GPUs' UUIDs all different), a dict entry and a key tuple per series took 15 MB,
    this takes 2.9 MB (tracemalloc)."""

    keys: tuple[SeriesKey, ...]
    uuids: tuple[str | None, ...]
    values: array  # of doubles: no float object per value

    def as_values(self) -> HealthValues:
        return {
            (component, device, uuid, signal): value
            for (component, device, signal), uuid, value in zip(
                self.keys, self.uuids, self.values, strict=True
            )
        }


class LastValues:
    """The last value of each health series, by node, to write a row only when it changes.
    A series that is not in a node's reading (its GPU lost, one of its targets failed) keeps its
    last value."""

    def __init__(self, nodes: dict[tuple[str, str], NodeSeries] | None = None) -> None:
        self._nodes: dict[tuple[str, str], NodeSeries] = dict(nodes or {})
        # each node's `keys`, one tuple per distinct set of series
        self._shared: dict[tuple[SeriesKey, ...], tuple[SeriesKey, ...]] = {
            n.keys: n.keys for n in self._nodes.values()
        }

    def of(self, cluster: str, node: str) -> HealthValues:
        """The node's last values ({} before its first reading)."""
        last = self._nodes.get((cluster, node))
        return {} if last is None else last.as_values()

    def remember(self, cluster: str, node: str, values: HealthValues) -> None:
        """Make `values` the node's last values, all of its series."""
        ordered = sorted(values.items(), key=lambda item: _sort_key(item[0]))
        keys = tuple((c, d, s) for (c, d, _, s), _ in ordered)
        shared = self._shared.setdefault(keys, keys)
        uuids = tuple(u for (_, _, u, _), _ in ordered)
        numbers = array("d", (v for _, v in ordered))
        self._nodes[(cluster, node)] = NodeSeries(shared, uuids, numbers)
        if len(self._shared) > 2 * len(self._nodes) + 100:  # sets no node has any more
            self._shared = {n.keys: n.keys for n in self._nodes.values()}

    def copy(self) -> LastValues:
        """A snapshot, to go back to when the rows computed from here are not written."""
        return LastValues(self._nodes)


def health_rows(
    last: LastValues, ts: datetime, cluster: str, node: str, values: HealthValues
) -> list[dict[str, Any]]:
    """`health_samples` rows for the series of one node whose value changed: its first reading
    of a series since the collector started, or a different one.

    An XID count lives in the exporter's memory: when a GPU still answers but its XID series is
    gone, the exporter restarted (a reboot, an upgrade) and its counts start over, so the series
    gets a 0 row. Otherwise the same XID coming back at the same count would look unchanged and
    open no incident. A GPU that is not in the reading at all (lost, or the scrape failed) keeps
    its counts."""
    before = last.of(cluster, node)
    if before == values:
        return []  # every value as remembered: no XID series can have vanished either
    gpus = {key[:3] for key in values}
    for series, value in before.items():
        if value and series[3].startswith("xid_") and series[:3] in gpus and series not in values:
            values = {**values, series: 0.0}
    rows = [
        {
            "ts": ts,
            "cluster": cluster,
            "node": node,
            "component": component,
            "device": device,
            "gpu_uuid": uuid,
            "signal": signal,
            "value": value,
        }
        for (component, device, uuid, signal), value in sorted(
            values.items(), key=lambda item: _sort_key(item[0])
        )
        if before.get((component, device, uuid, signal)) != value
    ]
    last.remember(cluster, node, {**before, **values})
    return rows


def _label(s: Sample, name: str) -> str:
    try:
        return s.labels[name]
    except KeyError:
        raise ParseError(f"{s.name} has no {name!r} label") from None
