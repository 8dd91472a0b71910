"""Health readings through the real path: a `sing exporter --fake` process whose state file
scripts the faults, the `sing collector` daemon scraping it, then SQL on `health_samples`.

Each series gets a row for its first reading and then only when its value changes: the test
scripts an XID 79, a failed row remap, an aggregate ECC increase and an InfiniBand link going
down once, and checks both the exact rows and that rounds with nothing new add none.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sing.collector.convert import read_node
from sing.collector.health import LastValues, health_rows
from sing.collector.promtext import ParseError, Sample
from sing.warehouse.store import Warehouse
from tests.ports import free_port
from tests.test_collector_pull import ScriptedPrometheus, prometheus, pull_collector  # noqa: F401
from tests.test_collector_scrape import file_sd_entry, http_get, running, sing, wait_for

# Two healthy GPUs with two NVLinks each, and one InfiniBand port.
NODE_YAML = """\
model: NVIDIA H200
count: 2
defaults:
  util: 0.5
  memory_used: 1.0e+9
  power_w: 300
  energy_j: 0
  temperature_c: 50
  ecc_corrected: 0
  ecc_uncorrected: 0
  ecc_corrected_aggregate: 0
  ecc_uncorrected_aggregate: 0
  row_remap_correctable: 0
  row_remap_uncorrectable: 0
  row_remap_pending: 0
  row_remap_failed: 0
  throttle_hw_slowdown: 0
  throttle_hw_thermal: 0
  throttle_sw_thermal: 0
  throttle_hw_power_brake: 0
  pcie_replays: 0
  nvlinks: 2
  nvlink_crc_errors: 0
  nvlink_replay_errors: 0
  nvlink_recovery_errors: 0
  xids: {}
rdma:
  mlx5_0/1: {rate: 400 Gb/sec (4X NDR), link_layer: InfiniBand}
"""
GPU_SIGNALS = [
    "ecc_corrected_aggregate", "ecc_corrected_volatile", "ecc_uncorrected_aggregate",
    "ecc_uncorrected_volatile", "nvlink_crc_errors", "nvlink_recovery_errors",
    "nvlink_replay_errors", "pcie_replays", "row_remap_correctable", "row_remap_failed",
    "row_remap_pending", "row_remap_uncorrectable", "throttle_hw_power_brake",
    "throttle_hw_slowdown", "throttle_hw_thermal", "throttle_sw_thermal",
]  # fmt: skip
PORT_SIGNALS = {
    "link_downed": 0.0, "link_error_recovery": 0.0, "link_state": 4.0,
    "physical_state": 5.0, "port_rcv_errors": 0.0, "symbol_error": 0.0,
}  # fmt: skip


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A fake node "gpu01" served by a real exporter; (port, its state file)."""
    (tmp_path / "node.yaml").write_text(NODE_YAML)
    state = tmp_path / "state.json"
    state.write_text("{}")
    port = free_port()
    argv = sing(
        "exporter", "--fake", str(tmp_path / "node.yaml"), "--fake-state", str(state),
        "--fake-root", str(tmp_path / "root"), f"--node=gpu01:{port}", "--cache-seconds=0.05",
        "--health-refresh-s=0",
    )  # fmt: skip
    with running(argv, tmp_path / "exporter.log"):
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), what="exporter")
        yield port, state


def test_changes_of_health_readings_become_rows(tmp_path: Path, node: tuple[int, Path]) -> None:
    port, state = node
    (tmp_path / "targets.json").write_text(json.dumps([file_sd_entry("gpu01", port)]))
    config = tmp_path / "sing.toml"
    config.write_text(
        '[site]\ncluster = "lab"\n[collector]\n'
        f'file_sd = "{tmp_path / "targets.json"}"\ninterval_s = 0.3\n'
    )
    wh = Warehouse(tmp_path / "wh")

    def query(sql: str) -> list[tuple]:
        con = wh.connect()
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    def rounds() -> int:
        return query("SELECT count(*) FROM scrapes")[0][0]

    def health() -> list[tuple]:
        return query(
            "SELECT cluster, node, component, device, gpu_uuid, signal, value FROM health_samples "
            "ORDER BY ts, component, device, signal"
        )

    def quiet_rounds(expected: int) -> None:
        """Three more rounds add no row: nothing changed."""
        seen = rounds()
        wait_for(lambda: rounds() >= seen + 3, what="three more rounds")
        assert len(health()) == expected

    argv = sing("--config", str(config), "--warehouse", str(wh.root), "collector")
    with running(argv, tmp_path / "collector.log"):
        first = 2 * len(GPU_SIGNALS) + len(PORT_SIGNALS)
        wait_for(lambda: len(health()) == first, what="first readings")
        quiet_rounds(first)
        rows = health()
        uuids = dict(
            query("SELECT DISTINCT device, gpu_uuid FROM health_samples WHERE gpu_uuid NOTNULL")
        )
        gpu_rows = [("lab", "gpu01", "gpu", d, uuids[d], s, 0.0) for d in "01" for s in GPU_SIGNALS]
        port_rows = [
            ("lab", "gpu01", "rdma", "mlx5_0/1", None, s, v) for s, v in PORT_SIGNALS.items()
        ]
        assert sorted(rows) == sorted(gpu_rows + port_rows)

        # Each fault is added to the state file on top of the ones before it.
        gpus: dict[str, dict] = {"0": {}, "1": {}}
        ports: dict[str, dict] = {}
        faults = [
            (gpus["0"], {"xids": {"79": 1}}, [("gpu", "0", "xid_79", 1.0)]),
            (
                gpus["1"],
                {"row_remap_uncorrectable": 1, "row_remap_failed": 1},
                [
                    ("gpu", "1", "row_remap_failed", 1.0),
                    ("gpu", "1", "row_remap_uncorrectable", 1.0),
                ],
            ),
            (
                gpus["0"],
                {"ecc_uncorrected_aggregate": 2},
                [("gpu", "0", "ecc_uncorrected_aggregate", 2.0)],
            ),
            (
                ports.setdefault("mlx5_0/1", {}),
                {"error_counters": {"link_downed": 1}},
                [("rdma", "mlx5_0/1", "link_downed", 1.0)],
            ),
        ]
        expected = first
        for target, change, new in faults:
            target.update(change)
            tmp = state.with_suffix(".tmp")
            tmp.write_text(json.dumps({"gpus": gpus, "rdma": ports}))
            tmp.replace(state)
            expected += len(new)
            wait_for(lambda n=expected: len(health()) >= n, what=f"rows {new}")
            assert [(c, d, s, v) for _, _, c, d, _, s, v in health()[expected - len(new) :]] == new
            quiet_rounds(expected)

    changes = query(
        "SELECT node, component, device, gpu_uuid, signal, value FROM health_samples "
        "WHERE ts > (SELECT min(ts) FROM health_samples) ORDER BY ts, signal"
    )
    assert changes == [
        ("gpu01", "gpu", "0", uuids["0"], "xid_79", 1.0),
        ("gpu01", "gpu", "1", uuids["1"], "row_remap_failed", 1.0),
        ("gpu01", "gpu", "1", uuids["1"], "row_remap_uncorrectable", 1.0),
        ("gpu01", "gpu", "0", uuids["0"], "ecc_uncorrected_aggregate", 2.0),
        ("gpu01", "rdma", "mlx5_0/1", None, "link_downed", 1.0),
    ]


def test_a_restarted_collector_writes_first_readings_again_and_a_new_gpu_is_a_new_series() -> None:
    """Rows when a value changes, per series: a swapped GPU (same index, new UUID) starts over."""
    last = LastValues()

    def rows(uuid: str, ecc: float) -> list[tuple]:
        labels = {"gpu": "0", "uuid": uuid, "type": "uncorrected", "counter": "aggregate"}
        reading = read_node([Sample("sing_gpu_ecc_errors_total", labels, ecc)])
        return [(r["gpu_uuid"], r["signal"], r["value"]) for r in health_rows(
            last, None, "lab", "n", reading.health)]  # type: ignore[arg-type]  # fmt: skip

    assert rows("GPU-a", 1) == [("GPU-a", "ecc_uncorrected_aggregate", 1.0)]
    assert rows("GPU-a", 1) == []
    assert rows("GPU-a", 0) == [("GPU-a", "ecc_uncorrected_aggregate", 0.0)]  # a reset is news
    assert rows("GPU-b", 0) == [("GPU-b", "ecc_uncorrected_aggregate", 0.0)]
    assert rows("GPU-a", 0) == []  # both series kept: GPU-a's last value was 0 too
    assert rows("GPU-a", 3) == [("GPU-a", "ecc_uncorrected_aggregate", 3.0)]
    assert rows("GPU-b", 0) == []
    fresh = LastValues()  # a fresh start: every series' first reading again
    reading = read_node([Sample("sing_gpu_ecc_errors_total", {"gpu": "0", "uuid": "GPU-a",
                         "type": "uncorrected", "counter": "aggregate"}, 3)])  # fmt: skip
    assert len(health_rows(fresh, None, "lab", "n", reading.health)) == 1  # type: ignore[arg-type]


def test_a_series_missing_from_a_reading_keeps_its_last_value() -> None:
    """GPU 1 lost for a round (or its second target failed): it comes back with the same values,
    which are not news; a GPU's series values kept apart from the other GPU's and node's."""
    last = LastValues()

    def rows(*gpus: tuple[str, float]) -> list[tuple]:
        reading = read_node([Sample("sing_gpu_row_remap_rows",
                                    {"gpu": g, "uuid": f"G{g}", "type": "correctable"}, v)
                             for g, v in gpus])  # fmt: skip
        return [(r["device"], r["value"]) for r in health_rows(
            last, None, "lab", "n", reading.health)]  # type: ignore[arg-type]  # fmt: skip

    assert rows(("0", 1), ("1", 2)) == [("0", 1.0), ("1", 2.0)]
    assert rows(("0", 1)) == []
    assert rows(("0", 1), ("1", 2)) == []
    assert rows(("0", 2), ("1", 2)) == [("0", 2.0)]
    assert rows(("1", 5)) == [("1", 5.0)]
    assert last.of("lab", "n") == {
        ("gpu", "0", "G0", "row_remap_correctable"): 2.0,
        ("gpu", "1", "G1", "row_remap_correctable"): 5.0,
    }
    assert last.of("lab", "other") == {}


def test_nodes_with_the_same_series_share_one_tuple_of_their_keys() -> None:
    """The memory of the last values: 152 series on each of 1,000 nodes took 15 MB with a key
    tuple each. Nodes whose series are alike share their keys, whatever their GPUs' UUIDs."""
    last = LastValues()
    for node in ("n1", "n2"):
        reading = read_node([
            Sample("sing_gpu_row_remap_failed", {"gpu": g, "uuid": f"{node}-G{g}"}, 0)
            for g in ("0", "1")
        ])  # fmt: skip
        health_rows(last, None, "lab", node, reading.health)  # type: ignore[arg-type]
    first, second = (last._nodes[("lab", n)] for n in ("n1", "n2"))
    assert first.keys is second.keys
    assert (first.uuids, second.uuids) == (("n1-G0", "n1-G1"), ("n2-G0", "n2-G1"))


def test_an_exporter_restart_starts_the_xid_counts_over() -> None:
    """GPU 0 answers without its XID series: the exporter restarted, so the series goes to 0
    and the same XID seen again at the same count is a new row (an incident, a drain). GPU 1,
    absent altogether (lost), keeps its count."""
    last = LastValues()

    def rows(*samples: Sample) -> list[tuple]:
        reading = read_node(list(samples))
        return [(r["device"], r["signal"], r["value"]) for r in health_rows(
            last, None, "lab", "n", reading.health)]  # type: ignore[arg-type]  # fmt: skip

    def xid(gpu: str, count: float) -> Sample:
        return Sample(
            "sing_gpu_xid_errors_total", {"gpu": gpu, "uuid": f"G{gpu}", "xid": "79"}, count
        )

    def remap(gpu: str) -> Sample:
        return Sample("sing_gpu_row_remap_failed", {"gpu": gpu, "uuid": f"G{gpu}"}, 0)

    assert rows(xid("0", 1), remap("0"), xid("1", 2), remap("1")) == [
        ("0", "row_remap_failed", 0.0), ("0", "xid_79", 1.0),
        ("1", "row_remap_failed", 0.0), ("1", "xid_79", 2.0),
    ]  # fmt: skip
    assert rows(remap("0")) == [("0", "xid_79", 0.0)]  # GPU 1 lost: nothing about it
    assert rows(remap("0")) == []  # the same again: the zeroed count is not news twice
    assert rows(xid("0", 1), remap("0"), xid("1", 2), remap("1")) == [("0", "xid_79", 1.0)]


def test_a_copy_of_the_last_values_goes_its_own_way() -> None:
    """Pull mode computes a step's rows on a copy and keeps it only when they are written: the
    original must not learn what the copy saw (sing/collector/pull.py)."""
    last = LastValues()
    labels = {"gpu": "0", "uuid": "G0", "type": "uncorrected", "counter": "aggregate"}

    def rows(on: LastValues, ecc: float) -> int:
        reading = read_node([Sample("sing_gpu_ecc_errors_total", labels, ecc)])
        return len(health_rows(on, None, "lab", "n", reading.health))  # type: ignore[arg-type]

    assert rows(last, 1) == 1
    copy = last.copy()
    assert (rows(copy, 2), rows(copy, 2)) == (1, 0)
    assert rows(last, 1) == 0  # the original still holds 1
    assert rows(last, 2) == 1


@pytest.mark.parametrize(
    ("sample", "signal"),
    [
        (Sample("sing_gpu_xid_errors_total", {"gpu": "0", "xid": "48"}, 1), "xid_48"),
        (Sample("sing_gpu_xid_errors_total", {"gpu": "0", "xid": "4'8"}, 1), None),
        (Sample("sing_gpu_ecc_errors_total", {"gpu": "0", "type": "corrected"}, 1),
         "ecc_corrected_volatile"),  # an exporter from before the counter label
        (Sample("sing_rdma_port_errors_total",
                {"device": "mlx5_0", "port": "1", "counter": "VL15_dropped"}, 1), None),
    ],
)  # fmt: skip
def test_only_known_label_values_name_signals(sample: Sample, signal: str | None) -> None:
    assert [key[-1] for key in read_node([sample]).health] == ([signal] if signal else [])


@pytest.mark.parametrize(
    "name", ["sing_gpu_clock_event_reasons", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
)
def test_clock_event_mask_becomes_one_flag_per_trouble_bit(name: str) -> None:
    """0x45 = idle (0x1) + power cap (0x4), a healthy GPU's reasons, + hw thermal (0x40)."""
    health = read_node([Sample(name, {"gpu": "2", "uuid": "GPU-c"}, 0x45)]).health
    assert health == {
        ("gpu", "2", "GPU-c", "throttle_hw_slowdown"): 0.0,
        ("gpu", "2", "GPU-c", "throttle_sw_thermal"): 0.0,
        ("gpu", "2", "GPU-c", "throttle_hw_thermal"): 1.0,
        ("gpu", "2", "GPU-c", "throttle_hw_power_brake"): 0.0,
    }


def test_dcgm_exporter_and_node_exporter_health_series_are_understood() -> None:
    gpu = {"gpu": "1", "UUID": "GPU-d", "modelName": "NVIDIA A100"}
    port = {"device": "mlx5_3", "port": "1"}
    samples = [
        Sample("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", gpu, 2),
        Sample("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu, 1),
        Sample("DCGM_FI_DEV_ROW_REMAP_FAILURE", {**gpu, "GPU_I_ID": "3"}, 1),  # MIG: per GPU
        Sample("DCGM_FI_DEV_XID_ERRORS", gpu, 79),  # the last XID, not a count: not taken
        Sample("node_infiniband_link_downed_total", port, 4),
        Sample("node_infiniband_state_id", port, 4),
    ]
    assert read_node(samples).health == {
        ("gpu", "1", "GPU-d", "ecc_uncorrected_aggregate"): 2,
        ("gpu", "1", "GPU-d", "row_remap_failed"): 1,
        ("rdma", "mlx5_3/1", None, "link_downed"): 4,
        ("rdma", "mlx5_3/1", None, "link_state"): 4,
    }


def test_a_health_series_without_its_labels_is_a_malformed_payload() -> None:
    with pytest.raises(ParseError, match="sing_gpu_row_remap_failed has no 'gpu' label"):
        read_node([Sample("sing_gpu_row_remap_failed", {}, 1)])
    with pytest.raises(ParseError, match="gpu label 'x' is not a number"):
        read_node([Sample("sing_gpu_row_remap_failed", {"gpu": "x"}, 1)])


def test_pull_mode_rereads_health_rows_a_failed_write_lost(
    tmp_path: Path,
    prometheus: tuple[str, ScriptedPrometheus],  # noqa: F811 - the fixture imported above
) -> None:
    """Pull mode: a `health_samples` append that fails is read again with the last values as
    they were before it, so the change it held is written once, not lost."""
    url, script = prometheus
    xid_since = [math.inf]  # node a's GPU reports XID 79 from this scrape time on
    plain = script.query_range

    def with_xid(params: dict[str, str]) -> dict:
        data = plain(params)
        energy = next(
            s for s in data["result"]
            if s["metric"]["__name__"] == "sing_gpu_energy_joules_total"
            and s["metric"]["node"] == "a"
        )  # fmt: skip
        values = [
            [t, "1" if script.newest_sample("a", t) >= xid_since[0] else "0"]
            for t, _ in energy["values"]
        ]
        metric = {**energy["metric"], "__name__": "sing_gpu_xid_errors_total", "xid": "79"}
        data["result"].append({"metric": metric, "values": values})
        return data

    script.query_range = with_xid  # type: ignore[method-assign]
    wh = Warehouse(tmp_path / "wh")
    pull = pull_collector(wh, url)
    pull.pull_round()
    table_dir = wh.root / "health_samples"
    table_dir.rename(tmp_path / "health-away")  # a real fault: the table's directory is a file
    table_dir.write_text("not a directory")
    time.sleep(2.1)
    now = math.floor(time.time())
    xid_since[0] = now
    script.ingested = dict.fromkeys(script.ingested, now)
    pull.pull_round()
    table_dir.unlink()
    (tmp_path / "health-away").rename(table_dir)
    time.sleep(1.1)
    script.ingested = dict.fromkeys(script.ingested, math.floor(time.time()))
    pull.pull_round()
    rows = (
        wh.connect()
        .execute("SELECT node, epoch(ts)::BIGINT, signal, value FROM health_samples ORDER BY 2")
        .fetchall()
    )
    assert [(n, s, v) for n, _, s, v in rows] == [("a", "xid_79", 0.0), ("a", "xid_79", 1.0)]
    assert rows[1][1] == now
