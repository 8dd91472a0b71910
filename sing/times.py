"""Times that people and files give: ISO 8601, and UTC when they name no zone.

One reading for every `--since`, `--until` and `--now`, for trace files' timestamps and for the
simulator's window, so "2026-11-01" means the same instant in every command (a naive time read
as the machine's local zone would shift a site's month by its offset).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime


def parse_time(text: str, what: str = "time") -> datetime:
    """An aware datetime from ISO 8601 text (`2026-11-01`, `2026-11-01T12:00`, a `Z` or an
    offset); ValueError saying what was wrong and what works."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{what} {text!r} is not an ISO 8601 time (e.g. 2026-11-01 or 2026-11-01T12:00Z)"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def time_option(text: str) -> datetime:
    """`parse_time` as an argparse type, so a bad time is a usage error naming the option."""
    try:
        return parse_time(text, "")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).strip()) from None
