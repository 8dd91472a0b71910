"""The action ladder: notify, then warn with a deadline, then cancel once the deadline passed.

The ladder keeps no state of its own: where each (cluster, job, rule) stands is read back from
the audit trail every round, so a restarted service neither repeats a message nor loses a
deadline. A ladder is one *episode*: it ends when the job is left alone (it ended, changed or
recovered); a later violation starts a new one. Real and dry-run trails are kept apart, so a
dry-run warning never leads to a real cancellation.

Messages: each kind at most once per episode; per user and rule at most one message per
`user_message_period_s` across their jobs (the others are held and go out later; a cancellation
notice is never held back for that); none during quiet hours (they wait). A deadline is set when
the warning actually goes out, so it never ends less than the grace after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import duckdb

from sing.config import ConfigError
from sing.policy.evaluate import EXEMPT, INCOMPLETE, OK, STALE, UNKNOWN, VIOLATING, Verdict
from sing.policy.messages import CANCELLED, NOTIFY, WARN
from sing.policy.rules import Rule
from sing.policy.settings import PolicySettings
from sing.warehouse.audit import ACTION, EVALUATION, MESSAGE, ROUND_ORDER

# Outcomes the ladder adds to the evaluation verdicts (sing/warehouse/audit.py lists them all).
RECOVERED, ENDED, CHANGED = "recovered", "ended", "changed"
CANCEL, LEFT_ALONE = "cancel", "left_alone"
RECONCILE = "reconcile"  # a cancel intent with no outcome: ask the executor what happened
HELD = "held"  # a message that waits (quiet hours, the user's period); detail says which
QUIET_HOURS, USER_PERIOD = "quiet_hours", "user_period"
WAIT = "wait"  # nothing to do now (check's word)

Key = tuple[str, str, str]  # (cluster, job id, rule)


@dataclass
class Episode:
    """Where one (cluster, job, rule) ladder stands, in one mode (real or dry run)."""

    start_time: datetime | None = None  # the job's start when the episode began
    sent: dict[str, datetime] = field(default_factory=dict)  # message kind -> when
    deadline: datetime | None = None
    cancelled: bool = False
    held: tuple[str, str] | None = None  # (kind, reason) of the last hold, until a send
    # message kind -> recipients it reached (a partial delivery is completed, never repeated)
    delivered: dict[str, set[str]] = field(default_factory=dict)
    cancel_intent: datetime | None = None  # a cancel begun and not yet seen through
    last_evaluation: str | None = None  # over all episodes: evaluations are recorded on change

    @property
    def active(self) -> bool:
        """Something was sent or done that a later round must follow up."""
        return (
            bool(self.sent)
            or self.cancelled
            or self.held is not None
            or self.cancel_intent is not None
            or bool(self.delivered)
        )


@dataclass(frozen=True)
class Decision:
    """What a round does for one (job, rule): the evaluation to record and the next step."""

    rule: Rule
    job: dict[str, Any]
    evidence: dict[str, Any]
    verdict: str  # violating, ok, exempt, stale, ended, changed
    dry_run: bool
    evaluation: str | None = None  # outcome to record now; None: unchanged since last recorded
    action: str = WAIT  # notify, warn, cancel, cancelled (the notice), left_alone, held, wait
    hold: tuple[str, str] | None = None  # action held: (message kind, reason)
    deadline: datetime | None = None  # the warning's (set now for a warning)
    start_time: datetime | None = None  # the job's, as the episode knows it
    delivered: frozenset[str] = frozenset()  # who already has this step's message

    @property
    def key(self) -> Key:
        return (self.job["cluster"], self.job["job_id"], self.rule.name)


class QuietHours:
    """A daily span ('22:00-07:00', local to the site's `zone`) when no message goes out."""

    def __init__(self, spec: str, zone: ZoneInfo) -> None:
        self.span: tuple[time, time] | None = None
        self.zone = zone
        if not spec:
            return
        try:
            start, end = (time.fromisoformat(part.strip()) for part in spec.split("-"))
        except ValueError as err:
            raise ConfigError(f"[policy] quiet_hours = {spec!r}: use 'HH:MM-HH:MM'") from err
        self.span = (start, end)

    def __contains__(self, moment: datetime) -> bool:
        if self.span is None:
            return False
        start, end = self.span
        local = moment.astimezone(self.zone).time()
        return start <= local < end if start <= end else local >= start or local < end


# A message row that tells its owner: a dry run's (nothing is sent there), or a real delivery the
# channel accepted that reached the owner. An undelivered message, or the admins' copy alone, is
# no message: the ladder sends it again and no deadline runs from it. Trails written before
# `to_owner` existed have it NULL; their deliveries went to owners or were copies of those.
TOLD_SQL = """(dry_run OR (ok AND channel IS NOT NULL
               AND coalesce((detail ->> 'to_owner')::BOOLEAN, true)))"""
CANCEL_INTENT = "cancel_intent"  # an action row written before scancel is called


def load_episodes(con: duckdb.DuckDBPyConnection) -> dict[tuple[Key, bool], Episode]:
    """Every ladder's episode, per (key, dry run), from the trail (oldest event first)."""
    rows = con.execute(
        f"""
        SELECT cluster, job_id, rule, dry_run, event, outcome, ts, deadline, ok, recipient,
               {TOLD_SQL}, (detail ->> 'start_time')::TIMESTAMPTZ, detail ->> 'kind',
               detail ->> 'reason'
        FROM policy_events WHERE job_id IS NOT NULL AND rule IS NOT NULL
        ORDER BY ts, {ROUND_ORDER}
        """
    ).fetchall()
    episodes: dict[tuple[Key, bool], Episode] = {}
    for row in rows:
        cluster, job_id, rule, dry, event, outcome, ts, deadline, ok, recipient, told = row[:11]
        start_time, held_kind, held_reason = row[11:]
        key = ((cluster, job_id, rule), bool(dry))
        ep = episodes.setdefault(key, Episode())
        ep.start_time = ep.start_time or start_time
        if event == EVALUATION:
            ep.last_evaluation = outcome
        elif event == ACTION and outcome == LEFT_ALONE:
            episodes[key] = Episode(last_evaluation=ep.last_evaluation)
        elif event == ACTION and outcome == CANCEL_INTENT:
            ep.cancel_intent = ts
        elif event == ACTION and outcome == CANCEL:
            ep.cancel_intent = None  # seen through, done or failed
            ep.cancelled = ep.cancelled or bool(ok)
        elif event == MESSAGE and outcome == HELD:
            ep.held = (held_kind, held_reason)
        elif event == MESSAGE:
            if ok and recipient:
                ep.delivered.setdefault(outcome, set()).add(recipient)
            if told and outcome not in ep.sent:
                ep.sent[outcome] = ts
                ep.held = None
                if outcome == WARN:
                    ep.deadline = deadline
    return episodes


def load_last_sent(
    con: duckdb.DuckDBPyConnection, since: datetime
) -> dict[tuple[str, str, bool], tuple[datetime, str]]:
    """Per (user, rule, dry run): the newest ladder message that told its owner since `since`,
    and its job."""
    rows = con.execute(
        f"""
        SELECT "user", rule, dry_run, max(ts), arg_max(job_id, ts) FROM policy_events
        WHERE event = 'message' AND outcome IN ('notify', 'warn') AND {TOLD_SQL}
          AND ts >= $since AND "user" IS NOT NULL AND rule IS NOT NULL
        GROUP BY ALL
        """,
        {"since": since},
    ).fetchall()
    return {(user, rule, bool(dry)): (ts, job) for user, rule, dry, ts, job in rows}


class Ladder:
    """Decides each (job, rule)'s next step from its verdict and its episode."""

    def __init__(
        self,
        settings: PolicySettings,
        quiet: QuietHours,
        episodes: dict[tuple[Key, bool], Episode],
        last_sent: dict[tuple[str, str, bool], tuple[datetime, str]],
        now: datetime,
    ) -> None:
        self.settings = settings
        self.episodes = episodes
        self.last_sent = dict(last_sent)
        self.now = now
        self.quiet = quiet

    def episode(self, key: Key, dry_run: bool) -> Episode:
        return self.episodes.get((key, dry_run), Episode())

    def decide(self, verdict: Verdict) -> Decision:
        """The step for a running job the rule judged."""
        rule, job = verdict.rule, verdict.job
        dry = not rule.acts(self.settings)
        ep = self.episode(verdict.key, dry)
        base = {
            "rule": rule,
            "job": job,
            "evidence": verdict.evidence,
            "dry_run": dry,
            "deadline": ep.deadline,
            "start_time": ep.start_time or job["start_time"],
        }
        if ep.cancel_intent is not None:  # a round died between its intent and scancel's answer
            return Decision(**base, verdict=verdict.outcome, action=RECONCILE)
        if ep.active and ep.start_time and not same_start(ep.start_time, job["start_time"]):
            return Decision(**base, verdict=CHANGED, evaluation=CHANGED, action=LEFT_ALONE)
        outcome = verdict.outcome
        if outcome == OK:
            # an open ladder ends here, even when the data went stale on the way back
            if ep.active:
                return Decision(**base, verdict=OK, evaluation=RECOVERED, action=LEFT_ALONE)
            if ep.last_evaluation == VIOLATING:
                return Decision(**base, verdict=OK, evaluation=RECOVERED)
            return Decision(**base, verdict=OK)
        evaluation = outcome if ep.last_evaluation != outcome else None
        if outcome == EXEMPT:
            action = LEFT_ALONE if ep.active else WAIT
            return Decision(**base, verdict=EXEMPT, evaluation=evaluation, action=action)
        if outcome in (STALE, INCOMPLETE, UNKNOWN):  # no verdict on old, partial, unknown data
            return Decision(**base, verdict=outcome, evaluation=evaluation)
        return self._climb(base | {"verdict": VIOLATING, "evaluation": evaluation}, ep)

    def decide_gone(self, key: Key, dry_run: bool, rule: Rule, job: dict[str, Any]) -> Decision:
        """The step for a job with an open episode that is no longer running as it was."""
        ep = self.episode(key, dry_run)
        ended = job.get("end_time") is not None or job.get("start_time") is None
        verdict = ENDED if ended else CHANGED
        base = {
            "rule": rule,
            "job": job,
            "evidence": {},
            "dry_run": dry_run,
            "deadline": ep.deadline,
            "start_time": ep.start_time,
        }
        if ep.cancel_intent is not None:
            return Decision(**base, verdict=verdict, action=RECONCILE)
        if ep.cancelled and CANCELLED not in ep.sent:
            return self._message(base | {"verdict": verdict}, ep, CANCELLED)
        return Decision(**base, verdict=verdict, evaluation=verdict, action=LEFT_ALONE)

    def open_episodes(self) -> list[tuple[Key, bool]]:
        """Episodes still to be followed up (a cancellation notice still owed counts)."""
        return [
            key
            for key, ep in self.episodes.items()
            if ep.active and not (ep.cancelled and CANCELLED in ep.sent)
        ]

    def _climb(self, d: dict[str, Any], ep: Episode) -> Decision:
        """The next step of a violating job's ladder; `d` is its decision's fields but the
        step's (built once: thousands of jobs a round climb)."""
        steps, rule = d["rule"].actions, d["rule"]
        if "notify" in steps and NOTIFY not in ep.sent:
            return self._message(d, ep, NOTIFY)
        if "warn" in steps and WARN not in ep.sent:
            notified = ep.sent.get(NOTIFY)
            if notified and self.now < notified + timedelta(minutes=rule.warn_after_minutes):
                return Decision(**d)
            return self._message(d, ep, WARN)
        warned = WARN in ep.sent  # the owner got the warning: its deadline is theirs
        due = warned and ep.deadline is not None and self.now >= ep.deadline
        if "cancel" in steps and not ep.cancelled and due:
            return Decision(**d, action=CANCEL)
        if ep.cancelled and CANCELLED not in ep.sent:
            return self._message(d, ep, CANCELLED)
        return Decision(**d)

    def _message(self, d: dict[str, Any], ep: Episode, kind: str) -> Decision:
        """Send `kind` now, or hold it (quiet hours; the user's period, not for notices)."""
        job, rule, dry = d["job"], d["rule"], d["dry_run"]
        reason = None
        if self.now in self.quiet:
            reason = QUIET_HOURS
        elif kind != CANCELLED:
            last = self.last_sent.get((job["user"], rule.name, dry))
            period = timedelta(seconds=self.settings.user_message_period_s)
            if last and last[1] != job["job_id"] and self.now < last[0] + period:
                reason = USER_PERIOD
        if reason:
            hold = (kind, reason)
            return Decision(**d, action=HELD if ep.held != hold else WAIT, hold=hold)
        if kind != CANCELLED:
            self.last_sent[(job["user"], rule.name, dry)] = (self.now, job["job_id"])
        delivered = frozenset(ep.delivered.get(kind, ()))
        if kind == WARN and "cancel" in rule.actions:  # a warning without a cancel sets none
            deadline = self.now + timedelta(minutes=rule.grace_minutes)
            return Decision(**(d | {"deadline": deadline}), action=kind, delivered=delivered)
        return Decision(**d, action=kind, delivered=delivered)


def same_start(a: datetime | None, b: datetime | None) -> bool:
    """The same run of a job: start times within a second (Slurm reports whole seconds)."""
    return a is not None and b is not None and abs((a - b).total_seconds()) <= 1
