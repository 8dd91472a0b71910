"""Incident detection on readings written to `health_samples` and `scrapes` as the collector
writes them (a row per series when its value changes; a row per scrape attempt), one class
at a time; and rounds run in separate processes, as a restarted collector runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.config import Config
from sing.health.detect import detect_round, detection_job
from sing.health.incidents import close_incident, list_incidents
from sing.health.settings import HealthSettings
from sing.schema import table
from sing.warehouse.store import Warehouse
from tests.policy_world import add_job

MIN = timedelta(minutes=1)
SETTINGS = HealthSettings()


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


@pytest.fixture
def t0() -> datetime:
    """Half an hour ago: the first round looks back an hour."""
    return datetime.now(UTC).replace(microsecond=0) - 30 * MIN


def readings(wh: Warehouse, *rows: tuple) -> None:
    """(ts, node, component, device, signal, value) rows, one append per time (a round)."""
    for ts in sorted({r[0] for r in rows}):
        batch = [
            {
                "ts": t,
                "cluster": "campus",
                "node": node,
                "component": component,
                "device": device,
                "gpu_uuid": f"GPU-{node}-{device}" if component == "gpu" else None,
                "signal": signal,
                "value": float(value),
            }
            for t, node, component, device, signal, value in rows
            if t == ts
        ]
        wh.append("health_samples", pa.Table.from_pylist(batch, table("health_samples").schema))


def scrapes(wh: Warehouse, ts: datetime, answers: dict[str, list[bool]]) -> None:
    """One collector round: each node's targets, up or not."""
    rows = [
        {
            "ts": ts,
            "target": f"http://{node}:{9400 + i}/metrics",
            "node": node,
            "up": up,
            "duration_s": 0.01 if up else 2.0,
            "samples": 120 if up else 0,
            "error": None if up else "timeout: no answer in 2 s",
        }
        for node, targets in answers.items()
        for i, up in enumerate(targets)
    ]
    wh.append("scrapes", pa.Table.from_pylist(rows, table("scrapes").schema))


def incidents(wh: Warehouse) -> list[dict]:
    return sorted(list_incidents(wh), key=lambda r: r["opened_at"])


def gpu(ts: datetime, signal: str, value: float, node: str = "n1", device: str = "3") -> tuple:
    return (ts, node, "gpu", device, signal, value)


def test_a_new_serious_xid_opens_one_incident_with_the_jobs_there(wh, t0) -> None:
    add_job(wh, "101", t0 - 60 * MIN, nodes=["n1"])
    add_job(wh, "102", t0 - 60 * MIN, nodes=["n2"])
    readings(
        wh,
        gpu(t0, "xid_79", 0),
        gpu(t0, "xid_13", 0),  # an application's fault: not serious
        gpu(t0 + MIN, "xid_79", 1),
        gpu(t0 + MIN, "xid_13", 4),
    )
    result = detect_round(wh, SETTINGS, "campus")
    assert len(result.opened) == 1 and not result.noted
    (row,) = incidents(wh)
    assert (row["node"], row["device"], row["class"]) == ("n1", "3", "xid")
    assert row["signal"] == "xid_79"
    assert (row["source"], row["opened_at"], row["jobs"]) == ("auto", t0 + MIN, ["101"])
    assert row["opened_by"].startswith("sing health@")
    evidence = json.loads(row["evidence"])
    assert (evidence["value"], evidence["previous"]) == (1.0, 0.0)
    assert evidence["gpu_uuid"] == "GPU-n1-3"
    # The same GPU again, and another serious XID on it: notes on the open incident.
    readings(wh, gpu(t0 + 2 * MIN, "xid_79", 2), gpu(t0 + 3 * MIN, "xid_48", 1))
    again = detect_round(wh, SETTINGS, "campus")
    assert (again.opened, again.noted) == ([], [row["incident_id"]] * 2)
    (row,) = incidents(wh)
    assert row["notes"] == 3
    # Closed, then a new XID: a new incident. A GPU whose counter only reset opens nothing.
    close_incident(wh, row["incident_id"], "GPU reset", actor="ana")
    readings(wh, gpu(t0 + 4 * MIN, "xid_79", 0, device="5"), gpu(t0 + 5 * MIN, "xid_79", 3))
    detect_round(wh, SETTINGS, "campus")
    assert [(r["device"], r["closed_by"]) for r in incidents(wh)] == [("3", "ana"), ("3", None)]


def test_a_row_remap_that_fails_opens_once(wh, t0) -> None:
    readings(
        wh,
        gpu(t0, "row_remap_failed", 0),
        gpu(t0, "row_remap_pending", 1),
        gpu(t0 + MIN, "row_remap_failed", 1),
        gpu(t0, "row_remap_failed", 1, node="n2", device="0"),  # its first reading: failed
    )
    detect_round(wh, SETTINGS, "campus")
    found = [(r["node"], r["device"], r["class"]) for r in incidents(wh)]
    assert sorted(found) == [("n1", "3", "row_remap"), ("n2", "0", "row_remap")]
    for r in incidents(wh):
        close_incident(wh, r["incident_id"], "GPU replaced", actor="ana")
    # A restarted collector writes each series' value again: still failed is no new failure.
    readings(wh, gpu(t0 + 5 * MIN, "row_remap_failed", 1))
    assert detect_round(wh, SETTINGS, "campus").findings == []


def test_uncorrected_ecc_errors_over_the_limit(wh, t0) -> None:
    settings = HealthSettings(ecc_uncorrected_limit=3)
    readings(
        wh,
        gpu(t0, "ecc_uncorrected_volatile", 0),
        gpu(t0 + MIN, "ecc_uncorrected_volatile", 2),  # 2 < 3
        gpu(t0, "ecc_uncorrected_aggregate", 40, device="1"),  # lifetime count: the baseline
        gpu(t0, "ecc_corrected_volatile", 900, device="2"),  # corrected: not watched
    )
    assert detect_round(wh, settings, "campus").findings == []
    readings(wh, gpu(t0 + 2 * MIN, "ecc_uncorrected_volatile", 5))  # 3 more
    readings(wh, gpu(t0 + 2 * MIN, "ecc_uncorrected_aggregate", 41, device="1"))  # 1 more
    result = detect_round(wh, settings, "campus")
    assert [(f.device, f.klass, f.signal) for f in result.findings] == [
        ("3", "ecc", "ecc_uncorrected_volatile")
    ]
    assert "3 new uncorrected ECC errors on n1 GPU 3" in result.findings[0].text


def test_a_flapping_link_opens_one_incident(wh, t0) -> None:
    port = ("n4", "rdma", "mlx5_0/1", "link_downed")
    slow = ("n5", "rdma", "mlx5_1/1", "link_downed")
    readings(
        wh,
        (t0, *port, 7),  # downs before sing looked: the baseline
        (t0 + MIN, *port, 8),
        (t0 + 4 * MIN, *port, 9),
        (t0 + 6 * MIN, *port, 10),  # the third down within 10 minutes
        (t0 + 7 * MIN, *port, 11),  # still flapping: a note
        (t0, *slow, 0),
        (t0 + 8 * MIN, *slow, 1),
        (t0 + 19 * MIN, *slow, 2),
        (t0 + 30 * MIN, *slow, 3),  # three downs in 22 minutes: not flapping
        (t0 + 2 * MIN, "n4", "rdma", "mlx5_0/1", "symbol_error", 50),
    )
    result = detect_round(wh, SETTINGS, "campus")
    assert len(result.opened) == 1 and result.noted == result.opened
    (row,) = incidents(wh)
    assert (row["node"], row["device"], row["class"]) == ("n4", "mlx5_0/1", "link")
    assert row["opened_at"] == t0 + 6 * MIN
    assert json.loads(row["evidence"])["downs_in_window"] == 3


def test_a_node_whose_scrapes_all_fail_is_down(wh, t0) -> None:
    add_job(wh, "300", t0 - 60 * MIN, nodes=["n7"])
    for i in range(25):
        ts = t0 + i * MIN
        scrapes(
            wh,
            ts,
            {
                "n7": [i < 5] * 2,  # down from minute 5, both targets: 20 minutes
                "n8": [True, i < 5],  # one target down, the node answers
                "n9": [not 5 <= i < 12] * 2,  # down 7 minutes, back
            },
        )
    result = detect_round(wh, SETTINGS, "campus")
    (finding,) = result.findings
    (row,) = incidents(wh)
    assert (row["node"], row["device"], row["class"]) == ("n7", None, "node_down")
    assert (row["opened_at"], row["jobs"]) == (t0 + 5 * MIN, ["300"])
    assert "n7 has not answered a scrape for 10 min" in finding.text
    # Still down at the next round: the incident is open, no second one, no note.
    scrapes(wh, t0 + 25 * MIN, {"n7": [False, False]})
    assert detect_round(wh, SETTINGS, "campus").findings == []


def test_a_down_node_is_of_the_cluster_the_inventory_puts_it_in(wh, t0) -> None:
    """Pull mode can scrape several clusters: scrapes carry no cluster, the inventory does."""
    wh.append("nodes", pa.Table.from_pylist([
        {"cluster": "bio", "node": "b-gpu3", "gpus": 8, "valid_from": t0 - 60 * MIN},
    ], table("nodes").schema))  # fmt: skip
    for i in range(15):
        scrapes(wh, t0 + i * MIN, {"b-gpu3": [False], "n7": [False]})
    detect_round(wh, SETTINGS, "campus")
    assert {(r["cluster"], r["node"]) for r in incidents(wh)} == {("campus", "n7")}
    detect_round(wh, SETTINGS, "bio", site_cluster="campus")  # each cluster's own round
    assert {(r["cluster"], r["node"]) for r in incidents(wh)} == {
        ("bio", "b-gpu3"),
        ("campus", "n7"),  # not in the inventory: the site's cluster
    }


ROUND = """
import sys
from sing.health.detect import detect_round
from sing.health.settings import HealthSettings
from sing.warehouse.store import Warehouse
result = detect_round(Warehouse(sys.argv[1]), HealthSettings(), "campus")
print(len(result.opened), len(result.noted))
"""


def round_in_a_new_process(wh: Warehouse) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ROUND, str(wh.root)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_restarted_detector_neither_reopens_nor_misses(wh, t0) -> None:
    readings(wh, gpu(t0, "xid_79", 0), gpu(t0 + MIN, "xid_79", 1))
    assert round_in_a_new_process(wh) == "1 0"
    assert round_in_a_new_process(wh) == "0 0"  # the same readings: nothing new
    (row,) = incidents(wh)
    close_incident(wh, row["incident_id"], "reset", actor="ana")
    assert round_in_a_new_process(wh) == "0 0"  # closed stays closed
    readings(wh, gpu(t0 + 2 * MIN, "row_remap_failed", 1, node="n2"))  # arrived in between
    assert round_in_a_new_process(wh) == "1 0"
    assert [r["class"] for r in incidents(wh)] == ["xid", "row_remap"]


def test_the_collector_schedules_detection_unless_turned_off(wh, t0) -> None:
    readings(wh, gpu(t0, "xid_94", 1))
    job, interval_s = detection_job(Config({}), wh)
    assert interval_s == 60.0
    assert [f.signal for r in job() for f in r.findings] == ["xid_94"]
    assert detection_job(Config({"health": {"interval_s": 0}}), wh) is None


def test_a_series_previous_value_is_found_days_back(wh, t0) -> None:
    """Series are written when they change: the value before a reading may be days old (and in
    files a round does not otherwise open). A restarted collector writes it again: no news."""
    days_ago = t0 - timedelta(days=3)
    readings(
        wh,
        gpu(days_ago, "xid_79", 1),  # an incident then, long closed
        gpu(days_ago, "row_remap_failed", 1, device="4"),
        gpu(days_ago, "xid_94", 2, device="5"),
        gpu(t0, "xid_79", 1),  # the restart's first readings: the same values
        gpu(t0, "row_remap_failed", 1, device="4"),
        gpu(t0, "xid_94", 3, device="5"),  # one more XID 94 since: news
    )
    result = detect_round(wh, SETTINGS, "campus")
    assert [(f.device, f.signal) for f in result.findings] == [("5", "xid_94")]
    assert result.findings[0].evidence["previous"] == 2.0
