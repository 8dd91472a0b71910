"""Shared reading and normalising for importers: text tables, numbers, times, job rows.

Sources are read as text (every column a string) so that a bad value is reported with its file,
line and column instead of becoming a silent null; blank lines (a trailing one is common) are
skipped. Naive times are read in the source's timezone and converted to UTC; times with an
offset keep their offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa

from sing.errors import UserError
from sing.traces import sql
from sing.traces.format import JOBS, NODES, conform, state_sql

LINE = "_line"
# Unix seconds of 0001-01-01 and 9999-12-31 23:59:59: the times a datetime can hold.
EPOCH_RANGE_S = (-62_135_596_800, 253_402_300_799)
NULL_TOKENS = ["", "None", "none", "NULL", "null", "NaN", "nan", "-"]

# Columns a source module hands over (times as UTC datetimes); any may be null.
JOB_COLUMNS = {
    "job_id": pl.String,
    "user": pl.String,
    "group": pl.String,
    "partition": pl.String,
    "submit": pl.Datetime("us", "UTC"),
    "start": pl.Datetime("us", "UTC"),
    "end": pl.Datetime("us", "UTC"),
    "run_s": pl.Float64,
    "queue_s": pl.Float64,
    "state": pl.String,
    "num_gpus": pl.Int64,
    "num_nodes": pl.Int64,
    "gpus_per_node": pl.Int64,
    "gpu_model": pl.String,
    "gpu_request": pl.Float64,
    "gpu_model_request": pl.String,
    "time_limit_s": pl.Int64,
}
# A node list's columns, as the format names them or as a source does (Alibaba openb: sn, gpu,
# model); the first name found of each is read.
NODE_COLUMNS = {
    "node": ("node", "sn"),
    "gpus": ("gpus", "gpu"),
    "gpu_model": ("gpu_model", "model"),
}


@dataclass
class Source:
    """A loaded public trace: normalised job rows plus what the datasheet says about them."""

    jobs: pl.DataFrame
    title: str
    collection: str
    biases: list[str] = field(default_factory=list)
    # Times counted from the trace's own start (a pod list): that start is the release start,
    # so the source's seconds are the release's. None: midnight UTC of the first submit day.
    origin: datetime | None = None
    # GPU-seconds the source holds by its own columns: the release must keep them (validate).
    gpu_seconds: float | None = None
    # The cluster the source itself describes (an SWF header), used when no --nodes is given.
    nodes: pa.Table | None = None


def read_table(
    path: Path, columns: list[str] | None = None, required: tuple[str, ...] = ()
) -> pl.DataFrame:
    """A CSV file as strings with its line numbers (`_line`); `columns` for a headerless file."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        df = pl.read_csv(
            path,
            infer_schema=False,
            has_header=columns is None,
            new_columns=columns,
            null_values=NULL_TOKENS,
        )
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a readable CSV file: {err}") from err
    first_line = 2 if columns is None else 1
    df = df.with_row_index(LINE, offset=first_line).filter(
        ~pl.all_horizontal(pl.exclude(LINE).is_null())
    )
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise UserError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(df.columns[1:])}"
        )
    return df


def header_file(path: Path) -> list[str]:
    """Column names from an Alibaba-style `.header` file (one comma-separated line)."""
    if not path.is_file():
        raise UserError(f"{path}: header file not found (needed for the headerless table)")
    return [c.strip() for c in path.read_text().strip().split(",")]


def number(df: pl.DataFrame, column: str, path: Path, dtype=pl.Float64) -> pl.Series:
    """A column as finite numbers (whole ones for Int64, in its range); the first value that
    is not one is an error naming its line. A fraction where a count is due (1.5 GPUs) is an
    error, never rounded: rounding would change the source's GPU-time."""
    values = df[column].str.strip_chars().cast(pl.Float64, strict=False)
    values = pl.select(pl.when(values.is_finite()).then(values)).to_series()
    if dtype == pl.Int64:
        _fail_on_unparsed(df, column, values, path, "a number")
        whole = pl.select(pl.when(values == values.round(0)).then(values)).to_series()
        _fail_on_unparsed(df, column, whole, path, "a whole number")
        values = whole.cast(pl.Int64, strict=False)  # out of range: null, reported
    _fail_on_unparsed(df, column, values, path, "a number")
    return values


def times(df: pl.DataFrame, column: str, path: Path, timezone: str) -> pl.Series:
    """A column of 'YYYY-MM-DD HH:MM:SS[.f][+hh:mm]' times as UTC."""
    text = df[column].str.strip_chars().str.replace("T", " ")
    has_offset = text.str.contains(r"(Z|[+-]\d\d:?\d\d)$").any()
    if has_offset:
        parsed = text.str.replace("Z$", "+00:00").str.to_datetime(
            "%Y-%m-%d %H:%M:%S%.f%:z", strict=False, time_unit="us"
        )
    else:
        parsed = text.str.to_datetime(
            "%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us"
        ).dt.replace_time_zone(timezone, ambiguous="earliest", non_existent="null")
    parsed = parsed.dt.convert_time_zone("UTC")
    # Only what a datetime can hold: 0001-01-01 00:00 in UTC+8 is in the year 0 in UTC.
    parsed = pl.select(pl.when(parsed.dt.year().is_between(1, 9999)).then(parsed)).to_series()
    _fail_on_unparsed(df, column, parsed, path, f"a time like 2020-01-31 23:59:59 ({timezone})")
    return parsed


def seconds_since_epoch(df: pl.DataFrame, column: str, path: Path) -> pl.Series:
    """A column of (possibly shifted) Unix times in seconds, as UTC datetimes."""
    values = number(df, column, path)
    in_range = pl.select(pl.when(values.is_between(*EPOCH_RANGE_S)).then(values)).to_series()
    _fail_on_unparsed(df, column, in_range, path, "Unix seconds within the years 1-9999")
    return (values * 1e6).cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")


def require(df: pl.DataFrame, values: pl.Series, column: str, path: Path) -> None:
    """Fail on the first row where a required value is missing."""
    reject(df, values.is_null(), path, f"column {column} is empty")


def reject(df: pl.DataFrame, bad: pl.Series, path: Path, problem: str) -> None:
    """Fail on the first row where `bad` holds, naming its line."""
    rows = df.filter(bad.fill_null(False))
    if rows.height:
        raise UserError(f"{path}: line {rows[LINE][0]}: {problem}")


def read_nodes(path: Path) -> pa.Table:
    """A node list (node, GPUs, GPU model per row) as the format's `nodes` table.

    Names are kept as the source wrote them (a public trace's own node names); a node without
    GPUs has gpus 0 and no model. A repeated node name is an error: the list is an inventory.
    """
    df = read_table(path)
    found = {
        name: next((c for c in choices if c in df.columns), None)
        for name, choices in NODE_COLUMNS.items()
    }
    missing = [" or ".join(NODE_COLUMNS[name]) for name, column in found.items() if column is None]
    if missing:
        raise UserError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(df.columns[1:])}"
        )
    nodes = df[found["node"]].str.strip_chars()
    require(df, nodes, found["node"], path)
    reject(df, nodes.is_duplicated() & ~nodes.is_first_distinct(), path, "node listed twice")
    gpus = number(df, found["gpus"], path, pl.Int64)
    require(df, gpus, found["gpus"], path)
    reject(df, gpus < 0, path, f"column {found['gpus']}: a node has 0 GPUs or more")
    table = pl.DataFrame(
        {"node": nodes, "gpus": gpus, "gpu_model": df[found["gpu_model"]].str.strip_chars()}
    )
    return conform(NODES, table.to_arrow())


def _fail_on_unparsed(
    df: pl.DataFrame, column: str, parsed: pl.Series, path: Path, what: str
) -> None:
    bad = df.filter(df[column].is_not_null() & parsed.is_null())
    if bad.height:
        raise UserError(
            f"{path}: line {bad[LINE][0]}: column {column}: {bad[column][0]!r} is not {what}"
        )


def to_jobs(frame: pl.DataFrame, origin: datetime | None = None) -> tuple[pa.Table, datetime]:
    """Normalised job rows -> the format's jobs table, times relative to `origin` (by default
    midnight UTC of the first submit day)."""
    frame = frame.select(
        [
            frame[c].cast(t) if c in frame.columns else pl.lit(None, t).alias(c)
            for c, t in JOB_COLUMNS.items()
        ]
    )
    if frame.height == 0:
        raise UserError("the trace holds no jobs")
    first = frame["submit"].min()
    release_start = origin or datetime(first.year, first.month, first.day, tzinfo=UTC)
    con = sql.connect()
    con.register("src", frame.to_arrow())
    since = "epoch_us($origin)"
    jobs = con.sql(
        f"""
        SELECT job_id, "user", "group",
               (epoch_us(submit) - {since}) / 1e6 AS submit_s,
               (epoch_us(start) - {since}) / 1e6 AS start_s,
               (epoch_us("end") - {since}) / 1e6 AS end_s,
               {_non_negative('coalesce(run_s, (epoch_us("end") - epoch_us(start)) / 1e6)')}
                   AS run_s,
               {_non_negative("coalesce(queue_s, (epoch_us(start) - epoch_us(submit)) / 1e6)")}
                   AS queue_s,
               {state_sql("state")} AS state,
               partition, num_nodes,
               coalesce(gpus_per_node, CASE WHEN num_nodes > 0 AND num_gpus % num_nodes = 0
                                            THEN num_gpus // num_nodes END) AS gpus_per_node,
               num_gpus, gpu_model, gpu_request, gpu_model_request, time_limit_s,
               {state_sql("state")} IN ('running', 'pending') AS censored
        FROM src ORDER BY submit_s, job_id
        """,
        params={"origin": release_start},
    ).to_arrow_table()
    return conform(JOBS, jobs), release_start


def _non_negative(expr: str) -> str:
    """Clock skew in sources gives a few negative delays; the format's minimum is 0."""
    return f"CASE WHEN {expr} < 0 THEN 0 ELSE {expr} END"
