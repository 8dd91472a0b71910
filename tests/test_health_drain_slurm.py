"""Drain suggestions from scripted health readings, and the drain itself on a real Slurm.

The readings are written to `health_samples` as the collector writes them (a row per change).
gpu-1 crosses two limits: its GPU 2's row remapping failed, and XID 79 (fallen off the bus)
was seen on GPU 5 within the window; gpu-2 stays under every limit: one link down (limit 3),
no uncorrected ECC error, an XID 13 (an application's fault, not listed) and an XID 79 count
that is old (before the window). `sing health drain` runs as the admin would run it, against
the loopback Slurm of tests/slurm_harness.py, and `sinfo` says what Slurm made of it.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.config import Config, ConfigError
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor
from sing.health.settings import HealthSettings
from sing.policy.drain import candidates, command, reason_text
from sing.warehouse.store import Warehouse
from tests.real_path.site import SING
from tests.slurm_harness import SlurmCluster, running, scratch

NOW = datetime.now(UTC).replace(microsecond=0)
CLUSTER = "campus"


def reading(node: str, minutes_ago: float, signal: str, value: float, device: str = "0") -> dict:
    component = "rdma" if signal == "link_downed" else "gpu"
    return {"ts": NOW - timedelta(minutes=minutes_ago), "cluster": CLUSTER, "node": node,
            "component": component, "device": device, "signal": signal,
            "value": value}  # fmt: skip


READINGS = [
    # gpu-1: over two limits
    reading("gpu-1", 600, "row_remap_failed", 0, "2"),
    reading("gpu-1", 30, "row_remap_failed", 1, "2"),
    reading("gpu-1", 600, "xid_79", 0, "5"),
    reading("gpu-1", 20, "xid_79", 1, "5"),
    reading("gpu-1", 600, "ecc_uncorrected_volatile", 0, "2"),
    # gpu-2: under every limit
    reading("gpu-2", 2 * 24 * 60, "link_downed", 4, "mlx5_0/1"),  # before the window
    reading("gpu-2", 10, "link_downed", 5, "mlx5_0/1"),  # +1 in the window; limit 3
    reading("gpu-2", 5, "xid_13", 7),  # not a listed XID
    reading("gpu-2", 3 * 24 * 60, "xid_79", 2),  # three days ago: outside the window
    reading("gpu-2", 600, "ecc_uncorrected_volatile", 0),
    reading("gpu-2", 600, "retired_pages_pending", 0),
]


def warehouse_at(root: Path, rows: list[dict] = READINGS) -> Warehouse:
    wh = Warehouse(root)
    wh.append("health_samples", pa.Table.from_pylist(rows))
    return wh


def test_the_limits_pick_the_node_over_them(tmp_path: Path) -> None:
    con = warehouse_at(tmp_path / "wh").connect()
    (node,) = candidates(con, HealthSettings(), NOW)
    assert (node["cluster"], node["node"]) == (CLUSTER, "gpu-1")
    shown = {(e["signal"], e["device"], e["figure"], e["value"]) for e in node["evidence"]}
    assert shown == {("row_remap_failed", "2", "now", 1), ("xid_79", "5", "increase", 1)}
    assert node["reason"] == (
        "sing health: row_remap_failed=1 on gpu 2 (limit 1), xid_79=+1 on gpu 5 (limit 1)"
    )
    drain_gpu1 = "scontrol update nodename=gpu-1 state=drain"
    assert node["command"] == f'{drain_gpu1} reason="{node["reason"]}"'
    # Lower limits catch gpu-2's link downs; a limit of 0 turns a check off.
    lower = HealthSettings(drain_link_downed=1, drain_xid={"79": 0}, drain_row_remap_failed=False)
    (node,) = candidates(con, lower, NOW)
    assert node["node"] == "gpu-2" and node["evidence"][0]["signal"] == "link_downed"


def test_a_counter_reset_counts_from_zero(tmp_path: Path) -> None:
    rows = [
        reading("gpu-3", 2 * 24 * 60, "xid_48", 5),
        reading("gpu-3", 60, "xid_48", 1),  # the exporter restarted and saw one more
        reading("gpu-4", 2 * 24 * 60, "xid_48", 5),
        reading("gpu-4", 60, "xid_48", 5),  # the collector restarted: same value, no increase
    ]
    con = warehouse_at(tmp_path / "wh", rows).connect()
    found = candidates(con, HealthSettings(), NOW)
    assert [n["node"] for n in found] == ["gpu-3"]
    assert found[0]["evidence"][0]["value"] == 1


def test_first_readings_are_a_baseline_and_restarts_add_no_evidence(tmp_path: Path) -> None:
    """A port first seen with months of link downs is not flapping now; a flag the collector
    wrote again after a restart is evidence from when it changed, so a drain after that change
    (and an admin's resume) stands."""
    rows = [
        reading("gpu-5", 30, "link_downed", 40, "mlx5_0/1"),  # first ever reading: a baseline
        reading("gpu-6", 600, "row_remap_failed", 1, "3"),
        reading("gpu-6", 10, "row_remap_failed", 1, "3"),  # the collector restarted
    ]
    con = warehouse_at(tmp_path / "wh", rows).connect()
    (node,) = candidates(con, HealthSettings(), NOW)
    assert node["node"] == "gpu-6"
    assert node["newest_evidence"] == NOW - timedelta(minutes=600)


def test_the_reason_carries_no_shell_characters() -> None:
    evidence = [{"component": "rdma", "device": 'mlx5_0/1";rm -rf $HOME`', "signal": "link_downed",
                 "figure": "increase", "value": 4.0, "limit": 3}]  # fmt: skip
    reason = reason_text(evidence)
    assert reason == "sing health: link_downed=+4 on rdma mlx5_0/1__rm -rf _HOME_ (limit 3)"
    assert command("gpu-9", reason).count('"') == 2
    # a node name comes from a scrape target's labels: quoted for the shell
    assert command("gpu1;rm -rf ~", reason).startswith("scontrol update nodename='gpu1;rm -rf ~' ")


def test_the_settings_are_checked(tmp_path: Path) -> None:
    file = tmp_path / "sing.toml"
    file.write_text('[health]\ndrain_xid = {"bus" = 1}\n')
    with pytest.raises(ConfigError, match="drain_xid: 'bus' = 1"):
        Config.load(file).section("health", HealthSettings)
    file.write_text("[health]\ndrain_window_hours = 0\n")
    with pytest.raises(ConfigError, match="drain_window_hours = 0"):
        Config.load(file).section("health", HealthSettings)


def test_the_local_executor_says_it_cannot_drain(tmp_path: Path) -> None:
    """With the local executor, the drain fails with its reason, recorded, nothing else done."""
    wh = warehouse_at(tmp_path / "wh")
    config = write_config(tmp_path, drain=True, dry_run=False, kind="local")
    done = sing(tmp_path, config, "--json")
    assert done.returncode == 1
    (node,) = json.loads(done.stdout)["rows"]
    assert node["done"] == "failed" and "local executor cannot drain gpu-1" in node["error"]
    (event,) = drains(wh)
    assert (event["ok"], event["dry_run"], event["channel"]) == (False, False, "local")


def write_config(tmp: Path, drain: bool, dry_run: bool, kind: str = "slurm") -> Path:
    file = tmp / "sing.toml"
    file.write_text(
        f'[site]\ncluster = "{CLUSTER}"\nwarehouse = "wh"\n[executor]\nkind = "{kind}"\n'
        f"[health]\ndrain = {str(drain).lower()}\ndry_run = {str(dry_run).lower()}\n"
    )
    return file


def sing(tmp: Path, config: Path, *args: str, env: dict | None = None):
    return subprocess.run([SING, "health", "drain", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp,
                          env=env)  # fmt: skip


def drains(wh: Warehouse) -> list[dict]:
    rows = wh.connect().sql(
        "SELECT ts, cluster, dry_run, ok, channel, detail FROM policy_events "
        "WHERE event = 'action' AND outcome = 'drain' ORDER BY ts"
    )
    return [dict(zip(rows.columns, r, strict=True)) for r in rows.fetchall()]


@pytest.fixture(scope="module")
def slurm():
    with running(SlurmCluster(scratch("sing-drain-"))) as cluster:
        yield cluster


def node_states(cluster: SlurmCluster) -> dict[str, tuple[str, str]]:
    """node -> (state, reason) as `sinfo` shows them."""
    text = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%T|%250E"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = (line.split("|") for line in text.splitlines() if line.strip())
    return {node: (state, reason.strip()) for node, state, reason in rows}


@pytest.mark.slurm
def test_dry_run_and_suggestions_drain_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    wh = warehouse_at(tmp_path / "wh")
    config = write_config(tmp_path, drain=False, dry_run=False)  # no permission
    done = sing(tmp_path, config, env=slurm.env)
    assert done.returncode == 0, done.stderr
    assert "scontrol update nodename=gpu-1 state=drain reason=" in done.stdout
    assert "gpu-2" not in done.stdout and "Suggestions only" in done.stdout
    assert not drains(wh)  # a suggestion is not a decision
    config = write_config(tmp_path, drain=True, dry_run=True)  # permission, but a dry run
    done = sing(tmp_path, config, "--json", env=slurm.env)
    assert done.returncode == 0, done.stderr
    (node,) = json.loads(done.stdout)["rows"]
    assert (node["node"], node["done"]) == ("gpu-1", "dry run")
    (event,) = drains(wh)
    assert (event["dry_run"], event["ok"]) == (True, True)
    assert json.loads(event["detail"])["node"] == "gpu-1"
    states = node_states(slurm)
    assert states["gpu-1"][0] == "idle" and states["gpu-2"][0] == "idle"


@pytest.mark.slurm
def test_with_permission_the_node_over_a_limit_is_drained(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    wh = warehouse_at(tmp_path / "wh")
    config = write_config(tmp_path, drain=True, dry_run=False)
    try:
        done = sing(tmp_path, config, env=slurm.env)
        assert done.returncode == 0, done.stderr
        states = node_states(slurm)
        state, reason = states["gpu-1"]
        assert state == "drained"
        assert reason == (
            "sing health: row_remap_failed=1 on gpu 2 (limit 1), xid_79=+1 on gpu 5 (limit 1)"
        )
        assert states["gpu-2"][0] == "idle"  # under every limit
        # what reconciliation reads back (sing.policy.drain.reconcile) from this real Slurm
        with pytest.MonkeyPatch.context() as patch:
            for key, value in slurm.env.items():
                patch.setenv(key, value)
            executor = SlurmExecutor(CLUSTER, ExecutorSettings())
            seen, other = executor.node_state("gpu-1"), executor.node_state("gpu-2")
            unknown = executor.node_state("gpu-99")
        assert seen is not None and seen.drained and seen.reason == reason
        assert other is not None and not other.drained and unknown is None
        (event,) = drains(wh)
        assert (event["dry_run"], event["ok"], event["channel"]) == (False, True, "slurm")
        detail = json.loads(event["detail"])
        assert detail["command"].startswith("scontrol update nodename=gpu-1 state=drain")
        # Once drained, a later run leaves the node to the admins until a reading changes.
        done = sing(tmp_path, config, "--json", env=slurm.env)
        (node,) = json.loads(done.stdout)["rows"]
        assert node["done"].startswith("drained ") and node["done"].endswith("nothing newer")
        assert len(drains(wh)) == 1
    finally:
        subprocess.run(["scontrol", "update", "nodename=gpu-1", "state=resume"], env=slurm.env)
