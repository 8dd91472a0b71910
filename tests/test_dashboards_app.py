"""The dashboards through Streamlit's AppTest: every page's values, filters and access rules.

One synthetic 2-day warehouse (16 nodes x 8 GPUs) serves the module; expected figures are
computed here with plain SQL over the raw tables, independently of the app's queries.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from sing.config import Config, ConfigError
from sing.dashboards import access
from sing.dashboards.settings import DashboardSettings, RoleSettings
from sing.demo.synthetic import generate
from sing.executors.records import JobRecord, to_tables
from sing.warehouse.store import Warehouse
from tests.dashboard_app import APP, metrics, open_app
from tests.shared_data import PHILLY, require

END = datetime(2026, 6, 1, tzinfo=UTC)
ADMIN, USER, RESEARCHER = "ghopper", "aturing", "rsearch"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    root = tmp_path_factory.mktemp("dash") / "wh"
    wh = Warehouse(root)
    generate(wh, days=2, seed=1, end=END)
    config = root.parent / "sing.toml"
    config.write_text(
        f'[roles]\nadmins = ["{ADMIN}"]\nresearchers = ["{RESEARCHER}"]\n'
        f'[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n'
        f'trace_files = ["{PHILLY}"]\n'
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SING_WAREHOUSE", str(root))
        mp.setenv("SING_CONFIG", str(config))
        mp.delenv("SING_DASHBOARD_DEMO", raising=False)
        yield wh


def pct(text: str) -> float:
    return float(text.rstrip("%")) / 100


def sql(wh: Warehouse, query: str, params: dict | None = None) -> list[tuple]:
    return wh.connect().execute(query, params or {}).fetchall()


def data_span(wh: Warehouse) -> tuple[datetime, datetime]:
    return sql(wh, "SELECT (SELECT min(submit_time) FROM jobs), max(ts) FROM gpu_samples")[0]


def expected_assignment(wh: Warehouse, since: datetime, until: datetime) -> float:
    (rate,) = sql(
        wh,
        """
        SELECT sum(num_gpus * epoch(least(coalesce(end_time, $until), $until)
                                    - greatest(start_time, $since)))
               / (128 * epoch($until - $since))
        FROM jobs WHERE start_time < $until AND coalesce(end_time, $until) > $since
        """,
        {"since": since, "until": until},
    )[0]
    return rate


def job_of(wh: Warehouse, user: str, other: bool = False) -> str:
    """A finished job with GPU samples of `user` (or of somebody else)."""
    op = "<>" if other else "="
    return sql(
        wh,
        f"""SELECT job_id FROM jobs WHERE "user" {op} $u AND end_time IS NOT NULL
            AND job_id IN (SELECT job_id FROM gpu_samples) ORDER BY job_id LIMIT 1""",
        {"u": user},
    )[0][0]


# ---- identity and roles -----------------------------------------------------------------


def test_labels_hide_other_users_from_non_admins() -> None:
    names = ["alovelace", "aturing", "bliskov"]
    assert access.user_labels(names, access.Viewer("x", "admin")) == names
    assert access.user_labels(names, access.Viewer("aturing", "user")) == [
        "user 1",
        "aturing (you)",
        "user 2",
    ]
    assert access.user_labels(names, access.Viewer("aturing", "researcher")) == [
        "user 1",
        "user 2",
        "user 3",
    ]
    me = access.Viewer("aturing", "user")
    assert [access.holder_label(u, me) for u in ("aturing", "bliskov", None)] == [
        "you",
        "other job",
        "",
    ]
    assert access.holder_label("bliskov", access.Viewer("r", "researcher")) == "in use"


def test_bad_dashboard_settings_name_the_key(tmp_path: Path) -> None:
    file = tmp_path / "sing.toml"
    file.write_text('[dashboard]\nauth = "ldap"\n')
    with pytest.raises(ConfigError, match=r"auth = 'ldap'"):
        Config.load(file).section("dashboard", DashboardSettings)
    file.write_text('[roles]\nadmins = "ghopper"\n')
    with pytest.raises(ConfigError, match=r"\[roles\] admins must be a list"):
        Config.load(file).section("roles", RoleSettings)


def test_visitor_who_is_not_signed_in_sees_nothing(warehouse: Warehouse) -> None:
    at = open_app(None)
    assert "Sign-in is not configured" in at.error[0].value
    assert not at.metric and not at.dataframe and not at.get("vega_lite_chart")
    at = AppTest.from_file(APP, default_timeout=60)
    at.user = {"is_logged_in": False}
    at.secrets["auth"] = {"client_id": "x", "client_secret": "y", "redirect_uri": "http://h/o"}
    at.run()
    assert [b.label for b in at.button] == ["Sign in"] and not at.metric


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"email": f"{ADMIN}@elsewhere.org", "email_verified": True}, "not users of this cluster"),
        ({"email": f"{ADMIN}@campus.edu", "email_verified": False}, "has not verified"),
        ({"name": "Grace Hopper"}, "carries no 'email'"),
    ],
)
def test_a_signed_in_stranger_is_refused_even_in_demo_mode(
    warehouse: Warehouse, monkeypatch, claims: dict, why: str
) -> None:
    for demo in ([], ["--demo"]):  # the app's own argument, as `sing dashboard --demo` passes it
        monkeypatch.setattr(sys, "argv", [APP, *demo])
        at = AppTest.from_file(APP, default_timeout=60)
        at.user = {"is_logged_in": True, **claims}
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert why in at.error[0].value, demo
        assert not at.metric and not at.dataframe and not at.get("vega_lite_chart")
        assert [b.label for b in at.button] == ["Sign out"]  # to sign in as somebody else
        assert "demo_role" not in at.session_state  # no role picker to fall back on


@pytest.mark.parametrize(
    ("user", "pages"),
    [
        (ADMIN, [p.file for p in access.PAGES]),
        (
            USER,
            ["cluster", "by_node_count", "fairness", "my_jobs", "accounting", "job", "simulator"],
        ),
        (RESEARCHER, ["cluster", "by_node_count", "fairness", "traces", "simulator", "workload"]),
    ],
)
def test_each_role_reaches_exactly_its_pages(warehouse: Warehouse, user: str, pages: list) -> None:
    wanted = {p if p.endswith(".py") else f"pages/{p}.py" for p in pages}
    at = open_app(user)
    for spec in access.PAGES:  # pages of other roles are not even registered
        if spec.file not in wanted:
            with pytest.raises(ValueError, match="Could not find a navigation page"):
                at.switch_page(spec.file)
    for spec in access.PAGES:
        if spec.file in wanted:
            at.switch_page(spec.file).run()
            assert not at.exception, (spec.file, [e.message for e in at.exception])
            assert at.title[0].value, spec.file


def test_demo_mode_says_so_on_every_page(warehouse: Warehouse, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [APP, "--demo"])  # as `streamlit run app.py -- --demo`
    at = open_app(None)
    assert at.selectbox(key="demo_role").value == "admin"
    for spec in access.PAGES:
        at.switch_page(spec.file).run()
        assert not at.exception, (spec.file, [e.message for e in at.exception])
        assert any("Demo mode" in w.value for w in at.warning), spec.file
    # A demo visitor who picks "user" is held to that user's jobs like anybody else.
    # (The sidebar's widgets are set through Session State: AppTest keeps only the page's
    # elements after the first run of an st.navigation app.)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["demo_role"], at.session_state["demo_user"] = "user", USER
    at.query_params["job"] = job_of(warehouse, USER, other=True)
    at.run().switch_page("pages/job.py").run()
    assert "that you may see" in at.error[0].value
    at.switch_page("pages/my_jobs.py").run()
    assert at.title[0].value == f"Jobs of {USER}"


# ---- pages ------------------------------------------------------------------------------


def test_cluster_numbers_match_the_raw_tables_and_follow_the_window(warehouse: Warehouse) -> None:
    first, last = data_span(warehouse)
    at = open_app(USER)
    shown = metrics(at)
    expected = expected_assignment(warehouse, first, last)
    assert abs(pct(shown["GPU assignment rate"]) - expected) <= 0.006
    (util,) = sql(
        warehouse,
        "SELECT avg(util) FROM gpu_samples WHERE ts >= $a AND ts < $b",
        {"a": first, "b": last},
    )[0]
    assert abs(pct(shown["GPU utilization (all GPUs)"]) - util) <= 0.011
    # Only the first day (the cluster filling up): other figures, again matching the raw tables.
    at.date_input(key="window").set_value((first.date(), first.date())).run()
    day_end = datetime(first.year, first.month, first.day, tzinfo=UTC) + timedelta(days=1)
    narrowed = metrics(at)["GPU assignment rate"]
    assert abs(pct(narrowed) - expected_assignment(warehouse, first, day_end)) <= 0.006
    assert narrowed != shown["GPU assignment rate"]
    assert len(at.get("vega_lite_chart")) == 3


def test_idle_jobs_are_ranked_multi_node_first_with_links(warehouse: Warehouse) -> None:
    at = open_app(ADMIN, "idle_jobs")
    table = at.dataframe[0].value
    assert len(table) == int(metrics(at)["Idle jobs"]) > 0
    multi = (table["num_nodes"] > 1).tolist()
    assert multi == sorted(multi, reverse=True)  # multi-node jobs first
    for group in (table[table["num_nodes"] > 1], table[table["num_nodes"] == 1]):
        wasted = group["wasted_gpu_hours"].tolist()
        assert wasted == sorted(wasted, reverse=True)
    assert all(re.fullmatch(r"job\?job=\d+", link) for link in table["job"])
    assert (table["mean_util"] < 0.05).all()
    before = len(table)
    at.slider(key="util").set_value(0.3).run()
    assert len(at.dataframe[0].value) > before


def test_by_node_count_shows_the_falling_utilization_and_filters_by_partition(
    warehouse: Warehouse,
) -> None:
    at = open_app(RESEARCHER, "by_node_count")
    shown = metrics(at)
    widest = list(shown)[-1]  # metrics run from 1 node up
    assert widest != "1 node" and pct(shown["1 node"]) > pct(shown[widest])  # the paper's shape
    gpu_hours = at.dataframe[0].value["gpu_hours"].sum()
    at.selectbox(key="partition").set_value("interactive").run()
    assert at.dataframe[0].value["gpu_hours"].sum() < gpu_hours
    assert list(metrics(at)) == ["1 node"]  # interactive jobs are small


def test_fairness_shows_names_to_admins_only(warehouse: Warehouse) -> None:
    names = {r[0] for r in sql(warehouse, 'SELECT DISTINCT "user" FROM jobs')}
    admin = open_app(ADMIN, "fairness")
    assert set(admin.dataframe[0].value["who"]) == names
    jain = float(metrics(admin)["Jain's index (GPU-hours per user)"])
    assert 1 / len(names) <= jain <= 1
    user = open_app(USER, "fairness")
    who = set(user.dataframe[0].value["who"])
    assert f"{USER} (you)" in who and not (who & names)
    assert float(metrics(user)["Jain's index (GPU-hours per user)"]) == jain


def test_my_jobs_lists_only_the_users_own_jobs(warehouse: Warehouse) -> None:
    at = open_app(USER, "my_jobs")
    shown = set(at.dataframe[0].value["job"].str.removeprefix("job?job="))
    first, last = data_span(warehouse)
    own = {
        r[0]
        for r in sql(
            warehouse,
            """SELECT job_id FROM jobs WHERE "user" = $u AND start_time IS NOT NULL
               AND start_time < $b AND coalesce(end_time, $b) > $a""",
            {"u": USER, "a": first, "b": last},
        )
    }
    assert shown == own and int(metrics(at)["Jobs"]) == len(own)
    assert "user" not in [box.key for box in at.selectbox]  # only admins pick a user
    assert set(at.selectbox(key="detail_job").options) == own


def test_my_jobs_of_a_user_with_only_cpu_jobs_shows_no_gpu_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU-only jobs are synced too: a window holding only those has no GPU-hours to weight by."""
    root = tmp_path / "wh"
    start = END - timedelta(hours=5)
    cpu_jobs = [
        JobRecord(str(n), "campus", "COMPLETED", user="cpuonly", partition="cpu",
                  submit_time=start, start_time=start, end_time=start + timedelta(hours=n),
                  exit_code=0, nodes=("cpu01",), num_gpus=0)
        for n in (1, 2)
    ]  # fmt: skip
    jobs, _ = to_tables(cpu_jobs, recorded_at=END)
    Warehouse(root).append("jobs", jobs)
    config = tmp_path / "sing.toml"
    config.write_text('[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n')
    monkeypatch.setenv("SING_WAREHOUSE", str(root))
    monkeypatch.setenv("SING_CONFIG", str(config))
    at = open_app("cpuonly", "my_jobs")
    shown = metrics(at)
    assert shown["Jobs"] == "2" and shown["GPU-hours"] == "0.0 h"
    assert shown["GPU utilization (GPU-hour weighted)"] == "n/a"
    assert any("0 GPU(s)" in caption.value for caption in at.caption)  # the job in detail


def test_job_page_shows_own_job_and_refuses_anybody_elses(warehouse: Warehouse) -> None:
    mine, theirs = job_of(warehouse, USER), job_of(warehouse, USER, other=True)
    at = open_app(USER, "job", query={"job": mine})
    (util,) = sql(warehouse, "SELECT avg(util) FROM gpu_samples WHERE job_id = ?", [mine])[0]
    assert abs(pct(metrics(at)["Mean GPU utilization"]) - util) <= 0.006
    assert len(at.get("vega_lite_chart")) >= 3  # util, memory, power
    # Another user's job by URL: nothing about it, not even whether it exists.
    for job in (theirs, "no-such-job"):
        at = open_app(USER, "job", query={"job": job})
        assert at.error[0].value == f"No job {job} that you may see."
        assert not at.metric and not at.dataframe and not at.get("vega_lite_chart")
    # ... nor by typing the id into the page.
    at = open_app(USER, "job", query={"job": mine})
    at.text_input(key="job_id").set_value(theirs).run()
    assert "that you may see" in at.error[0].value and not at.metric
    # Admins see any job.
    at = open_app(ADMIN, "job", query={"job": theirs})
    assert "Mean GPU utilization" in metrics(at)


def test_traces_page_previews_only_pseudonyms_and_offers_the_zip(warehouse: Warehouse) -> None:
    at = open_app(RESEARCHER, "traces")
    preview = at.dataframe[0].value
    names = {r[0] for r in sql(warehouse, 'SELECT DISTINCT "user" FROM jobs')}
    ids = {r[0] for r in sql(warehouse, "SELECT job_id FROM jobs")}
    assert len(preview) > 0 and not (set(preview["user"]) & names)
    assert not (set(preview["job_id"]) & ids)
    jobs, left_out = metrics(at)["Jobs in the release"], metrics(at)["Jobs left out (rare shapes)"]
    (submitted,) = sql(warehouse, "SELECT count(*) FROM jobs")[0]
    assert int(jobs.replace(",", "")) + int(left_out.replace(",", "")) == submitted
    assert at.get("download_button")


def test_simulator_compares_policies_on_warehouse_jobs_and_philly(warehouse: Warehouse) -> None:
    at = open_app(USER, "simulator")
    shown = metrics(at)
    assert set(shown) >= {f"{p}: GPUs assigned" for p in ("fcfs", "sing", "easy", "sjf")}
    wait = {p: float(shown[f"{p}: mean wait"].removesuffix(" h")) for p in ("fcfs", "sing")}
    assert wait["sing"] <= wait["fcfs"]  # backfill never makes the mean wait worse here
    require(PHILLY)
    assert any("philly" in o for o in at.radio(key="source").options)
    at.radio(key="source").set_value(at.radio(key="source").options[1]).run()
    at.date_input(key="window").set_value((datetime(2017, 10, 23).date(),) * 2).run()
    at.multiselect(key="policies").set_value(["fcfs", "sing"]).run()
    assert not at.exception, [e.message for e in at.exception]
    assert set(metrics(at)) == {
        "fcfs: GPUs assigned",
        "fcfs: mean wait",
        "sing: GPUs assigned",
        "sing: mean wait",
    }
    (replayed,) = [c.value for c in at.caption if "jobs replayed" in c.value]
    assert int(replayed.split()[0].replace(",", "")) > 100


def test_window_default_covers_the_last_days_of_data(warehouse: Warehouse) -> None:
    at = open_app(USER)
    first, last = data_span(warehouse)
    assert at.date_input(key="window").value == (first.date(), last.date())
    assert last - first < timedelta(days=3)
