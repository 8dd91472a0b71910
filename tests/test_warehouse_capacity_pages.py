"""Dashboard pages over warehouses whose capacity is unknown or whose jobs hold no GPU time:
they say "unknown" (or "n/a") instead of showing a rate computed against a guessed capacity,
and never fail on a division by zero. Driven through Streamlit's AppTest like
tests/test_dashboards_app.py, on tiny hand-made warehouses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.test_analytics import add_gpu_samples, add_job, add_nodes, at

ADMIN = "ghopper"


def open_page(root: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """The page as an admin of the warehouse at `root`; fails on any exception in it."""
    config = root.parent / "sing.toml"
    config.write_text(
        f'[roles]\nadmins = ["{ADMIN}"]\n'
        '[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n'
    )
    monkeypatch.setenv("SING_WAREHOUSE", str(root))
    monkeypatch.setenv("SING_CONFIG", str(config))
    monkeypatch.delenv("SING_DASHBOARD_DEMO", raising=False)
    return open_app(ADMIN, page)


def test_cluster_page_without_node_inventory_says_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs and samples but no `nodes` rows: no assignment rate, a warning saying why."""
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "1", ["n1"], 4, at(0), at(2))
    add_gpu_samples(wh, "1", "n1", [0, 1, 2, 3], at(0), at(2), 0.5)
    app = open_page(wh.root, "cluster", monkeypatch)
    shown = metrics(app)
    assert shown["GPU assignment rate"] == "unknown"
    assert shown["GPU utilization (all GPUs)"] == "unknown"
    assert any("Capacity or allocations unknown" in w.value for w in app.warning)
    assert any("No node inventory (capacity unknown)" in c.value for c in app.caption)


def test_cluster_page_rates_only_over_the_known_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n1 (4 GPUs) enters the inventory at midnight, two hours into the job: the hours before
    are unknown and left out (the old page divided them by the whole inventory); the job holds
    all 4 GPUs in the known hours, so the rate is 100 %."""
    wh = Warehouse(tmp_path / "wh")
    add_nodes(wh, ["n1"], gpus=4, valid_from=at(14))  # 2026-01-06 00:00
    add_job(wh, "1", ["n1"], 4, at(12), at(16))  # 22:00 to 02:00
    add_gpu_samples(wh, "1", "n1", [0, 1, 2, 3], at(12), at(16), 0.5)
    app = open_page(wh.root, "cluster", monkeypatch)
    assert metrics(app)["GPU assignment rate"] == "100%"
    assert any("unknown for 2 of 4 hours" in w.value for w in app.warning)


def test_pages_with_jobs_that_hold_no_gpu_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only CPU jobs (0 GPUs): no share of GPU-hours exists, so the Fairness page shows n/a
    rather than dividing by zero."""
    wh = Warehouse(tmp_path / "wh")
    add_nodes(wh, ["n1"])
    add_job(wh, "1", ["n1"], 0, at(0), at(2))
    add_job(wh, "2", ["n1"], 0, at(0), at(2), user="bob")
    app = open_page(wh.root, "fairness", monkeypatch)
    assert metrics(app)["Top user's share"] == "n/a"
