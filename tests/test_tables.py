"""The table formatter on rows written by hand: alignment, units, rounding, NULL, long text."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from sing.tables import Column, cell, hours, percent, render, render_query


def test_numbers_right_text_left_headings_with_units() -> None:
    rows = [
        {"user": "ada", "gpu_hours": 1234.5678, "util": 0.4567, "run_s": 5400, "jobs": 12000},
        {"user": "bartholomew", "gpu_hours": 2.0, "util": None, "run_s": 36, "jobs": 3},
    ]
    columns = [
        Column("user", "user"),
        Column("gpu_hours", "GPU-h", digits=1),
        percent("util", "util"),
        hours("run_s", "run"),
        Column("jobs", "jobs"),
    ]
    assert render(rows, columns).splitlines() == [
        "user           GPU-h   util %  run h    jobs",
        "ada          1,234.6     45.7   1.50  12,000",
        "bartholomew      2.0  unknown   0.01       3",
    ]


def test_no_rows_prints_the_headings() -> None:
    assert render([], [Column("a", "A h"), Column("b", "B")]) == "A h  B"


def test_cells_of_every_kind() -> None:
    plain = Column("x", "x")
    assert cell(None, plain) == "unknown"
    assert cell(float("nan"), plain) == "unknown"
    assert cell(None, Column("x", "x", missing="n/a")) == "n/a"
    assert cell(True, plain) == "yes" and cell(False, plain) == "no"
    assert cell(0.123456, plain) == "0.123"
    assert cell(Decimal("7.5"), plain) == "7.500"
    assert cell(datetime(2026, 1, 5, 10, 30, tzinfo=UTC), plain) == "2026-01-05 10:30:00"
    assert cell(date(2026, 1, 5), plain) == "2026-01-05"
    assert cell(["gpu01", "gpu02"], plain) == "gpu01,gpu02"
    assert cell([], Column("x", "x", missing="-")) == "-"
    assert cell("gpu01,gpu02,gpu03", Column("x", "x", width=8)) == "gpu01,g…"
    assert cell(8.0e9, Column("x", "GB", digits=2, per=1e9)) == "8.00"
    assert cell(3_150_000, Column("x", "kWh", digits=2, per=3.6e6)) == "0.88"  # 0.875 exactly


def test_query_results_by_position_with_null_as_null() -> None:
    rows = [(1, None, 0.5), (22, "b", None)]
    assert render_query(["n", "a", "a"], rows).splitlines() == [
        " n  a         a",
        " 1  NULL  0.500",
        "22  b      NULL",
    ]
