"""Fail closed where the policies act: nobody is cancelled who was not told, no verdict rests on
part of a job's data, no cancel happens without its intent on record, and a breaker stops a
round that would cancel too much. Each test runs real rounds over a real warehouse and the
local executor's real job processes (tests/test_policy_ladder.py's world)."""

# ruff: noqa: F811 - `world` is test_policy_ladder's fixture, imported
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from sing.cli import main
from sing.cli.policy import policy_job
from sing.config import Config
from sing.errors import UserError
from sing.executors.base import TIMEOUT, CommandError
from sing.executors.local import LocalExecutor
from sing.policy import breaker
from sing.policy.breaker import TRIPPED
from sing.policy.engine import round_lock
from sing.policy.messages import NO_CHANNEL, Delivery, Message
from sing.warehouse.store import Warehouse
from tests.policy_world import RecordingPostman, add_job, add_samples, engine, settings
from tests.test_policy_ladder import IDLE, RULE, World, real, world  # noqa: F401

ADMIN = "hpc-admins@example.edu"


@dataclass
class FlakyPostman:
    """Delivers to the owner only while `up`; the admins' copy of warnings always arrives."""

    up: bool = False
    sent: list[Message] = field(default_factory=list)

    def send(self, message: Message) -> list[Delivery]:
        self.sent.append(message)
        owner = f"{message.user}@example.edu"
        out = []
        if owner not in message.delivered:
            out.append(Delivery("email", owner, self.up, "" if self.up else "Connection refused"))
        if message.kind in ("warn", "cancelled", "breaker") and ADMIN not in message.delivered:
            out.append(Delivery("email", ADMIN, True, to_owner=False))
        return out


def climb(world: World, policy, t0, minutes) -> dict[int, str]:
    return {m: policy.run(t0 + timedelta(minutes=m)).decisions[0].action for m in minutes}


def test_an_undelivered_warning_starts_no_deadline_and_no_cancel(world):
    job_id, start = world.start_job()
    t0 = start + timedelta(hours=2)
    add_samples(world.wh, job_id, start, t0 + timedelta(hours=6), IDLE)
    postman = FlakyPostman()
    policy = engine(world.wh, real(), world.executor, postman)
    # Owner unreachable for three hours: the notice is tried every round and fails, so no
    # warning follows, no deadline runs and nothing is cancelled.
    climb(world, policy, t0, range(0, 180, 10))
    assert world.executor._read(job_id).state == "RUNNING"
    assert ("action", "cancel") not in world.trail(job_id)
    assert {m.kind for m in postman.sent} == {"notify"}
    # Mail back for the notice; down again when the warning goes: only the admins' copy
    # arrives, which is not the owner told, so the deadline does not start.
    postman.up = True
    t1 = t0 + timedelta(minutes=180)
    assert climb(world, policy, t1, (0,)) == {0: "notify"}
    postman.up = False
    assert climb(world, policy, t1, (31,)) == {31: "warn"}
    postman.up = True
    steps = climb(world, policy, t1, (40, 92, 99, 101))
    assert steps == {40: "warn", 92: "wait", 99: "wait", 101: "cancel"}  # deadline 40 + 60
    assert world.state(job_id) == "CANCELLED"
    warns = [m for m in postman.sent if m.kind == "warn"]
    assert len(warns) == 2 and ADMIN in warns[1].delivered  # the admins are not told twice


def test_an_admins_copy_alone_is_not_the_owner_told(world):
    job_id, t0 = world.idle_job()
    postman = FlakyPostman()
    policy = engine(world.wh, real(), world.executor, postman)
    add_samples(world.wh, job_id, t0, t0 + timedelta(hours=5), IDLE)
    policy.run(t0)
    con = world.wh.connect()
    rows = con.sql(
        "SELECT outcome, ok, detail FROM policy_events WHERE event = 'message'"
    ).fetchall()
    con.close()
    assert rows and all(not ok for _, ok, _ in rows)  # the notice failed: recorded, not sent


def test_a_real_ladder_without_a_channel_to_owners_refuses_to_start(tmp_path, capsys):
    config = tmp_path / "sing.toml"
    config.write_text(
        '[site]\ncluster = "campus"\nwarehouse = "wh"\n'
        '[executor]\nkind = "local"\nlocal_gpus = [0]\nlocal_state_dir = "jobs"\n'
        '[policy]\ndry_run = false\nsmtp_host = "127.0.0.1"\n'  # a relay, but no mail_domain
        f'admin_emails = ["{ADMIN}"]\n'
        '[policy.rules.idle]\nkind = "idle_gpus"\ndry_run = false\n'
        'actions = ["notify", "warn", "cancel"]\n'
    )
    assert main(["--config", str(config), "policy", "run"]) != 0
    err = capsys.readouterr().err
    assert "no channel reaches a job's owner" in err and "mail_domain" in err
    assert "Traceback" not in err
    with pytest.raises(UserError, match="mail_domain"):
        policy_job(Config.load(config), None)
    # dry run (the default) needs no channel: check and a dry round still run
    config.write_text(config.read_text().replace("dry_run = false\nsmtp", "smtp"))
    (tmp_path / "wh").mkdir()  # a round reads the warehouse: a missing one is an error
    assert main(["--config", str(config), "policy", "run"]) == 0


def test_half_the_gpus_unsampled_is_incomplete_never_a_verdict(world):
    job_id, start = world.start_job()
    t0 = start + timedelta(hours=2)
    # 2 nodes x 8 GPUs: node 1's eight idle GPUs report, node 2 (the busy one) never does
    con = world.wh.connect()
    con.close()
    add_job(world.wh, job_id, start, num_gpus=16, num_nodes=2, nodes=["n1", "n2"])
    add_samples(world.wh, job_id, start, t0, {("n1", i): 0.0 for i in range(8)})
    policy = engine(world.wh, real(), world.executor, FlakyPostman(up=True))
    (decision,) = policy.run(t0).decisions
    assert decision.verdict == "incomplete" and decision.action == "wait"
    assert decision.evidence["coverage"] == pytest.approx(0.5)
    # under_request counted an unsampled GPU as unused; now it counts as no evidence at all
    under = {"kind": "under_request", "min_run_hours": 1, "request_share": 0.45}
    add_samples(world.wh, job_id, start, t0, {("n2", i): 1.0 for i in range(7)})
    policy = engine(world.wh, settings({"u": under}), world.executor, FlakyPostman(up=True))
    (decision,) = policy.decide(t0)
    assert decision.evidence["coverage"] == pytest.approx(15 / 16)
    # 7 busy GPUs and one unseen of 16: 8/16 may be busy, over the 45% asked (7/16 is not)
    assert decision.verdict == "ok"


@dataclass
class DyingExecutor:
    """The local executor, but the process 'dies' (KeyboardInterrupt) around scancel."""

    inner: object
    cancel_first: bool  # True: dies after the cancel happened; False: before it

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def cancel(self, job_id: str) -> None:
        if self.cancel_first:
            self.inner.cancel(job_id)
        raise KeyboardInterrupt


@pytest.mark.parametrize("cancel_first", [False, True])
def test_a_round_killed_at_the_cancel_leaves_its_intent_and_is_reconciled(world, cancel_first):
    job_id, t0 = world.idle_job()
    postman = FlakyPostman(up=True)
    policy = engine(world.wh, real(), world.executor, postman)
    climb(world, policy, t0, (0, 31))  # notified, warned: deadline at +91
    dying = engine(world.wh, real(), DyingExecutor(world.executor, cancel_first), postman)
    with pytest.raises(KeyboardInterrupt):
        dying.run(t0 + timedelta(minutes=92))
    assert world.trail(job_id)[-1] == ("action", "cancel_intent")  # on record before the act
    if cancel_first:
        assert world.state(job_id) == "CANCELLED"
        # the job sync brings Slurm's (here the local executor's) record of the end
        add_job(world.wh, job_id, t0 - timedelta(hours=2), state="CANCELLED",
                end_time=t0 + timedelta(minutes=92))  # fmt: skip
    (decision,) = policy.run(t0 + timedelta(minutes=95)).decisions
    assert decision.action == "reconcile"
    trail = world.trail(job_id)
    assert trail.count(("action", "cancel_intent")) == 1 and trail[-1] == ("action", "cancel")
    con = world.wh.connect()
    ((ok,),) = con.sql(
        "SELECT ok FROM policy_events WHERE outcome = 'cancel' ORDER BY ts DESC LIMIT 1"
    ).fetchall()
    con.close()
    assert ok is cancel_first
    if not cancel_first:  # it did not happen: the next round cancels, with a new intent
        assert policy.run(t0 + timedelta(minutes=97)).decisions[0].action == "cancel"
        assert world.state(job_id) == "CANCELLED"
        assert world.trail(job_id).count(("action", "cancel_intent")) == 2
    else:
        kinds = [m.kind for m in postman.sent]
        policy.run(t0 + timedelta(minutes=99))
        assert [m.kind for m in postman.sent][len(kinds) :] == ["cancelled"]


def test_the_breaker_stops_cancels_tells_the_admins_and_resume_clears_it(tmp_path, capsys):
    executor = LocalExecutor("campus", tmp_path / "state", gpus=list(range(6)), node="n1")
    world = World(Warehouse(tmp_path / "wh"), executor, RecordingPostman())
    jobs = [world.idle_job() for _ in range(3)]
    t0 = max(t for _, t in jobs)
    postman = FlakyPostman(up=True)
    rules = {"idle": {**RULE, "dry_run": False}}
    policy = engine(
        world.wh, settings(rules, dry_run=False, max_cancels_per_hour=2, user_message_period_s=0),
        world.executor, postman,
    )  # fmt: skip
    for minutes in (0, 31, 92):
        policy.run(t0 + timedelta(minutes=minutes))
    states = sorted(world.state(j, timeout=3) for j, _ in jobs)
    assert states == ["CANCELLED", "CANCELLED", "RUNNING"]
    assert world.trail().count(("action", TRIPPED)) == 1
    assert [m.kind for m in postman.sent].count("breaker") == 1
    # tripped stays tripped, past the hour too
    policy.run(t0 + timedelta(minutes=170))
    assert sorted(world.state(j, timeout=1) for j, _ in jobs).count("RUNNING") == 1
    assert world.trail().count(("action", TRIPPED)) == 1
    # an admin resumes (the rounds run at scripted times: the resume is recorded at one too)
    assert breaker.resume(world.wh, "campus", t0 + timedelta(minutes=170, seconds=30), "me", "ok")
    config = tmp_path / "resume.toml"
    config.write_text(f'[site]\ncluster = "campus"\nwarehouse = "{world.wh.root}"\n')
    assert main(["--config", str(config), "policy", "resume", "--note", "again"]) == 0
    assert "not tripped" in capsys.readouterr().out
    policy.run(t0 + timedelta(minutes=171))
    assert all(world.state(j) == "CANCELLED" for j, _ in jobs)
    for record in executor.running():
        executor.cancel(record.job_id)


def test_one_round_at_a_time_per_warehouse(world):
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with round_lock(world.wh):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        with pytest.raises(UserError, match="another policy round is running"):  # noqa: SIM117
            with round_lock(world.wh, wait_s=0.5):
                pass
    finally:
        release.set()
        holder.join()
    with round_lock(world.wh, wait_s=0.5):  # free again
        pass
    assert Path(world.wh.root, ".locks", "policy-round.lock").exists()


class Unreachable:
    """A postman with no channel to anyone (no relay, no webhook): it delivers nothing."""

    def send(self, message: Message) -> list[Delivery]:
        return []


def test_with_no_channel_at_all_nobody_is_cancelled(world):
    job_id, t0 = world.idle_job()
    policy = engine(world.wh, real(), world.executor, Unreachable())
    steps = climb(world, policy, t0, range(0, 175, 5))
    assert set(steps.values()) == {"notify"}  # tried each round, never counted as sent
    assert world.executor._read(job_id).state == "RUNNING"
    con = world.wh.connect()
    rows = con.sql("SELECT DISTINCT ok, detail ->> 'error' FROM policy_events "
                   "WHERE event = 'message'").fetchall()  # fmt: skip
    con.close()
    assert rows == [(False, NO_CHANNEL)]


def test_doctor_head_names_a_real_ladder_without_a_channel(tmp_path, capsys):
    config = tmp_path / "sing.toml"
    rule = '[policy.rules.idle]\nkind = "idle_gpus"\ndry_run = false\n'
    config.write_text(f'[site]\nwarehouse = "wh"\n[policy]\ndry_run = false\n{rule}')
    main(["--config", str(config), "doctor", "head"])
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "policy channels" in x]
    assert "FAIL" in line and "smtp_host and mail_domain" in line
    hook = '[policy]\nwebhook_url = "http://chat.example.edu/hook"\n'
    config.write_text(config.read_text().replace("[policy]\n", hook, 1))
    main(["--config", str(config), "doctor", "head"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "policy channels" in x]
    assert "OK" in line and "idle act" in line


@dataclass
class HungScheduler:
    """The local executor, but squeue (its `running`) times out as a stopped slurmctld makes it."""

    inner: object

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def running(self):
        raise CommandError("squeue", TIMEOUT, "squeue --json timed out after 30 s")


def test_a_hung_scheduler_holds_the_cancel_and_is_recorded(world):
    job_id, t0 = world.idle_job()
    postman = FlakyPostman(up=True)
    climb(world, engine(world.wh, real(), world.executor, postman), t0, (0, 31))
    hung = engine(world.wh, real(), HungScheduler(world.executor), postman)
    (decision,) = hung.run(t0 + timedelta(minutes=92)).decisions
    assert decision.action == "cancel"  # due, but the executor cannot say what runs: it waits
    assert world.executor._read(job_id).state == "RUNNING"
    assert ("action", "cancel_intent") not in world.trail(job_id)
    con = world.wh.connect()
    rows = con.sql("SELECT command, reason, actor FROM command_failures").fetchall()
    con.close()
    assert rows == [("squeue", "timeout", "pytest@test")]
