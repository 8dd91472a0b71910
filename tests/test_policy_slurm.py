"""The policy loop on the real path: an idle job is warned, then cancelled by `scancel` on a real
Slurm after its grace period; an exempt job and a job that recovers are left alone.

    real Slurm 22.05 on loopback (tests/slurm_harness.py), the project's prolog mapping GPUs
      -> one `python -m sing.exporters` per node, fake NVML scripted to known utilisation
      -> `sing collector` (file_sd targets, job sync through squeue/sacct)
      -> `sing policy run`, one round per process, as cron or a timer would start it
      -> email through a real SMTP server on loopback (aiosmtpd), `scancel`, `sacct`.

Four 2-GPU jobs, each on gpu-1 where Slurm's first fit puts them (checked): `idle` never uses
its GPUs; `notebook` idles too but its name is exempt; `recover` idles until it has been warned,
then the test scripts its GPUs busy before its deadline; `busy` works all along. The rule
judges a sliding window of 15 s and warns 15 s after its notice with a 90 s grace: long enough
that the test can show, before the idle job's deadline, that the recovered job is left alone.

Every round is its own process, so the ladder's memory is only what the audit trail holds: that
no message repeats and no deadline moves across ~30 of them is the restart test. Mid-ladder, the
exporters stop: once the idle job's deadline has passed on data older than `max_data_age_s`, the
rounds find it stale and wait; the cancellation comes only after the exporters are back.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from sing.warehouse.audit import ROUND_ORDER
from sing.warehouse.store import Warehouse
from tests.mailbox import Mailbox, Webhook, smtp_server, webhook_server
from tests.ports import free_ports
from tests.real_path.processes import Service, run, wait_for
from tests.real_path.site import (
    IDLE,
    SING,
    Submitter,
    Use,
    script_state,
    scripted_use,
    slurm_site,
    start_collector,
    start_exporters,
    up_scrapes,
    write_targets,
)
from tests.real_path.slurm import Allocation, gpu_allocation, job_states
from tests.slurm_harness import NODES, TEST_USER, TEST_USER2, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

SITE_CLUSTER = "campus"
MAIL_DOMAIN = "campus.edu"
ADMIN_EMAIL = "hpc-admins@campus.edu"
FIRST_JOB_ID = 4711  # ids no date or figure in a message could contain by chance
EXPORTER_PORTS = dict(zip(NODES, free_ports(len(NODES)), strict=True))
RULE = "idle-gpus"
WINDOW_MIN = 0.25  # the rule's sliding window, and how long a job runs before it is judged
WARN_AFTER_MIN = 0.25
GRACE_MIN = 1.5
MAX_DATA_AGE_S = 10.0
BUSY = Use(util=0.9, sm_active=0.7, power_w=300.0, memory_used=40 * 10**9)

CONFIG = f"""\
[site]
cluster = "{SITE_CLUSTER}"
warehouse = "warehouse"
[executor]
kind = "slurm"
[collector]
file_sd = "targets.json"
interval_s = 2.0
scrape_timeout_s = 1.5
job_sync_interval_s = 3.0
maintenance_interval_s = 3600
metrics_port = 0
[policy]
dry_run = false
interval_s = 0  # the test starts every round itself
max_data_age_s = {MAX_DATA_AGE_S}
# A 15 s window holds 7 scrapes 2 s apart; on a loaded 2-core box a round or two slips, so
# the test asks for half of them (a site's hour-long windows lose no share to one late round).
min_coverage = 0.5
smtp_host = "127.0.0.1"
smtp_port = {{smtp_port}}
webhook_url = "{{webhook_url}}"
mail_from = "sing@{MAIL_DOMAIN}"
mail_domain = "{MAIL_DOMAIN}"
admin_emails = ["{ADMIN_EMAIL}"]
[policy.rules.{RULE}]
kind = "idle_gpus"
actions = ["notify", "warn", "cancel"]
dry_run = false
threshold = 0.05
minutes = {WINDOW_MIN}
warn_after_minutes = {WARN_AFTER_MIN}
grace_minutes = {GRACE_MIN}
exempt_names = ["notebook-*"]
"""


@dataclass(frozen=True)
class JobSpec:
    key: str
    name: str
    user: str
    use: Use  # of each of its GPUs until the test rescripts them
    placement: Allocation  # where Slurm's first fit puts it (checked, then relied on)


# `idle` and `recover` belong to different users: a user hears about one job per rule and day.
JOBS = (
    JobSpec("idle", "train-idle", TEST_USER, IDLE, {"gpu-1": [0, 1]}),
    JobSpec("notebook", "notebook-lab", TEST_USER2, IDLE, {"gpu-1": [2, 3]}),
    JobSpec("recover", "train-recover", TEST_USER2, IDLE, {"gpu-1": [4, 5]}),
    JobSpec("busy", "train-busy", TEST_USER, BUSY, {"gpu-1": [6, 7]}),
)
BY_KEY = {spec.key: spec for spec in JOBS}


def use_of(node: str, gpu: int) -> Use:
    return scripted_use(JOBS, node, gpu)


def profile(spec: JobSpec) -> str:
    return f"name: {spec.name}\nnodes: 1\ngpus_per_node: 2\nentry: {{commands: 'sleep 3600'}}\n"


def mails(loop: Loop, recipient: str, job_id: str) -> list[EmailMessage]:
    """The emails the SMTP server took for `recipient` that name job `job_id`, in order."""
    return [r.message for r in loop.mailbox.received
            if recipient in r.rcpt_tos and job_id in body(r.message)]  # fmt: skip


def posts(loop: Loop, job_id: str) -> list[str]:
    """The chat webhook's messages that name job `job_id`, in order."""
    return [p["text"] for p in loop.webhook.posts if job_id in p["text"]]


def body(message: EmailMessage) -> str:
    """The subject and the plain-text part, where a reader sees the job and the command."""
    part = message.get_body(preferencelist=("plain",)) or message
    return f"{message['Subject']}\n{part.get_content()}"


@dataclass
class Loop:
    """What the scenario did, and what it saw along the way."""

    base: Path
    config: Path
    env: dict[str, str]
    mailbox: Mailbox
    webhook: Webhook
    ids: dict[str, str] = field(default_factory=dict)  # job key -> Slurm job id
    allocation: dict[str, Allocation] = field(default_factory=dict)
    rounds: int = 0
    recovered_at: datetime | None = None  # when the test scripted `recover` busy
    exporters_stopped: datetime | None = None
    stale_rounds: list[datetime] = field(default_factory=list)  # past the deadline, data stale
    running_while_stale: dict[str, str] = field(default_factory=dict)  # squeue then
    exporters_restarted: datetime | None = None
    states: dict[str, str] = field(default_factory=dict)  # sacct State at the end

    def sql(self, query: str, params: list | dict | None = None) -> list[tuple]:
        con = Warehouse(self.base / "warehouse").connect()
        try:
            return con.execute(query, params or []).fetchall()
        finally:
            con.close()

    def sing(self, *args: str) -> str:
        return run([SING, "--config", str(self.config), *args], self.env)

    def round(self) -> None:
        """One `sing policy run`: a fresh process reading the ladder back from the trail."""
        self.sing("policy", "run")
        self.rounds += 1

    def trail(self, key: str, event: str | None = None) -> list[dict[str, Any]]:
        """The job's policy_events, oldest first."""
        rows = self.sql(
            "SELECT ts, event, outcome, deadline, channel, recipient, dry_run, ok, actor, detail "
            "FROM policy_events WHERE job_id = ? AND rule = ? AND (? IS NULL OR event = ?) "
            f"ORDER BY ts, {ROUND_ORDER}",
            [self.ids[key], RULE, event, event],
        )
        names = ("ts", "event", "outcome", "deadline", "channel", "recipient", "dry_run", "ok",
                 "actor", "detail")  # fmt: skip
        return [dict(zip(names, row, strict=True)) for row in rows]

    def outcomes(self, key: str, event: str) -> list[str]:
        return [e["outcome"] for e in self.trail(key, event)]

    def deadline(self, key: str) -> datetime | None:
        warns = [e for e in self.trail(key, "message") if e["outcome"] == "warn" and e["ok"]]
        return warns[0]["deadline"] if warns else None

    def wait_for_running(self, services: list) -> None:
        """Until the collector's job sync has recorded every submitted job as running."""
        ids = sorted(self.ids.values())
        wait_for(
            lambda: self.sql(
                "SELECT count(DISTINCT job_id) FROM jobs WHERE list_contains(?, job_id) "
                "AND start_time IS NOT NULL AND end_time IS NULL",
                [ids],
            )[0][0] == len(ids),
            "the collector's job sync to record the running jobs",
            60,
            services,
        )  # fmt: skip

    def rounds_until(self, check: Any, what: str, timeout: float, services: list) -> None:
        """Policy rounds, one after another, until `check()` holds."""
        wait_for(lambda: self.round() or check(), what, timeout, services)


def now() -> datetime:
    return datetime.now(UTC)


def user_email(key: str) -> str:
    return f"{BY_KEY[key].user}@{MAIL_DOMAIN}"


def sacct_state(job_id: str, env: dict[str, str]) -> str:
    return run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], env).strip()


@pytest.fixture(scope="module")
def loop(request: pytest.FixtureRequest) -> Iterator[Loop]:
    """The whole scenario, once for the module; every process it starts is stopped after it.

    The scratch directory (logs of every process, the warehouse) is kept when a test of the
    module failed, its path given in a warning; MariaDB's files are removed either way.
    """
    with slurm_site(request, "sing-policy-", "policy loop", FIRST_JOB_ID) as (cluster, base, stack):
        mailbox = stack.enter_context(smtp_server())
        webhook = stack.enter_context(webhook_server())
        env = {**cluster.env, "TZ": "UTC"}
        yield _play(cluster, Loop(base, base / "sing.toml", env, mailbox, webhook), stack)


def _start_exporters(
    cluster: SlurmCluster, loop: Loop, stack: contextlib.ExitStack
) -> list[Service]:
    return start_exporters(cluster, loop.base, loop.env, EXPORTER_PORTS, use_of, stack)


def _play(cluster: SlurmCluster, loop: Loop, stack: contextlib.ExitStack) -> Loop:
    """Nodes, collector, jobs, then policy rounds through each step of the ladder."""
    base, config = loop.base, loop.config
    config.write_text(CONFIG.format(smtp_port=loop.mailbox.port, webhook_url=loop.webhook.url))
    exporters = _start_exporters(cluster, loop, stack)
    write_targets(base, EXPORTER_PORTS)
    started = now()
    collector = start_collector(config, base, loop.env)
    stack.callback(collector.stop)
    services = [*exporters, collector]
    warehouse = base / "warehouse"
    wait_for(lambda: up_scrapes(warehouse, started) >= 1, "both nodes scraped", 90, services)

    _submit(cluster, loop, services)
    loop.wait_for_running(services)

    def rounds_until(check: Any, what: str, timeout: float) -> None:
        loop.rounds_until(check, what, timeout, services)

    # notify, then warn 15 s later: both idle jobs reach their deadline's countdown.
    rounds_until(lambda: loop.deadline("idle") and loop.deadline("recover"), "two warnings", 150)

    # `recover` gets to work before its deadline and is left alone.
    busy = {str(gpu): BUSY.fields() for gpu in BY_KEY["recover"].placement["gpu-1"]}
    script_state(base / "fake-state.json", {"gpu-1": busy})
    loop.recovered_at = now()
    rounds_until(lambda: "left_alone" in loop.outcomes("recover", "action"), "recovery", 60)

    # The exporters stop before the idle job's deadline; past it, on stale data, rounds wait.
    deadline = loop.deadline("idle")
    assert now() + timedelta(seconds=MAX_DATA_AGE_S + 5) < deadline, (
        "the recovery took most of the grace (a premise of this test): lengthen GRACE_MIN"
    )
    for service in exporters:
        service.stop()
    loop.exporters_stopped = now()
    services = [collector]
    wait_for(lambda: not any(s.alive() for s in exporters), "the exporters to stop", 30)
    stale_from = max(deadline, loop.exporters_stopped + timedelta(seconds=MAX_DATA_AGE_S))
    rounds_until(lambda: now() > stale_from + timedelta(seconds=1), "the data to go stale", 240)
    for _ in range(2):
        loop.stale_rounds.append(now())
        loop.round()
    loop.running_while_stale = job_states(loop.env)

    # Fresh data again: the deadline is long past, so the next fresh round cancels.
    loop.exporters_restarted = now()
    exporters = _start_exporters(cluster, loop, stack)
    services = [*exporters, collector]
    back = loop.exporters_restarted
    wait_for(lambda: up_scrapes(warehouse, back) >= 2, "scrapes after the restart", 60, services)
    rounds_until(lambda: "cancel" in loop.outcomes("idle", "action"), "the cancellation", 60)
    idle = loop.ids["idle"]
    wait_for(lambda: idle not in job_states(loop.env), "scancel to end the idle job", 60)
    rounds_until(lambda: "cancelled" in loop.outcomes("idle", "message"), "the notice", 60)
    loop.states = {key: sacct_state(job_id, loop.env) for key, job_id in loop.ids.items()}
    return loop


def _submit(cluster: SlurmCluster, loop: Loop, services: list[Service]) -> None:
    """Each job as its user; each runs (prolog done) before the next, so first fit places it."""
    submitter = Submitter(cluster, loop.config, loop.base, loop.env)
    for spec in JOBS:
        loop.ids[spec.key] = submitter.submit(spec.user, spec.key, profile(spec), 1, services)
    loop.allocation = {key: gpu_allocation(job_id, loop.env) for key, job_id in loop.ids.items()}
    assert loop.allocation == {s.key: s.placement for s in JOBS}, (
        "Slurm placed the jobs other than the script assumes (a premise of this test, not a "
        f"product failure): {loop.allocation}"
    )


# ---- the idle job --------------------------------------------------------------------------


def test_idle_job_is_notified_warned_then_cancelled_by_scancel(loop: Loop) -> None:
    messages = [e for e in loop.trail("idle", "message") if e["recipient"] == user_email("idle")]
    assert [e["outcome"] for e in messages] == ["notify", "warn", "cancelled"]
    assert all(e["ok"] and not e["dry_run"] and e["channel"] == "email" for e in messages)
    # The intent is on record before scancel runs, the outcome after it.
    intent, cancel = loop.trail("idle", "action")
    assert intent["outcome"] == "cancel_intent" and intent["ts"] <= cancel["ts"]
    assert (cancel["outcome"], cancel["ok"], cancel["dry_run"]) == ("cancel", True, False)
    assert cancel["actor"].startswith("sing policy run@")
    # After the grace: no sooner than the deadline the warning set, grace after the warning.
    warned = messages[1]
    assert warned["deadline"] - warned["ts"] >= timedelta(minutes=GRACE_MIN)
    assert cancel["ts"] >= warned["deadline"]
    assert loop.states["idle"].startswith("CANCELLED"), loop.states


def test_emails_reach_the_user_with_the_scancel_command(loop: Loop) -> None:
    job_id = loop.ids["idle"]
    received = mails(loop, user_email("idle"), job_id)
    assert len(received) == 3, [m["Subject"] for m in received]  # notify, warn, cancelled
    notice, warning, _cancelled = received
    for message in (notice, warning):
        assert f"scancel {job_id}" in body(message), body(message)
        assert message["From"] == f"sing@{MAIL_DOMAIN}"
    # The admins are copied on the warning and the cancellation, not on a first notice.
    assert [m["Subject"] for m in mails(loop, ADMIN_EMAIL, job_id)] == [
        warning["Subject"], _cancelled["Subject"],
    ]  # fmt: skip


def test_chat_webhook_gets_each_step_once_with_the_scancel_command(loop: Loop) -> None:
    job_id = loop.ids["idle"]
    texts = posts(loop, job_id)
    assert len(texts) == 3, texts  # notify, warn, cancelled
    assert f"scancel {job_id}" in texts[1]
    assert posts(loop, loop.ids["notebook"]) == posts(loop, loop.ids["busy"]) == []


# ---- the jobs left alone -------------------------------------------------------------------


def test_exempt_job_is_never_messaged_and_still_runs(loop: Loop) -> None:
    assert loop.outcomes("notebook", "evaluation") == ["exempt"]
    assert loop.trail("notebook", "message") == loop.trail("notebook", "action") == []
    assert mails(loop, user_email("notebook"), loop.ids["notebook"]) == []
    assert loop.states["notebook"] == "RUNNING"


def test_job_that_recovers_before_its_deadline_is_left_alone(loop: Loop) -> None:
    evaluations = loop.outcomes("recover", "evaluation")
    assert evaluations[:2] == ["violating", "recovered"], evaluations
    messages = [e["outcome"] for e in loop.trail("recover", "message")
                if e["recipient"] == user_email("recover")]  # fmt: skip
    assert messages == ["notify", "warn"]
    assert loop.outcomes("recover", "action") == ["left_alone"]
    (left,) = loop.trail("recover", "action")
    assert loop.recovered_at < left["ts"] < loop.deadline("recover")
    assert loop.states["recover"] == "RUNNING"
    assert len(mails(loop, user_email("recover"), loop.ids["recover"])) == 2


def test_busy_job_is_never_judged_idle(loop: Loop) -> None:
    # Its only verdicts on record: stale while the exporters were down, and incomplete while
    # the window after their return held too few samples; never violating.
    assert set(loop.outcomes("busy", "evaluation")) <= {"stale", "incomplete"}
    assert loop.trail("busy", "message") == loop.trail("busy", "action") == []
    assert loop.states["busy"] == "RUNNING"


# ---- restarts and stale data ---------------------------------------------------------------


def test_rounds_in_fresh_processes_neither_repeat_a_message_nor_move_a_deadline(
    loop: Loop,
) -> None:
    assert loop.rounds >= 10  # every one a new process that read the ladder from the trail
    for key in ("idle", "recover"):
        sent = [(e["outcome"], e["recipient"]) for e in loop.trail(key, "message")]
        assert len(sent) == len(set(sent)), sent
        warns = [e for e in loop.trail(key, "message") if e["outcome"] == "warn"]
        assert len({e["deadline"] for e in warns}) == 1, warns
    kinds = [m["Subject"] for m in mails(loop, user_email("idle"), loop.ids["idle"])]
    assert len(kinds) == len(set(kinds)), kinds


def test_stale_data_makes_the_rule_wait(loop: Loop) -> None:
    idle = loop.ids["idle"]
    assert loop.running_while_stale.get(idle) == "RUNNING"
    deadline = loop.deadline("idle")
    assert all(ts > deadline for ts in loop.stale_rounds)
    stale = [e for e in loop.trail("idle", "evaluation") if e["outcome"] == "stale"]
    assert stale and loop.exporters_stopped < stale[0]["ts"] < loop.exporters_restarted
    _, cancel = loop.trail("idle", "action")
    assert cancel["ts"] > loop.exporters_restarted


def test_policy_log_json_shows_the_trail(loop: Loop) -> None:
    rows = json.loads(loop.sing("policy", "log", "--json"))
    rows = rows["rows"] if isinstance(rows, dict) else rows
    idle = [r for r in rows if r["job_id"] == loop.ids["idle"]]
    seen = {(r["event"], r["outcome"]) for r in idle}
    expected = {("evaluation", "violating"), ("evaluation", "stale"), ("message", "notify"),
                ("message", "warn"), ("action", "cancel"), ("message", "cancelled")}  # fmt: skip
    assert expected <= seen, seen
    assert {r["job_id"] for r in rows} >= {loop.ids[k] for k in ("idle", "notebook", "recover")}
    busy = {r["outcome"] for r in rows if r["job_id"] == loop.ids["busy"]}
    assert busy <= {"stale", "incomplete"}, busy
