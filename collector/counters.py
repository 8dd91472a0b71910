"""Deltas of cumulative counters, computed as samples arrive.

Why here and not in SQL: a window function over months of RDMA samples costs seconds and
gigabytes at query time, while the collector already holds each port's previous value.
A counter that goes down was reset (node reboot, driver reload) or wrapped; in both cases the
new value is what accrued since it restarted from zero, so the delta is the new value and never
negative (Prometheus's `rate()` reads resets the same way).
"""

from __future__ import annotations

from collections.abc import Hashable


class CounterDeltas:
    """The previous value of each counter, by any hashable key."""

    def __init__(self) -> None:
        self._last: dict[Hashable, int] = {}

    def delta(self, key: Hashable, value: int | None) -> int | None:
        """Increase since this key's previous value; None for the first value seen."""
        if value is None:
            return None
        previous = self._last.get(key)
        self._last[key] = value
        if previous is None:
            return None
        return value - previous if value >= previous else value

    def seed(self, key: Hashable, value: int) -> None:
        """Start from a value stored before a restart, so the next delta is not lost."""
        self._last.setdefault(key, value)

    def __len__(self) -> int:
        return len(self._last)
