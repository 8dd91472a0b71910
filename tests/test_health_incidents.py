"""Incidents opened, noted, closed and listed as an admin does, through the library and the real
`sing incident` command; the jobs each incident holds, and the failed jobs linked to it."""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sing.config import Config, ConfigError
from sing.errors import UserError
from sing.health.incidents import (
    close_incident,
    jobs_in_incidents,
    list_incidents,
    note_incident,
    open_incident,
)
from sing.health.settings import SERIOUS_XIDS, HealthSettings
from sing.warehouse.store import Warehouse
from tests.policy_world import add_job

T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


def open_on(wh: Warehouse, node: str = "n1", at: datetime = T0, **fields) -> str:
    kwargs = {"cluster": "campus", "klass": "xid", "note": "GPU fell off the bus", "actor": "ana"}
    return open_incident(wh, node=node, now=at, **(kwargs | fields))


# ---- settings ----------------------------------------------------------------------------


def test_health_settings_defaults_and_site_values(tmp_path: Path) -> None:
    assert Config({}).section("health", HealthSettings) == HealthSettings()
    assert HealthSettings().serious_xids == SERIOUS_XIDS and 79 in SERIOUS_XIDS
    site = Config({"health": {"serious_xids": [79], "flapping_downs": 5, "node_down_minutes": 3}})
    s = site.section("health", HealthSettings)
    assert (s.serious_xids, s.flapping_downs, s.node_down_minutes) == ([79], 5, 3.0)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"flaping_downs": 3}, "unknown key 'flaping_downs' (did you mean 'flapping_downs'?)"),
        ({"serious_xids": "79"}, "serious_xids must be a list"),
        ({"serious_xids": [79, -1]}, "serious_xids: -1 is not an XID code"),
        ({"node_down_minutes": 0}, "node_down_minutes = 0.0 must be more than 0"),
        ({"interval_s": -5}, "interval_s = -5.0: use 0 (off) or more"),
        ({"ecc_uncorrected_limit": 1.5}, "ecc_uncorrected_limit must be int"),
    ],
)
def test_bad_health_settings_are_named(section: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config({"health": section}).section("health", HealthSettings)


# ---- open, note, close, list -------------------------------------------------------------


def test_open_keeps_the_jobs_running_on_the_node(wh: Warehouse) -> None:
    add_job(wh, "10", T0 - HOUR, nodes=["n1", "n2"])  # running on n1: kept
    add_job(wh, "11", T0 - HOUR, nodes=["n2"])  # another node
    add_job(wh, "12", T0 - 2 * HOUR, end_time=T0 - HOUR, state="COMPLETED")  # ended before
    add_job(wh, "13", T0 + HOUR)  # starts after
    add_job(wh, "14", T0 - HOUR, end_time=T0 + HOUR, state="FAILED")  # ran then, ended later
    add_job(wh, "15", T0 - HOUR, cluster="other")  # the same node name on another cluster
    incident_id = open_on(wh, device="3", signal="xid_79", evidence={"value": 1})
    assert incident_id.startswith("INC-") and len(incident_id) == 12
    (row,) = list_incidents(wh)
    assert row["jobs"] == ["10", "14"]
    assert (row["node"], row["device"], row["class"], row["source"]) == ("n1", "3", "xid", "manual")
    assert (row["opened_at"], row["opened_by"], row["closed_at"]) == (T0, "ana", None)
    assert json.loads(row["evidence"]) == {"value": 1} and row["notes"] == 1


def test_note_and_close_record_who_and_how_it_ended(wh: Warehouse) -> None:
    incident_id = open_on(wh)
    other = open_on(wh, node="n2", at=T0 + HOUR)
    note_incident(wh, incident_id, "reseated the GPU", actor="ben", now=T0 + HOUR)
    close_incident(wh, incident_id, "GPU replaced (RMA 4711)", actor="ben", now=T0 + 2 * HOUR)
    note_incident(wh, incident_id, "vendor confirmed", actor="ana", now=T0 + 3 * HOUR)
    rows = {r["incident_id"]: r for r in list_incidents(wh)}
    closed = rows[incident_id]
    assert (closed["closed_at"], closed["closed_by"]) == (T0 + 2 * HOUR, "ben")
    assert closed["resolution"] == "GPU replaced (RMA 4711)" and closed["notes"] == 4
    assert [r["incident_id"] for r in list_incidents(wh, open_only=True)] == [other]
    assert [r["incident_id"] for r in list_incidents(wh)] == [other, incident_id]  # newest first
    assert {r["incident_id"] for r in list_incidents(wh, since=T0 + 3 * HOUR)} == {other}
    history = (
        wh.connect()
        .sql(
            "SELECT event, author, text FROM incident_notes WHERE incident_id = ? ORDER BY ts",
            params=[incident_id],
        )
        .fetchall()
    )
    assert history == [
        ("opened", "ana", "GPU fell off the bus"),
        ("note", "ben", "reseated the GPU"),
        ("closed", "ben", "GPU replaced (RMA 4711)"),
        ("note", "ana", "vendor confirmed"),
    ]


def test_mistakes_are_clear_errors_and_change_nothing(wh: Warehouse) -> None:
    incident_id = open_on(wh)
    close_incident(wh, incident_id, "fixed", actor="ben", now=T0 + HOUR)
    with pytest.raises(UserError, match=f"{incident_id} was already closed at .* by ben"):
        close_incident(wh, incident_id, "again", actor="ana", now=T0 + 2 * HOUR)
    with pytest.raises(UserError, match="no incident 'INC-00000000'"):
        note_incident(wh, "INC-00000000", "hello", actor="ana")
    with pytest.raises(UserError, match="no incident 'INC-00000000'"):
        close_incident(wh, "INC-00000000", "hello", actor="ana")
    with pytest.raises(UserError, match="class 'gpu' is not one of xid, ecc"):
        open_on(wh, klass="gpu")
    (row,) = list_incidents(wh)
    assert (row["closed_by"], row["resolution"], row["notes"]) == ("ben", "fixed", 2)


def test_failed_jobs_are_linked_to_the_incident_open_on_their_node(wh: Warehouse) -> None:
    incident_id = open_on(wh)
    close_incident(wh, incident_id, "fixed", actor="ben", now=T0 + 4 * HOUR)
    start = T0 - HOUR
    add_job(wh, "20", start, end_time=T0 + HOUR, state="FAILED")  # linked
    add_job(wh, "21", start, end_time=T0 + 2 * HOUR, state="NODE_FAIL", nodes=["n0", "n1"])
    add_job(wh, "22", start, end_time=T0 + HOUR, state="COMPLETED")  # did not fail
    add_job(wh, "23", start, end_time=T0 + HOUR, state="FAILED", nodes=["n2"])  # elsewhere
    add_job(wh, "24", start, end_time=T0 + 5 * HOUR, state="FAILED")  # after it closed
    add_job(wh, "25", start, end_time=T0 - HOUR / 2, state="FAILED")  # before it opened
    still_open = open_on(wh, node="n2", at=T0 + 3 * HOUR, klass="node_down")
    add_job(wh, "26", start, end_time=T0 + 6 * HOUR, state="NODE_FAIL", nodes=["n2"])
    # a day and more after it opened, an incident nobody closed is not what failed a job
    add_job(wh, "27", start, end_time=T0 + 28 * HOUR, state="FAILED", nodes=["n2"])
    rows = {r["incident_id"]: r["failed_jobs"] for r in list_incidents(wh)}
    assert rows == {incident_id: ["20", "21"], still_open: ["26"]}
    con = wh.connect()
    linked = jobs_in_incidents(con).order("job_id").fetchall()
    assert [(r[0], r[4], r[7]) for r in linked] == [
        (incident_id, "20", "FAILED"),
        (incident_id, "21", "NODE_FAIL"),
        (still_open, "26", "NODE_FAIL"),
    ]


# ---- the command -------------------------------------------------------------------------


def sing(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SING_CONFIG"}
    env["SING_WAREHOUSE"] = str(tmp_path / "wh")
    return subprocess.run(
        [sys.executable, "-m", "sing.cli", *argv], capture_output=True, text=True, env=env
    )


def test_sing_incident_open_note_close_list(tmp_path: Path) -> None:
    add_job(Warehouse(tmp_path / "wh"), "7", datetime.now(UTC) - HOUR, nodes=["gpu03"])
    opened = sing(
        tmp_path,
        "incident",
        "open",
        "gpu03",
        "--class",
        "service_request",
        "--note",
        "user reports NCCL hangs",
    )
    assert opened.returncode == 0, opened.stderr
    incident_id = opened.stdout.strip()
    assert sing(tmp_path, "incident", "note", incident_id, "ran dcgmi diag -r 3").returncode == 0
    table = sing(tmp_path, "incident", "list", "--open").stdout.splitlines()
    assert table[0].split()[:3] == ["id", "cluster", "node"]
    assert table[1].split()[:5] == [incident_id, "campus", "gpu03", "service_request", "manual"]
    closed = sing(tmp_path, "incident", "close", incident_id, "--note", "cable replaced")
    assert closed.returncode == 0, closed.stderr
    again = sing(tmp_path, "incident", "close", incident_id, "--note", "twice")
    assert again.returncode == 1
    assert f"sing: incident {incident_id} was already closed" in again.stderr
    assert "Traceback" not in again.stderr
    unknown = sing(tmp_path, "incident", "note", "INC-nothere", "hi")
    assert (unknown.returncode, unknown.stderr.strip()) == (
        1,
        "sing: no incident 'INC-nothere'; `sing incident list` shows their ids",
    )
    assert sing(tmp_path, "incident", "list", "--open").stdout.strip() == "no incidents open"
    (row,) = json.loads(sing(tmp_path, "incident", "list", "--json").stdout)["rows"]
    assert row["incident_id"] == incident_id and row["jobs"] == ["7"]
    assert row["opened_by"] == row["closed_by"] == getpass.getuser()
    assert (row["resolution"], row["notes"]) == ("cable replaced", 3)
    bad = sing(tmp_path, "incident", "open", "gpu03", "--class", "gpu", "--note", "x")
    assert bad.returncode == 2 and "invalid choice: 'gpu'" in bad.stderr
