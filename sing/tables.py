"""Tables for people: the one way `sing` prints rows on a terminal.

Every human-readable report names its columns here (which field, the heading with its unit, the
unit size and the rounding), so units, rounding and the word for a missing figure are decided once
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
