"""A lane: waiting jobs of one class (or the whole queue) in priority order.

The scheduler needs three things of its queues: the best waiting job, removing it, and (for EASY's
look-ahead) the next few in order. A heap gives the first two in O(log n) but walking it in order
is slow; a sorted list read from a moving start index `pos` gives all three cheaply, and arrivals
in submit order (every policy but sjf) are simply appended.

Entries are `(priority, job index)`. A job that leaves the queue some other way (started from
another lane, cancelled, held) keeps its entry until it reaches the front, where `head` skips it;
skipped entries are dropped in bulk now and then, so memory stays proportional to the queue.
"""

from __future__ import annotations

import bisect
from typing import Final

# Final: compiled, read from a C variable, not looked up per call (see sing/scheduler/cluster.py).
insort: Final = bisect.insort

# (priority, job index). A plain `tuple`, not tuple[float, int]: a compiled build
# (sing.scheduler.native) then hands the entry itself around instead of unpacking and repacking it
# at every call.
Entry = tuple
WAITING: Final = 0  # the job state `head` looks for (sing.scheduler.core's state codes)
COMPACT_AT: Final = 4096  # drop skipped entries once this many have piled up at the front


class Lane:
    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[Entry] = []
        self.pos = 0

    def push(self, entry: Entry) -> None:
        items = self.items
        # (priorities compare cheaper than entries; a tie goes to insort, which orders by job)
        if not items or entry[0] > items[-1][0]:
            items.append(entry)
        else:
            insort(items, entry, self.pos)

    def head(self, state: list[int]) -> Entry | None:
        """The first entry of a waiting job, skipping (for good) those of jobs that left."""
        items, pos = self.items, self.pos
        end = len(items)
        while pos < end:
            job: int = items[pos][1]  # (typed: compiled, the state test is a C compare)
            if state[job] == WAITING:
                break
            pos += 1
        if pos != self.pos:
            if pos >= COMPACT_AT and 2 * pos > end:
                del items[:pos]
                end -= pos
                pos = 0
            self.pos = pos
        return items[pos] if pos < end else None

    def pop(self) -> None:
        """Drop the front entry (the head just started)."""
        self.pos += 1

    def first(self, k: int) -> list[Entry]:
        """The first `k` entries in order, skipped ones included (after `head`, [0] is the head)."""
        return self.items[self.pos : self.pos + k]
