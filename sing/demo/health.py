"""How well the live demo is scraped, minute by minute, from the warehouse's `scrapes` table.

The demo is healthy when, in every minute from its first scrape on, every simulated node answered
and nearly all scrapes did: on a loaded 2-core machine a starved exporter shows up here first, as
scrapes that time out. `bench/bench_demo.py` reports these figures and the end-to-end test
asserts them. Minutes are counted from the first scrape, not from the clock, so the first minute
is a whole one; the last, unfinished minute is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Minute:
    start: datetime
    rounds: int  # collector rounds begun in this minute
    attempts: int  # scrapes tried
    answered: int  # scrapes that returned a page
    nodes_up: int  # nodes that answered at least once

    @property
    def answered_share(self) -> float:
        return self.answered / self.attempts if self.attempts else 0.0


def scrape_minutes(con: duckdb.DuckDBPyConnection, since: datetime) -> list[Minute]:
    """Every full minute of scrapes stamped at or after `since` (a scrape's time is its round's)."""
    rows = con.execute(
        "SELECT ts, node, up FROM scrapes WHERE ts >= ? ORDER BY ts", [since]
    ).fetchall()
    if not rows:
        return []
    first, last = rows[0][0], rows[-1][0]
    minutes = []
    start = first
    while start + MINUTE <= last:  # a later round was written, so this minute is complete
        inside = [(ts, node, up) for ts, node, up in rows if start <= ts < start + MINUTE]
        minutes.append(
            Minute(
                start=start,
                rounds=len({ts for ts, _, _ in inside}),
                attempts=len(inside),
                answered=sum(up for _, _, up in inside),
                nodes_up=len({node for _, node, up in inside if up}),
            )
        )
        start += MINUTE
    return minutes
