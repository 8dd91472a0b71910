"""The node inventory, cluster stamping and energy deltas on the real path: `sing exporter --fake`
processes scraped by `sing collector --once` processes; and the inventory's merge rule for
exporter and executor (sinfo) witnesses, round by round."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.collector.convert import Hardware
from sing.collector.inventory import Inventory, load_inventory
from sing.executors.records import NodeRecord
from sing.schema import TABLES
from sing.warehouse.store import Warehouse
from tests.test_collector_scrape import (  # noqa: F401 - `exporter` is a fixture
    collector_once,
    exporter,
    file_sd_entry,
)

H200_BYTES = 150_754_820_096


def collect_once(config: Path, wh: Path) -> None:
    result = collector_once(config, wh)
    assert result.returncode == 0, result.stderr


def test_once_writes_inventory_cluster_and_energy_deltas_across_restarts(
    tmp_path: Path,
    exporter: dict[str, int],  # noqa: F811 - the imported fixture
) -> None:
    (tmp_path / "targets.json").write_text(
        json.dumps([file_sd_entry(n, p) for n, p in exporter.items()])
    )
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[site]\ncluster = "lab"\n[collector]\nfile_sd = "{tmp_path}/targets.json"\n'
    )
    collect_once(config, tmp_path / "wh")
    time.sleep(1.0)
    collect_once(config, tmp_path / "wh")  # a new process: reads versions and counters back

    con = Warehouse(tmp_path / "wh").connect()
    rounds = con.execute("SELECT DISTINCT ts FROM scrapes ORDER BY ts").fetchall()
    (first,), (second,) = rounds
    nodes = con.execute(
        "SELECT node, gpus, gpu_model, gpu_memory_bytes, partition, cluster, valid_from, source "
        "FROM nodes ORDER BY node"
    ).fetchall()
    # One version per node, from the first round: the restart found nothing changed.
    assert nodes == [
        (node, 4, "NVIDIA H200", H200_BYTES, None, "lab", first, "exporter") for node in "ab"
    ]
    clusters = con.execute(
        "SELECT DISTINCT cluster FROM gpu_samples UNION ALL SELECT DISTINCT cluster FROM "
        "rdma_samples"
    ).fetchall()
    assert clusters == [("lab",), ("lab",)]
    energy = con.execute(
        "SELECT ts, count(*), count(energy_delta_j), min(energy_delta_j), max(energy_delta_j) "
        "FROM gpu_samples GROUP BY ts ORDER BY ts"
    ).fetchall()
    assert [row[:3] for row in energy] == [(first, 8, 0), (second, 8, 8)]
    # The fake integrates 300 W: the second round's deltas are 300 J/s since the first.
    seconds = (second - first).total_seconds()
    assert energy[1][3] == pytest.approx(300 * seconds, rel=0.25)
    assert energy[1][4] == pytest.approx(300 * seconds, rel=0.25)


T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
A100 = Hardware(8, "NVIDIA A100-SXM4-80GB", 85_899_345_920)


def listed(*names: str, partition: str = "debug") -> dict[tuple[str, str], NodeRecord]:
    return {("c", n): NodeRecord(n, 8, "a100", partition) for n in names}


def versions(rows: list[dict]) -> list[tuple]:
    return [(r["node"], r["gpus"], r["gpu_model"], r["partition"], r["source"]) for r in rows]


def test_inventory_merges_exporter_and_sinfo_and_writes_only_changes(tmp_path: Path) -> None:
    inv = Inventory()
    minute = timedelta(minutes=1)
    both = listed("gpu-1", "gpu-2")
    # gpu-1's exporter answers, gpu-2 has none: its Gres count stands in.
    first = inv.versions(T0, {("c", "gpu-1"): A100}, both)
    assert versions(first) == [
        ("gpu-1", 8, "NVIDIA A100-SXM4-80GB", "debug", "exporter+sinfo"),
        ("gpu-2", 8, "a100", "debug", "sinfo"),
    ]
    assert first[0]["gpu_memory_bytes"] == A100.memory_bytes and first[0]["valid_from"] == T0
    # Nothing changed, or gpu-1's scrape failed: no new version.
    assert inv.versions(T0 + minute, {("c", "gpu-1"): A100}, both) == []
    assert inv.versions(T0 + 2 * minute, {}, both) == []
    # gpu-1 lost a GPU (exporter), then moved partition (sinfo): one version each.
    seven = Hardware(7, A100.model, A100.memory_bytes)
    assert versions(inv.versions(T0 + 3 * minute, {("c", "gpu-1"): seven}, both)) == [
        ("gpu-1", 7, A100.model, "debug", "exporter+sinfo")
    ]
    moved = listed("gpu-1", partition="long") | listed("gpu-2")
    assert versions(inv.versions(T0 + 4 * minute, {}, moved)) == [
        ("gpu-1", 7, A100.model, "long", "exporter+sinfo")
    ]
    # sinfo stops listing gpu-2: it left (gpus = 0), once.
    gone = inv.versions(T0 + 5 * minute, {}, listed("gpu-1", partition="long"))
    assert versions(gone) == [("gpu-2", 0, "a100", None, "sinfo")]
    assert gone[0]["valid_from"] == T0 + 5 * minute
    assert inv.versions(T0 + 6 * minute, {}, listed("gpu-1", partition="long")) == []
    # Without an executor inventory, nodes are never retired: a failed scrape is no departure.
    only_exporters = Inventory()
    only_exporters.versions(T0, {("c", "n1"): A100}, None)
    assert only_exporters.versions(T0 + minute, {}, None) == []

    # A restart reads the last versions back and writes nothing for unchanged nodes.
    wh = Warehouse(tmp_path / "wh")
    rows = first + gone
    wh.append("nodes", pa.Table.from_pylist(rows, schema=TABLES["nodes"].schema))
    again = load_inventory(wh, "c")
    assert again.versions(T0 + 7 * minute, {("c", "gpu-1"): A100}, listed("gpu-1")) == []
    assert again.versions(T0 + 7 * minute, {}, listed("gpu-1", "gpu-2")) != []  # gpu-2 back
