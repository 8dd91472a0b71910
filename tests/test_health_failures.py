"""Failure metrics of a month from a warehouse written as the collector and `sing incident`
write it: each job below plays one case of the failure classes, each incident one case of the
incident counts, so every figure the report prints is worked out by hand here.

November 2026 (720 h), three GPU nodes of 8 GPUs in the inventory all month: 2160 node-hours,
17280 GPU-hours. Incidents of cluster campus (H = hardware):
- I1 H xid on n1, 11-05 10:00 to 16:00 (6 h, closed in the month);
- I2 H ecc on n2, opened 11-20, still open;
- I3 H link on n1, opened 10-30 (before), closed 11-02 (72 h: closes in the month);
- S1, S2 service requests on n3, 11-10 (closed after 2 h) and 11-12 (open);
- I4 H other on n3, opened 12-02: after the month.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.executors.records import JobRecord, runs_table, to_tables
from sing.health.failures import FAILURE_CLASSES, over_time, report, snapshot
from sing.warehouse.store import Warehouse
from tests.real_path.site import SING

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)


def at(day: int, hour: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


# job -> (state, node(s), end, hours, GPUs, class expected); every job on cluster campus.
JOBS = {
    "1": ("COMPLETED", ("n3",), at(3), 10, 4, "success"),
    "2": ("FAILED", ("n3",), at(4), 2, 4, "user_error"),
    "3": ("OUT_OF_MEMORY", ("n3",), at(4, 5), 1, 4, "user_error"),
    "4": ("FAILED", ("n1",), at(5, 12), 3, 4, "node_failure"),  # during I1
    "5": ("FAILED", ("n1",), at(5, 17), 1, 4, "user_error"),  # after I1 closed
    "6": ("NODE_FAIL", ("n2",), at(8), 5, 4, "node_failure"),
    "7": ("TIMEOUT", ("n3",), at(9), 4, 4, "timeout"),
    "8": ("PREEMPTED", ("n3",), at(9, 3), 2, 4, "preemption"),
    "9": ("CANCELLED by 1001", ("n3",), at(9, 4), 1, 4, "cancelled"),
    "10": ("FAILED", ("n3", "n2"), at(20, 12), 1, 2, "node_failure"),  # I2 open on its 2nd node
    "11": ("FAILED", ("n3",), at(10, 1), 1, 4, "user_error"),  # a service request is no fault
    "14": ("FAILED", ("n1",), at(1, 12), 1, 4, "node_failure"),  # during I3, opened before
    "15": ("COMPLETED", ("n1",), at(30, 23), 1, 1, "success"),
}
NOT_COUNTED = {
    "12": ("RUNNING", ("n2",), None, 0, 4, None),
    "13": ("COMPLETED", ("n3",), at(31, 12, month=10), 1, 4, None),  # ended in October
}
# The same node name on another cluster, failing while campus's n1 had I1: a user error.
OTHER_CLUSTER_JOB = ("4", "other", "FAILED", ("n1",), at(5, 12), 1, 4)


def incident(iid: str, node: str, klass: str, opened: datetime, closed: datetime | None) -> dict:
    return {"incident_id": iid, "cluster": "campus", "node": node, "class": klass,
            "source": "manual", "opened_at": opened, "closed_at": closed,
            "opened_by": "ghopper", "recorded_at": opened}  # fmt: skip


INCIDENTS = [
    incident("I1", "n1", "xid", at(5, 10), at(5, 16)),
    incident("I2", "n2", "ecc", at(20), None),
    incident("I3", "n1", "link", at(30, month=10), at(2)),
    incident("S1", "n3", "service_request", at(10), at(10, 2)),
    incident("S2", "n3", "service_request", at(12), None),
    incident("I4", "n3", "other", at(2, month=12), None),
]


def job(job_id: str, cluster: str, state: str, nodes, end, hours, gpus) -> JobRecord:
    start = (end or DEC) - timedelta(hours=hours or 1)
    return JobRecord(job_id, cluster, state, user="alice", account="physics",
                     submit_time=start - timedelta(minutes=5), start_time=start, end_time=end,
                     nodes=nodes, num_gpus=gpus)  # fmt: skip


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("health") / "wh")
    records = [job(j, "campus", *case[:5]) for j, case in {**JOBS, **NOT_COUNTED}.items()]
    records.append(job(OTHER_CLUSTER_JOB[0], *OTHER_CLUSTER_JOB[1:]))
    wh.append("jobs", to_tables(records, recorded_at=DEC)[0])
    inventory = [
        {"cluster": "campus", "node": n, "gpus": 8, "gpu_model": "A100",
         "valid_from": at(1, month=10), "source": "sinfo"}
        for n in ("n1", "n2", "n3")
    ]  # fmt: skip
    wh.append("nodes", pa.Table.from_pylist(inventory))
    wh.append("incidents", pa.Table.from_pylist(INCIDENTS))
    return wh


def test_each_job_gets_its_failure_class(warehouse: Warehouse) -> None:
    found = report(warehouse.connect(), NOV, DEC, now=DEC)
    by_class = {row["failure_class"]: row for row in found["causes"]}
    assert [row["failure_class"] for row in found["causes"]] == list(FAILURE_CLASSES)
    expected: dict[str, list[str]] = {name: [] for name in FAILURE_CLASSES}
    for job_id, case in JOBS.items():
        expected[case[5]].append(job_id)
    expected["user_error"].append("other/4")
    for name, jobs in expected.items():
        assert by_class[name]["jobs"] == len(jobs), name
    assert found["jobs"] == len(JOBS) + 1 == 14
    assert by_class["node_failure"]["gpu_hours"] == pytest.approx(12 + 20 + 2 + 4)
    assert by_class["user_error"]["gpu_hours"] == pytest.approx(8 + 4 + 4 + 4 + 4)
    assert by_class["success"]["share"] == pytest.approx(2 / 14)
    # lost: user errors 24, node failures 38, timeout 16, preemption 8; not success, cancelled
    assert found["gpu_hours_lost"] == pytest.approx(86)


def test_a_requeued_jobs_earlier_runs_count_by_their_own_state(tmp_path: Path) -> None:
    """Job 20 ran three times: its node failed (NODE_FAIL, requeued), it was requeued by hand
    (REQUEUED), then it completed. `jobs` holds the last run; each run is a cause."""
    runs = [
        job("20", "campus", "NODE_FAIL", ("n1",), at(3, 2), 2, 4),
        job("20", "campus", "REQUEUED", ("n2",), at(3, 5), 1, 4),
        job("20", "campus", "COMPLETED", ("n3",), at(3, 10), 3, 4),
    ]
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", to_tables(runs[-1:], recorded_at=DEC)[0])
    wh.append("job_runs", runs_table(runs, recorded_at=DEC))
    found = report(snapshot(wh), NOV, DEC, now=DEC)
    by_class = {row["failure_class"]: (row["jobs"], row["gpu_hours"]) for row in found["causes"]}
    assert by_class["node_failure"] == (1, pytest.approx(8))
    assert by_class["preemption"] == (1, pytest.approx(4))
    assert by_class["success"] == (1, pytest.approx(12))
    assert found["jobs"] == 3 and found["gpu_hours_lost"] == pytest.approx(12)


def test_incident_counts_mtbf_and_service_requests(warehouse: Warehouse) -> None:
    found = report(warehouse.connect(), NOV, DEC, now=DEC)
    incidents = found["incidents"]
    assert (incidents["hardware"], incidents["service_requests"]) == (2, 2)  # I1, I2; S1, S2
    assert (incidents["opened"], incidents["closed"], incidents["open_at_end"]) == (4, 3, 2)
    assert incidents["mean_time_to_close_s"] == pytest.approx((6 + 72 + 2) / 3 * 3600)
    mtbf = found["mtbf"]
    assert (mtbf["node_hours"], mtbf["gpu_hours"]) == (pytest.approx(2160), pytest.approx(17280))
    assert mtbf["node_hours_between"] == pytest.approx(1080)
    assert mtbf["gpu_hours_between"] == pytest.approx(8640)
    assert found["service_requests_per_job"] == pytest.approx(2 / 14)
    nodes = {(row["node"]): row for row in found["nodes"]}
    assert set(nodes) == {"n1", "n2"}  # n3's incidents are requests, or after the month
    assert (nodes["n1"]["incidents"], nodes["n1"]["open_at_end"]) == (1, 0)  # I3 opened before
    assert nodes["n1"]["classes"] == ["link", "xid"]
    assert (nodes["n2"]["incidents"], nodes["n2"]["open_at_end"]) == (1, 1)


def test_a_month_without_incidents_has_no_mean_between_them(warehouse: Warehouse) -> None:
    found = report(warehouse.connect(), at(1, month=9), at(1, month=10), now=DEC)
    assert found["jobs"] == 0 and found["gpu_hours_lost"] == 0
    assert found["mtbf"]["node_hours_between"] is None
    assert found["service_requests_per_job"] is None
    assert all(row["share"] is None for row in found["causes"])


def test_failures_over_time_by_day(warehouse: Warehouse) -> None:
    rows = over_time(warehouse.connect(), NOV, DEC, DEC, bucket="day")
    fifth = {r["failure_class"]: r["jobs"] for r in rows if r["bucket"].day == 5}
    assert fifth == {"node_failure": 1, "user_error": 2}  # job 4; job 5 and the other cluster's
    assert sum(r["jobs"] for r in rows) == 14


def sing(warehouse: Warehouse, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SING, "health", *args, "--warehouse", str(warehouse.root)],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(warehouse.root).parent)  # fmt: skip


def test_report_command_prints_tables_and_json(warehouse: Warehouse) -> None:
    done = sing(warehouse, "report", "--period", "2026-11", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["jobs"] == 14 and found["incidents"]["hardware"] == 2
    assert found["window"]["since"].startswith("2026-11-01T00:00:00")
    assert [row["failure_class"] for row in found["rows"]] == list(FAILURE_CLASSES)
    done = sing(warehouse, "report", "--period", "2026-11")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Jobs that ended 2026-11-01 00:00 to 2026-12-01 00:00 UTC"
    assert lines[1].split() == ["cause", "jobs", "share", "of", "jobs", "%", "GPU-h"]
    assert "node_failure" in lines[5] and lines[5].split()[1:] == ["4", "28.6", "38.0"]
    figures = {}
    for line in lines[lines.index("") + 2 :]:
        if not line:
            break
        name, value = line.rsplit("  ", 1)
        figures[name.strip()] = value
    assert figures == {
        "jobs ended": "14",
        "GPU-hours lost to failed jobs": "86.0",
        "hardware incidents opened": "2",
        "mean time between incidents per node (h)": "1,080.0",
        "GPU-hours between incidents": "8,640.0",
        "service requests": "2",
        "jobs per service request": "7.0",
        "incidents opened / closed": "4 / 3",
        "incidents open at the end": "2",
        "mean time to close (h)": "26.7",
    }
    assert lines[-2:] == [
        "campus   n2                   1            1  ecc",
        "campus   n1                   1            0  link,xid",
    ]


def test_report_rejects_bad_windows(warehouse: Warehouse) -> None:
    done = sing(warehouse, "report", "--period", "2026-13")
    assert done.returncode == 1 and "--period: '2026-13' is not a real period" in done.stderr
    done = sing(warehouse, "report", "--period", "2026-11", "--since", "2026-11-02")
    assert done.returncode == 1 and "either --period or --since/--until" in done.stderr
    done = sing(warehouse, "report", "--since", "2026-11-02", "--until", "2026-11-01")
    assert done.returncode == 2 and "is not before --until" in done.stderr
