"""`sing policy check|run|log` as a site runs them, and the collector's scheduled round."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sing.cli import main
from sing.cli.collector import scheduled_policy
from sing.cli.policy import policy_job
from sing.config import Config, ConfigError
from sing.policy.rules import load_rules
from sing.policy.settings import PolicySettings
from sing.times import parse_time_or_ago
from sing.warehouse.store import Warehouse
from tests.policy_world import add_job, add_samples

CONFIG = """
[site]
cluster = "campus"
warehouse = "wh"

[executor]
kind = "local"
local_gpus = [0, 1]
local_state_dir = "jobs"

[collector]
interval_s = 60  # the samples' spacing (tests/policy_world.py): full coverage

[policy]
interval_s = 120

[policy.rules.idle-gpus]
kind = "idle_gpus"
minutes = 30
actions = ["notify", "warn", "cancel"]
exempt_users = ["carol"]
"""


@pytest.fixture
def site(tmp_path):
    """A site with two idle jobs (one of an exempt user) and a busy one, sampled until now."""
    config = tmp_path / "sing.toml"
    config.write_text(CONFIG)
    wh = Warehouse(tmp_path / "wh")
    now = datetime.now(UTC)
    start = now - timedelta(hours=2)
    for job_id, user, util in (("1", "alice", 0.0), ("2", "bob", 0.9), ("3", "carol", 0.0)):
        add_job(wh, job_id, start, user=user)
        add_samples(wh, job_id, start, now, {("n1", 0): util, ("n1", 1): util})
    return config


def sing(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_check_shows_each_job_and_rule_and_records_nothing(site, capsys):
    rows = json.loads(sing(capsys, "--config", str(site), "policy", "check", "--json"))["rows"]
    got = {r["job_id"]: (r["verdict"], r["action"], r["dry_run"]) for r in rows}
    assert got == {
        "1": ("violating", "notify", True),
        "2": ("ok", "wait", True),
        "3": ("exempt", "wait", True),
    }
    table = sing(capsys, "--config", str(site), "policy", "check")
    assert "violating" in table and "idle-gpus" in table
    heading = table.splitlines()[0].split()
    assert heading[:3] == ["cluster", "job", "user"] and "%" in heading  # a table for people
    log = json.loads(sing(capsys, "--config", str(site), "policy", "log", "--json"))
    assert log == {"rows": []}


def test_run_records_a_dry_round_and_log_shows_it(site, capsys):
    out = sing(capsys, "--config", str(site), "policy", "run")
    assert "event(s) recorded" in out
    log = json.loads(sing(capsys, "--config", str(site), "policy", "log", "--json"))["rows"]
    got = sorted((e["job_id"], e["event"], e["outcome"], e["dry_run"]) for e in log)
    assert got == [
        ("1", "evaluation", "violating", True),
        ("1", "message", "notify", True),
        ("3", "evaluation", "exempt", True),
    ]
    assert all(e["actor"].startswith("sing policy run@") for e in log)
    mine = json.loads(
        sing(capsys, "--config", str(site), "policy", "log", "--user", "carol", "--json")
    )["rows"]
    assert {e["job_id"] for e in mine} == {"3"}
    # a second round at once: the notice is not repeated, nothing changed
    sing(capsys, "--config", str(site), "policy", "run")
    again = json.loads(
        sing(capsys, "--config", str(site), "policy", "log", "--since", "1h", "--json")
    )["rows"]
    assert len(again) == len(log)
    assert "evaluation" in sing(capsys, "--config", str(site), "policy", "log")


def test_bad_rule_is_a_configuration_error(tmp_path, capsys):
    config = tmp_path / "sing.toml"
    config.write_text(CONFIG.replace('"idle_gpus"', '"idle_gpu"'))
    assert main(["--config", str(config), "policy", "check"]) == 2
    assert "idle-gpus" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="kind = 'idle_gpu'"):
        policy_job(Config.load(config), Warehouse(tmp_path / "wh"))


def test_the_collector_schedules_a_round_only_when_rules_exist(site, tmp_path):
    """As `sing collector` asks for it (sing/cli/collector.py): the engine is not even imported
    without rules or reports (tests/test_collector_imports.py)."""
    config = Config.load(site)
    job = scheduled_policy(config, Warehouse(tmp_path / "wh"))
    assert job is not None
    round_, interval_s = job
    assert interval_s == 120
    assert [d.job["job_id"] for d in round_().decisions] == ["1", "3"]  # 2 is fine: no step
    bare = tmp_path / "bare.toml"
    bare.write_text(CONFIG.split("[policy.rules")[0])
    assert scheduled_policy(Config.load(bare), Warehouse(tmp_path / "wh")) is None
    off = tmp_path / "off.toml"
    off.write_text(CONFIG.replace("interval_s = 120", "interval_s = 0"))
    assert scheduled_policy(Config.load(off), Warehouse(tmp_path / "wh")) is None


def test_since_accepts_durations_and_times():
    now = datetime(2026, 3, 2, 12, tzinfo=UTC)
    assert parse_time_or_ago("24h", "--since", now) == now - timedelta(hours=24)
    assert parse_time_or_ago("7d", "--since", now) == now - timedelta(days=7)
    assert parse_time_or_ago("2026-03-01T08", "--since", now) == datetime(2026, 3, 1, 8, tzinfo=UTC)
    with pytest.raises(ValueError, match="--since 'yesterday'"):
        parse_time_or_ago("yesterday", "--since", now)


def test_the_documented_example_is_a_valid_configuration(tmp_path):
    doc = (Path(__file__).parent.parent / "docs" / "policy.md").read_text()
    example = doc.split("## Example\n", 1)[1]
    toml = "\n".join(line.removeprefix("    ") for line in example.splitlines() if line.strip())
    (tmp_path / "sing.toml").write_text(toml)
    settings = Config.load(tmp_path / "sing.toml").section("policy", PolicySettings)
    rules = {r.name: r for r in load_rules(settings)}
    assert sorted(rules) == [
        "cores-per-gpu",
        "idle-gpus",
        "memory-hoarders",
        "silent-multinode",
        "untouched",
    ]
    assert rules["idle-gpus"].acts(settings) and not rules["silent-multinode"].acts(settings)
    assert rules["memory-hoarders"].kind == "excess_memory"
    assert rules["cores-per-gpu"].kind == "excess_cores_per_gpu"
