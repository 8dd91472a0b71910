"""Jobs that started before their node's first inventory version (every job running when sing
is installed, and the first sync's month of history) are charged by that first version, and the
report says how many were (issue 27, item 7.1: they were charged the default weight under model
NULL, silently)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sing.accounting.settings import AccountingSettings
from sing.accounting.usage import footnotes, usage
from sing.warehouse.store import Warehouse
from tests.test_accounting import add_node, by_group
from tests.test_analytics import add_job, at, run_sing

WEIGHTS = {"H100": 4.0, "H200": 6.0}
DEFAULT_WEIGHT = 3.0


@pytest.fixture
def installed_late(tmp_path: Path) -> Warehouse:
    """sing first saw h1 (4 H100s) at 10:00, and h1 became H200s at 30:00.

    E: 4 GPUs of h1 from 0:00 to 20:00, running when sing was installed: 80 H100-hours.
    L: 4 GPUs of h1 from 12:00 to 13:00, after the first version: 4 H100-hours.
    """
    wh = Warehouse(tmp_path / "wh")
    add_node(wh, "h1", "H100", valid_from=at(10))
    add_node(wh, "h1", "H200", valid_from=at(30))
    add_job(wh, "E", ["h1"], 4, at(0), at(20))
    add_job(wh, "L", ["h1"], 4, at(12), at(13), user="bob")
    return wh


def test_a_job_before_the_first_inventory_version_is_charged_by_it(
    installed_late: Warehouse,
) -> None:
    """E is charged 80 x 4 = 320 units as H100 (not 80 x 3 = 240 under model NULL), not by the
    H200 version that came later still; the H100 row says 1 job and 80 GPU-h were priced from
    a later inventory version, and the footnote says so in words."""
    settings = AccountingSettings(gpu_weights=WEIGHTS, default_weight=DEFAULT_WEIGHT)
    frame = usage(installed_late.connect(), "model", at(-1), at(48), settings, now=at(48))
    models = by_group(frame, "model")
    assert set(models) == {"H100"}
    h100 = models["H100"]
    assert h100["jobs"] == 2
    assert h100["allocated_gpu_hours"] == pytest.approx(84.0)
    assert h100["charge_units"] == pytest.approx(84 * 4.0)
    assert h100["later_inventory_jobs"] == 1
    assert h100["later_inventory_gpu_hours"] == pytest.approx(80.0)
    (note,) = footnotes(frame)
    assert "1 job(s), 80.0 GPU-h" in note and "first inventory version" in note

    users = by_group(
        usage(installed_late.connect(), "user", at(-1), at(48), settings, now=at(48)), "user"
    )
    assert users["alice"]["charge_units"] == pytest.approx(320.0)
    assert users["bob"]["later_inventory_jobs"] == 0
    assert users["bob"]["later_inventory_gpu_hours"] == 0


def test_no_footnote_when_every_job_had_its_inventory(installed_late: Warehouse) -> None:
    """After E ended only L and M (on h1 from 22:00, 1 h) are left: both started under the H100
    version, so nothing is flagged and no footnote is printed."""
    add_job(installed_late, "M", ["h1"], 2, at(22), at(23), user="bob")
    settings = AccountingSettings(gpu_weights=WEIGHTS)
    frame = usage(installed_late.connect(), "model", at(12), at(48), settings, now=at(48))
    assert frame["later_inventory_jobs"].to_list() == [1]  # E still runs 12:00-20:00
    after = usage(installed_late.connect(), "model", at(21), at(48), settings, now=at(48))
    assert after.select("model", "jobs", "later_inventory_jobs").rows() == [("H100", 1, 0)]
    assert footnotes(after) == []


def test_sing_report_usage_says_what_it_priced_from_a_later_inventory(
    installed_late: Warehouse, tmp_path: Path
) -> None:
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[site]\nwarehouse = "{installed_late.root}"\n'
        "[accounting]\ngpu_weights = {H100 = 4.0}\ndefault_weight = 3.0\n"
    )
    base = ("--config", str(config), "report", "usage", "--by", "model", "--period", "2026-01")
    base = (*base, "--now", "2026-02-01")
    table = run_sing(*base)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[1].split()[:2] == ["H100", "2"]
    assert not any(line.split()[0] in ("null", "None", "unknown") for line in lines[1:2])
    assert any(line.startswith("inventory: 1 job(s), 80.0 GPU-h") for line in lines)

    done = run_sing(*base, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert row["model"] == "H100" and row["charge_units"] == pytest.approx(336.0)
    assert row["later_inventory_jobs"] == 1
