"""The circuit breaker: when sing acts more than a site allows, it stops acting and says so.

A wrong rule, a broken exporter or a clock jump can make every job look idle at once; without a
limit sing would cancel them all in one round. At most `[policy] max_cancels_per_hour` real
cancels start within any hour on a cluster. The cancel that would pass the limit trips the
breaker instead: it is recorded (`action`/`breaker_tripped`, with why), the admins are told by
the policy's channels, and no cancel happens on that cluster until an admin runs
`sing policy resume`, which records `breaker_resumed`. The state lives in the audit trail only,
so every runner (the collector's round, `sing policy run`) sees the same breaker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from policy.audit import ACTION, MESSAGE, Event, record
from policy.messages import BREAKER, Message, Postman
from policy.settings import PolicySettings
from warehouse.store import Warehouse

TRIPPED, RESUMED = "breaker_tripped", "breaker_resumed"
BLOCKED = "cancel_blocked"  # a due cancel the breaker held back
WINDOW = timedelta(hours=1)

STATE_SQL = f"""
SELECT
    (SELECT arg_max(outcome, ts) FROM policy_events
     WHERE cluster = $cluster AND event = '{ACTION}' AND outcome IN ('{TRIPPED}', '{RESUMED}')),
    (SELECT max(ts) FILTER (WHERE outcome = '{TRIPPED}') FROM policy_events
     WHERE cluster = $cluster AND event = '{ACTION}'),
    (SELECT arg_max(detail ->> 'why', ts) FILTER (WHERE outcome = '{TRIPPED}') FROM policy_events
     WHERE cluster = $cluster AND event = '{ACTION}'),
    (SELECT count(*) FROM policy_events
     WHERE cluster = $cluster AND event = '{ACTION}' AND outcome = 'cancel_intent'
       AND NOT dry_run AND ts > $since)
"""


@dataclass
class Breaker:
    """The breaker of one cluster during one round."""

    cluster: str
    now: datetime
    max_cancels_per_hour: int
    recent_cancels: int  # real cancels begun within the last hour
    tripped_at: datetime | None = None
    why: str = ""
    new_trip: bool = False  # tripped in this round: record it and tell the admins
    blocked: list[str] = field(default_factory=list)  # jobs whose cancel it held back

    @classmethod
    def load(
        cls, warehouse: Warehouse, cluster: str, now: datetime, settings: PolicySettings
    ) -> Breaker:
        con = warehouse.connect({"policy_events": (now - WINDOW).date()})
        try:
            params = {"cluster": cluster, "since": now - WINDOW}
            state, tripped_at, why, recent = con.execute(STATE_SQL, params).fetchone()
        finally:
            con.close()
        breaker = cls(cluster, now, settings.max_cancels_per_hour, recent)
        if state == TRIPPED:
            breaker.tripped_at, breaker.why = tripped_at, why or ""
        return breaker

    def cancel_blocked(self, job_id: str) -> str | None:
        """Why the cancel of `job_id` must not happen now, or None (and it counts)."""
        if self.tripped_at is None and self.recent_cancels >= self.max_cancels_per_hour:
            self.tripped_at, self.new_trip = self.now, True
            self.why = (
                f"{self.recent_cancels} cancels within an hour reached [policy] "
                f"max_cancels_per_hour = {self.max_cancels_per_hour}"
            )
        if self.tripped_at is not None:
            self.blocked.append(job_id)
            return (
                f"circuit breaker tripped {self.tripped_at:%Y-%m-%d %H:%M} UTC ({self.why}); "
                "`sing policy resume` lets sing act again"
            )
        self.recent_cancels += 1
        return None

    def events(self, actor: str, postman: Postman) -> list[Event]:
        """The trip of this round, if any, and the admins' message about it."""
        if not self.new_trip:
            return []
        detail = {"why": self.why, "blocked_jobs": self.blocked}
        trip = Event(self.now, self.cluster, ACTION, TRIPPED, actor, False, detail=detail)
        message = Message(BREAKER, "", self.cluster, context={"why": self.why, **detail})
        told = [
            Event(
                self.now,
                self.cluster,
                MESSAGE,
                BREAKER,
                actor,
                False,
                channel=x.channel,
                recipient=x.recipient,
                ok=x.ok,
                detail={"error": x.error} if x.error else {},
            )
            for x in postman.send(message)
        ]
        return [trip, *told]


def resume(warehouse: Warehouse, cluster: str, now: datetime, actor: str, note: str) -> bool:
    """Clear a tripped breaker (recorded with the admin's note); False when none was tripped."""
    breaker = Breaker.load(warehouse, cluster, now, PolicySettings())
    if breaker.tripped_at is None:
        return False
    detail = {"note": note, "tripped_at": breaker.tripped_at.isoformat(), "why": breaker.why}
    record(warehouse, [Event(now, cluster, ACTION, RESUMED, actor, False, detail=detail)])
    return True
