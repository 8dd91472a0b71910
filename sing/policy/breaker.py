"""The circuit breaker: when sing acts more than a site allows, it stops acting and says so.

A wrong rule, a broken exporter or a clock jump can make every job look idle at once; without a
limit sing would cancel them all in one round. At most `[policy] max_cancels_per_hour` real
cancels start within any hour on a cluster. The cancel that would pass the limit trips the
breaker instead: it is recorded (`action`/`breaker_tripped`, with why), the admins are told by
the policy's channels, and no cancel happens on that cluster until an admin runs
`sing policy resume`, which records `breaker_resumed`. The state lives in the audit trail only,
so every runner (the collector's round, `sing policy run`) sees the same breaker.

Drains share it (`drain_blocked`, called by sing.policy.drain): the drain that would pass `[health]
max_drained_share` of the cluster's nodes trips the same breaker, so a trip by either stops
both cancels and drains until the resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sing.policy.messages import BREAKER, Message, Postman
from sing.policy.settings import PolicySettings
from sing.warehouse.audit import ACTION, MESSAGE, Event, record
from sing.warehouse.store import Warehouse

TRIPPED, RESUMED = "breaker_tripped", "breaker_resumed"
BLOCKED = "cancel_blocked"  # a due cancel the breaker held back
DRAIN_BLOCKED = "drain_blocked"  # a due drain the breaker held back
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
       AND NOT dry_run AND ts > $since),
    (SELECT max(ts) FROM policy_events
     WHERE cluster = $cluster AND event = '{ACTION}' AND outcome = '{RESUMED}')
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
    blocked_nodes: list[str] = field(default_factory=list)  # nodes whose drain it held back
    resumed_at: datetime | None = None  # the newest resume: drains count from then on

    @classmethod
    def load(
        cls, warehouse: Warehouse, cluster: str, now: datetime, settings: PolicySettings
    ) -> Breaker:
        # The whole trail: a trip (or resume) of days ago is the state until the next one.
        con = warehouse.connect({"policy_events": None})
        try:
            params = {"cluster": cluster, "since": now - WINDOW}
            state, tripped_at, why, recent, resumed_at = con.execute(STATE_SQL, params).fetchone()
        finally:
            con.close()
        breaker = cls(cluster, now, settings.max_cancels_per_hour, recent, resumed_at=resumed_at)
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
            return self._tripped_text()
        self.recent_cancels += 1
        return None

    def drain_blocked(
        self, node: str, drained_recently: int, nodes_total: int, max_share: float, window_s: float
    ) -> str | None:
        """Why the drain of `node` must not happen now, or None. `drained_recently` counts the
        cluster's real drains within `window_s` (and since the last resume); at most
        `max_share` of `nodes_total` nodes, at least one, and one when the inventory is empty."""
        limit = max(1, int(max_share * nodes_total))
        if self.tripped_at is None and drained_recently >= limit:
            self.tripped_at, self.new_trip = self.now, True
            of = f"of {nodes_total} nodes" if nodes_total else "(node inventory empty: 1 allowed)"
            self.why = (
                f"{drained_recently} drains within {window_s:g} s reached [health] "
                f"max_drained_share = {max_share:g} {of}; {node} not drained"
            )
        if self.tripped_at is not None:
            self.blocked_nodes.append(node)
            return self._tripped_text()
        return None

    def _tripped_text(self) -> str:
        return (
            f"circuit breaker tripped {self.tripped_at:%Y-%m-%d %H:%M} UTC ({self.why}); "
            "`sing policy resume` lets sing act again"
        )

    def events(self, actor: str, postman: Postman) -> list[Event]:
        """The trip of this round, if any, and the admins' message about it."""
        if not self.new_trip:
            return []
        detail = {
            "why": self.why,
            "blocked_jobs": self.blocked,
            "blocked_nodes": self.blocked_nodes,
        }
        trip = Event(self.now, self.cluster, ACTION, TRIPPED, actor, False, detail=detail)
        message = Message(BREAKER, "", self.cluster, context={"why": self.why, **detail})
        told = [
            Event(self.now, self.cluster, MESSAGE, BREAKER, actor, False, **x.audit_fields())
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
