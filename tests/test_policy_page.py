"""The waste policies on the dashboards, through Streamlit's AppTest: the admin page's pending
warnings, actions, messages and failures, and the warning banners users see on their own jobs.

The warehouse is written with `Warehouse.append` (jobs) and `sing.warehouse.audit.record` (the
trail), the way the collector and the policy engine write them; each job below plays one case.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from sing.cli.policy import make_engine
from sing.config import Config
from sing.dashboards.policy_view import ICON
from sing.executors.records import JobRecord, to_tables
from sing.warehouse.audit import ACTION, EVALUATION, MESSAGE, Event, record
from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.mailbox import webhook_server
from tests.policy_world import add_job, add_samples

END = datetime(2026, 6, 1, 12, tzinfo=UTC)  # the end of the data: "now" for the dashboards
ADMIN, ALICE, BOB, RESEARCHER = "ghopper", "alice", "bob", "rsearch"
ACTOR = "sing policy run@head1"
SEEN = "GPUs under 5% utilisation for 60 minutes"

# job -> (user, rule): which case each job plays is said where its trail is written.
JOBS = {
    "101": (ALICE, "idle"),
    "102": (ALICE, "idle"),
    "103": (BOB, "multinode"),
    "104": (BOB, "idle"),
    "105": (ALICE, "untouched"),
    "106": (BOB, "idle"),
    "107": (BOB, "idle"),
    "108": (BOB, "idle"),
    "109": (BOB, "multinode"),
    "110": (ALICE, "idle"),
}
PENDING = {"101", "104", "105", "109", "110"}
ENDED = {"102": ("CANCELLED", -55), "108": ("COMPLETED", -35)}  # job -> (state, minutes)


def minutes(n: float) -> datetime:
    return END + timedelta(minutes=n)


def event(job: str, ts: datetime, kind: str, outcome: str, **fields) -> Event:
    user, rule = JOBS[job]
    return Event(ts=ts, cluster="campus", event=kind, outcome=outcome, actor=ACTOR,
                 dry_run=fields.pop("dry_run", False), job_id=job, user=user,
                 account="physics", rule=rule, **fields)  # fmt: skip


def violating(job: str, ts: datetime, **evidence) -> Event:
    return event(job, ts, EVALUATION, "violating", detail=evidence)


def warn(job: str, ts: datetime, deadline: datetime, **fields) -> Event:
    told = {"seen": SEEN, "cancel_command": f"scancel {job}"}
    return event(job, ts, MESSAGE, "warn", deadline=deadline,
                 detail={**told, **fields.pop("detail", {})}, **fields)  # fmt: skip


def trail() -> list[Event]:
    return [
        # 101: warned by email and webhook (two rows), deadline ahead: pending, shown once.
        violating("101", minutes(-120), mean_util=0.012, idle_gpus=4),
        warn("101", minutes(-90), minutes(30), channel="email", recipient="alice@campus.edu"),
        warn("101", minutes(-90), minutes(30), channel="webhook", recipient="hooks"),
        # 102: warned, deadline passed, cancelled, told: an action, not pending.
        warn("102", minutes(-180), minutes(-60), channel="email", recipient="alice@campus.edu"),
        event("102", minutes(-55), ACTION, "cancel", channel="slurm"),
        event("102", minutes(-55), MESSAGE, "cancelled", channel="email", recipient="a@c.edu"),
        # 103: warned, then recovered before its deadline and left alone: not pending.
        warn("103", minutes(-60), minutes(60), channel="email", recipient="bob@campus.edu"),
        event("103", minutes(-30), EVALUATION, "recovered"),
        event("103", minutes(-30), ACTION, "left_alone", detail={"why": "ok"}),
        # 104: bob's, deadline ahead: pending (alice must not see it).
        warn("104", minutes(-30), minutes(90), channel="email", recipient="bob@campus.edu"),
        # 105: a dry-run warning: pending for admins, never shown to its user.
        warn("105", minutes(-20), minutes(120), dry_run=True),
        # 106: the warning's only delivery failed: not warned (the ladder retries), a failure.
        warn(
            "106",
            minutes(-10),
            minutes(50),
            channel="email",
            recipient="bob@campus.edu",
            ok=False,
            detail={"error": "connection refused"},
        ),
        # 107: warned, deadline passed, no cancellation (yet): no longer pending.
        warn("107", minutes(-150), minutes(-30), channel="email", recipient="bob@campus.edu"),
        # 108: warned, then the job ended before its deadline: the verdict alone closes it.
        warn("108", minutes(-70), minutes(50), channel="email", recipient="bob@campus.edu"),
        event("108", minutes(-35), EVALUATION, "ended"),
        # 109: a rule that warns without cancelling: no deadline, pending until the ladder ends.
        event("109", minutes(-15), MESSAGE, "warn", channel="email", recipient="bob@campus.edu"),
        # 110: an earlier episode ended (left alone); a new warning since: pending again.
        warn("110", minutes(-300), minutes(-240), channel="email", recipient="alice@campus.edu"),
        event("110", minutes(-250), ACTION, "left_alone", detail={"why": "recovered"}),
        warn("110", minutes(-40), minutes(20), channel="email", recipient="alice@campus.edu"),
    ]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    root = tmp_path_factory.mktemp("policy-page") / "wh"
    wh = Warehouse(root)
    start = END - timedelta(days=1)
    jobs = [
        JobRecord(job, "campus", state, user=user, account="physics", partition="gpu",
                  name=f"train-{job}", submit_time=start, start_time=start,
                  end_time=minutes(ended) if ended else None, nodes=("gpu01",), num_gpus=4)
        for job, (user, _) in JOBS.items()
        for state, ended in [ENDED.get(job, ("RUNNING", None))]
    ]  # fmt: skip
    jobs.append(JobRecord("100", "campus", "COMPLETED", user=BOB, submit_time=start,
                          start_time=start, end_time=END, exit_code=0))  # fmt: skip
    wh.append("jobs", to_tables(jobs, recorded_at=END)[0])
    record(wh, trail())
    config = root.parent / "sing.toml"
    config.write_text(
        f'[roles]\nadmins = ["{ADMIN}"]\nresearchers = ["{RESEARCHER}"]\n'
        '[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n'
        '[policy]\ntimezone = "Europe/Zurich"\n'
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SING_WAREHOUSE", str(root))
        mp.setenv("SING_CONFIG", str(config))
        mp.delenv("SING_DASHBOARD_DEMO", raising=False)
        yield wh


def job_ids(table) -> list[str]:
    return sorted(table["job"].str.removeprefix("job?job="))


def banners(at: AppTest) -> list[str]:
    return [w.value for w in at.warning if w.icon == ICON]


def test_admin_page_lists_exactly_the_pending_warnings(warehouse: Warehouse) -> None:
    at = open_app(ADMIN, "policy")
    assert at.title[0].value == "Waste policies"
    pending = at.dataframe[0].value
    assert job_ids(pending) == sorted(PENDING)  # 101 once, though warned on two channels
    soonest = pending.iloc[0]
    assert soonest["job"] == "job?job=110" and soonest["user"] == ALICE
    assert str(soonest["deadline"].tz) == "Europe/Zurich"
    assert soonest["deadline"].strftime("%H:%M") == "14:20"  # 12:20 UTC in summer time
    assert dict(zip(job_ids(pending), pending.sort_values("job")["mode"], strict=True)) == {
        "101": "real", "104": "real", "105": "dry run", "109": "real", "110": "real"
    }  # fmt: skip
    assert set(pending["seen"].dropna()) == {SEEN}
    assert pending.iloc[1]["figures"] == "idle gpus 4, mean util 0.012"  # job 101's verdict
    assert pending.iloc[-1]["job"] == "job?job=109" and pd.isna(pending.iloc[-1]["deadline"])
    assert metrics(at)["Pending warnings"] == "5"


def test_admin_page_shows_actions_messages_failures_and_counts(warehouse: Warehouse) -> None:
    at = open_app(ADMIN, "policy")
    _, actions, messages, failures, per_rule = (d.value for d in at.dataframe)
    taken = set(zip(actions["job"].str.removeprefix("job?job="), actions["outcome"], strict=True))
    assert taken == {("102", "cancel"), ("103", "left_alone"), ("110", "left_alone")}
    cancel = actions[actions["outcome"] == "cancel"].iloc[0]
    assert (cancel["channel"], cancel["actor"], cancel["mode"]) == ("slurm", ACTOR, "real")
    assert cancel["ts"].strftime("%Y-%m-%d %H:%M") == "2026-06-01 13:05"  # 11:05 UTC
    assert len(messages) == 13 and set(messages["outcome"]) == {"warn", "cancelled"}
    assert job_ids(failures) == ["106"] and "connection refused" in failures["detail"][0]
    shown = metrics(at)
    assert (shown["Jobs cancelled"], shown["Left alone"], shown["Failures"]) == ("1", "2", "1")
    assert shown["Messages"] == "12"  # the failed one not
    idle = per_rule[per_rule["rule"] == "idle"].iloc[0]
    # Warned: 101, 102, 104, 107, 108, 110 (106's failed); violating: only 101 has a verdict.
    assert (idle["warn"], idle["cancel"], idle["left_alone"], idle["failed"]) == (6, 1, 1, 1)
    assert idle["violating"] == 1 and idle["mode"] == "real"
    untouched = per_rule[per_rule["rule"] == "untouched"].iloc[0]
    assert (untouched["warn"], untouched["mode"]) == (1, "dry run")


def test_a_user_sees_their_own_real_warnings_and_no_one_elses(warehouse: Warehouse) -> None:
    at = open_app(ALICE, "my_jobs")
    shown = banners(at)
    assert len(shown) == 2  # 110 and 101: not 105 (dry run), not bob's 104
    assert shown[0].startswith("**Job 110** (campus), rule **idle**")
    first = shown[1]
    assert "**Job 101**" in first and f"Seen: {SEEN}." in first
    assert "Figures: idle gpus 4, mean util 0.012." in first
    assert "Deadline: 2026-06-01 14:30 CEST (warned 2026-06-01 12:30 CEST)." in first
    assert "cancel it: `scancel 101`" in first
    assert not any("104" in b or "105" in b or "Dry run" in b for b in shown)
    at = open_app(BOB, "my_jobs")
    bobs = banners(at)
    assert [b.split("**")[1] for b in bobs] == ["Job 104", "Job 109"]
    assert "Warned 2026-06-01 13:45 CEST; no cancellation follows." in bobs[1]


def test_the_job_page_warns_the_owner_and_admins_only(warehouse: Warehouse) -> None:
    at = open_app(ALICE, "job", query={"job": "101"})
    (banner,) = banners(at)
    assert "**Job 101**" in banner and "scancel 101" in banner
    at = open_app(ALICE, "job", query={"job": "104"})  # bob's: nothing, not even the warning
    assert at.error[0].value == "No job 104 that you may see." and not banners(at)
    at = open_app(ALICE, "job", query={"job": "102"})  # cancelled: no warning left
    assert not banners(at)
    at = open_app(ADMIN, "job", query={"job": "105"})  # admins also see dry-run ones
    (banner,) = banners(at)
    assert banner.startswith("Dry run, not sent and nothing will be cancelled: **Job 105**")
    at = open_app(ADMIN, "my_jobs")  # an admin's My jobs starts with the first user: alice
    assert at.title[0].value == f"Jobs of {ALICE}" and len(banners(at)) == 3


def test_only_admins_open_the_page(warehouse: Warehouse) -> None:
    for who in (RESEARCHER, ALICE):
        at = open_app(who)
        with pytest.raises(ValueError, match="Could not find a navigation page"):
            at.switch_page("pages/policy.py")


def test_a_time_zone_that_does_not_exist_is_named(
    warehouse: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[roles]\nadmins = ["{ADMIN}"]\n[dashboard]\nauth = "oidc"\n'
        'allowed_domains = ["campus.edu"]\n[policy]\ntimezone = "Mars/Olympus"\n'
    )
    monkeypatch.setenv("SING_CONFIG", str(config))
    at = open_app(ADMIN, "policy")
    assert "[policy] timezone = 'Mars/Olympus' is not a known time zone" in at.error[0].value
    assert not at.dataframe
    at = open_app(ALICE, "my_jobs")  # the jobs still show; the warnings say why they cannot
    assert "Mars/Olympus" in at.error[0].value and at.dataframe


def test_a_site_without_policies_gets_a_hint(
    warehouse: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = Warehouse(tmp_path / "wh")
    bare.append("jobs", warehouse.connect().sql("SELECT * FROM jobs").to_arrow_table())
    monkeypatch.setenv("SING_WAREHOUSE", str(bare.root))
    at = open_app(ADMIN, "policy")
    assert "No policy warned, messaged or acted" in at.info[0].value
    assert metrics(at)["Pending warnings"] == "0" and at.dataframe[0].value.empty


def test_a_warning_of_the_engine_reaches_its_users_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole way: a job idles, `sing policy run`'s engine (the site's executor and postman,
    a chat webhook on loopback the only channel) warns, and the user's pages show what the
    warning says."""
    wh = Warehouse(tmp_path / "wh")
    start = END - timedelta(hours=3)
    add_job(wh, "501", start, user=ALICE)
    add_samples(wh, "501", start, END, {("n1", 0): 0.0, ("n1", 1): 0.01})
    file = tmp_path / "sing.toml"
    file.write_text(
        '[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n[executor]\nkind = "slurm"\n'
        "[collector]\ninterval_s = 60\n"  # the samples' spacing
        '[policy]\ndry_run = false\ntimezone = "America/New_York"\nwebhook_url = "{hook}"\n'
        '[policy.rules.idle]\nkind = "idle_gpus"\nactions = ["warn", "cancel"]\n'
        "dry_run = false\nminutes = 60\ngrace_minutes = 90\n"
    )
    with webhook_server() as hook:
        file.write_text(file.read_text().replace("{hook}", hook.url))
        make_engine(Config.load(file), wh, "sing policy run").run(END)
    assert len(hook.posts) == 1
    monkeypatch.setenv("SING_WAREHOUSE", str(wh.root))
    monkeypatch.setenv("SING_CONFIG", str(file))
    for page, query in (("my_jobs", None), ("job", {"job": "501"})):
        (banner,) = banners(open_app(ALICE, page, query))
        assert banner.startswith("**Job 501** (campus), rule **idle**")
        assert "Seen: GPUs under 5% utilisation for 60 minutes." in banner
        assert "Deadline: 2026-06-01 09:30 EDT (warned 2026-06-01 08:00 EDT)." in banner
        assert "cancel it: `scancel 501`" in banner
    assert not banners(open_app(BOB, "my_jobs"))
