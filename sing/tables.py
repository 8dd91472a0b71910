"""Tables for people: the one way `sing` prints rows on a terminal.

Every human-readable report names its columns here (which field, the heading with its unit, the
unit size and the rounding), so units, rounding and the word for a missing figure are decided once
and look the same everywhere. Scripts use `--json`, which prints the rows unformatted.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

# NULL in a measured figure means sing could not know it; NULL in a query result is just NULL.
UNKNOWN = "unknown"
GAP = "  "


@dataclass(frozen=True)
class Column:
    """One printed column: `key` of the row, `heading` (with its unit), then how to show it.

    Numbers are first divided by `per`, the printed unit in stored units (3600: seconds shown in
    hours, 3.6e6: joules in kWh, 0.01: a share in %); `digits` rounds them (None: integers as
    they are, floats to 3 decimals); `missing` is shown for NULL; `width` cuts long text (a node
    list) so one row stays on one line.
    """

    key: str | int
    heading: str
    digits: int | None = None
    per: float = 1.0
    missing: str = UNKNOWN
    width: int | None = None


def percent(key: str, heading: str, digits: int = 1, missing: str = UNKNOWN) -> Column:
    """A share (0-1) shown in %."""
    return Column(key, f"{heading} %", digits=digits, per=0.01, missing=missing)


def hours(key: str, heading: str, digits: int = 2, missing: str = UNKNOWN) -> Column:
    """A duration stored in seconds, shown in hours."""
    return Column(key, f"{heading} h", digits=digits, per=3600, missing=missing)


def render(rows: Iterable[Mapping[Any, Any]], columns: Sequence[Column]) -> str:
    """The rows as aligned text: a heading line, then one line per row; numbers right-aligned,
    text left-aligned, no trailing spaces."""
    rows = list(rows)
    cells = [[cell(row.get(c.key), c) for c in columns] for row in rows]
    numeric = [any(_is_number(row.get(c.key)) for row in rows) for c in columns]
    lines = [[c.heading for c in columns], *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join(
        GAP.join(
            text.rjust(width) if right else text.ljust(width)
            for text, width, right in zip(line, widths, numeric, strict=True)
        ).rstrip()
        for line in lines
    )


def cell(value: Any, column: Column) -> str:
    """One value as its column shows it."""
    if value is None or value == [] or (isinstance(value, float) and value != value):  # or NaN
        return column.missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _is_number(value):
        shown = value / column.per if column.per != 1 else value
        if column.digits is not None:
            return f"{shown:,.{column.digits}f}"
        return f"{shown:,}" if isinstance(shown, int) else f"{shown:,.3f}"
    if isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, date):
        text = value.isoformat()
    elif isinstance(value, list | tuple):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    if column.width and len(text) > column.width:
        return text[: column.width - 1] + "…"
    return text


def render_query(names: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The result of an ad hoc query: headings are its column names, NULL prints as NULL.
    Cells are found by position, as a query may repeat a name (`SELECT 1 AS a, 2 AS a`)."""
    columns = [Column(i, name, missing="NULL") for i, name in enumerate(names)]
    return render((dict(enumerate(row)) for row in rows), columns)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def scaled_bytes(value: float | None, per_second: bool = False, binary: bool = False) -> str:
    """Bytes in the largest unit that keeps the figure at or above 1, so a person reads
    "265.6 TB", not "265624.51 GB"; every printed byte count goes through here. SI units
    (powers of 1000) for traffic; `binary` (powers of 1024) for memory, as GPUs size it."""
    if value is None or value != value:  # NULL or NaN: sing could not know it
        return UNKNOWN
    units, step = (BINARY_UNITS, 1024) if binary else (BYTE_UNITS, 1000)
    shown, unit = float(value), units[0]
    for unit in units:
        if abs(shown) < step or unit == units[-1]:
            break
        shown /= step
    digits = 0 if unit == units[0] else 1
    return f"{shown:.{digits}f} {unit}" + ("/s" if per_second else "")


def window_text(since: datetime | None, until: datetime | None) -> str:
    """A report's window in words, for the line that says a report found nothing in it."""
    if since and until:
        return f"{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC"
    if since or until:
        return f"{'since' if since else 'before'} {since or until:%Y-%m-%d %H:%M} UTC"
    return "the whole history"


def print_json(rows: Iterable[Mapping[str, Any]], **extra: Any) -> None:
    """The one `--json` envelope of every command, {"rows": [...], ...}, so a script reads every
    command the same way (docs/analytics.md). Times are ISO 8601; what JSON lacks (decimals,
    durations) is written as text."""
    json.dump({"rows": list(rows), **extra}, sys.stdout, default=_json_value)
    print()


def _json_value(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime | date) else str(value)
