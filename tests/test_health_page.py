"""The Health page through Streamlit's AppTest, per role: admins see open incidents, failure
causes, GPU-hours lost, MTBF and the drain suggestions; users and researchers cannot open it.

The warehouse is written as the collector and `sing incident` write it: four jobs that ended in
the last two days (a success, a user error, a job that failed on n1 while its XID incident was
open, a timeout) and one running at the end of the data, an incident on n1 still open, one
closed on n2, readings that put n1 over the drain limits, and a dry-run drain of n1.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from sing.executors.records import JobRecord, to_tables
from sing.warehouse.audit import ACTION, Event, record
from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app, serving

END = datetime(2026, 6, 1, 12, tzinfo=UTC)  # the end of the data
ADMIN, ALICE, RESEARCHER = "ghopper", "alice", "rsearch"


def hours_ago(n: float) -> datetime:
    return END - timedelta(hours=n)


# job -> (state, node, ended hours ago, run hours, GPUs)
JOBS = {
    "1": ("COMPLETED", "n2", 30, 10, 4),
    "2": ("FAILED", "n2", 20, 2, 4),
    "3": ("FAILED", "n1", 5, 3, 8),  # during the open incident on n1: a node failure
    "4": ("TIMEOUT", "n2", 2, 4, 2),
}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    root = tmp_path_factory.mktemp("health-page") / "wh"
    wh = Warehouse(root)
    jobs = [
        JobRecord(job, "campus", state, user=ALICE, account="physics",
                  submit_time=hours_ago(ago + run + 1), start_time=hours_ago(ago + run),
                  end_time=hours_ago(ago), nodes=(node,), num_gpus=gpus)
        for job, (state, node, ago, run, gpus) in JOBS.items()
    ]  # fmt: skip
    jobs.append(JobRecord("5", "campus", "RUNNING", user=ALICE, submit_time=END,
                          start_time=END, nodes=("n2",), num_gpus=1))  # fmt: skip
    wh.append("jobs", to_tables(jobs, recorded_at=END)[0])
    wh.append(
        "nodes",
        pa.Table.from_pylist(
            [{"cluster": "campus", "node": n, "gpus": 8, "valid_from": END - timedelta(days=60)}
             for n in ("n1", "n2")]
        ),
    )  # fmt: skip
    wh.append(
        "incidents",
        pa.Table.from_pylist(
            [
                {"incident_id": "inc-1", "cluster": "campus", "node": "n1", "class": "xid",
                 "source": "auto", "signal": "xid_79", "opened_at": hours_ago(6),
                 "closed_at": None, "opened_by": "sing collector"},
                {"incident_id": "inc-2", "cluster": "campus", "node": "n2", "class": "link",
                 "source": "manual", "signal": None, "opened_at": hours_ago(50),
                 "closed_at": hours_ago(40), "opened_by": ADMIN},
            ]
        ),
    )  # fmt: skip
    wh.append(
        "health_samples",
        pa.Table.from_pylist(
            [{"ts": hours_ago(h), "cluster": "campus", "node": "n1", "component": "gpu",
              "device": "3", "signal": "xid_79", "value": v} for h, v in ((72, 0), (6, 1))]
        ),
    )  # fmt: skip
    drained = Event(ts=hours_ago(1), cluster="campus", event=ACTION, outcome="drain",
                    actor="sing health drain@head1", dry_run=True, channel="slurm",
                    detail={"node": "n1", "reason": "sing health: xid_79=+1 on gpu 3"})  # fmt: skip
    record(wh, [drained])
    config = root.parent / "sing.toml"
    config.write_text(
        f'[roles]\nadmins = ["{ADMIN}"]\nresearchers = ["{RESEARCHER}"]\n'
        '[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n'
    )
    with serving(root, config):
        yield wh


def test_admins_see_incidents_failures_and_drain_suggestions(warehouse: Warehouse) -> None:
    at = open_app(ADMIN, "health")
    assert at.title[0].value == "Health"
    shown = metrics(at)
    assert shown["Open incidents"] == "1"
    # lost: job 2 (4 GPUs x 2 h), job 3 (8 x 3), job 4 (2 x 4); job 1 succeeded
    assert shown["GPU-hours lost"] == "40.0 h"
    # The default window is the data's: from job 1's submission 41 h before the end; two
    # nodes (82 node-hours, 656 GPU-hours), one incident opened in it (inc-2 is older).
    assert shown["MTBF per node"] == "82 h"
    assert shown["GPU-hours between incidents"] == "656 GPU-h"
    opened, causes, nodes, drain, done = (d.value for d in at.dataframe)
    assert list(opened["incident_id"]) == ["inc-1"] and opened["node"][0] == "n1"
    by_class = dict(zip(causes["failure_class"], causes["jobs"], strict=True))
    assert by_class == {"success": 1, "user_error": 1, "timeout": 1, "node_failure": 1,
                        "preemption": 0, "cancelled": 0}  # fmt: skip
    assert set(nodes["node"]) == {"n1", "n2"}
    assert list(drain["node"]) == ["n1"]
    assert drain["command"][0].startswith("scontrol update nodename=n1 state=drain reason=")
    assert "xid_79=+1 on gpu 3" in drain["reason"][0]
    assert list(done["dry_run"]) == [True] and '"node": "n1"' in done["detail"][0]


def test_only_admins_open_the_page(warehouse: Warehouse) -> None:
    for who in (RESEARCHER, ALICE):
        at = open_app(who)
        with pytest.raises(ValueError, match="Could not find a navigation page"):
            at.switch_page("pages/health.py")
