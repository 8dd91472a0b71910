"""One policy round: evaluate every rule, decide each ladder's step, send, cancel, record.

Everything a round decided lands in the audit trail in one commit, dry run or not, so `sing
policy log` shows what happened (or would have). Before a cancellation the executor is asked
whether the job still runs as the same run (same start time): the warehouse can lag behind it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb

from sing.collector.service import record_command_failure
from sing.errors import UserError
from sing.executors.base import Executor
from sing.executors.records import JobRecord
from sing.executors.slurm import SlurmExecutor
from sing.gcpause import cyclic_gc_paused
from sing.policy.breaker import BLOCKED, Breaker
from sing.policy.evaluate import DataNeeds, Evaluator, open_round
from sing.policy.ladder import (
    CANCEL,
    CANCEL_INTENT,
    CHANGED,
    ENDED,
    HELD,
    LEFT_ALONE,
    QUIET_HOURS,
    RECONCILE,
    Decision,
    Ladder,
    QuietHours,
    load_episodes,
    load_last_sent,
    same_start,
)
from sing.policy.messages import CANCELLED, NO_CHANNEL, NOTIFY, WARN, Message, Postman
from sing.policy.rules import load_rules
from sing.policy.settings import PolicySettings
from sing.warehouse.audit import ACTION, EVALUATION, MESSAGE, Event, record
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)

# The job's fields a message's `job` context carries (a subset of
# sing.warehouse.analytics.job_usage).
JOB_FIELDS = (
    "job_id",
    "name",
    "user",
    "account",
    "partition",
    "qos",
    "num_nodes",
    "num_gpus",
    "start_time",
    "run_s",
)
FIGURES = ("mean_util", "gpus_never_used", "rdma_bytes_per_node_hour")


@dataclass
class Round:
    """What one round decided, and the trail rows it wrote (none for `check`)."""

    decisions: list[Decision]
    events: list[Event]


class Engine:
    def __init__(
        self,
        settings: PolicySettings,
        warehouse: Warehouse,
        executor: Executor,
        postman: Postman,
        actor: str,
        sample_interval_s: float,
    ) -> None:
        self.settings = settings
        self.needs = DataNeeds(settings.max_data_age_s, settings.min_coverage, sample_interval_s)
        self.rules = load_rules(settings)
        self.warehouse = warehouse
        self.executor = executor
        self.postman = postman
        self.actor = actor
        self.quiet = QuietHours(settings.quiet_hours, settings.zone)

    def decide(self, now: datetime | None = None, fine_jobs: bool = True) -> list[Decision]:
        """Every (job, rule) step this round would take; nothing is sent, done or recorded.
        Without `fine_jobs`, a job a rule finds fine gets a decision only when the trail
        remembers the pair (a ladder to end, a verdict to change): what a round needs."""
        with cyclic_gc_paused():
            return self._decide(now or datetime.now(UTC), fine_jobs)

    def _decide(self, now: datetime, fine_jobs: bool) -> list[Decision]:
        period = timedelta(seconds=self.settings.user_message_period_s)
        con = open_round(self.warehouse, self.rules, now, (now - period).date())
        try:
            episodes, last_sent = load_episodes(con), load_last_sent(con, now - period)
            ladder = Ladder(self.settings, self.quiet, episodes, last_sent, now)
            decisions = []
            running: set[tuple[str, str, str]] = set()
            evaluator = Evaluator(con, now, self.needs, self.rules)
            for rule in self.rules:
                for verdict in evaluator.verdicts(rule, remembered_only=not fine_jobs):
                    running.add(verdict.key)
                    decisions.append(ladder.decide(verdict))
            decisions += self._gone(con, ladder, running)
            return decisions
        finally:
            con.close()

    def run(self, now: datetime | None = None) -> Round:
        """One round: decide, then send, cancel and record every outcome in one commit (a
        cancel's intent goes first, in a commit of its own). Jobs that are fine and that the
        trail does not remember are left out: nothing to do. One round at a time per warehouse:
        a second runner waits for the first (`round_lock`)."""
        now = now or datetime.now(UTC)
        with round_lock(self.warehouse), cyclic_gc_paused():
            decisions = self.decide(now, fine_jobs=False)
            acting = any(d.action in (CANCEL, RECONCILE) for d in decisions)
            live = self._live() if acting else None
            # The breaker reads the whole trail: only a round with a real cancel due needs it.
            cluster, limit = self.executor.cluster, self.settings.max_cancels_per_hour
            due = any(d.action == CANCEL and not d.dry_run for d in decisions)
            self.breaker = (
                Breaker.load(self.warehouse, cluster, now, self.settings)
                if due
                else Breaker(cluster, now, limit, recent_cancels=0)
            )
            events = [e for d in decisions for e in self._act(d, now, live)]
            events += self.breaker.events(self.actor, self.postman)
            record(self.warehouse, events)
        return Round(decisions, events)

    def _gone(
        self, con: duckdb.DuckDBPyConnection, ladder: Ladder, running: set[tuple[str, str, str]]
    ) -> list[Decision]:
        """Decisions for open episodes whose job no longer runs (ended, or requeued)."""
        rules = {r.name: r for r in self.rules}
        open_keys = [
            (key, dry)
            for key, dry in ladder.open_episodes()
            if key not in running
            and key[2] in rules
            and dry == (not rules[key[2]].acts(self.settings))
        ]
        ids = sorted({key[1] for key, _ in open_keys})
        found = con.sql("FROM jobs WHERE list_contains($ids, job_id)", params={"ids": ids})
        jobs = {(j["cluster"], j["job_id"]): j for j in found.to_arrow_table().to_pylist()}
        out = []
        for key, dry in open_keys:
            job = jobs.get(key[:2], {"cluster": key[0], "job_id": key[1]})
            out.append(ladder.decide_gone(key, dry, rules[key[2]], job))
        return out

    # ---- acting --------------------------------------------------------------------------

    def _live(self) -> dict[str, JobRecord] | None:
        """The jobs the executor runs now, by id; None when it cannot say (cancels wait)."""
        try:
            return {r.job_id: r for r in self.executor.running()}
        except Exception as err:  # noqa: BLE001 - squeue down: no cancel this round
            log.warning("the executor cannot list its running jobs: %s; cancels wait", err)
            record_command_failure(self.warehouse, self.executor.cluster, err, self.actor)
            return None

    def _act(self, d: Decision, now: datetime, live: dict[str, JobRecord] | None) -> list[Event]:
        events = []
        if d.evaluation:
            events.append(self._event(d, now, EVALUATION, d.evaluation, detail=d.evidence))
        if d.action in (NOTIFY, WARN, CANCELLED):
            events += self._send(d, now, d.action)
        elif d.action == HELD and d.hold:
            kind, reason = d.hold
            events.append(
                self._event(d, now, MESSAGE, HELD, detail={"kind": kind, "reason": reason})
            )
        elif d.action == LEFT_ALONE:
            events.append(self._event(d, now, ACTION, LEFT_ALONE, detail={"why": d.verdict}))
        elif d.action == CANCEL and live is not None:
            events += self._cancel(d, now, live)
        elif d.action == RECONCILE and live is not None:
            events += self._reconcile(d, now, live)
        return events

    def _reconcile(self, d: Decision, now: datetime, live: dict[str, JobRecord]) -> list[Event]:
        """A cancel whose round died between its intent and scancel's answer: ask the executor.
        Still running as the same run: the cancel did not happen (recorded failed; the ladder
        cancels again). Gone: it happened, or the job ended on its own; Slurm's record says
        which, and until the warehouse has the record the intent stays open."""
        if d.job["cluster"] != self.executor.cluster:
            return []
        job = live.get(d.job["job_id"])
        kind = executor_kind(self.executor)
        if job is not None and same_start(job.start_time, d.start_time):
            why = {"error": "the round stopped before the cancel was confirmed; still running"}
            return [self._event(d, now, ACTION, CANCEL, channel=kind, ok=False, detail=why)]
        if job is not None:  # requeued: the run the intent was for is gone, this one is new
            changed = {"error": "the job was requeued before the cancel was confirmed"}
            return [
                self._event(d, now, ACTION, CANCEL, channel=kind, ok=False, detail=changed),
                self._event(d, now, ACTION, LEFT_ALONE, detail={"why": CHANGED}),
            ]
        state = (d.job.get("state") or "").upper()
        if d.job.get("end_time") is None:
            return []  # not running, no end on record yet: the next round looks again
        if state.startswith("CANCELLED"):
            done = {"reconciled": f"the executor records the job {state}"}
            return [self._event(d, now, ACTION, CANCEL, channel=kind, detail=done)]
        ended = {"error": f"the job ended {state or 'on its own'} before the cancel"}
        return [
            self._event(d, now, ACTION, CANCEL, channel=kind, ok=False, detail=ended),
            self._event(d, now, ACTION, LEFT_ALONE, detail={"why": ENDED}),
        ]

    def _cancel(self, d: Decision, now: datetime, live: dict[str, JobRecord]) -> list[Event]:
        """Cancel if the executor still runs the same job; otherwise leave it alone. Jobs of
        another cluster wait for that cluster's own service."""
        if d.job["cluster"] != self.executor.cluster:
            return []
        job = live.get(d.job["job_id"])
        if job is None or not same_start(job.start_time, d.start_time):
            why = ENDED if job is None else CHANGED
            return [
                self._event(d, now, EVALUATION, why),
                self._event(d, now, ACTION, LEFT_ALONE, detail={"why": why}),
            ]
        error = ""
        if not d.dry_run:
            blocked = self.breaker.cancel_blocked(d.job["job_id"])
            if blocked:
                return [self._event(d, now, ACTION, BLOCKED, ok=False, detail={"why": blocked})]
            # The intent is on record before Slurm is asked: a crash in between is found and
            # reconciled at the next round, never an act without a row.
            record(self.warehouse, [self._event(d, now, ACTION, CANCEL_INTENT, detail=d.evidence)])
            try:
                self.executor.cancel(d.job["job_id"])
            except Exception as err:  # noqa: BLE001 - any executor failure is recorded, retried
                log.warning("cancelling job %s failed: %s", d.job["job_id"], err)
                record_command_failure(self.warehouse, self.executor.cluster, err, self.actor)
                error = str(err) or type(err).__name__
        done = self._event(
            d,
            now,
            ACTION,
            CANCEL,
            channel=executor_kind(self.executor),
            ok=not error,
            detail={"error": error} if error else d.evidence,
        )
        if error:
            return [done]
        # The notice follows at once, unless quiet hours hold it (a later round sends it).
        if now in self.quiet:
            held = {"kind": CANCELLED, "reason": QUIET_HOURS}
            return [done, self._event(d, now, MESSAGE, HELD, detail=held)]
        return [done, *self._send(d, now, CANCELLED)]

    def _send(self, d: Decision, now: datetime, kind: str) -> list[Event]:
        # What the user is told, kept for the dashboards' warning banners (sing/dashboards/).
        told = {
            "seen": d.rule.says(),
            "cancel_command": cancel_command(self.executor, d.job["job_id"]),
        }
        if d.dry_run:
            return [self._event(d, now, MESSAGE, kind, deadline=d.deadline, detail=told)]
        deliveries = self.postman.send(self._message(d, kind))
        if not deliveries:  # no channel reaches this user: undelivered, the ladder waits
            undelivered = {**told, "error": NO_CHANNEL, "to_owner": True}
            return [self._event(d, now, MESSAGE, kind, ok=False, detail=undelivered)]
        return [
            self._event(
                d, now, MESSAGE, kind, deadline=d.deadline,
                **x.audit_fields({**told, "to_owner": x.to_owner}),
            )
            for x in deliveries
        ]  # fmt: skip

    def _message(self, d: Decision, kind: str) -> Message:
        job = d.job
        context = {
            "job": {
                **{k: job.get(k) for k in JOB_FIELDS},
                **{k: d.evidence.get(k) for k in FIGURES},
            },
            "rule": {
                "name": d.rule.name,
                "kind": d.rule.kind,
                "description": d.rule.says(),
                "holds": d.rule.holds(),
                "threshold": d.rule.threshold,
                "minutes": d.rule.minutes,
            },
            "evidence": d.evidence,
            "deadline": d.deadline,
            "cancel_command": cancel_command(self.executor, job["job_id"]),
            "dry_run": d.dry_run,
            "cluster": job["cluster"],
        }
        return Message(
            kind,
            job.get("user") or "",
            job["cluster"],
            job["job_id"],
            d.rule.name,
            job.get("account"),
            context,
            d.delivered,
        )

    def _event(self, d: Decision, now: datetime, event: str, outcome: str, **fields: Any) -> Event:
        detail = dict(fields.pop("detail", {}) or {})
        detail["start_time"] = d.start_time.isoformat() if d.start_time else None
        return Event(
            ts=now,
            cluster=d.job["cluster"],
            event=event,
            outcome=outcome,
            actor=self.actor,
            dry_run=d.dry_run,
            job_id=d.job["job_id"],
            user=d.job.get("user"),
            account=d.job.get("account"),
            rule=d.rule.name,
            detail=detail,
            **fields,
        )


ROUND_WAIT_S = 120.0  # a second runner waits this long for the round before it


@contextmanager
def round_lock(warehouse: Warehouse, wait_s: float = ROUND_WAIT_S) -> Iterator[None]:
    """One policy round at a time per warehouse (the collector's and `sing policy run`, or
    two timers): two rounds would read the same trail and both send and cancel. The second
    waits for the first, then gives up with a message saying who holds it."""
    path = warehouse.root / ".locks" / "policy-round.lock"
    path.parent.mkdir(exist_ok=True)
    with open(path, "a+") as fh:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip() or "another process"
                    raise UserError(
                        f"another policy round is running on this warehouse ({holder}) for "
                        f"over {wait_s:.0f} s; nothing done: try again when it ends"
                    ) from None
                time.sleep(0.2)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def executor_kind(executor: Executor) -> str:
    """'slurm' or 'local': the executor that cancels (the trail's channel of an action)."""
    return "slurm" if isinstance(executor, SlurmExecutor) else "local"


def cancel_command(executor: Executor, job_id: str) -> str:
    """The exact command a user runs to cancel the job themselves."""
    if executor_kind(executor) == "slurm":
        return f"scancel {job_id}"
    return f"sing jobs cancel {job_id}"
