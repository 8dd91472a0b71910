"""RDMA (InfiniBand and RoCE) port traffic from sysfs, laid out as Linux lays it out.

Reads /sys/class/infiniband/<device>/ports/<port>/: `counters/`, `counters_ext/`, `hw_counters/`,
`rate`, `state`, `phys_state` and `link_layer`. A missing file or one reading "N/A" (or
"N/A (no PMA)") is skipped: not every adapter has every counter.

Which copy of a traffic counter is read, and when a 32-bit one is unknown, is sing/infiniband.py's
rule, shared with the collector's reading of node_exporter: an unknown counter's series is left
out and `sing_rdma_counter_saturated` says so.

`rate` reads e.g. "100 Gb/sec (4X EDR)" or "40 Gb/sec", and "0 GB/sec" has been seen on real
ports (issue 28). The number is read as Gbit/s whatever the case of the unit, as
prometheus/procfs reads it, so such a port exports a rate of 0 (no link, or the rate unknown)
instead of counting a parse error every scrape.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sing.exporters.errors import ErrorCounter
from sing.infiniband import TRAFFIC, traffic_value

# rdma_samples column -> (metric name, help)
TRAFFIC_METRICS = {
    "tx_bytes": ("sing_rdma_transmit_bytes", "Bytes sent."),
    "rx_bytes": ("sing_rdma_receive_bytes", "Bytes received."),
    "tx_packets": ("sing_rdma_transmit_packets", "Packets sent."),
    "rx_packets": ("sing_rdma_receive_packets", "Packets received."),
}
ERROR_COUNTERS = (
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "link_error_recovery",
    "link_downed",
)
NOT_COUNTERS = {"lifespan"}  # hw_counters/lifespan is a refresh setting, not a count
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*G[bB]/sec\b")
_STATE = re.compile(r"^\s*(\d+)\s*:")


class RdmaSource:
    """Reads every port's files; each directory is listed once, so absent counters cost nothing."""

    def __init__(self, sysfs_root: str | Path, errors: ErrorCounter) -> None:
        self.root = os.path.join(sysfs_root, "class", "infiniband")
        self.errors = errors

    def _read(self, path: str) -> str | None:
        """A sysfs file's text, or None when absent or "N/A"; other failures are counted."""
        try:  # os.open/os.read: a third of open()'s cost, and a port has dozens of files
            fd = os.open(path, os.O_RDONLY)
            try:
                text = os.read(fd, 4096).decode(errors="replace").strip()
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError:
            self.errors.count("rdma", "read_error")
            return None
        return None if text == "" or text.startswith("N/A") else text

    def _number(self, path: str) -> int | None:
        text = self._read(path)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            self.errors.count("rdma", "parse_error")
            return None

    def _parsed(self, path: str, pattern: re.Pattern[str]) -> float | None:
        text = self._read(path)
        if text is None:
            return None
        match = pattern.match(text)
        if match is None:
            self.errors.count("rdma", "parse_error")
            return None
        return float(match.group(1))

    def ports(self) -> list[tuple[str, str, str]]:
        """(device, port, path) for every port, in a stable order."""
        return [
            (device, port, os.path.join(self.root, device, "ports", port))
            for device in _listdir(self.root)
            for port in _listdir(os.path.join(self.root, device, "ports"))
        ]

    def _counters(self, path: str) -> dict[str, int]:
        """Every readable number in a counters directory, by file name."""
        values = {}
        for name in _listdir(path):
            if name not in NOT_COUNTERS and (value := self._number(f"{path}/{name}")) is not None:
                values[name] = value
        return values

    def metrics(self) -> list[Metric]:
        labels = ["device", "port"]
        traffic = [CounterMetricFamily(*TRAFFIC_METRICS[c.column], labels=labels) for c in TRAFFIC]
        port_errors = CounterMetricFamily(
            "sing_rdma_port_errors",
            "Port error counters by counter name.",
            labels=[*labels, "counter"],
        )
        hw = CounterMetricFamily(
            "sing_rdma_hw_counter",
            "Adapter-specific hw_counters by name.",
            labels=[*labels, "counter"],
        )
        rate = GaugeMetricFamily(
            "sing_rdma_link_rate_bytes_per_second", "Link signalling rate.", labels=labels
        )
        state = GaugeMetricFamily(
            "sing_rdma_link_state", "Logical port state (4 = ACTIVE).", labels=labels
        )
        phys = GaugeMetricFamily(
            "sing_rdma_physical_state", "Physical port state (5 = LinkUp).", labels=labels
        )
        info = GaugeMetricFamily(
            "sing_rdma_port_info", "Port link layer.", labels=[*labels, "link_layer"]
        )
        saturated = GaugeMetricFamily(
            "sing_rdma_counter_saturated",
            "1: this 32-bit traffic counter is stuck at 2^32-1, so its series is left out "
            "(unknown, not zero); 0: its series is exported.",
            labels=[*labels, "counter"],
        )
        for device, port, path in self.ports():
            key = [device, port]
            counters = self._counters(f"{path}/counters")
            extended = self._counters(f"{path}/counters_ext")
            for family, counter in zip(traffic, TRAFFIC, strict=True):
                plain, ext = counters.get(counter.counter), extended.get(counter.extended)
                if plain is None and ext is None:
                    continue
                value = traffic_value(
                    counter,
                    None if plain is None else plain * counter.scale,
                    None if ext is None else ext * counter.scale,
                )
                saturated.add_metric([*key, counter.counter], float(value is None))
                if value is not None:
                    family.add_metric(key, value)
            for name in ERROR_COUNTERS:
                if name in counters:
                    port_errors.add_metric([*key, name], counters[name])
            for name, value in self._counters(f"{path}/hw_counters").items():
                hw.add_metric([*key, name], value)
            if (gbit := self._parsed(f"{path}/rate", _RATE)) is not None:
                rate.add_metric(key, gbit * 1e9 / 8)
            if (code := self._parsed(f"{path}/state", _STATE)) is not None:
                state.add_metric(key, code)
            if (code := self._parsed(f"{path}/phys_state", _STATE)) is not None:
                phys.add_metric(key, code)
            if (layer := self._read(f"{path}/link_layer")) is not None:
                info.add_metric([*key, layer], 1)
        return [*traffic, saturated, rate, state, phys, info, port_errors, hw]


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
