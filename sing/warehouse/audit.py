"""The policies' audit trail: every verdict, message and action as a `policy_events` row.

The trail is also the ladder's memory: what was sent to whom and which deadline was set are read
back from it, so a restarted service neither repeats a message nor loses a deadline.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from sing.schema import table
from sing.warehouse.store import Warehouse

if TYPE_CHECKING:  # `events` gives a polars frame (DuckDB's .pl()); a collector never asks
    import polars as pl

EVALUATION, MESSAGE, ACTION = "evaluation", "message", "action"

# One round's events share their time; their order within it: verdicts, then an act's intent,
# then actions, then messages (the ladder replays the trail in this order).
ROUND_ORDER = """CASE event WHEN 'evaluation' THEN 0
    WHEN 'action' THEN CASE WHEN outcome LIKE '%\\_intent' ESCAPE '\\' THEN 1 ELSE 2 END
    ELSE 3 END"""

# An event's `detail` as the trail stores it: JSON, keys sorted, anything else (times) as text.
# One encoder for every event: `json.dumps` with options builds a new one per call.
DETAIL_JSON = json.JSONEncoder(sort_keys=True, default=str)


def actor(command: str) -> str:
    """Who acts: the command and the host it runs on, e.g. 'sing policy run@head1'."""
    return f"{command}@{socket.gethostname()}"


@dataclass(frozen=True)
class Event:
    """One row of `policy_events` (sing/schema.py says what each field holds)."""

    ts: datetime
    cluster: str
    event: str
    outcome: str
    actor: str
    dry_run: bool
    job_id: str | None = None
    user: str | None = None
    account: str | None = None
    rule: str | None = None
    deadline: datetime | None = None
    channel: str | None = None
    recipient: str | None = None
    ok: bool = True
    detail: dict[str, Any] = field(default_factory=dict)


def record(warehouse: Warehouse, events: list[Event]) -> int:
    """Append `events` in one commit (one round's outcomes land together or not at all)."""
    if not events:
        return 0
    # Column by column: a round writes thousands of events, and a dict per row costs twice.
    columns = {f.name: [getattr(e, f.name) for e in events] for f in fields(Event)}
    columns["detail"] = [DETAIL_JSON.encode(e.detail) for e in events]
    rows = pa.Table.from_pydict(columns, table("policy_events").schema)
    return warehouse.append("policy_events", rows)


def events(
    con: duckdb.DuckDBPyConnection,
    since: datetime | None = None,
    user: str | None = None,
    kinds: tuple[str, ...] = (EVALUATION, MESSAGE, ACTION),
) -> pl.DataFrame:
    """The trail, newest first; `user` restricts it to one user's jobs and messages."""
    return con.sql(
        f"""
        SELECT ts, cluster, job_id, "user", account, rule, event, outcome, deadline, channel,
               recipient, dry_run, ok, actor, detail
        FROM policy_events
        WHERE ($since IS NULL OR ts >= $since) AND ($user IS NULL OR "user" = $user)
          AND list_contains($kinds, event)
        ORDER BY ts DESC, {ROUND_ORDER} DESC
        """,
        params={"since": since, "user": user, "kinds": list(kinds)},
    ).pl()
