"""Incident detection per cluster (issue 27, item 7.3): each cluster's round reads only that
cluster's readings and moves only its own watermark. Before, a round read every cluster's
readings (opening the other's incidents in its name) and stored the newest reading of any
cluster as where it stopped, so its own readings that arrived late were skipped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from sing.config import Config
from sing.health.detect import detect_round, detection_job
from sing.health.incidents import list_incidents
from sing.health.settings import HealthSettings
from sing.schema import table
from sing.warehouse.store import Warehouse

MIN = timedelta(minutes=1)
SETTINGS = HealthSettings()


def xid(wh: Warehouse, cluster: str, node: str, ts: datetime, value: float) -> None:
    """One XID 79 counter reading of GPU 0 of `node`, written as the collector writes it."""
    row = {
        "ts": ts,
        "cluster": cluster,
        "node": node,
        "component": "gpu",
        "device": "0",
        "gpu_uuid": f"GPU-{node}-0",
        "signal": "xid_79",
        "value": value,
    }
    wh.append("health_samples", pa.Table.from_pylist([row], table("health_samples").schema))


def opened(wh: Warehouse) -> set[tuple[str, str]]:
    return {(r["cluster"], r["node"]) for r in list_incidents(wh)}


@pytest.fixture
def t0() -> datetime:
    """Half an hour ago: a first round looks back an hour."""
    return datetime.now(UTC).replace(microsecond=0) - 30 * MIN


def test_each_cluster_reads_only_its_readings_and_moves_only_its_watermark(tmp_path, t0):
    """Campus and bio write interleaved readings; bio's are newer. Campus's round opens only
    campus's incident and stops at campus's newest reading (t0 + 2 min), not bio's (t0 + 10);
    a campus reading at t0 + 5 that arrives after the round still opens at the next round.
    Bio's own round then opens bio's incident, once."""
    wh = Warehouse(tmp_path / "wh")
    xid(wh, "campus", "c1", t0, 0)
    xid(wh, "bio", "b1", t0 + MIN, 0)
    xid(wh, "campus", "c1", t0 + 2 * MIN, 1)  # campus c1: a new XID 79
    xid(wh, "bio", "b1", t0 + 10 * MIN, 1)  # bio b1: a new XID 79, newer

    first = detect_round(wh, SETTINGS, "campus")
    assert [(f.cluster, f.node) for f in first.findings] == [("campus", "c1")]
    assert opened(wh) == {("campus", "c1")}
    assert first.samples_until == t0 + 2 * MIN

    xid(wh, "campus", "c2", t0, 0)
    xid(wh, "campus", "c2", t0 + 5 * MIN, 1)  # late: older than bio's newest reading
    late = detect_round(wh, SETTINGS, "campus")
    assert [(f.cluster, f.node) for f in late.findings] == [("campus", "c2")]
    assert opened(wh) == {("campus", "c1"), ("campus", "c2")}

    bio = detect_round(wh, SETTINGS, "bio", site_cluster="campus")
    assert [(f.cluster, f.node) for f in bio.findings] == [("bio", "b1")]
    assert bio.samples_until == t0 + 10 * MIN
    assert detect_round(wh, SETTINGS, "bio", site_cluster="campus").findings == []
    assert detect_round(wh, SETTINGS, "campus").findings == []
    assert opened(wh) == {("campus", "c1"), ("campus", "c2"), ("bio", "b1")}


def test_a_pull_collector_detects_every_cluster_of_the_inventory(tmp_path, t0):
    """A collector reading a Prometheus server writes several clusters: its scheduled job runs
    one round per cluster of the inventory; a scraping collector only its site's."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", pa.Table.from_pylist([
        {"cluster": "bio", "node": "b1", "gpus": 8, "valid_from": t0 - 60 * MIN},
    ], table("nodes").schema))  # fmt: skip
    xid(wh, "bio", "b1", t0, 1)
    xid(wh, "campus", "c1", t0, 1)
    scraping, _ = detection_job(Config({}), wh)
    assert [(f.cluster, f.node) for r in scraping() for f in r.findings] == [("campus", "c1")]
    pulling, _ = detection_job(Config({}), wh, pull=True)
    assert [(f.cluster, f.node) for r in pulling() for f in r.findings] == [("bio", "b1")]
    assert opened(wh) == {("campus", "c1"), ("bio", "b1")}
