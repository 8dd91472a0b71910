"""The one InfiniBand traffic-counter rule, shared by sing's exporter and the collector.

A port's traffic can reach sing two ways: sing's exporter reads sysfs itself
(sing/exporters/rdma.py), or the collector ingests node_exporter's `node_infiniband_*` series
(sing/collector/convert.py). Both must give the same answer for the same sysfs tree, so both call
`traffic_value` here.

sysfs has up to two copies of each traffic counter (Linux drivers/infiniband/core/sysfs.c;
prometheus/procfs sysfs/class_infiniband.go): `counters/<name>`, 64-bit when the adapter has
extended counters (mlx5) and 32-bit otherwise, and on kernels before 4.5 the 64-bit
`counters_ext/<name>_64`, which node_exporter exports as `node_infiniband_legacy_*`. The 64-bit
copy wins. A 32-bit counter does not wrap: it stops at 2^32 - 1 (InfiniBand PortCounters), so a
`counters/` value of exactly 2^32 - 1 words (or packets) with no 64-bit copy is unknown, not a
count that stopped moving. (A 64-bit `counters/` that reads exactly 2^32 - 1 is one value in 2^32
and is read as unknown too: not worth a doubt.)
"""

from __future__ import annotations

from dataclasses import dataclass

# port_xmit_data and port_rcv_data count 4-byte words (InfiniBand spec, PortCounters).
DATA_WORD_BYTES = 4
SATURATED_32BIT = 2**32 - 1


@dataclass(frozen=True)
class TrafficCounter:
    """One traffic counter under every name it has in sysfs and in node_exporter."""

    column: str  # rdma_samples column
    counter: str  # counters/ file
    extended: str  # counters_ext/ file
    scale: int  # sysfs unit -> bytes or packets
    node_exporter: str  # node_exporter's series for counters/ (already scaled)
    node_exporter_legacy: str  # ... and for counters_ext/

    @property
    def stuck(self) -> int:
        """The scaled value of a 32-bit counter stuck at its maximum."""
        return SATURATED_32BIT * self.scale


TRAFFIC = (
    TrafficCounter(
        "tx_bytes",
        "port_xmit_data",
        "port_xmit_data_64",
        DATA_WORD_BYTES,
        "node_infiniband_port_data_transmitted_bytes_total",
        "node_infiniband_legacy_data_transmitted_bytes_total",
    ),
    TrafficCounter(
        "rx_bytes",
        "port_rcv_data",
        "port_rcv_data_64",
        DATA_WORD_BYTES,
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_legacy_data_received_bytes_total",
    ),
    TrafficCounter(
        "tx_packets",
        "port_xmit_packets",
        "port_xmit_packets_64",
        1,
        "node_infiniband_port_packets_transmitted_total",
        "node_infiniband_legacy_packets_transmitted_total",
    ),
    TrafficCounter(
        "rx_packets",
        "port_rcv_packets",
        "port_rcv_packets_64",
        1,
        "node_infiniband_port_packets_received_total",
        "node_infiniband_legacy_packets_received_total",
    ),
)


def traffic_value(counter: TrafficCounter, plain: int | None, extended: int | None) -> int | None:
    """Bytes or packets from the `counters/` and `counters_ext/` values, both already scaled
    (x4 for data); None when the traffic is unknown. At least one of them must be given."""
    if extended is not None:
        return extended
    if plain is None:
        raise ValueError(f"{counter.counter}: neither counters/ nor counters_ext/ was read")
    return None if plain == counter.stuck else plain
