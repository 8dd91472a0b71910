"""The ladder end to end over a real warehouse and the local executor's real job processes:
notify -> warn -> cancel, dry run, restarts, recovery, stale data, ended and requeued jobs,
throttling and quiet hours. Rounds run at chosen times (`now`) over samples scripted for them."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from sing.executors.local import LocalExecutor
from sing.executors.profile import JobProfile
from sing.warehouse.audit import events
from sing.warehouse.store import Warehouse
from tests.policy_world import RecordingPostman, add_job, add_samples, engine, settings

RULE = {
    "kind": "idle_gpus",
    "minutes": 60,
    "actions": ["notify", "warn", "cancel"],
    "warn_after_minutes": 30,
    "grace_minutes": 60,
}
IDLE = {("n1", 0): 0.0, ("n1", 1): 0.0}
BUSY = {("n1", 0): 0.8, ("n1", 1): 0.7}
# The trail of a ladder climbed to the top.
FULL_LADDER = [
    ("evaluation", "violating"),
    ("message", "notify"),
    ("message", "warn"),
    ("action", "cancel_intent"),  # on record before the executor is asked
    ("action", "cancel"),
    ("message", "cancelled"),
]


@dataclasses.dataclass
class World:
    wh: Warehouse
    executor: LocalExecutor
    postman: RecordingPostman

    def start_job(self, user: str = "alice") -> tuple[str, datetime]:
        """A real job process holding both GPUs, its record in the warehouse; (id, start)."""
        job_id = self.executor.submit(
            JobProfile(name="train", commands="sleep 600", gpus_per_node=2)
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            record = self.executor._read(job_id)
            if record.state == "RUNNING":
                add_job(self.wh, job_id, record.start_time, user=user)
                return job_id, record.start_time
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} did not start")

    def idle_job(self) -> tuple[str, datetime]:
        """A real job whose GPUs idle from its start for five hours; (id, two hours in)."""
        job_id, start = self.start_job()
        add_samples(self.wh, job_id, start, start + timedelta(hours=5), IDLE)
        return job_id, start + timedelta(hours=2)

    def state(self, job_id: str, timeout: float = 15) -> str:
        """The job's state once settled (a cancel takes its process a moment)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.executor._read(job_id).state
            if state != "RUNNING":
                return state
            time.sleep(0.05)
        return "RUNNING"

    def trail(self, job_id: str | None = None) -> list[tuple[str, str]]:
        """(event, outcome) of the trail, oldest first (one job's, or all)."""
        con = self.wh.connect()
        rows = events(con).reverse().to_dicts()
        con.close()
        return [(r["event"], r["outcome"]) for r in rows if job_id in (None, r["job_id"])]


@pytest.fixture
def world(tmp_path):
    executor = LocalExecutor("campus", tmp_path / "state", gpus=[0, 1, 2, 3], node="n1")
    yield World(Warehouse(tmp_path / "wh"), executor, RecordingPostman())
    for record in executor.running():
        executor.cancel(record.job_id)


def real(**fields):
    """Settings that act for real (both the section and the rule say so)."""
    return settings({"idle": {**RULE, "dry_run": False}}, dry_run=False, **fields)


def test_idle_job_is_notified_warned_then_cancelled_after_its_deadline(world):
    job_id, start = world.start_job()
    t0 = start + timedelta(hours=2)
    add_samples(world.wh, job_id, start, t0 + timedelta(hours=2), IDLE)
    policy = engine(world.wh, real(), world.executor, world.postman)

    steps = {}
    for minutes in (0, 10, 31, 90, 92):
        result = policy.run(t0 + timedelta(minutes=minutes))
        (decision,) = result.decisions
        steps[minutes] = decision.action
        if minutes == 31:
            assert decision.deadline == t0 + timedelta(minutes=91)
        if minutes < 92:
            assert world.executor._read(job_id).state == "RUNNING"
    assert steps == {0: "notify", 10: "wait", 31: "warn", 90: "wait", 92: "cancel"}
    assert world.state(job_id) == "CANCELLED"
    kinds = [m.kind for m in world.postman.sent]
    assert kinds == ["notify", "warn", "cancelled"]
    warn = world.postman.sent[1]
    assert warn.context["deadline"] == t0 + timedelta(minutes=91)
    assert warn.context["cancel_command"] == f"sing jobs cancel {job_id}"
    assert warn.context["job"]["num_gpus"] == 2 and warn.context["job"]["mean_util"] == 0.0
    assert warn.context["dry_run"] is False
    assert world.trail(job_id) == FULL_LADDER


def test_dry_run_records_what_would_happen_and_does_nothing(world):
    job_id, t0 = world.idle_job()
    # the section acts, the rule does not (and the other way round): both are dry runs
    for policy_settings in (
        settings({"idle": RULE}, dry_run=False),
        settings({"idle": {**RULE, "dry_run": False}}),
    ):
        policy = engine(world.wh, policy_settings, world.executor, world.postman)
        for minutes in (0, 31, 92, 120):
            policy.run(t0 + timedelta(minutes=minutes))
    assert world.postman.sent == []
    assert world.executor._read(job_id).state == "RUNNING"
    con = world.wh.connect()
    trail = events(con).reverse()
    con.close()
    assert trail["dry_run"].all()
    # one dry ladder, shared by both dry configurations: nothing repeated (and no intent: a
    # dry run asks the executor nothing)
    dry_ladder = [step for step in FULL_LADDER if step != ("action", "cancel_intent")]
    assert [(r["event"], r["outcome"]) for r in trail.to_dicts()] == dry_ladder


def test_restart_mid_ladder_repeats_nothing_and_keeps_the_deadline(world):
    job_id, t0 = world.idle_job()
    first = engine(world.wh, real(), world.executor, world.postman)
    first.run(t0)
    first.run(t0 + timedelta(minutes=31))  # warned: deadline t0 + 91 min

    restarted = engine(world.wh, real(), world.executor, world.postman)
    (decision,) = restarted.run(t0 + timedelta(minutes=45)).decisions
    assert (decision.action, decision.deadline) == ("wait", t0 + timedelta(minutes=91))
    assert restarted.run(t0 + timedelta(minutes=90)).events == []
    assert world.executor._read(job_id).state == "RUNNING"
    restarted.run(t0 + timedelta(minutes=92))
    assert world.state(job_id) == "CANCELLED"
    assert [m.kind for m in world.postman.sent] == ["notify", "warn", "cancelled"]


def test_a_job_that_recovers_before_its_deadline_is_left_alone(world):
    job_id, start = world.start_job()
    t0 = start + timedelta(hours=2)
    add_samples(world.wh, job_id, start, t0 + timedelta(minutes=40), IDLE)
    add_samples(world.wh, job_id, t0 + timedelta(minutes=41), t0 + timedelta(hours=3), BUSY)
    policy = engine(world.wh, real(), world.executor, world.postman)
    policy.run(t0)
    policy.run(t0 + timedelta(minutes=31))
    (decision,) = policy.run(t0 + timedelta(minutes=100)).decisions  # busy for the last hour
    assert (decision.verdict, decision.action) == ("ok", "left_alone")
    policy.run(t0 + timedelta(minutes=110))
    assert world.executor._read(job_id).state == "RUNNING"
    assert world.trail(job_id)[-2:] == [("evaluation", "recovered"), ("action", "left_alone")]
    assert [m.kind for m in world.postman.sent] == ["notify", "warn"]


def test_stale_data_at_the_deadline_waits_for_fresh_samples(world):
    job_id, start = world.start_job()
    t0 = start + timedelta(hours=2)
    add_samples(world.wh, job_id, start, t0 + timedelta(minutes=40), IDLE)
    policy = engine(world.wh, real(max_data_age_s=600), world.executor, world.postman)
    policy.run(t0)
    policy.run(t0 + timedelta(minutes=31))
    (decision,) = policy.run(t0 + timedelta(minutes=95)).decisions  # exporter silent since +40
    assert (decision.verdict, decision.action) == ("stale", "wait")
    assert world.executor._read(job_id).state == "RUNNING"
    add_samples(world.wh, job_id, t0 + timedelta(minutes=41), t0 + timedelta(minutes=100), IDLE)
    (decision,) = policy.run(t0 + timedelta(minutes=100)).decisions
    assert decision.action == "cancel"
    assert world.state(job_id) == "CANCELLED"
    assert ("evaluation", "stale") in world.trail(job_id)


def test_a_job_that_ended_or_was_requeued_is_left_alone(world):
    ended, start = world.start_job()
    requeued, start2 = world.start_job()
    t0 = max(start, start2) + timedelta(hours=2)
    for job_id, began in ((ended, start), (requeued, start2)):
        add_samples(world.wh, job_id, began, t0 + timedelta(hours=3), IDLE)
    policy = engine(world.wh, real(user_message_period_s=0), world.executor, world.postman)
    policy.run(t0)
    policy.run(t0 + timedelta(minutes=31))
    # one ends on its own; the other is requeued and starts again (a new run, same id)
    add_job(world.wh, ended, start, end_time=t0 + timedelta(minutes=50), state="COMPLETED")
    add_job(world.wh, requeued, start2 + timedelta(minutes=60))
    by_job = {d.job["job_id"]: d for d in policy.run(t0 + timedelta(minutes=60)).decisions}
    assert (by_job[ended].verdict, by_job[ended].action) == ("ended", "left_alone")
    assert (by_job[requeued].verdict, by_job[requeued].action) == ("changed", "left_alone")
    policy.run(t0 + timedelta(minutes=95))
    assert world.executor._read(requeued).state == "RUNNING"
    assert world.trail(ended)[-2:] == [("evaluation", "ended"), ("action", "left_alone")]


def test_the_executor_has_the_last_word_before_a_cancel(world):
    job_id, t0 = world.idle_job()
    policy = engine(world.wh, real(), world.executor, world.postman)
    policy.run(t0)
    policy.run(t0 + timedelta(minutes=31))
    world.executor.cancel(job_id)  # gone, though the warehouse has not heard yet
    assert world.state(job_id) == "CANCELLED"
    policy.run(t0 + timedelta(minutes=92))
    assert world.trail(job_id)[-2:] == [("evaluation", "ended"), ("action", "left_alone")]
    assert [m.kind for m in world.postman.sent] == ["notify", "warn"]


def test_one_message_per_user_and_rule_per_period(world):
    t0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    start = t0 - timedelta(hours=2)
    for job_id, user in (("1", "alice"), ("2", "alice"), ("3", "bob")):
        add_job(world.wh, job_id, start, user=user)
        add_samples(world.wh, job_id, start, t0 + timedelta(hours=30), IDLE)
    rule = {"idle": {**RULE, "actions": ["notify"], "dry_run": False}}
    policy = engine(
        world.wh,
        settings(rule, dry_run=False, user_message_period_s=86400),
        world.executor,
        world.postman,
    )
    first = {d.job["job_id"]: (d.action, d.hold) for d in policy.run(t0).decisions}
    assert first == {
        "1": ("notify", None),
        "2": ("held", ("notify", "user_period")),
        "3": ("notify", None),
    }
    policy.run(t0 + timedelta(hours=1))  # still held: recorded once only
    later = {d.job["job_id"]: d.action for d in policy.run(t0 + timedelta(hours=24)).decisions}
    assert later == {"1": "wait", "2": "notify", "3": "wait"}
    assert [(m.user, m.job_id) for m in world.postman.sent] == [
        ("alice", "1"),
        ("bob", "3"),
        ("alice", "2"),
    ]
    assert world.trail("2") == [
        ("evaluation", "violating"),
        ("message", "held"),
        ("message", "notify"),
    ]


def test_quiet_hours_hold_messages_and_the_deadline_counts_from_the_send(world):
    night = datetime(2026, 3, 2, 22, 30, tzinfo=UTC)
    start = night - timedelta(hours=2)
    add_job(world.wh, "1", start)
    add_samples(world.wh, "1", start, night + timedelta(hours=12), IDLE)
    rule = {"idle": {**RULE, "actions": ["warn", "cancel"], "dry_run": False}}
    quiet = settings(rule, dry_run=False, quiet_hours="22:00-07:00", timezone="UTC")
    policy = engine(world.wh, quiet, world.executor, world.postman)
    (held,) = policy.run(night).decisions
    assert (held.action, held.hold) == ("held", ("warn", "quiet_hours"))
    assert policy.run(night + timedelta(hours=2)).events == []  # still quiet: nothing new
    morning = datetime(2026, 3, 3, 7, 5, tzinfo=UTC)
    (sent,) = policy.run(morning).decisions
    assert (sent.action, sent.deadline) == ("warn", morning + timedelta(minutes=60))
    assert [m.kind for m in world.postman.sent] == ["warn"]


def test_quiet_hours_in_the_sites_timezone():
    from sing.policy.ladder import QuietHours

    quiet = QuietHours("22:00-07:00", ZoneInfo("America/New_York"))
    assert datetime(2026, 7, 2, 3, 0, tzinfo=UTC) in quiet  # 23:00 in New York
    assert datetime(2026, 7, 2, 12, 0, tzinfo=UTC) not in quiet  # 08:00 there
    assert datetime(2026, 7, 2, 12, 0, tzinfo=UTC) not in QuietHours("", ZoneInfo("UTC"))
