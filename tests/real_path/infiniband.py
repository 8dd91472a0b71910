"""A node's InfiniBand ports in the real sysfs layout, with traffic the test drives itself.

Written here from the kernel's layout, not with the exporter's code (a fake must not import what
it checks): `<root>/class/infiniband/<device>/ports/<port>/counters/port_{xmit,rcv}_{data,packets}`
plus `rate`, `state`, `phys_state` and `link_layer`. The data counters count 4-byte words
(InfiniBand spec, PortCounters: PortXmitData "divided by 4"). A 32-bit counter that reached
2^32 - 1 stays there (it saturates, it does not wrap), which is how old adapters lose traffic.

Traffic flows only in a *burst*: each port's counters rise at its rates for exactly `duration_s`
and then stop, the last write setting the exact final value, so the bytes a job sent are known
exactly however the writer thread was scheduled.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

WORD_BYTES = 4
SATURATED_32 = 2**32 - 1
MTU_BYTES = 4096  # packets are counted as if full
STEP_S = 0.2  # how often the burst rewrites the counters


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    rate: str  # as sysfs says it, e.g. "200 Gb/sec (4X HDR)"
    tx_words: int  # counter values before the burst
    rx_words: int
    tx_bytes_per_s: float  # during the burst
    rx_bytes_per_s: float
    rx_saturated: bool = False  # a 32-bit port_rcv_data stuck at 2^32 - 1 throughout

    def burst_bytes(self, duration_s: float) -> tuple[int, int | None]:
        """(tx, rx) bytes the burst adds; rx None when its counter is saturated (unknown)."""
        tx, rx = self.tx_bytes_per_s * duration_s, self.rx_bytes_per_s * duration_s
        for value in (tx, rx):
            if value != int(value) or int(value) % WORD_BYTES:
                raise ValueError(f"{self.device}: choose rates giving whole words, not {value}")
        return int(tx), None if self.rx_saturated else int(rx)


class IbTree:
    """The InfiniBand part of one node's /sys, under `root` (the exporter's --sysfs-root)."""

    def __init__(self, root: Path, ports: list[Port]) -> None:
        self.root = root
        self.ports = ports
        for p in ports:
            base = self._port_dir(p)
            (base / "counters").mkdir(parents=True, exist_ok=True)
            self._write(base / "rate", p.rate)
            self._write(base / "state", "4: ACTIVE")
            self._write(base / "phys_state", "5: LinkUp")
            self._write(base / "link_layer", "InfiniBand")
        self.write_counters(0.0)

    def _port_dir(self, p: Port) -> Path:
        return self.root / "class" / "infiniband" / p.device / "ports" / str(p.port)

    def write_counters(self, elapsed_s: float) -> None:
        """Counters after `elapsed_s` seconds of burst."""
        for p in self.ports:
            tx = p.tx_words + int(p.tx_bytes_per_s * elapsed_s) // WORD_BYTES
            rx = p.rx_words + int(p.rx_bytes_per_s * elapsed_s) // WORD_BYTES
            counters = self._port_dir(p) / "counters"
            self._write(counters / "port_xmit_data", tx)
            self._write(counters / "port_rcv_data", SATURATED_32 if p.rx_saturated else rx)
            self._write(counters / "port_xmit_packets", tx * WORD_BYTES // MTU_BYTES)
            self._write(counters / "port_rcv_packets", rx * WORD_BYTES // MTU_BYTES)

    def _write(self, path: Path, value: object) -> None:
        """Replace a file whole (a sysfs read never sees half a value), staging it outside
        the port's directories so the exporter never lists a file real sysfs lacks."""
        staging = self.root / ".staging"
        staging.mkdir(exist_ok=True)
        tmp = staging / f"{threading.get_ident()}.tmp"
        tmp.write_text(f"{value}\n")
        os.replace(tmp, path)


class BurstThread(threading.Thread):
    """Drives the trees' counters through one burst of `duration_s` in the background."""

    def __init__(self, trees: list[IbTree], duration_s: float) -> None:
        super().__init__(name="ib-burst", daemon=True)
        self.trees, self.duration_s = trees, duration_s

    def run(self) -> None:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < self.duration_s:
            for tree in self.trees:
                tree.write_counters(elapsed)
            time.sleep(STEP_S)
        for tree in self.trees:
            tree.write_counters(self.duration_s)  # exactly the burst's bytes, however late
