"""One sysfs tree, one answer: sing's exporter and node_exporter's series give the same rdma rows.

The same InfiniBand port reaches the warehouse through sing's exporter (it reads sysfs) or
through node_exporter's `node_infiniband_*` series (the collector ingests them). Both go through
sing/infiniband.py's rule: the 64-bit copy wins, a 32-bit counter stuck at 2^32-1 is unknown.
Tested on node_exporter's own fixture pair (its sysfs tree and the page it exports for it) and on
a tree with stuck counters, whose node_exporter page is written here from node_exporter's
mapping (collector/infiniband_linux.go; procfs sysfs/class_infiniband.go multiplies the data
counters by 4), not with sing's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sing.collector.convert import WANTED, read_node
from sing.collector.promtext import parse
from sing.exporters.errors import ErrorCounter
from sing.exporters.rdma import RdmaSource

FIXTURES = Path(__file__).parent / "fixtures" / "node_exporter_ib"
STUCK = 2**32 - 1

Ports = dict[tuple[str, int], dict[str, int | None]]


def untar(ttar: Path, root: Path) -> None:
    """Unpack a ttar archive (node_exporter's fixture format: `Directory:`/`Path:` entries,
    `Lines: n` then n lines of content, then `Mode:`)."""
    lines = iter(ttar.read_text().splitlines())
    for line in lines:
        if line.startswith("Directory: "):
            (root / line.removeprefix("Directory: ")).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = root / line.removeprefix("Path: ")
            count = int(next(lines).removeprefix("Lines: "))
            path.write_text("".join(next(lines) + "\n" for _ in range(count)))


class _Rdma:
    def __init__(self, source: RdmaSource) -> None:
        self.source = source

    def collect(self):
        return self.source.metrics()


def exporter_page(sys_root: Path, errors: ErrorCounter | None = None) -> str:
    """What sing's exporter serves for the tree (its RDMA part)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Rdma(RdmaSource(sys_root, errors or ErrorCounter())))
    return generate_latest(registry).decode()


def rows(page: str) -> Ports:
    """The rdma columns the collector stores for a page."""
    return read_node(parse(page, WANTED)).ports


def test_node_exporter_fixture_pair_gives_one_answer(tmp_path: Path) -> None:
    untar(FIXTURES / "sys_class_infiniband.ttar", tmp_path)
    ours = rows(exporter_page(tmp_path / "sys"))
    theirs = rows((FIXTURES / "e2e-output-infiniband.txt").read_text())
    # counters_ext wins: port 2's counters/port_rcv_data reads 0, its port_rcv_data_64 4631917
    # words; port 1's port_rcv_packets_64 reads 0 beside a 32-bit counters/ of 6825908347
    expected = {
        ("mlx4_0", port): {
            "tx_bytes": 3733440 * 4,
            "rx_bytes": 4631917 * 4,
            "tx_packets": 0,
            "rx_packets": 0,
        }
        for port in (1, 2)
    }
    assert ours == theirs == expected  # i40iw0 reads "N/A (no PMA)": no traffic row either way


# node_exporter's series per sysfs file (collector/infiniband_linux.go), value x4 for data.
NODE_EXPORTER_NAMES = {
    ("counters", "port_xmit_data"): ("port_data_transmitted_bytes_total", 4),
    ("counters", "port_rcv_data"): ("port_data_received_bytes_total", 4),
    ("counters", "port_xmit_packets"): ("port_packets_transmitted_total", 1),
    ("counters", "port_rcv_packets"): ("port_packets_received_total", 1),
    ("counters_ext", "port_xmit_data_64"): ("legacy_data_transmitted_bytes_total", 4),
    ("counters_ext", "port_rcv_data_64"): ("legacy_data_received_bytes_total", 4),
    ("counters_ext", "port_xmit_packets_64"): ("legacy_packets_transmitted_total", 1),
    ("counters_ext", "port_rcv_packets_64"): ("legacy_packets_received_total", 1),
    ("counters_ext", "port_unicast_xmit_packets"): ("legacy_unicast_packets_transmitted_total", 1),
    ("counters", "unicast_xmit_packets"): ("unicast_packets_transmitted_total", 1),
}

# (device, port) -> directory -> file -> value, as the kernel writes them
TREE = {
    # mlx4 on an old kernel: 32-bit counters/ stuck, 64-bit counters_ext/ moving
    ("mlx4_0", 1): {
        "counters": {
            "port_xmit_data": STUCK,
            "port_rcv_data": STUCK,
            "port_xmit_packets": STUCK,
            "port_rcv_packets": 123,
            "unicast_xmit_packets": 5,
        },
        "counters_ext": {
            "port_xmit_data_64": 9_000_000_000,
            "port_rcv_data_64": 8_000_000_000,
            "port_xmit_packets_64": 7_000_000_000,
            "port_rcv_packets_64": 6_000_000_000,
            "port_unicast_xmit_packets": 5,
        },
    },
    # a 32-bit adapter with no counters_ext: stuck counters are unknown, the others are read
    ("qib0", 1): {
        "counters": {
            "port_xmit_data": STUCK,
            "port_rcv_data": 1000,
            "port_xmit_packets": 250,
            "port_rcv_packets": STUCK,
        },
    },
    # mlx5: 64-bit counters/ only
    ("mlx5_0", 1): {
        "counters": {
            "port_xmit_data": 10**12,
            "port_rcv_data": 2 * 10**12,
            "port_xmit_packets": 10**9,
            "port_rcv_packets": 2 * 10**9,
        },
    },
}


def write_tree(root: Path) -> None:
    for (device, port), dirs in TREE.items():
        base = root / "class" / "infiniband" / device / "ports" / str(port)
        for name, text in (("rate", "100 Gb/sec (4X EDR)"), ("state", "4: ACTIVE")):
            base.mkdir(parents=True, exist_ok=True)
            (base / name).write_text(text + "\n")
        for directory, files in dirs.items():
            (base / directory).mkdir()
            for name, value in files.items():
                (base / directory / name).write_text(f"{value}\n")


def node_exporter_page() -> str:
    """node_exporter's page for TREE, from its mapping (values as floats, as it prints them)."""
    lines = []
    for (device, port), dirs in TREE.items():
        for directory, files in dirs.items():
            for name, value in files.items():
                metric, scale = NODE_EXPORTER_NAMES[(directory, name)]
                labels = f'device="{device}",port="{port}"'
                lines.append(f"node_infiniband_{metric}{{{labels}}} {float(value * scale)!r}")
    return "\n".join(lines) + "\n"


def test_stuck_counters_are_unknown_through_both_paths(tmp_path: Path) -> None:
    write_tree(tmp_path)
    ours = rows(exporter_page(tmp_path))
    theirs = rows(node_exporter_page())
    expected = {
        ("mlx4_0", 1): {
            "tx_bytes": 36_000_000_000,
            "rx_bytes": 32_000_000_000,
            "tx_packets": 7_000_000_000,
            "rx_packets": 6_000_000_000,
        },
        ("qib0", 1): {"tx_bytes": None, "rx_bytes": 4000, "tx_packets": 250, "rx_packets": None},
        ("mlx5_0", 1): {
            "tx_bytes": 4 * 10**12,
            "rx_bytes": 8 * 10**12,
            "tx_packets": 10**9,
            "rx_packets": 2 * 10**9,
        },
    }
    assert ours == theirs == expected


def test_legacy_series_win_in_either_order() -> None:
    legacy = 'node_infiniband_legacy_data_received_bytes_total{device="d",port="1"} 1e+12\n'
    plain = f'node_infiniband_port_data_received_bytes_total{{device="d",port="1"}} {STUCK * 4}\n'
    assert rows(legacy + plain) == rows(plain + legacy) == {("d", 1): {"rx_bytes": 10**12}}
    assert rows(plain) == {("d", 1): {"rx_bytes": None}}  # 17179869180 bytes: stuck, unknown


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("100 Gb/sec (4X EDR)", 12.5e9),
        ("2.5 Gb/sec (1X SDR)", 312.5e6),
        ("40 Gb/sec", 5e9),
        ("0 GB/sec", 0.0),  # no link: a rate of 0, not a parse error
    ],
)
def test_link_rate_forms(tmp_path: Path, text: str, bytes_per_s: float) -> None:
    base = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    base.mkdir(parents=True)
    (base / "rate").write_text(text + "\n")
    errors = ErrorCounter()
    page = exporter_page(tmp_path, errors)
    (sample,) = parse(page, {"sing_rdma_link_rate_bytes_per_second"})
    assert sample.value == bytes_per_s
    assert list(errors.metric().samples) == []


def test_unreadable_rate_is_still_a_parse_error(tmp_path: Path) -> None:
    base = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    base.mkdir(parents=True)
    (base / "rate").write_text("fast\n")
    errors = ErrorCounter()
    assert parse(exporter_page(tmp_path, errors), {"sing_rdma_link_rate_bytes_per_second"}) == []
    assert [(s.labels, s.value) for s in errors.metric().samples] == [
        ({"source": "rdma", "kind": "parse_error"}, 1.0)
    ]
