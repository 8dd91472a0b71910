"""Job ids are text in the warehouse but numbers to people: "9" comes before "10".

Slurm ids are numbers, array and heterogeneous jobs add a suffix ("1234_7", "1234+1"); the
order key compares the digit runs as numbers and the rest as text, so every id has a place
and the lowest numeric id wins every tie.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def job_order(job_id: str) -> tuple[str | int, ...]:
    """Sort key: "9" < "10" < "10_2" < "10_10" < "x"; the parts alternate text, number, text."""
    parts = _DIGITS.split(job_id)
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))


def lowest_job(job_ids: set[str] | list[str]) -> str:
    """The job with the lowest id, compared as numbers."""
    return min(job_ids, key=job_order)
