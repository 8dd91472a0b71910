"""prometheus/procfs's InfiniBand fixture read by sing's exporter: the answers procfs's own test
expects (sysfs/class_infiniband_test.go, TestInfiniBandClass and TestParseSlowRate).

The tree (tests/fixtures/procfs_ib/) is procfs's `sys/class/infiniband`: hfi1_0 (Omni-Path),
mlx4_0 (two ports) and mlx5_0 (with hw_counters). Its `counters/` hold values past 2^32 and no
`counters_ext/`, so every traffic value is the `counters/` file's (data x4), as procfs reads it;
the 64-bit-copy and stuck-32-bit rules are tried in tests/test_ingest_infiniband.py.

Where sing differs, by design (docs/exporter.md): `hw_counters/lifespan` is a refresh setting,
not exported; `port_xmit_wait` is not an error counter, not exported; a `rate` that does not parse
drops that port's rate (counted as `rdma/parse_error`) where procfs fails the whole class.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sing.exporters.errors import ErrorCounter
from tests.test_ingest_infiniband import exporter_page, rows, untar

FIXTURES = Path(__file__).parent / "fixtures" / "procfs_ib"


def series(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exporter's page: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def port_values(page: str, name: str) -> dict[tuple[str, str], float]:
    """One per-port series: (device, port) -> value."""
    return {
        (dict(labels)["device"], dict(labels)["port"]): value
        for (sample, labels), value in series(page).items()
        if sample == name
    }


def test_traffic_matches_procfs_class_infiniband_test(tmp_path: Path) -> None:
    untar(FIXTURES / "sys_class_infiniband.ttar", tmp_path)
    errors = ErrorCounter()
    page = exporter_page(tmp_path / "fixtures" / "sys", errors)
    # procfs's PortXmitData/PortRcvData (words x4) and packet counts, per port
    assert rows(page) == {
        ("hfi1_0", 1): {
            "tx_bytes": 1094233306172,
            "rx_bytes": 1380366808104,
            "tx_packets": 568318856,
            "rx_packets": 638036947,
        },
        ("mlx4_0", 1): {
            "tx_bytes": 106036453180,
            "rx_bytes": 8884894436,
            "tx_packets": 85734114,
            "rx_packets": 87169372,
        },
        ("mlx4_0", 2): {
            "tx_bytes": 106161427560,
            "rx_bytes": 9841747136,
            "tx_packets": 88622850,
            "rx_packets": 89332064,
        },
        ("mlx5_0", 1): {
            "tx_bytes": 11523046035392,
            "rx_bytes": 72505381512,
            "tx_packets": 10907922116,
            "rx_packets": 541889824,
        },
    }
    saturated = port_values(page, "sing_rdma_counter_saturated")
    assert set(saturated.values()) == {0.0}  # no counter stuck at 2^32-1 in this tree
    assert errors.metric().samples == []  # nothing failed to read or parse


def test_rate_and_states_match_procfs(tmp_path: Path) -> None:
    untar(FIXTURES / "sys_class_infiniband.ttar", tmp_path)
    page = exporter_page(tmp_path / "fixtures" / "sys")
    # procfs's Rate (bytes/s), StateID and PhysStateID
    assert port_values(page, "sing_rdma_link_rate_bytes_per_second") == {
        ("hfi1_0", "1"): 12500000000,  # 100 Gb/sec (4X EDR)
        ("mlx4_0", "1"): 5000000000,  # 40 Gb/sec (4X QDR)
        ("mlx4_0", "2"): 5000000000,
        ("mlx5_0", "1"): 3125000000,  # 25 Gb/sec (1X EDR)
    }
    assert set(port_values(page, "sing_rdma_link_state").values()) == {4}
    assert port_values(page, "sing_rdma_physical_state") == {
        ("hfi1_0", "1"): 5,
        ("mlx4_0", "1"): 5,
        ("mlx4_0", "2"): 5,
        ("mlx5_0", "1"): 4,  # mlx5_0's phys_state reads "4: ACTIVE" in the fixture
    }
    assert {labels for (name, labels) in series(page) if name == "sing_rdma_port_info"} == {
        (("device", d), ("link_layer", "InfiniBand"), ("port", p))
        for d, p in [("hfi1_0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2"), ("mlx5_0", "1")]
    }


def test_error_and_hw_counters_match_procfs(tmp_path: Path) -> None:
    untar(FIXTURES / "sys_class_infiniband.ttar", tmp_path)
    page = exporter_page(tmp_path / "fixtures" / "sys")
    by_counter: dict[tuple[str, str, str, str], float] = {}
    for (name, labels), value in series(page).items():
        if name in ("sing_rdma_port_errors_total", "sing_rdma_hw_counter_total"):
            label = dict(labels)
            by_counter[(name, label["device"], label["port"], label["counter"])] = value
    errors = {k: v for k, v in by_counter.items() if k[0] == "sing_rdma_port_errors_total"}
    assert len(errors) == 4 * 12 and set(errors.values()) == {0}  # procfs: every one 0
    assert not any(k[3] == "port_xmit_wait" for k in by_counter)  # procfs: mlx4 3599, 3846
    hw = {k[3]: v for k, v in by_counter.items() if k[0] == "sing_rdma_hw_counter_total"}
    assert {k for k, v in hw.items() if v} | {"lifespan"} == {
        "duplicate_request",
        "lifespan",
        "local_ack_timeout_err",
        "out_of_sequence",
        "packet_seq_err",
        "req_cqe_error",
        "req_cqe_flush_error",
        "resp_cqe_error",
        "resp_cqe_flush_error",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
        "roce_slow_restart_cnps",
        "rx_read_requests",
        "rx_write_requests",
    }  # procfs's non-zero mlx5 hw counters
    assert (hw["duplicate_request"], hw["local_ack_timeout_err"], hw["req_cqe_error"]) == (
        41,
        131,
        3481,
    )
    assert (hw["resp_cqe_error"], hw["rx_read_requests"], hw["rx_write_requests"]) == (
        8109,
        175528982,
        742114,
    )
    assert "lifespan" not in hw and len(hw) == 24  # procfs reads 25 files, lifespan (10) too


def one_port(root: Path, rate: str) -> Path:
    port = root / "class" / "infiniband" / "mlx5_9" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "counters" / "port_xmit_data").write_text("25\n")
    (port / "rate").write_text(rate + "\n")
    return root


def test_procfs_slow_rate_cases(tmp_path: Path) -> None:
    # TestParseSlowRate: "0 GB/sec" -> 0, "2.5 Gb/sec (1X SDR)" -> 312500000,
    # "500 Gb/sec (4X HDR)" -> 62500000000 bytes/s
    cases = {"0 GB/sec": 0, "2.5 Gb/sec (1X SDR)": 312500000, "500 Gb/sec (4X HDR)": 62500000000}
    for number, (text, want) in enumerate(cases.items()):
        page = exporter_page(one_port(tmp_path / str(number), text))
        assert port_values(page, "sing_rdma_link_rate_bytes_per_second") == {("mlx5_9", "1"): want}


def test_a_bad_rate_drops_that_reading_where_procfs_fails_the_class(tmp_path: Path) -> None:
    errors = ErrorCounter()
    page = exporter_page(one_port(tmp_path, "fast"), errors)
    assert port_values(page, "sing_rdma_link_rate_bytes_per_second") == {}
    assert rows(page) == {("mlx5_9", 1): {"tx_bytes": 100}}  # the port's traffic still read
    assert [(s.labels, s.value) for s in errors.metric().samples] == [
        ({"source": "rdma", "kind": "parse_error"}, 1.0)
    ]
