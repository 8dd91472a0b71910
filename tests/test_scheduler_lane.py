"""The lane: priority order, lazy skipping of jobs that left, compaction."""

from __future__ import annotations

from sing.scheduler.lane import COMPACT_AT, WAITING, Lane

GONE = 2  # any state but WAITING


def test_order_skipping_and_look_ahead() -> None:
    lane, state = Lane(), [WAITING] * 6
    for entry in [(5.0, 0), (1.0, 1), (3.0, 2), (3.0, 3)]:  # out of order: sjf's runtimes
        lane.push(entry)
    assert lane.head(state) == (1.0, 1)
    lane.pop()
    state[2] = GONE  # started from another lane
    assert lane.first(3) == [(3.0, 2), (3.0, 3), (5.0, 0)]  # look-ahead sees it until skipped
    assert lane.head(state) == (3.0, 3)
    assert lane.first(3) == [(3.0, 3), (5.0, 0)]
    lane.push((0.5, 4))  # a better job arriving later goes to the front
    assert lane.head(state) == (0.5, 4)
    state[0] = state[3] = state[4] = GONE
    assert lane.head(state) is None


def test_skipped_entries_are_dropped_in_bulk() -> None:
    n = 3 * COMPACT_AT
    lane, state = Lane(), [WAITING] * n
    for i in range(n):
        lane.push((float(i), i))
    for i in range(2 * COMPACT_AT):
        state[i] = GONE
    assert lane.head(state) == (float(2 * COMPACT_AT), 2 * COMPACT_AT)
    assert (lane.pos, len(lane.items)) == (0, COMPACT_AT)
