"""Job ids are text in the warehouse but numbers to people: "9" comes before "10".

Slurm ids are numbers, array and heterogeneous jobs add a suffix ("1234_7", "1234+1"); the
order compares the digit runs as numbers and the rest as text, so every id has a place and the
lowest numeric id wins every tie. It is defined once for Python (`job_order`) and once for SQL
(`job_order_sql`), and tests/test_jobids.py shows the two sort any ids alike: the collector
stamping a shared GPU and `sing warehouse import` attributing a sample pick the same job.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def job_order(job_id: str) -> tuple[tuple[str | int, ...], str]:
    """Sort key: "9" < "10" < "10_2" < "10_10" < "x"; the parts alternate text, number, text,
    and ids that differ only in leading zeros ("007", "7") are ordered by their text."""
    parts = _DIGITS.split(job_id)
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts)), job_id


def lowest_job(job_ids: set[str] | list[str]) -> str:
    """The job with the lowest id, compared as numbers."""
    return min(job_ids, key=job_order)


def job_order_sql(column: str = "job_id", descending: bool = False) -> str:
    """SQL ORDER BY terms that sort as `job_order` does (highest first if `descending`): the
    id's runs of digits and of other characters in turn, a digit run compared as a number (its
    length without leading zeros, then its digits, so no id is too long for an integer type),
    then the id's text."""
    direction = " DESC" if descending else ""
    runs = (
        "[CASE WHEN regexp_full_match(part, '[0-9]+') "
        "THEN {'text': '', 'digits': length(ltrim(part, '0')), 'number': ltrim(part, '0')} "
        "ELSE {'text': part, 'digits': 0, 'number': ''} END "
        f"FOR part IN regexp_extract_all({column}, '[0-9]+|[^0-9]+')]"
    )
    return f"{runs}{direction}, {column}{direction}"
