"""The Accounting page under Streamlit's AppTest, for each role, on the warehouse of
tests/test_accounting_statement.py (written through `Warehouse.append`; its docstring works out
the figures): account "lab" (alice, bob; PI pat) and "other-lab" (one user, no allocation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sing.dashboards import access
from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.test_accounting_statement import CONFIG, SHOUTY, write_lab

ADMIN, PI, BOB = "root", "pat", "bob"
ROLES = f"""
[roles]
admins = ["{ADMIN}"]
researchers = ["rsearch"]
pis = {{lab = ["{PI}"], empty-lab = ["{PI}"]}}
[dashboard]
auth = "oidc"
allowed_domains = ["campus.edu"]
trace_files = []
"""


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Warehouse:
    wh = Warehouse(tmp_path / "wh")
    write_lab(wh)
    config = tmp_path / "sing.toml"
    config.write_text(CONFIG + ROLES)
    monkeypatch.setenv("SING_WAREHOUSE", str(wh.root))
    monkeypatch.setenv("SING_CONFIG", str(config))
    monkeypatch.delenv("SING_DASHBOARD_DEMO", raising=False)
    return wh


def column(at, index: int, name: str) -> list:
    return at.dataframe[index].value[name].tolist()


def test_admin_sees_every_account(lab: Warehouse) -> None:
    at = open_app(ADMIN, "accounting")
    assert at.title[0].value == "Accounting"
    assert at.selectbox(key="period").options == ["January 2026"]
    assert column(at, 0, "account") == ["lab", "other-lab"]  # by allocated GPU-hours
    assert column(at, 0, "allocated_gpu_hours") == pytest.approx([5.0, 1.0])
    assert column(at, 0, "charge_units") == pytest.approx([5.0, 2.0])  # A100 weight 2
    assert at.selectbox(key="account").options == ["lab", "other-lab"]
    shown = metrics(at)
    assert shown["GPU-hours allocated"] == "5.0 h"
    assert (shown["GPU-hours used"], shown["GPU-hours idle"]) == ("2.0 h", "1.0 h")
    assert (shown["Allocation"], shown["Balance"]) == ("12.0 units", "7.0 units")
    assert (shown["Energy"], shown["Carbon"]) == ("0.42 kWh", "0.17 kg CO2e")
    assert column(at, 1, "user") == ["alice", "bob"]
    assert column(at, 1, "used_gpu_hours") == pytest.approx([2.0, 0.0])

    at.selectbox(key="account").set_value("other-lab").run()
    assert column(at, 1, "user") == [SHOUTY]
    assert metrics(at)["Allocation"] == "unknown"  # none configured for other-lab


def test_pi_sees_their_account_with_its_users_only(lab: Warehouse) -> None:
    at = open_app(PI, "accounting")
    assert at.selectbox(key="account").options == ["lab"]  # empty-lab has no use this month
    assert metrics(at)["GPU-hours allocated"] == "5.0 h"
    assert column(at, 0, "user") == ["alice", "bob"]
    assert len(at.dataframe) == 1  # no table of all accounts
    assert [i.value for i in at.info] == ["You used no GPUs in January 2026."]
    page = str([e.value for e in at.main if hasattr(e, "value")])
    assert "other-lab" not in page and SHOUTY not in page


def test_user_sees_only_their_own_use(lab: Warehouse) -> None:
    at = open_app(BOB, "accounting")
    assert "account" not in [box.key for box in at.selectbox]
    assert len(at.dataframe) == 1
    assert column(at, 0, "account") == ["lab"]
    assert column(at, 0, "allocated_gpu_hours") == pytest.approx([1.0])
    assert column(at, 0, "idle_gpu_hours") == pytest.approx([1.0])
    assert "user" not in at.dataframe[0].value.columns
    assert not metrics(at)  # no account totals


def test_researchers_have_no_accounting_page(lab: Warehouse) -> None:
    at = open_app("rsearch")
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        at.switch_page("pages/accounting.py")
    assert "pages/accounting.py" in [p.file for p in access.pages_for(access.USER)]
