"""Tables for people: the one way `sing` prints rows on a terminal.

Every human-readable report names its columns here (which field, the heading with its unit, the
scale and the rounding), so units, rounding and the word for a missing figure are decided once
and look the same everywhere. Scripts use `--json`, which prints the rows unformatted.
"""

from __future__ import annotations

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

    `scale` multiplies numbers first (100 for a share shown in %, 1/3600 for seconds in hours);
    `digits` rounds them (None: integers as they are, floats to 3 decimals); `missing` is shown
    for NULL; `width` cuts long text (a node list) so one row stays on one line.
    """

    key: str
    heading: str
    digits: int | None = None
    scale: float = 1.0
    missing: str = UNKNOWN
    width: int | None = None


def percent(key: str, heading: str, digits: int = 1) -> Column:
    """A share (0-1) shown in %."""
    return Column(key, f"{heading} %", digits=digits, scale=100)


def hours(key: str, heading: str, digits: int = 2) -> Column:
    """A duration stored in seconds, shown in hours."""
    return Column(key, f"{heading} h", digits=digits, scale=1 / 3600)


def render(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column]) -> str:
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
    if value is None or (isinstance(value, float) and value != value):  # NULL or NaN
        return column.missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    if _is_number(value):
        scaled = value * column.scale if column.scale != 1 else value
        if column.digits is not None:
            return f"{scaled:,.{column.digits}f}"
        return f"{scaled:,}" if isinstance(scaled, int) else f"{scaled:,.3f}"
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


def auto_columns(names: Sequence[str], missing: str = "NULL") -> list[Column]:
    """Columns for rows whose fields are not known in advance (an ad hoc SQL query)."""
    return [Column(name, name, missing=missing) for name in names]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)
