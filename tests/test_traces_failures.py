"""The trace format's failure class of each job and its anonymized incident list (format 1.2):
known failed jobs and incidents in a warehouse -> the classes and the list a release carries.

Two days from T0 on three nodes. Incidents: an XID on node02 from hour 5 to hour 9, an ECC
incident on node03 opened the day before the window and still open, a service request on
node01 (hour 30 to 31; the person who asked, the notes and the resolution must not leave), and
one after the window. Each job plays a failure class; job 1003 failed on node02 during the XID
incident, 1004 failed there after it closed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.traces.export import export_trace
from sing.traces.settings import TraceSettings
from sing.traces.validate import validate
from sing.warehouse.store import Warehouse

T0 = datetime(2025, 3, 3, tzinfo=UTC)
UNTIL = T0 + timedelta(days=2)
KEY = bytes(range(32))
HOSTS = ["gpu-rack7-node01", "gpu-rack7-node02", "gpu-rack7-node03"]
SECRET_NOTE = "alice.liddell says the GPU smells of smoke"


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


# job id -> (state, exit code, node, submit hour, run hours, expected failure class)
JOBS = {
    "1001": ("COMPLETED", 0, 0, 1, 2, "success"),
    "1002": ("FAILED", 1, 0, 2, 1, "user_error"),
    "1003": ("FAILED", 1, 1, 4, 3, "node_failure"),  # ends at hour 7: XID incident open
    "1004": ("FAILED", 1, 1, 9, 1, "user_error"),  # ends at hour 10: the incident closed at 9
    "1005": ("NODE_FAIL", None, 2, 3, 1, "node_failure"),
    "1006": ("OUT_OF_MEMORY", None, 0, 5, 1, "user_error"),
    "1007": ("TIMEOUT", None, 0, 6, 1, "timeout"),
    "1008": ("PREEMPTED", None, 2, 7, 1, "preemption"),
    "1009": ("CANCELLED by 1001", None, 0, 8, 1, "cancelled"),
    "1010": ("FAILED", 2, 2, 20, 1, "node_failure"),  # node03's ECC incident, open, 23 h old
    "1011": ("FAILED", 1, 0, 30, 0.5, "user_error"),  # during the service request: no fault
    "1012": ("RUNNING", None, 0, 40, None, None),  # censored: no class yet
}


def incident(iid: str, node: int, klass: str, opened: float, closed: float | None) -> dict:
    return {"incident_id": iid, "cluster": "campus", "node": HOSTS[node], "class": klass,
            "source": "manual", "opened_at": at(opened),
            "closed_at": at(closed) if closed is not None else None,
            "opened_by": "alice.liddell", "closed_by": "ghopper", "resolution": SECRET_NOTE,
            "evidence": '{"host": "gpu-rack7-node02"}'}  # fmt: skip


INCIDENTS = [
    incident("inc-7", 1, "xid", 5, 9),
    incident("inc-3", 2, "ecc", -1, None),
    incident("inc-9", 0, "service_request", 30, 31),
    incident("inc-11", 0, "other", 60, None),  # after the window
]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("wh"))
    rows = []
    for job_id, (state, code, node, submit, run, _) in JOBS.items():
        start = at(submit) + timedelta(minutes=10)
        rows.append({"job_id": job_id, "cluster": "campus", "user": f"user{int(job_id) % 3}",
                     "account": "lab", "partition": "gpu", "submit_time": at(submit),
                     "start_time": start,
                     "end_time": start + timedelta(hours=run) if run is not None else None,
                     "state": state, "exit_code": code, "num_nodes": 1, "gpus_per_node": 1,
                     "num_gpus": 1, "nodes": [HOSTS[node]]})  # fmt: skip
    wh.append("jobs", pa.Table.from_pylist(rows))
    wh.append("incidents", pa.Table.from_pylist(INCIDENTS))
    return wh


def test_each_job_carries_its_failure_class(warehouse: Warehouse, tmp_path: Path) -> None:
    settings = TraceSettings.precise(k=1)
    out = export_trace(warehouse, T0, UNTIL, tmp_path / "t", KEY, settings).path
    jobs = pq.read_table(out / "jobs.parquet").to_pylist()
    by_submit = {round(j["submit_s"] / 3600, 3): j["failure_class"] for j in jobs}
    assert by_submit == {float(case[3]): case[5] for case in JOBS.values()}
    assert validate(out) == []


def test_incidents_are_listed_anonymized(warehouse: Warehouse, tmp_path: Path) -> None:
    settings = TraceSettings.precise(k=1)
    out = export_trace(warehouse, T0, UNTIL, tmp_path / "t", KEY, settings).path
    incidents = pq.read_table(out / "incidents.parquet")
    assert incidents.column_names == ["incident", "node", "class", "opened_s", "closed_s"]
    assert incidents.to_pylist() == [
        # opened before the window: counts from its start; still open at the end: no close
        {"incident": "i1", "node": "n003", "class": "ecc", "opened_s": 0.0, "closed_s": None},
        {"incident": "i2", "node": "n002", "class": "xid", "opened_s": 5 * 3600.0,
         "closed_s": 9 * 3600.0},
        {"incident": "i3", "node": "n001", "class": "service_request",
         "opened_s": 30 * 3600.0, "closed_s": 31 * 3600.0},
    ]  # fmt: skip
    jobs = pq.read_table(out / "jobs.parquet").to_pylist()
    failed_on = {j["nodes"][0] for j in jobs if j["failure_class"] == "node_failure"}
    assert failed_on == {"n002", "n003"}  # the same aliases as the incidents'
    text = "".join(p.read_text(errors="replace") for p in out.iterdir() if p.suffix != ".parquet")
    text += "".join(str(v) for v in incidents.to_pydict().values())
    for secret in (SECRET_NOTE, "alice.liddell", "ghopper", "inc-7", *HOSTS):
        assert secret not in text


def test_the_default_policy_bins_times_and_names_no_node(
    warehouse: Warehouse, tmp_path: Path
) -> None:
    settings = TraceSettings(k=1)  # day bins from a secret origin, per-job node names
    out = export_trace(warehouse, T0, UNTIL, tmp_path / "t", KEY, settings).path
    incidents = pq.read_table(out / "incidents.parquet").to_pylist()
    assert [i["class"] for i in incidents] == ["ecc", "xid", "service_request"]
    assert all(i["node"] is None for i in incidents)
    assert all(i["opened_s"] % 86400 == 0 for i in incidents)
    assert incidents[1]["opened_s"] == incidents[1]["closed_s"]  # hours 5 and 9: the same day
    assert validate(out) == []


def test_validate_finds_a_class_that_does_not_fit_the_state(
    warehouse: Warehouse, tmp_path: Path
) -> None:
    settings = TraceSettings.precise(k=1, write_csv=False)
    out = export_trace(warehouse, T0, UNTIL, tmp_path / "t", KEY, settings).path
    jobs = pq.read_table(out / "jobs.parquet")
    classes = jobs["failure_class"].to_pylist()
    row = jobs["state"].to_pylist().index("completed")
    classes[row] = "node_failure"
    column = jobs.column_names.index("failure_class")
    tampered = jobs.set_column(column, "failure_class", pa.array(classes))
    pq.write_table(tampered, out / "jobs.parquet")
    problems = validate(out)
    expected = f"jobs.parquet: row {row + 1}: failure_class 'node_failure' with state 'completed'"
    assert expected in problems


def test_validate_names_a_field_of_a_later_format_instead_of_failing(
    warehouse: Warehouse, tmp_path: Path
) -> None:
    """A field this version does not know (a 1.4 trace's, say) is a problem named, not a crash."""
    settings = TraceSettings.precise(k=1, write_csv=False)
    out = export_trace(warehouse, T0, UNTIL, tmp_path / "t", KEY, settings).path
    package = json.loads((out / "datapackage.json").read_text())
    jobs = pq.read_table(out / "jobs.parquet")
    later = pa.array([None] * jobs.num_rows, pa.float64())
    pq.write_table(jobs.append_column("gpu_temp_max", later), out / "jobs.parquet")
    resource = next(r for r in package["resources"] if r["name"] == "jobs")
    resource["schema"]["fields"].append({"name": "gpu_temp_max", "type": "number"})
    (out / "datapackage.json").write_text(json.dumps(package))
    problems = validate(out)
    assert "jobs.parquet: field 'gpu_temp_max' is not in format 1.3" in problems
