"""Accounting periods by name (2026, 2026-Q4, 2026-11, 2026-W47, 2026-11-30) as UTC windows.

An account's month is a UTC calendar month everywhere: the statement, `sing report usage
--period` and the monthly digest to the account's contact (`month_before`), so a PI's digest and
statement cover the same hours."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from sing.errors import UserError

FORMS = "YYYY, YYYY-Qn, YYYY-MM, YYYY-Www (ISO week) or YYYY-MM-DD"


def period_window(period: str, where: str = "period") -> tuple[datetime, datetime]:
    """(since, until) of a named period: its first instant and the next period's first, UTC."""
    text = period.strip()
    try:
        if m := re.fullmatch(r"(\d{4})", text):
            year = int(m[1])
            return _utc(date(year, 1, 1)), _utc(date(year + 1, 1, 1))
        if m := re.fullmatch(r"(\d{4})-Q([1-4])", text, re.IGNORECASE):
            year, quarter = int(m[1]), int(m[2])
            start = date(year, 3 * quarter - 2, 1)
            return _utc(start), _utc(_add_months(start, 3))
        if m := re.fullmatch(r"(\d{4})-W(\d{2})", text, re.IGNORECASE):
            start = date.fromisocalendar(int(m[1]), int(m[2]), 1)
            return _utc(start), _utc(start + timedelta(days=7))
        if m := re.fullmatch(r"(\d{4})-(\d{2})", text):
            start = date(int(m[1]), int(m[2]), 1)
            return _utc(start), _utc(_add_months(start, 1))
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            start = date.fromisoformat(text)
            return _utc(start), _utc(start + timedelta(days=1))
    except ValueError as err:
        raise UserError(f"{where}: {period!r} is not a real period: {err}") from err
    raise UserError(f"{where}: {period!r} is not a period; use {FORMS}")


def month_before(now: datetime) -> str:
    """The last complete month before `now`, by name (`2026-11`): the month a statement or a
    monthly digest sent at `now` covers."""
    first = now.astimezone(UTC).date().replace(day=1)
    before = first - timedelta(days=1)
    return f"{before.year:04d}-{before.month:02d}"


def _utc(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _add_months(start: date, months: int) -> date:
    index = start.year * 12 + start.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)
