"""Times that people and files give: ISO 8601, and UTC when they name no zone.

One reading for every `--since`, `--until` and `--now`, for trace files' timestamps and for the
simulator's window, so "2026-11-01" means the same instant in every command (a naive time read
as the machine's local zone would shift a site's month by its offset). People may also give a
time ago (`30m`, `24h`, `7d`) to any command's time option; files may not.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

ISO_EXAMPLES = "e.g. 2026-11-01 or 2026-11-01T12:00Z"
_AGO = re.compile(r"([0-9]+)([mhd])")  # ASCII digits only: '٢٤h' is no count of hours
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, what: str = "time") -> datetime:
    """An aware datetime from ISO 8601 text (`2026-11-01`, `2026-11-01T12:00`, a `Z` or an
    offset); ValueError saying what was wrong and what works."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an ISO 8601 time ({ISO_EXAMPLES})") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_time_or_ago(text: str, what: str = "time", now: datetime | None = None) -> datetime:
    """`parse_time`, or a time ago: `30m`, `24h`, `7d` before `now` (default: the clock)."""
    if ago := _AGO.fullmatch(text.strip()):
        return (now or datetime.now(UTC)) - timedelta(seconds=int(ago[1]) * _UNIT_S[ago[2]])
    try:
        return parse_time(text, what)
    except ValueError:
        raise ValueError(
            f"{what} {text!r} is neither an ISO 8601 time ({ISO_EXAMPLES}) nor a time ago "
            "(30m, 24h, 7d)"
        ) from None


def time_option(text: str) -> datetime:
    """`parse_time_or_ago` as an argparse type, so a bad time is a usage error naming the
    option."""
    try:
        return parse_time_or_ago(text, "")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).strip()) from None
