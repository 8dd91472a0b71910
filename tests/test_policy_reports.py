"""Job-end reports and digests, sent through the real Postman to an SMTP server on loopback.

The warehouse is written through `Warehouse.append` (tests/test_analytics.py's helpers); every
digest figure the tests expect is worked out here from the jobs the test wrote, and each message
is parsed back from what the server received.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sing.accounting.periods import month_before, period_window
from sing.accounting.settings import AccountingSettings
from sing.accounting.statement import statements
from sing.cli import main
from sing.cli.policy import full_round, make_engine
from sing.config import Config, Thresholds
from sing.policy.messages import NO_CHANNEL
from sing.policy.postman import make_postman
from sing.policy.reports import last_period, send_digests, send_job_end_reports
from sing.warehouse import audit
from sing.warehouse.job_report import job_report, load_notes, render
from sing.warehouse.store import Warehouse
from tests.mailbox import Mailbox, smtp_server
from tests.ports import free_port
from tests.test_analytics import add_gpu_samples, add_job, add_nodes, at

BERLIN = "Europe/Berlin"


@dataclass(frozen=True)
class Job:
    """A job the test writes: one node, each GPU at a constant utilisation, `hours` long."""

    job_id: str
    user: str
    account: str
    utils: tuple[float, ...]  # one per GPU
    start: float  # hours after Monday 2026-01-05 10:00 UTC
    hours: float

    @property
    def gpu_hours(self) -> float:
        return len(self.utils) * self.hours

    @property
    def idle_gpu_hours(self) -> float:  # a GPU at 0 idles in every sample
        return sum(self.hours for u in self.utils if u == 0)

    @property
    def end(self) -> datetime:
        return at(self.start + self.hours)


# Jobs ending in the week of Monday 2026-01-05 (Berlin time), and so in January.
WEEK = [
    Job("a1", "alice", "vision", (0.8,) * 4, 0, 2),
    Job("a2", "alice", "vision", (0.4, 0.0), 24, 4),
    Job("b1", "bob", "vision", (0.3,) * 4, 2, 2),
    Job("c1", "carol", "nlp", (0.9,) * 8, 0, 1),
]
OUTSIDE = [
    Job("early", "alice", "vision", (0.1,) * 4, -24 * 7, 2),  # 29 December
    Job("late", "alice", "vision", (0.1,) * 4, 24 * 6 + 14, 2),  # ends 12 Jan, 03:00 Berlin
]
JANUARY = [*WEEK, OUTSIDE[1]]


def write(wh: Warehouse, jobs: list[Job]) -> None:
    for job in jobs:
        node = f"n-{job.job_id}"
        add_nodes(wh, [node], gpus=len(job.utils))
        start = at(job.start)
        add_job(wh, job.job_id, [node], len(job.utils), start, job.end, user=job.user,
                account=job.account)  # fmt: skip
        for gpu, util in enumerate(job.utils):
            add_gpu_samples(wh, job.job_id, node, [gpu], start, job.end, util)


def weighted_util(jobs: list[Job]) -> float:
    return sum(sum(j.utils) / len(j.utils) * j.gpu_hours for j in jobs) / sum(
        j.gpu_hours for j in jobs
    )


def config(tmp_path: Path, port: int, **policy: Any) -> Config:
    settings = {
        "dry_run": False,
        "smtp_host": "127.0.0.1",
        "smtp_port": port,
        "mail_domain": "example.edu",
        "timezone": BERLIN,
    }
    return Config({"policy": {**settings, **policy}}, tmp_path / "sing.toml")


def trail(wh: Warehouse, kind: str) -> list[dict[str, Any]]:
    found = audit.events(wh.connect(), kinds=(audit.MESSAGE,)).filter(outcome=kind)
    return found.sort("ts", "job_id", "user", "account").to_dicts()


def body(box: Mailbox, to: str) -> str:
    [mail] = [m.message for m in box.received if m.rcpt_tos == [to]]
    return mail.get_body(("plain",)).get_content().replace("\r\n", "\n")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reports") / "wh"
    write(Warehouse(root), WEEK + OUTSIDE)
    return root


@pytest.fixture
def wh(written: Path, tmp_path: Path) -> Warehouse:
    """A copy of the written warehouse per test (each test adds its own audit trail)."""
    return Warehouse(Path(shutil.copytree(written, tmp_path / "wh")))


# Job-end reports: `now` is Monday 12 Jan 05:00 UTC, 3 hours after `late` ended; the week's jobs
# ended more than a day before, so they get no report.
END_NOW = at(24 * 6 + 19)


def test_each_finished_job_is_reported_to_its_owner_once(tmp_path, wh):
    write(wh, [Job("d1", "dave", "nlp", (0.5, 0.25), 24 * 6 + 12, 1)])
    add_job(wh, "running", ["n-d1"], 1, at(24 * 6 + 12), None, user="dave")
    add_job(wh, "cpu-only", ["n-d1"], 0, at(24 * 6 + 12), at(24 * 6 + 13), user="dave")
    with smtp_server() as box:
        cfg = config(tmp_path, box.port, job_end_reports=True)
        sent = send_job_end_reports(wh, cfg, make_postman(cfg), END_NOW)
        again = send_job_end_reports(Warehouse(wh.root), cfg, make_postman(cfg), END_NOW)
    assert [(e.job_id, e.recipient, e.ok, e.dry_run) for e in sent] == [
        ("d1", "dave@example.edu", True, False),
        ("late", "alice@example.edu", True, False),
    ]
    assert again == [] and len(box.received) == 2
    mail = next(m.message for m in box.received if m.rcpt_tos == ["dave@example.edu"])
    assert mail["Subject"] == "[sing] Job d1 on test ended: 38% GPU utilisation"
    text = body(box, "dave@example.edu")
    report = job_report(wh.connect(), "d1", Thresholds(), load_notes(None), END_NOW, "test")
    assert render(report) in text  # the `sing job` report itself
    assert "GPU-hours allocated 2.0" in text and "sing job d1" in text
    rows = trail(wh, "job_end")
    assert [(r["job_id"], r["user"], r["channel"], r["ok"]) for r in rows] == [
        ("d1", "dave", "email", True),
        ("late", "alice", "email", True),
    ]


def test_opted_out_users_get_no_report(tmp_path, wh):
    with smtp_server() as box:
        cfg = config(tmp_path, box.port, job_end_reports=True, job_end_opt_out=["alice"])
        assert send_job_end_reports(wh, cfg, make_postman(cfg), END_NOW) == []
    assert box.received == [] and trail(wh, "job_end") == []


def test_reports_are_off_unless_the_site_enables_them(tmp_path, wh):
    with smtp_server() as box:
        cfg = config(tmp_path, box.port)
        assert send_job_end_reports(wh, cfg, make_postman(cfg), END_NOW) == []
        assert send_digests(wh, cfg, make_postman(cfg), "weekly", END_NOW) == []
    assert box.received == []


def test_a_failed_report_is_recorded_and_sent_again_next_round(tmp_path, wh):
    down = config(tmp_path, free_port(), job_end_reports=True)
    [failed] = send_job_end_reports(wh, down, make_postman(down), END_NOW)
    assert (failed.job_id, failed.ok) == ("late", False)
    assert "ConnectionRefusedError" in failed.detail["error"]
    with smtp_server() as box:
        up = config(tmp_path, box.port, job_end_reports=True)
        later = END_NOW + timedelta(minutes=5)
        [sent] = send_job_end_reports(wh, up, make_postman(up), later)
        assert send_job_end_reports(wh, up, make_postman(up), later) == []
    assert (sent.job_id, sent.ok) == ("late", True) and len(box.received) == 1
    assert [(r["ts"], r["ok"]) for r in trail(wh, "job_end")] == [(END_NOW, False), (later, True)]


def test_a_dry_run_records_what_it_would_send_and_does_not_settle_the_real_send(tmp_path, wh):
    with smtp_server() as box:
        dry = config(tmp_path, box.port, job_end_reports=True, dry_run=True)
        [held] = send_job_end_reports(wh, dry, make_postman(dry), END_NOW)
        assert send_job_end_reports(wh, dry, make_postman(dry), END_NOW) == []
        assert box.received == []
        real = config(tmp_path, box.port, job_end_reports=True)
        [sent] = send_job_end_reports(wh, real, make_postman(real), END_NOW)
    assert (held.dry_run, held.channel, held.detail) == (True, None, {"held": "dry run"})
    assert (sent.dry_run, sent.recipient) == (False, "alice@example.edu")
    assert len(box.received) == 1


# Digests: `now` is Monday 12 Jan 09:00 Berlin; the last week is 5-11 January there.
DIGEST_NOW = datetime(2026, 1, 12, 8, 0, tzinfo=UTC)


def test_the_last_week_is_the_sites_and_the_last_month_the_statements():
    tz = ZoneInfo(BERLIN)
    assert last_period("weekly", DIGEST_NOW, tz) == (
        datetime(2026, 1, 5, tzinfo=tz),
        datetime(2026, 1, 12, tzinfo=tz),
    )
    # 23:30 UTC on 31 January is already February in Berlin, but an account's month is UTC's
    # (issue 30: the digest covered 1 January 00:00 Berlin on, the statement 01:00 Berlin on).
    late = datetime(2026, 1, 31, 23, 30, tzinfo=UTC)
    assert last_period("monthly", late, tz) == period_window("2025-12")
    assert last_period("monthly", DIGEST_NOW, tz) == period_window(month_before(DIGEST_NOW))


def test_the_monthly_digest_and_the_statement_cover_the_same_month(tmp_path, wh):
    """The digest sent on 2 February and `sing report statement --period 2026-01`: one window."""
    now = datetime(2026, 2, 2, tzinfo=UTC)
    contacts = {"vision": "pi-vision@example.edu"}
    cfg = config(tmp_path, 0, monthly_account_digests=True, account_contacts=contacts)
    (sent,) = send_digests(wh, cfg, make_postman(cfg), "monthly", now, dry_run=True)
    (statement,) = statements(wh.connect(), month_before(now), AccountingSettings(), ["vision"])
    assert sent.detail["period"] == statement.since.isoformat() == "2026-01-01T00:00:00+00:00"


def test_the_weekly_digest_compares_each_user_with_the_cluster(tmp_path, wh):
    with smtp_server() as box:
        cfg = config(tmp_path, box.port, weekly_digests=True)
        sent = send_digests(wh, cfg, make_postman(cfg), "weekly", DIGEST_NOW)
        assert send_digests(wh, cfg, make_postman(cfg), "weekly", DIGEST_NOW) == []
    users = sorted({j.user for j in WEEK})
    assert sorted(e.recipient for e in sent) == [f"{u}@example.edu" for u in users]
    assert all(e.ok and e.detail == {"period": "2026-01-05T00:00:00+01:00"} for e in sent)
    assert len(box.received) == len(users)
    mean = {u: weighted_util([j for j in WEEK if j.user == u]) for u in users}
    ranked = sorted(users, key=lambda u: -mean[u])
    for user in users:
        mine = [j for j in WEEK if j.user == user]
        text = body(box, f"{user}@example.edu")
        assert "ended from 2026-01-05 to 2026-01-11" in text
        assert f"  Jobs                  {len(mine)}\n" in text
        assert f"  GPU-hours             {sum(j.gpu_hours for j in mine):.1f}\n" in text
        assert (
            f"  Mean GPU utilisation  {mean[user]:.0%}  (the cluster: {weighted_util(WEEK):.0%})"
            in text
        )
        assert f"  Idle GPU-hours        {sum(j.idle_gpu_hours for j in mine):.1f}\n" in text
        rank = ranked.index(user) + 1
        assert f"  Rank by utilisation   {rank} of {len(users)} users" in text
    alice = next(m.message for m in box.received if m.rcpt_tos == ["alice@example.edu"])
    assert alice["Subject"] == f"[sing] Your GPU week on test: {mean['alice']:.0%} mean utilisation"


def test_the_monthly_digest_goes_to_each_accounts_contact(tmp_path, wh):
    contacts = {"vision": "pi-vision@example.edu"}  # nlp has no contact: no digest
    with smtp_server() as box:
        cfg = config(tmp_path, box.port, monthly_account_digests=True, account_contacts=contacts)
        sent = send_digests(wh, cfg, make_postman(cfg), "monthly", datetime(2026, 2, 2, tzinfo=UTC))
    assert [(e.account, e.recipient, e.ok) for e in sent] == [
        ("vision", "pi-vision@example.edu", True)
    ]
    [mail] = box.received
    assert mail.message["Subject"] == "[sing] GPU usage of account vision on test, 2026-01"
    text = body(box, "pi-vision@example.edu")
    vision = [j for j in JANUARY if j.account == "vision"]
    assert f"  GPU-hours             {sum(j.gpu_hours for j in vision):.1f}\n" in text
    assert f"Mean GPU utilisation  {weighted_util(vision):.0%}  (the cluster: " in text
    assert "  Rank by utilisation   2 of 2 accounts" in text  # nlp's 90 % is first
    for user in ("alice", "bob"):
        mine = [j for j in vision if j.user == user]
        gpu_hours, idle = sum(j.gpu_hours for j in mine), sum(j.idle_gpu_hours for j in mine)
        util = f"{weighted_util(mine):.0%}"
        row = f"  {user:<16} {len(mine):6d} {gpu_hours:11.1f} {util:>9} {idle:16.1f}"
        assert row in text.splitlines()
    assert "carol" not in text
    [row] = trail(wh, "monthly_digest")
    assert (row["account"], row["user"], row["channel"]) == ("vision", None, "email")


def test_digests_held_for_want_of_a_channel_are_recorded_once(tmp_path, wh):
    cfg = Config({"policy": {"dry_run": False, "weekly_digests": True}}, tmp_path / "sing.toml")
    held = send_digests(wh, cfg, make_postman(cfg), "weekly", DIGEST_NOW)
    assert {(e.ok, e.detail["error"]) for e in held} == {(False, NO_CHANNEL)}
    assert len(held) == len({j.user for j in WEEK})
    assert send_digests(wh, cfg, make_postman(cfg), "weekly", DIGEST_NOW) == []


def site_config(tmp_path: Path, port: int, weekly: bool) -> Path:
    file = tmp_path / "sing.toml"
    file.write_text(
        f"""
[site]
warehouse = "wh"

[policy]
dry_run = false
weekly_digests = {str(weekly).lower()}
smtp_host = "127.0.0.1"
smtp_port = {port}
mail_domain = "example.edu"
timezone = "{BERLIN}"
"""
    )
    return file


def test_sing_policy_digest_sends_the_weeks_digests_once(tmp_path, wh, capsys):
    with smtp_server() as box:
        argv = ["--config", str(site_config(tmp_path, box.port, True)), "policy", "digest"]
        when = ["--weekly", "--now", "2026-01-12T09:00:00+01:00"]
        assert main([*argv, *when, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert main([*argv, *when]) == 0
        assert capsys.readouterr().out == "no weekly digest is due (each goes out once)\n"
    users = sorted({j.user for j in WEEK})
    assert sorted((r["user"], r["recipient"], r["ok"]) for r in rows) == [
        (u, f"{u}@example.edu", True) for u in users
    ]
    assert len(box.received) == len(users)
    [row] = trail(wh, "weekly_digest")[:1]
    assert row["actor"].startswith("sing policy digest@")


def test_sing_policy_digest_says_when_digests_are_off(tmp_path, wh, capsys):
    argv = ["--config", str(site_config(tmp_path, free_port(), False)), "policy", "digest"]
    assert main([*argv, "--weekly"]) == 1
    assert "weekly digests are off: set [policy] weekly_digests = true" in capsys.readouterr().err


def test_each_round_sends_what_is_due_once_and_nothing_in_quiet_hours(tmp_path, wh):
    """The collector's round sends job-end reports and digests itself, each once, and holds
    them while quiet hours last (END_NOW is 06:00 in Berlin)."""
    with smtp_server() as box:
        cfg = config(
            tmp_path, box.port, job_end_reports=True, weekly_digests=True,
            quiet_hours="05:00-07:00",
        )  # fmt: skip
        engine = make_engine(cfg, wh, "sing collector")
        full_round(engine, cfg, END_NOW)
        assert box.received == [] and trail(wh, "job_end") == []
        for minutes in (120, 125):
            full_round(engine, cfg, END_NOW + timedelta(minutes=minutes))
    assert [r["job_id"] for r in trail(wh, "job_end")] == ["late"]
    digests = sorted(r["user"] for r in trail(wh, "weekly_digest"))
    assert digests == sorted({j.user for j in WEEK})
    assert len(box.received) == 1 + len(digests)
