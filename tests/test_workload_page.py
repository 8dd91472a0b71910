"""The Workload page through Streamlit's AppTest: the cluster beside a release picked from
[dashboard] trace_releases, the figures worked out by hand in tests/test_workload.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.test_analytics import run_sing
from tests.test_workload import HELIOS_LOG, JOBS, MON, H

ADMIN, RESEARCHER, ALICE = "ghopper", "rsearch", "alice"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workload-page")
    Warehouse(root / "wh").append("jobs", pa.Table.from_pylist(JOBS))
    (root / "cluster_log.csv").write_text(HELIOS_LOG)
    release = root / "releases" / "helios-mini"
    out = run_sing("trace", "import", "--format", "helios", str(root / "cluster_log.csv"),
                   "--out", str(release))  # fmt: skip
    assert out.returncode == 0, out.stderr
    (root / "releases" / "notes").mkdir()  # not a release: not offered
    (root / "releases" / "broken").mkdir()  # a release without its jobs table
    (root / "releases" / "broken" / "datapackage.json").write_text("{}")
    config = root / "sing.toml"
    config.write_text(
        f'[roles]\nadmins = ["{ADMIN}"]\nresearchers = ["{RESEARCHER}"]\n'
        '[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n'
        'trace_releases = "releases"\n'
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SING_WAREHOUSE", str(root / "wh"))
        mp.setenv("SING_CONFIG", str(config))
        mp.delenv("SING_DASHBOARD_DEMO", raising=False)
        yield release


@pytest.mark.parametrize("who", [ADMIN, RESEARCHER])
def test_the_cluster_beside_a_release(site: Path, who: str) -> None:
    at = open_app(who, "workload")
    at.date_input(key="window").set_value((MON.date(), (MON + 6 * 24 * H).date())).run()
    picker = at.multiselect(key="releases")
    assert picker.options == ["broken", "helios-mini"]
    picker.select(str(site)).run()
    assert not at.exception, [e.message for e in at.exception]
    shown = metrics(at)
    assert (shown["campus: GPU jobs"], shown["helios-mini: GPU jobs"]) == ("5", "4")
    assert len(at.get("vega_lite_chart")) == 6  # 4 distributions, load by hour and weekday
    run = at.dataframe[0].value.set_index("source")
    assert run.loc["campus", "p50 h"] == 2 and run.loc["helios-mini", "p50 h"] == 2
    assert run.loc["campus", "mean h"] == pytest.approx(6000 / 3600)
    assert run.loc["helios-mini", "mean h"] == pytest.approx(7800 / 3600)
    gpus = at.dataframe[2].value.set_index("source")
    assert (gpus.loc["campus", "p90 GPUs"], gpus.loc["helios-mini", "p99 GPUs"]) == (8, 16)
    assert ALICE not in str([d.value.to_dict() for d in at.dataframe])


def test_a_damaged_release_is_named_and_the_others_shown(site: Path) -> None:
    at = open_app(ADMIN, "workload")
    at.multiselect(key="releases").select(str(site.parent / "broken")).select(str(site)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert ["no jobs.parquet" in e.value for e in at.error] == [True]
    assert set(metrics(at)) == {"campus: GPU jobs", "helios-mini: GPU jobs"}


def test_users_do_not_reach_the_page(site: Path) -> None:
    at = open_app(ALICE)
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        at.switch_page("pages/workload.py")
