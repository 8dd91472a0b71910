"""The drain breaker: sing drains at most `[health] max_drained_share` of a cluster's nodes
within `drain_breaker_window_s`; the drain past that trips the policies' circuit breaker, which
tells the admins once and blocks every drain (and cancel) until `sing policy resume`.

`sing health drain` runs as the admin runs it, against the fake `scontrol` and `sinfo` of
tests/test_health_drain_intent.py. The inventory holds ten nodes; gpu-1, gpu-2 and gpu-3 have
each a GPU whose row remapping failed, so all three are drain candidates.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.policy.breaker import RESUMED, TRIPPED, Breaker
from sing.policy.settings import PolicySettings
from sing.schema import TABLES
from sing.warehouse.audit import ACTION, Event, record
from sing.warehouse.store import Warehouse
from tests.mailbox import webhook_server
from tests.real_path.site import SING
from tests.test_health_drain_intent import FakeSlurm
from tests.test_health_drain_slurm import CLUSTER, NOW, reading, sing, write_config

OVER = ("gpu-1", "gpu-2", "gpu-3")


def site_at(tmp: Path, inventory: int = 10) -> Warehouse:
    wh = Warehouse(tmp / "wh")
    rows = [reading(n, m, "row_remap_failed", v, "2") for n in OVER for m, v in ((600, 0), (30, 1))]
    wh.append("health_samples", pa.Table.from_pylist(rows))
    if inventory:
        nodes = [
            {
                "node": f"gpu-{i}",
                "gpus": 8,
                "gpu_model": "H100",
                "gpu_memory_bytes": 80 << 30,
                "partition": "gpu",
                "cluster": CLUSTER,
                "valid_from": NOW - timedelta(days=30),
                "source": "sinfo",
                "recorded_at": NOW - timedelta(days=30),
            }  # fmt: skip
            for i in range(1, inventory + 1)
        ]
        wh.append("nodes", pa.Table.from_pylist(nodes, schema=TABLES["nodes"].schema))
    return wh


def configure(tmp: Path, hook_url: str) -> Path:
    config = write_config(tmp, drain=True, dry_run=False)
    config.write_text(config.read_text() + f'[policy]\nwebhook_url = "{hook_url}"\n')
    return config


def outcomes(wh: Warehouse) -> list[tuple[str, dict]]:
    rows = wh.connect().sql(
        "SELECT outcome, detail FROM policy_events WHERE event = 'action' "
        "AND outcome <> 'drain_intent' ORDER BY ts, outcome"
    )
    return [(outcome, json.loads(detail)) for outcome, detail in rows.fetchall()]


def drained(result: subprocess.CompletedProcess) -> dict[str, str]:
    return {row["node"]: row["done"] for row in json.loads(result.stdout)["rows"]}


def resume(tmp: Path, config: Path) -> None:
    done = subprocess.run(
        [SING, "policy", "resume", "--config", str(config), "--note", "gpu-1..3 really broken"],
        capture_output=True, text=True, timeout=120, cwd=tmp, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0 and "cleared" in done.stdout, done.stderr


@pytest.fixture
def hook():
    with webhook_server() as hook:
        yield hook


def test_one_drain_of_ten_nodes_then_the_breaker_trips_once_and_blocks_the_rest(
    tmp_path: Path, hook
) -> None:
    wh, slurm = site_at(tmp_path), FakeSlurm(tmp_path)
    config = configure(tmp_path, hook.url)
    first = sing(tmp_path, config, "--json", env=slurm.env())
    assert first.returncode == 1, first.stderr  # blocked drains: an admin must look
    assert drained(first) == {"gpu-1": "drained", "gpu-2": "blocked", "gpu-3": "blocked"}
    assert slurm.lines("drains") == ["drain gpu-1"]
    trail = outcomes(wh)
    trips = [d for o, d in trail if o == TRIPPED]
    (trip,) = trips
    assert "max_drained_share = 0.1 of 10 nodes" in trip["why"] and "gpu-2" in trip["why"]
    assert trip["blocked_nodes"] == ["gpu-2", "gpu-3"]
    blocked = [d for o, d in trail if o == "drain_blocked"]
    assert [d["node"] for d in blocked] == ["gpu-2", "gpu-3"]
    assert all("circuit breaker tripped" in d["error"] for d in blocked)
    (post,) = hook.posts
    assert "Drains held back: gpu-2, gpu-3" in json.dumps(post)
    # the trip stops cancels too: one breaker per cluster
    settings = PolicySettings()
    assert Breaker.load(wh, CLUSTER, datetime.now(UTC), settings).cancel_blocked("42")

    # tripped stays tripped: blocked again, shown with the reason, no second message
    again = sing(tmp_path, config, env=slurm.env())
    assert "blocked: circuit breaker tripped" in again.stdout
    assert slurm.lines("drains") == ["drain gpu-1"] and len(hook.posts) == 1
    assert [o for o, _ in outcomes(wh)].count(TRIPPED) == 1

    # the admin resumes: the window counts from the resume, so one more drain goes through,
    # and the next trips the breaker again
    resume(tmp_path, config)
    after = sing(tmp_path, config, "--json", env=slurm.env())
    assert drained(after)["gpu-2"] == "drained" and drained(after)["gpu-3"] == "blocked"
    assert slurm.lines("drains") == ["drain gpu-1", "drain gpu-2"]
    assert [o for o, _ in outcomes(wh)].count(TRIPPED) == 2 and len(hook.posts) == 2


def test_a_cancel_trip_blocks_drains_without_a_new_trip(tmp_path: Path, hook) -> None:
    wh, slurm = site_at(tmp_path), FakeSlurm(tmp_path)
    why = {"why": "6 cancels within an hour reached [policy] max_cancels_per_hour = 5"}
    record(wh, [Event(NOW, CLUSTER, ACTION, TRIPPED, "policy", False, detail=why)])
    done = sing(tmp_path, configure(tmp_path, hook.url), "--json", env=slurm.env())
    assert set(drained(done).values()) == {"blocked"} and slurm.lines("drains") == []
    assert "max_cancels_per_hour" in json.loads(done.stdout)["rows"][0]["error"]
    assert [o for o, _ in outcomes(wh)] == [TRIPPED, *["drain_blocked"] * 3]
    assert hook.posts == []  # told when it tripped, not again


def test_an_empty_inventory_allows_one_drain_and_says_so(tmp_path: Path, hook) -> None:
    wh, slurm = site_at(tmp_path, inventory=0), FakeSlurm(tmp_path)
    done = sing(tmp_path, configure(tmp_path, hook.url), "--json", env=slurm.env())
    assert list(drained(done).values()) == ["drained", "blocked", "blocked"]
    (trip,) = [d for o, d in outcomes(wh) if o == TRIPPED]
    assert "node inventory empty: 1 allowed" in trip["why"]


def test_a_resume_before_the_window_does_not_widen_it(tmp_path: Path) -> None:
    """A share of 0.2 of 10 nodes allows two; a resume long ago changes nothing."""
    wh = site_at(tmp_path)
    record(wh, [Event(NOW - timedelta(days=1), CLUSTER, ACTION, RESUMED, "me", False)])
    breaker = Breaker.load(wh, CLUSTER, NOW, PolicySettings())
    assert breaker.resumed_at == NOW - timedelta(days=1)
    assert breaker.drain_blocked("gpu-1", 1, 10, 0.2, 3600) is None
    assert breaker.drain_blocked("gpu-2", 2, 10, 0.2, 3600) is not None and breaker.new_trip


def test_a_trip_of_days_ago_still_blocks_drains_and_cancels(tmp_path: Path) -> None:
    """The state is the newest trip or resume, however old: it never lapses by itself."""
    wh = site_at(tmp_path)
    why = {"why": "drains within 3600 s reached [health] max_drained_share"}
    record(
        wh, [Event(NOW - timedelta(days=2), CLUSTER, ACTION, TRIPPED, "sing", False, detail=why)]
    )
    breaker = Breaker.load(wh, CLUSTER, NOW, PolicySettings())
    assert breaker.tripped_at == NOW - timedelta(days=2)
    assert "max_drained_share" in breaker.drain_blocked("gpu-1", 0, 10, 0.1, 3600)
    assert breaker.cancel_blocked("42") is not None and not breaker.new_trip
