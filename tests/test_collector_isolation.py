"""One target's bad values cannot lose another target's rows (issue 28, item 1).

Old dcgm-exporter pages carry 2^64-1 sentinels (e.g. on DCGM_FI_DEV_FB_USED), and a page can
name `gpu="70000"`: neither fits its warehouse column (int64 bytes, int16 index). Before, the
round's Arrow conversion raised for every node's rows, scrapes included, every round while that
node answered. The pages are served over HTTP and scraped by the real collector.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.collector import rows as rows_module
from sing.collector.convert import NodeReading
from sing.collector.counters import CounterDeltas
from sing.collector.rows import RoundRows, fit_reading
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import Target
from sing.config import Config
from sing.schema import TABLES
from sing.warehouse import delta
from sing.warehouse.store import Warehouse
from tests.http_stub import serving
from tests.test_collector_scrape import collector_once, file_sd_entry, write_config

SENTINEL = 18446744073709551615  # 2^64 - 1
GPU = 'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-{node}-{gpu}"}} {util}\n'
BAD_PAGE = (
    GPU.format(gpu=0, node="bad", util=40)
    + GPU.format(gpu=1, node="bad", util=60)
    + GPU.format(gpu=70000, node="bad", util=10)
    + 'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-bad-0"} 18446744073709551615\n'
    + 'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bad-1"} 2048\n'
    + 'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"} 1e30\n'
    + 'node_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 5000\n'
)
XID_PAGE = (
    GPU.format(gpu=0, node="xid", util=90)
    + 'sing_gpu_xid_errors_total{gpu="0",uuid="GPU-xid-0",xid="79"} 1\n'
)
HEALTHY_PAGE = GPU.format(gpu=0, node="ok", util=50) + GPU.format(gpu=1, node="ok", util=55)
TS = datetime(2026, 1, 1, tzinfo=UTC)
PAGES = {"/bad/metrics": BAD_PAGE, "/xid/metrics": XID_PAGE, "/ok/metrics": HEALTHY_PAGE}


@pytest.fixture
def pages() -> Iterator[str]:
    with serving(lambda path: PAGES[path].encode()) as address:
        yield address


def targets(address: str) -> list[Target]:
    return [Target(f"http://{address}/{node}/metrics", node) for node in ("bad", "xid", "ok")]


def assert_round_stored(wh: Warehouse) -> None:
    con = wh.connect()
    gpus = con.execute(
        "SELECT node, gpu_index, round(util::DOUBLE, 2), mem_used_bytes FROM gpu_samples "
        "ORDER BY node, gpu_index"
    ).fetchall()
    assert gpus == [
        ("bad", 0, 0.4, None),  # the sentinel dropped, the GPU's other values kept
        ("bad", 1, 0.6, 2048 * 1024 * 1024),
        ("ok", 0, 0.5, None),
        ("ok", 1, 0.55, None),
        ("xid", 0, 0.9, None),
    ]
    rdma = con.execute("SELECT node, tx_bytes, rx_bytes FROM rdma_samples").fetchall()
    assert rdma == [("bad", None, 5000)]
    xid = con.execute("SELECT node, signal, value FROM health_samples").fetchall()
    assert xid == [("xid", "xid_79", 1.0)]
    scrapes = con.execute(
        "SELECT node, up, dropped, dropped_reasons FROM scrapes ORDER BY node"
    ).fetchall()
    assert scrapes == [
        ("bad", True, 3, "gpu_index_out_of_range=1, mem_used_bytes_out_of_range=1, "
                         "tx_bytes_out_of_range=1"),
        ("ok", True, 0, None),
        ("xid", True, 0, None),
    ]  # fmt: skip


def test_a_round_keeps_every_target_and_counts_the_bad_values(tmp_path: Path, pages: str):
    config = Config({})
    wh = Warehouse(tmp_path / "wh")
    collector = Collector(
        config, config.section("collector", CollectorSettings), wh, lambda: targets(pages)
    )
    try:
        summary = collector.scrape_round()
    finally:
        collector.close()
    assert (summary.targets, summary.up) == (3, 3)
    assert_round_stored(wh)
    bad = f"http://{pages}/bad/metrics"
    value = collector.metrics.registry.get_sample_value
    for reason in ("gpu_index_out_of_range", "mem_used_bytes_out_of_range"):
        labels = {"target": bad, "reason": reason}
        assert value("sing_collector_samples_dropped_total", labels) == 1
    ok = {"target": f"http://{pages}/ok/metrics", "reason": "gpu_index_out_of_range"}
    assert value("sing_collector_samples_dropped_total", ok) is None


def test_collector_once_exits_0_with_a_bad_page(tmp_path: Path, pages: str):
    host, port = pages.split(":")
    groups = []
    for node in ("bad", "xid", "ok"):
        group = file_sd_entry(node, int(port))
        group["labels"]["__metrics_path__"] = f"/{node}/metrics"
        groups.append(group)
    (tmp_path / "targets.json").write_text(json.dumps(groups))
    config = write_config(tmp_path / "sing.toml", tmp_path / "targets.json")
    result = collector_once(config, tmp_path / "wh")
    assert result.returncode == 0, result.stderr
    assert "3/3 targets up" in result.stdout
    assert "dropped values that fit no column" in result.stderr
    assert_round_stored(Warehouse(tmp_path / "wh"))


@pytest.mark.parametrize("chunk_rows", [10_000, 1], ids=["one batch", "a batch per node"])
def test_rows_that_still_do_not_convert_lose_only_their_node(caplog, monkeypatch, chunk_rows):
    """The last line of defence: a reading that skipped `fit_reading` (a future column, a bug)
    costs its node's rows of that table, noted on its scrapes row, not the round; so too when
    the round's rows are turned into Arrow a few nodes at a time (`rows.CHUNK_ROWS`)."""
    monkeypatch.setattr(rows_module, "CHUNK_ROWS", chunk_rows)
    rows = RoundRows(CounterDeltas())
    good, bad = NodeReading(gpus={0: {"util": 0.5}}), NodeReading(gpus={0: {"temp_c": "hot"}})
    also_good = NodeReading(gpus={0: {"util": 0.25}})
    for node, reading in (("good", good), ("bad", bad), ("also_good", also_good)):
        rows.add_scrape(TS, f"http://{node}/metrics", node, 0.01, 1, None)
        rows.add_node(TS, "c", node, reading)
    tables = rows.tables()
    assert tables["gpu_samples"].column("node").to_pylist() == ["good", "also_good"]
    assert tables["gpu_samples"].column("util").to_pylist() == [0.5, 0.25]
    scrapes = tables["scrapes"].select(["node", "dropped", "dropped_reasons"]).to_pylist()
    assert scrapes == [
        {"node": "good", "dropped": 0, "dropped_reasons": None},
        {"node": "bad", "dropped": 1, "dropped_reasons": "unconvertible_gpu_samples=1"},
        {"node": "also_good", "dropped": 0, "dropped_reasons": None},
    ]
    assert rows.drops == {"http://bad/metrics": {"unconvertible_gpu_samples": 1}}
    assert "gpu_samples rows of node bad dropped" in caplog.text


@pytest.mark.parametrize(
    ("reading", "reason"),
    [
        (NodeReading(gpus={0: {"mem_used_bytes": 2**63}}), "mem_used_bytes_out_of_range"),
        (NodeReading(gpus={0: {"mem_total_bytes": -(2**63) - 1}}), "mem_total_bytes_out_of_range"),
        (NodeReading(gpus={0: {"power_w": 1e39}}), "power_w_out_of_range"),  # beyond float32
        (NodeReading(gpus={0: {"energy_j": float("nan")}}), "energy_j_out_of_range"),
        (NodeReading(gpus={0: {"mem_used_bytes": float("nan")}}), "mem_used_bytes_out_of_range"),
        (NodeReading(gpus={32768: {"util": 0.1}}, jobs={32768: "5"}), "gpu_index_out_of_range"),
        (NodeReading(models={-40000: "H100"}), "gpu_index_out_of_range"),
        (NodeReading(ports={("mlx5_0", 70000): {"tx_bytes": 1}}), "port_out_of_range"),
        (NodeReading(ports={("mlx5_0", 1): {"rx_packets": 2**64 - 1}}), "rx_packets_out_of_range"),
    ],
)
def test_what_fits_no_column_is_dropped_with_its_reason(reading: NodeReading, reason: str):
    assert fit_reading(reading) == {reason: 1}
    assert fit_reading(reading) == {}  # what is left fits
    rows = RoundRows(CounterDeltas())
    rows.add_node(TS, "c", "n1", reading)
    rows.tables()  # converts


def test_values_at_the_limits_are_kept():
    reading = NodeReading(
        gpus={32767: {"mem_used_bytes": 2**63 - 1, "power_w": 3.4e38, "energy_j": 1e300}},
        ports={("mlx5_0", -32768): {"tx_bytes": -(2**63), "rx_bytes": None}},
    )
    assert fit_reading(reading) == {}
    assert reading.gpus[32767]["mem_used_bytes"] == 2**63 - 1


def test_a_scrapes_table_from_before_the_drop_columns_stays_readable(tmp_path: Path, pages: str):
    """An older sing created `scrapes` without `dropped`: its rows read as NULL, new rows are
    appended to the same Delta table, and an outside Delta reader still opens it."""
    wh = Warehouse(tmp_path / "wh")
    old_schema = pa.schema([f for f in TABLES["scrapes"].schema if not f.name.startswith("drop")])
    directory = wh.table_dir("scrapes")
    dt = delta.ensure_table(directory, delta.table_schema(old_schema, True), [delta.DAY])
    old = pa.Table.from_pylist(
        [{"ts": TS, "target": "http://old/metrics", "node": "old", "up": True, "samples": 9}],
        schema=old_schema,
    )
    path = delta.temporary_path(directory, TS.date()).with_name("old.parquet")
    pq.write_table(old, path)
    delta.commit(dt, [delta.add_action(directory, path, TS.date(), "ts")], "append")

    config = Config({})
    collector = Collector(
        config, config.section("collector", CollectorSettings), wh, lambda: targets(pages)
    )
    try:
        collector.scrape_round()
    finally:
        collector.close()
    rows = wh.connect().execute("SELECT node, dropped FROM scrapes ORDER BY node").fetchall()
    assert rows == [("bad", 3), ("ok", 0), ("old", None), ("xid", 0)]
    assert pl.read_delta(str(directory)).height == 4
