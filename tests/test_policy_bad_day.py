"""A bad day for the policy loop on the real path (issue 27, item 8): everything that can go
wrong around a cancel goes wrong once, and the trail must still show that sing failed closed.

    real Slurm 22.05 on loopback, the project's prolog, one fake-GPU exporter per node,
    `sing collector`, rounds of `sing policy run` as processes (as in test_policy_slurm.py)

Two idle jobs: `wide` spans both nodes, and gpu-2's exporter stops as soon as it runs, so
at most half of its samples exist: under `min_coverage` it must stay `incomplete`, never judged
or messaged. `idle` (one node) goes through the ladder while things break in turn:

1. the SMTP server is down at first: its notice is recorded undelivered (ok false), retried;
2. the server comes up and two `sing policy run` start at once: one waits for the other's
   lock, and the notice goes out once;
3. after the warning, slurmctld is SIGSTOPped past the deadline with `command_timeout_s` = 5:
   rounds then cancel nothing and exit cleanly; the collector's job sync records failures;
4. after SIGCONT a round runs with a `scancel` that sleeps, and is SIGKILLed between its
   `cancel_intent` and scancel; the next rounds reconcile and cancel the job once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.mailbox import Mailbox, smtp_server, webhook_server
from tests.ports import free_port, free_ports
from tests.real_path.processes import Service, wait_for
from tests.real_path.site import (
    IDLE,
    SING,
    Submitter,
    slurm_site,
    start_collector,
    start_exporters,
    write_targets,
)
from tests.real_path.slurm import job_states, slurmctld_stopped
from tests.slurm_harness import NODES, TEST_USER, TEST_USER2, SlurmCluster
from tests.test_policy_slurm import MAIL_DOMAIN, RULE, Loop, mails, now, sacct_state

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

FIRST_JOB_ID = 5813
EXPORTER_PORTS = dict(zip(NODES, free_ports(len(NODES)), strict=True))
MIN_COVERAGE = 0.65  # half a job's GPUs unseen is under it; a late scrape or two is not
GRACE_MIN = 0.5
COMMAND_TIMEOUT_S = 5.0

CONFIG = f"""\
[site]
cluster = "campus"
warehouse = "warehouse"
[executor]
kind = "slurm"
command_timeout_s = {COMMAND_TIMEOUT_S}
[collector]
file_sd = "targets.json"
interval_s = 2.0
scrape_timeout_s = 1.5
job_sync_interval_s = 3.0
maintenance_interval_s = 3600
metrics_port = 0
[policy]
dry_run = false
interval_s = 0
max_data_age_s = 10.0
min_coverage = {MIN_COVERAGE}
smtp_host = "127.0.0.1"
smtp_port = {{smtp_port}}
mail_from = "sing@{MAIL_DOMAIN}"
mail_domain = "{MAIL_DOMAIN}"
admin_emails = ["hpc-admins@{MAIL_DOMAIN}"]
[policy.rules.{RULE}]
kind = "idle_gpus"
actions = ["notify", "warn", "cancel"]
dry_run = false
threshold = 0.05
minutes = 0.5
warn_after_minutes = 0.25
grace_minutes = {GRACE_MIN}
"""

OWNERS = {"wide": TEST_USER, "idle": TEST_USER2}


def profile(name: str, nodes: int) -> str:
    return f"name: {name}\nnodes: {nodes}\ngpus_per_node: 2\nentry: {{commands: 'sleep 3600'}}\n"


@dataclass
class Finished:
    """One `sing policy run` the test started beside others: when, how long, how it ended."""

    started: datetime
    seconds: float
    rc: int
    output: str


@dataclass
class BadDay:
    loop: Loop
    cluster: SlurmCluster
    began: datetime = field(default_factory=now)
    smtp_up: datetime | None = None
    undelivered_rounds: int = 0
    concurrent: list[Finished] = field(default_factory=list)
    stopped_from: datetime | None = None
    stopped_until: datetime | None = None
    stopped_rounds: list[Finished] = field(default_factory=list)
    killed_at: datetime | None = None
    killed_output: str = ""
    state: str = ""  # sacct State of `idle` at the end

    def events(self) -> list[dict[str, Any]]:
        """The whole trail of both jobs, oldest first."""
        return [e | {"key": key} for key in OWNERS for e in self.loop.trail(key)]


def policy_round(loop: Loop, log: Path, env: dict[str, str] | None = None) -> Service:
    """A `sing policy run` in the background, its output in `log`."""
    return Service([SING, "--config", str(loop.config), "policy", "run"], log, env or loop.env)


def finish(services: list[Service], started: datetime, timeout: float = 180) -> list[Finished]:
    """Wait for rounds started together at `started`; each with its own running time."""
    ended: dict[int, Finished] = {}

    def all_ended() -> bool:
        for i, service in enumerate(services):
            if i not in ended and not service.alive():
                seconds = (now() - started).total_seconds()
                ended[i] = Finished(started, seconds, service.process.returncode, service.tail())
        return len(ended) == len(services)

    wait_for(all_ended, "the policy rounds to end", timeout)
    return [ended[i] for i in range(len(services))]


def recorded(finished: Finished) -> int:
    """How many events the round says it recorded (`sing policy run`'s last line)."""
    return int(re.search(r"(\d+) event\(s\) recorded", finished.output).group(1))


def owner(key: str) -> str:
    return f"{OWNERS[key]}@{MAIL_DOMAIN}"


def delivered(loop: Loop, key: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in loop.trail(key, "message")
            if e["outcome"] == kind and e["ok"] and e["recipient"] == owner(key)]  # fmt: skip


@pytest.fixture(scope="module")
def day(request: pytest.FixtureRequest) -> Iterator[BadDay]:
    with slurm_site(request, "sing-bad-day-", "bad day", FIRST_JOB_ID) as (cluster, base, stack):
        mailbox = Mailbox(free_port())  # no server on it yet: the SMTP server is down
        webhook = stack.enter_context(webhook_server())  # not configured: email is the channel
        env = {**cluster.env, "TZ": "UTC"}
        loop = Loop(base, base / "sing.toml", env, mailbox, webhook)
        yield _play(BadDay(loop, cluster), stack)


def _play(day: BadDay, stack: contextlib.ExitStack) -> BadDay:
    loop, cluster, base = day.loop, day.cluster, day.loop.base
    loop.config.write_text(CONFIG.format(smtp_port=loop.mailbox.port))
    exporters = start_exporters(cluster, base, loop.env, EXPORTER_PORTS, lambda n, g: IDLE, stack)
    write_targets(base, EXPORTER_PORTS)
    collector = start_collector(loop.config, base, loop.env)
    stack.callback(collector.stop)
    services = [*exporters, collector]
    submitter = Submitter(cluster, loop.config, base, loop.env)
    loop.ids["wide"] = submitter.submit(TEST_USER, "wide", profile("wide", 2), 2, services)
    loop.ids["idle"] = submitter.submit(TEST_USER2, "idle", profile("idle", 1), 1, services)
    # gpu-2's exporter goes: `wide` has half its GPUs' samples at most from now on.
    exporters[1].stop()
    services = [exporters[0], collector]
    loop.wait_for_running(services)

    def rounds_until(check: Any, what: str, timeout: float) -> None:
        loop.rounds_until(check, what, timeout, services)

    # 1. SMTP down: the notice is recorded undelivered, and tried again next rounds.
    def undelivered() -> int:
        return sum(1 for e in loop.trail("idle", "message") if e["outcome"] == "notify"
                   and e["recipient"] == owner("idle") and not e["ok"])  # fmt: skip

    rounds_until(lambda: undelivered() >= 2, "two undelivered notices", 150)
    day.undelivered_rounds = undelivered()

    # 2. SMTP up, and two rounds at once: one sends the notice, the other finds it sent.
    stack.enter_context(smtp_server(box=loop.mailbox))
    day.smtp_up = now()
    pair = [policy_round(loop, base / f"round-concurrent-{i}.log") for i in range(2)]
    day.concurrent = finish(pair, day.smtp_up)
    rounds_until(lambda: delivered(loop, "idle", "warn"), "the warning, delivered", 90)

    # 3. slurmctld stopped until past the deadline: rounds that would cancel cannot see Slurm.
    deadline = delivered(loop, "idle", "warn")[0]["deadline"]
    day.stopped_from = now()
    with slurmctld_stopped(cluster):
        # Rounds until two of them started past the deadline, each with a cancel due.
        while sum(f.started > deadline for f in day.stopped_rounds) < 2:
            started = now()
            service = policy_round(loop, base / f"round-stopped-{len(day.stopped_rounds)}.log")
            day.stopped_rounds += finish([service], started)
        wait_for(
            lambda: loop.sql(
                "SELECT count(*) FROM command_failures WHERE ts >= ?", [day.stopped_from]
            )[0][0],  # fmt: skip
            "the collector to record its failed job syncs",
            60,
            services,
        )
    day.stopped_until = now()
    wait_for(lambda: loop.ids["idle"] in job_states(loop.env), "slurmctld to answer again", 60)

    # 4. A round killed while its scancel hangs: the intent is on record, the act is not.
    slow = base / "slow-bin"
    slow.mkdir()
    (slow / "scancel").write_text(f'#!/bin/sh\nsleep 120\nexec {shutil.which("scancel")} "$@"\n')
    (slow / "scancel").chmod(0o755)
    slow_env = {**loop.env, "PATH": f"{slow}:{loop.env['PATH']}"}

    def intents() -> int:
        return len([e for e in loop.trail("idle", "action") if e["outcome"] == "cancel_intent"])

    deadline_kill = time.monotonic() + 120
    while not intents():
        assert time.monotonic() < deadline_kill, "no round recorded a cancel intent"
        service = policy_round(loop, base / "round-killed.log", slow_env)
        wait_for(lambda s=service: intents() or not s.alive(), "a cancel intent", 60, services)
        loop.rounds += 1
    time.sleep(1.0)  # scancel's wrapper is asleep by now
    assert service.alive(), service.tail()
    os.killpg(service.process.pid, signal.SIGKILL)
    service.process.wait(10)
    day.killed_at, day.killed_output = now(), service.tail()

    def cancelled() -> bool:
        return any(e["outcome"] == "cancel" and e["ok"] for e in loop.trail("idle", "action"))

    rounds_until(cancelled, "the reconciled cancel", 90)
    wait_for(lambda: loop.ids["idle"] not in job_states(loop.env), "scancel to end `idle`", 60)
    rounds_until(lambda: delivered(loop, "idle", "cancelled"), "the cancel notice", 90)
    day.state = sacct_state(loop.ids["idle"], loop.env)
    return day


# ---- the job seen by halves ----------------------------------------------------------------


def test_half_covered_job_is_incomplete_never_judged_nor_messaged(day: BadDay) -> None:
    verdicts = day.loop.outcomes("wide", "evaluation")
    assert "incomplete" in verdicts and set(verdicts) <= {"incomplete", "stale"}, verdicts
    assert day.loop.trail("wide", "message") == day.loop.trail("wide", "action") == []
    assert job_states(day.loop.env).get(day.loop.ids["wide"]) == "RUNNING"


# ---- the mail server down, then two rounds at once -----------------------------------------


def test_undelivered_notices_are_recorded_failed_then_retried(day: BadDay) -> None:
    notices = [e for e in day.loop.trail("idle", "message")
               if e["outcome"] == "notify" and e["recipient"] == owner("idle")]  # fmt: skip
    failed, ok = [e for e in notices if not e["ok"]], [e for e in notices if e["ok"]]
    assert len(failed) >= 2 and all(e["ts"] < day.smtp_up for e in failed), failed
    assert len(ok) == 1 and ok[0]["ts"] > day.smtp_up, ok


def test_no_deadline_starts_before_the_owner_had_the_notice(day: BadDay) -> None:
    (notice,) = delivered(day.loop, "idle", "notify")
    warnings = [e for e in day.loop.trail("idle", "message") if e["outcome"] == "warn"]
    assert warnings and all(e["ts"] > notice["ts"] for e in warnings), warnings
    (warning,) = delivered(day.loop, "idle", "warn")
    assert warning["deadline"] - warning["ts"] >= timedelta(minutes=GRACE_MIN)


def test_two_rounds_at_once_both_finish_and_one_waited(day: BadDay) -> None:
    assert [f.rc for f in day.concurrent] == [0, 0], [f.output for f in day.concurrent]
    assert not any("Traceback" in f.output for f in day.concurrent)
    # The lock put them one after the other: the second found the notice sent, nothing to do.
    assert sorted(map(recorded, day.concurrent))[0] == 0, [f.output for f in day.concurrent]
    # The notice they both found due went out once (asserted over the trail below).
    received = mails(day.loop, owner("idle"), day.loop.ids["idle"])
    assert len(received) == 3, [m["Subject"] for m in received]  # notify, warn, cancelled


# ---- slurmctld stopped ---------------------------------------------------------------------


def test_rounds_while_slurmctld_is_stopped_cancel_nothing_and_exit_cleanly(day: BadDay) -> None:
    assert day.stopped_rounds
    for finished in day.stopped_rounds:
        assert finished.rc == 0 and "Traceback" not in finished.output, finished.output
    acts = [e for e in day.events() if e["event"] == "action"
            and day.stopped_from <= e["ts"] <= day.stopped_until]  # fmt: skip
    assert acts == [], acts
    # Those past the deadline had a cancel due, and said why they did not act.
    deadline = delivered(day.loop, "idle", "warn")[0]["deadline"]
    due = [f for f in day.stopped_rounds if f.started > deadline]
    assert len(due) == 2 and all("cancels wait" in f.output for f in due), due


def test_job_sync_failures_are_counted_while_slurmctld_is_stopped(day: BadDay) -> None:
    rows = day.loop.sql(
        "SELECT count(*) FROM command_failures WHERE ts BETWEEN ? AND ?",
        [day.stopped_from, day.stopped_until + timedelta(seconds=COMMAND_TIMEOUT_S)],
    )
    assert rows[0][0] >= 1


# ---- the round killed between intent and scancel -------------------------------------------


def test_killed_round_is_reconciled_and_the_job_cancelled_once(day: BadDay) -> None:
    actions = day.loop.trail("idle", "action")
    first_intent = next(e for e in actions if e["outcome"] == "cancel_intent")
    assert first_intent["ts"] < day.killed_at
    after = [(e["outcome"], e["ok"]) for e in actions if e["ts"] > first_intent["ts"]]
    # Reconciled: still running as the same run, so that cancel is recorded failed, then done.
    assert after[0] == ("cancel", False), after
    assert [a for a in after if a == ("cancel", True)] == [("cancel", True)], after
    assert day.state.startswith("CANCELLED"), day.state


# ---- over the whole trail ------------------------------------------------------------------


def test_every_cancel_has_an_intent_and_a_delivered_warning_before_it(day: BadDay) -> None:
    for key in OWNERS:
        actions = day.loop.trail(key, "action")
        for cancel in [e for e in actions if e["outcome"] == "cancel" and e["ok"]]:
            intents = [e for e in actions
                       if e["outcome"] == "cancel_intent" and e["ts"] <= cancel["ts"]]  # fmt: skip
            assert intents, actions
            warned = [e for e in delivered(day.loop, key, "warn") if e["ts"] < intents[-1]["ts"]]
            assert warned, day.loop.trail(key, "message")


def test_no_verdict_but_incomplete_or_stale_under_min_coverage(day: BadDay) -> None:
    for event in [e for e in day.events() if e["event"] == "evaluation"]:
        detail = event["detail"]
        detail = json.loads(detail) if isinstance(detail, str) else detail or {}
        coverage = detail.get("coverage")
        if coverage is not None and coverage < MIN_COVERAGE:
            assert event["outcome"] in ("incomplete", "stale"), event


def test_no_message_delivered_twice(day: BadDay) -> None:
    sent = [(e["key"], e["outcome"], e["recipient"]) for e in day.events()
            if e["event"] == "message" and e["ok"]]  # fmt: skip
    assert len(sent) == len(set(sent)), sent
    emails = [
        (rcpt, r.message["Subject"]) for r in day.loop.mailbox.received for rcpt in r.rcpt_tos
    ]
    assert len(emails) == len(set(emails)), emails


def test_figures(day: BadDay) -> None:
    """The measured figures of the day (shown with `pytest -s`)."""
    deadline = delivered(day.loop, "idle", "warn")[0]["deadline"]
    due = [f"{f.seconds:.1f}" for f in day.stopped_rounds if f.started > deadline]
    others = [f"{f.seconds:.1f}" for f in day.stopped_rounds if f.started <= deadline]
    rounds = day.loop.rounds + len(day.concurrent) + len(day.stopped_rounds)
    print(
        f"\nbad day: {(now() - day.began).total_seconds():.0f} s, {rounds} policy rounds "
        f"(each a process); {day.undelivered_rounds} undelivered notices while SMTP was down; "
        f"two rounds at once took {[f'{f.seconds:.1f}' for f in day.concurrent]} s; "
        f"slurmctld stopped {(day.stopped_until - day.stopped_from).total_seconds():.1f} s: "
        f"{len(others)} rounds before the deadline ({', '.join(others)} s), "
        f"{len(due)} with a cancel due ({', '.join(due)} s; command_timeout_s "
        f"{COMMAND_TIMEOUT_S:.0f})"
    )
    assert rounds >= 10
