"""Deltas of cumulative counters, computed as samples arrive.

Why here and not in SQL: a window function over months of samples costs seconds and gigabytes
at query time, while the collector already holds each counter's previous value.
Two rules, the same for RDMA bytes (integers) and GPU energy (float joules):
- A counter that goes down was reset (node reboot, driver reload) or wrapped; in both cases the
  new value is what accrued since it restarted from zero, so the delta is the new value and never
  negative (Prometheus's `rate()` reads resets the same way).
- An unknown value (the exporter said the counter is unknown, e.g. a saturated 32-bit InfiniBand
  counter) breaks the chain: what happened meanwhile is unknown, so the next known value has no
  delta either, instead of a difference across the gap that may be anything.
"""

from __future__ import annotations

from collections.abc import Hashable


class CounterDeltas:
    """The previous value of each counter, by any hashable key.

    Counters of things that come and go (a job's on a node) belong to a group (the node), so
    that `retain` forgets the gone ones' values, which would otherwise pile up for ever."""

    def __init__(
        self,
        last: dict[Hashable, float] | None = None,
        groups: dict[Hashable, set[Hashable]] | None = None,
    ) -> None:
        self._last: dict[Hashable, float] = dict(last or {})
        self._groups = {group: set(keys) for group, keys in (groups or {}).items()}

    def delta(
        self, key: Hashable, value: float | None, group: Hashable | None = None
    ) -> float | None:
        """Increase since this key's previous value; None for the first value after none or an
        unknown one. Integer counters give integer deltas."""
        if group is not None:
            self._groups.setdefault(group, set()).add(key)
        if value is None:
            self._last.pop(key, None)
            return None
        previous = self._last.get(key)
        self._last[key] = value
        if previous is None:
            return None
        return value - previous if value >= previous else value

    def seed(self, key: Hashable, value: float, group: Hashable | None = None) -> None:
        """Start from a value stored before a restart, so the next delta is not lost."""
        self._last.setdefault(key, value)
        if group is not None:
            self._groups.setdefault(group, set()).add(key)

    def retain(self, group: Hashable, keys: set[Hashable]) -> None:
        """Forget the counters of `group` that are not among `keys` (a job that left the node)."""
        for gone in self._groups.get(group, set()) - keys:
            self._last.pop(gone, None)
        self._groups[group] = set(keys)

    def copy(self) -> CounterDeltas:
        """A snapshot, to go back to when the rows computed from here are not written."""
        return CounterDeltas(self._last, self._groups)

    def __len__(self) -> int:
        return len(self._last)
