"""The default release on a synthetic history with telemetry (issue 31): a week of the demo's
campus (16 users, three of whom run all the multi-node jobs), whose per-job energy is what the
run-time-from-energy attack reads. The privacy report written with a release is checked here
too. Nothing here tests the real path: the generator's jobs are only a population to attack."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from sing.cli import main
from sing.traces import export, privacy
from sing.traces.compare import evaluate
from sing.traces.export import export_trace
from sing.traces.linkage import public_view
from sing.traces.privacy import ENERGY, EXACT, SACCT, SACCT_ORIGIN
from sing.traces.settings import TraceSettings
from sing.warehouse.store import Warehouse

UNTIL = datetime(2026, 11, 30, tzinfo=UTC)
SINCE = UNTIL - timedelta(days=7)
KEY = bytes(range(7, 39))
SCALED_ENERGY = "g.energy_j * t.scale AS energy_j"


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Warehouse, object]:
    root = tmp_path_factory.mktemp("history") / "wh"
    args = ["--warehouse", str(root), "demo-data", "--days", "7", "--seed", "5"]
    assert main([*args, "--end", UNTIL.isoformat()]) == 0
    wh = Warehouse(root)
    return wh, public_view(wh, SINCE, UNTIL)


def test_default_release_keeps_nearly_all_and_links_nobody(history):
    wh, public = history
    result = evaluate(wh, SINCE, UNTIL, TraceSettings(), KEY, public=public)
    report = result.privacy
    assert report.kept_jobs >= 0.9 * report.window_jobs and report.kept_gpu_hours_share >= 0.9
    assert {a.attack for a in report.attacks} == {SACCT, SACCT_ORIGIN, ENERGY, EXACT}
    for attack in report.attacks:
        assert attack.users_pct <= 5 and attack.jobs_pct <= 5, attack
    assert any(p.shape_hidden for p in report.precisions)  # the multi-node jobs are in
    for p in report.precisions:
        assert p.min_users >= 5 and p.max_top_share <= 0.5, p


def test_energy_as_measured_would_give_run_times_away(history, monkeypatch):
    """The same release with energy published as measured, not scaled with the released run
    time: the energy attack recovers run times inside their buckets and names users. So the
    attack is real, and the scaling is what stops it."""
    wh, public = history
    jobs_sql = export.jobs_sql

    def measured(aliases: str) -> str:
        text = jobs_sql(aliases)
        assert SCALED_ENERGY in text
        return text.replace(SCALED_ENERGY, "g.energy_j AS energy_j")

    monkeypatch.setattr(export, "jobs_sql", measured)
    leaky = evaluate(wh, SINCE, UNTIL, TraceSettings(), KEY, public=public).privacy
    energy = next(a for a in leaky.attacks if a.attack == ENERGY)
    assert energy.users_pct >= 50 and energy.precision >= 0.5, energy


def test_every_export_writes_its_privacy_report(history, tmp_path):
    wh, _ = history
    out = export_trace(wh, SINCE, UNTIL, tmp_path / "t", key=KEY).path
    package = json.loads((out / "datapackage.json").read_text())
    privacy = package["privacy"]
    assert privacy["k"] == 5 and privacy["kept_jobs"] == package["resources"][0]["rows"]
    assert [a["attack"] for a in privacy["attacks"]] == [SACCT, SACCT_ORIGIN, ENERGY, EXACT]
    readme = (out / "README.md").read_text()
    section = readme.split("## Privacy report", 1)[1].split("\n## ", 1)[0]
    assert "Quasi-identifiers considered: shape, submit, run, outcome; k = 5" in section
    for attack in privacy["attacks"]:
        assert f"| {attack['attack']} | {attack['users_linked']} of {attack['users']} " in section
    rows = [line for line in section.splitlines() if line.startswith("| 1 d | x2 |")]
    assert len(rows) == 1  # the finest precision, with its pools


def test_a_large_release_is_attacked_on_a_sample_of_its_pseudonyms(history, monkeypatch):
    """Past ASSESSED_JOBS the attacks run on the jobs of a keyed random share of the user
    pseudonyms: about that many jobs, and the report says its rates are estimates."""
    wh, public = history
    monkeypatch.setattr(privacy, "ASSESSED_JOBS", 300)
    report = evaluate(wh, SINCE, UNTIL, TraceSettings(), KEY, public=public).privacy
    assert 200 <= report.assessed_jobs <= 400 and report.kept_jobs > 1000
    assert all(a.jobs == report.assessed_jobs for a in report.attacks)
    assert any("keyed random sample of the release" in line for line in report.lines())
