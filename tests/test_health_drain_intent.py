"""Drains that always leave a record: the intent before the act, the outcome after, and an
intent whose outcome the process never wrote settled at the next run with what Slurm shows.

`sing health drain` runs as the admin runs it, with the Slurm executor, against fake `scontrol`
and `sinfo` scripts (PATH holds nothing else, so a real Slurm client installed here is never
run). The fake Slurm keeps each node's state in a file; `FAKE_DRAIN` makes its `scontrol`
kill sing (SIGKILL, nothing can be written after it) before or after it drains, fail, or
succeed; `FAKE_SINFO=fail` makes `sinfo` unable to answer. The readings are those of the
real-Slurm drain test: gpu-1 is over two limits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sing.config import Config
from sing.executors.base import NodeState
from sing.policy import drain
from sing.warehouse.store import Warehouse
from tests.test_health_drain_slurm import drains, sing, warehouse_at, write_config

SCONTROL = """#!/bin/bash
# scontrol update nodename=NODE state=drain reason=REASON
for arg in "$@"; do
    case "$arg" in nodename=*) node=${arg#nodename=} ;; reason=*) reason=${arg#reason=} ;; esac
done
case "$FAKE_DRAIN" in
    die-before) kill -9 $PPID; exit 0 ;;
    fail) echo "slurm_update error: Invalid node name specified" >&2; exit 1 ;;
esac
echo "drain $node" >> "$FAKE_SLURM/drains"
echo "drained|$reason" > "$FAKE_SLURM/node-$node"
[[ "$FAKE_DRAIN" == die-after ]] && kill -9 $PPID
exit 0
"""
SINFO = """#!/bin/bash
# sinfo --all --Node --noheader --nodes=NODE --format=%T|%300E
for arg in "$@"; do case "$arg" in --nodes=*) node=${arg#--nodes=} ;; esac; done
if [[ "$FAKE_SINFO" == fail ]]; then
    echo "slurm_load_node: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
echo "sinfo $node" >> "$FAKE_SLURM/queries"
state="$FAKE_SLURM/node-$node"
if [[ -f "$state" ]]; then echo "$(< "$state")"; else echo "idle|"; fi
"""


class FakeSlurm:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "slurm"
        self.bin = tmp / "bin"
        self.state.mkdir()
        self.bin.mkdir()
        for name, text in (("scontrol", SCONTROL), ("sinfo", SINFO)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)

    def env(self, drain: str = "ok", sinfo: str = "ok") -> dict[str, str]:
        return {"PATH": str(self.bin), "HOME": str(self.state), "FAKE_SLURM": str(self.state),
                "FAKE_DRAIN": drain, "FAKE_SINFO": sinfo}  # fmt: skip

    def lines(self, name: str) -> list[str]:
        path = self.state / name
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def site(tmp_path: Path) -> tuple[Warehouse, Path, FakeSlurm]:
    return (
        warehouse_at(tmp_path / "wh"),
        write_config(tmp_path, drain=True, dry_run=False),
        FakeSlurm(tmp_path),
    )


def trail(wh: Warehouse) -> list[tuple[str, bool, dict]]:
    """The drain rows of policy_events: (outcome, ok, detail), oldest first."""
    rows = wh.connect().sql(
        "SELECT outcome, ok, detail FROM policy_events WHERE event = 'action' "
        "AND outcome IN ('drain_intent', 'drain') ORDER BY ts"
    )
    return [(outcome, ok, json.loads(detail)) for outcome, ok, detail in rows.fetchall()]


def test_a_drain_writes_its_intent_first_and_its_outcome_after(site, tmp_path: Path) -> None:
    wh, config, slurm = site
    done = sing(tmp_path, config, "--json", env=slurm.env())
    assert done.returncode == 0, done.stderr
    assert slurm.lines("drains") == ["drain gpu-1"]
    (intent, outcome) = trail(wh)
    assert (intent[0], outcome[0], outcome[1]) == ("drain_intent", "drain", True)
    assert intent[2]["intent"] == outcome[2]["intent"] and intent[2]["node"] == "gpu-1"
    assert json.loads(done.stdout)["reconciled"] == []


def test_sing_killed_after_the_drain_is_reconciled_as_drained_not_drained_again(
    site, tmp_path: Path
) -> None:
    wh, config, slurm = site
    killed = sing(tmp_path, config, env=slurm.env(drain="die-after"))
    assert killed.returncode == -9
    ((outcome, _, _),) = trail(wh)  # the intent alone: the process died before the outcome
    assert outcome == "drain_intent"

    done = sing(tmp_path, config, "--json", env=slurm.env())
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    (settled,) = shown["reconciled"]
    assert (settled["node"], settled["done"], settled["ok"]) == ("gpu-1", "drained", True)
    (node,) = shown["rows"]
    assert node["done"].startswith("drained ") and node["done"].endswith("nothing newer")
    assert slurm.lines("drains") == ["drain gpu-1"]  # drained once, by the first run
    assert slurm.lines("queries") == ["sinfo gpu-1"]
    (intent, outcome) = trail(wh)
    assert (intent[0], outcome[0], outcome[1]) == ("drain_intent", "drain", True)
    assert outcome[2]["intent"] == intent[2]["intent"]
    assert len(drains(wh)) == 1
    # settled for good: a third run neither asks Slurm again nor drains
    again = sing(tmp_path, config, "--json", env=slurm.env())
    assert json.loads(again.stdout)["reconciled"] == [] and len(trail(wh)) == 2
    assert slurm.lines("drains") == ["drain gpu-1"]


def test_sing_killed_before_the_drain_is_reconciled_as_not_drained_then_drained(
    site, tmp_path: Path
) -> None:
    wh, config, slurm = site
    assert sing(tmp_path, config, env=slurm.env(drain="die-before")).returncode == -9
    assert slurm.lines("drains") == []

    done = sing(tmp_path, config, env=slurm.env())
    assert done.returncode == 0, done.stderr
    assert "An earlier drain of gpu-1" in done.stdout and "not drained" in done.stdout
    assert slurm.lines("drains") == ["drain gpu-1"]
    outcomes = [(outcome, ok) for outcome, ok, _ in trail(wh)]
    assert outcomes == [("drain_intent", True), ("drain", False),  # settled: not drained
                        ("drain_intent", True), ("drain", True)]  # fmt: skip
    assert "the scheduler shows idle (no reason)" in trail(wh)[1][2]["error"]


def test_when_slurm_cannot_say_the_intent_stays_open_and_the_node_is_left_alone(
    site, tmp_path: Path
) -> None:
    wh, config, slurm = site
    assert sing(tmp_path, config, env=slurm.env(drain="die-after")).returncode == -9
    unsure = sing(tmp_path, config, "--json", env=slurm.env(sinfo="fail"))
    assert unsure.returncode == 1  # an admin must look
    shown = json.loads(unsure.stdout)
    (settled,) = shown["reconciled"]
    assert settled["done"] == "unknown" and "Unable to contact slurm controller" in settled["error"]
    (node,) = shown["rows"]
    assert (node["done"], node["ok"]) == ("not drained", False)
    assert len(trail(wh)) == 1 and slurm.lines("drains") == ["drain gpu-1"]
    # Slurm answers again: the intent is settled, and the node is not drained a second time
    done = sing(tmp_path, config, "--json", env=slurm.env())
    assert json.loads(done.stdout)["reconciled"][0]["done"] == "drained"
    assert slurm.lines("drains") == ["drain gpu-1"]


def test_a_command_that_cannot_run_is_a_recorded_failed_drain(site, tmp_path: Path) -> None:
    """scontrol not executable (PermissionError) or failing: recorded with the error."""
    wh, config, slurm = site
    (slurm.bin / "scontrol").chmod(0o644)
    done = sing(tmp_path, config, "--json", env=slurm.env())
    assert done.returncode == 1
    (node,) = json.loads(done.stdout)["rows"]
    assert node["done"] == "failed" and "scontrol could not run" in node["error"]
    (intent, outcome) = trail(wh)
    assert intent[0] == "drain_intent" and (outcome[0], outcome[1]) == ("drain", False)
    assert "Permission denied" in outcome[2]["error"]
    (slurm.bin / "scontrol").chmod(0o755)
    failed = sing(tmp_path, config, env=slurm.env(drain="fail"))
    assert failed.returncode == 1 and "Invalid node name specified" in failed.stderr


class Raising:
    """An executor whose drain raises what no executor is meant to raise."""

    cluster = "campus"

    def drain(self, node: str, reason: str) -> None:
        raise RuntimeError("the scheduler's library crashed")

    def node_state(self, node: str) -> NodeState | None:
        return NodeState("idle", "")


def test_any_error_of_the_executor_is_a_failed_drain_not_the_end_of_the_run(
    site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh, config, _ = site
    monkeypatch.setattr(drain, "make_executor", lambda config: Raising())
    outcome = drain.run(wh, Config.load(config))
    (node,) = outcome["nodes"]
    assert (node["done"], node["ok"], node["error"]) == (
        "failed",
        False,
        "the scheduler's library crashed",
    )
    assert [(o, ok) for o, ok, _ in trail(wh)] == [("drain_intent", True), ("drain", False)]
