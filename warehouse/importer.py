"""`sing warehouse import`: load a CSV or Parquet file into one warehouse table.

CSV is read as text first and every value is checked against its column's type, so a bad value
is reported with file, row and column, and nothing is written unless the whole file is good.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from sing.errors import UserError
from warehouse.schema import table
from warehouse.store import Warehouse, conform

# DuckDB types that check CSV text for each Arrow type of the schema.
_DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "REAL",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


def import_file(wh: Warehouse, table_name: str, path: Path) -> int:
    """Load `path` into `table_name`; returns rows written. Raises UserError on bad input."""
    spec = table(table_name)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        try:
            data = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise UserError(f"{path}: not a readable Parquet file: {err}") from err
    else:
        data = _read_csv(path, spec)
    try:
        batch = conform(spec, data)
    except UserError as err:
        raise UserError(f"{path}: {err}") from err
    return wh.append(table_name, batch)


def _read_csv(path: Path, spec) -> pa.Table:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    try:
        con.execute(
            "CREATE TABLE raw AS SELECT row_number() OVER () AS __row, * "
            "FROM read_csv(?, all_varchar = true, header = true)",
            [str(path)],
        )
    except duckdb.Error as err:
        raise UserError(f"{path}: cannot read as CSV: {err}") from err
    columns = [c for c in con.sql("SELECT * FROM raw LIMIT 0").columns]
    unknown = [c for c in columns[1:] if c not in spec.schema.names]
    if unknown:
        raise UserError(
            f"{path}: unknown column(s) {', '.join(unknown)} for table {spec.name}; "
            f"columns are {', '.join(spec.schema.names)}"
        )
    selects = []
    for field in spec.schema:
        if field.name not in columns:
            continue
        expr, sql_type = _typed(field)
        bad = con.execute(
            f'SELECT __row, "{field.name}" FROM raw WHERE "{field.name}" IS NOT NULL '
            f"AND trim(\"{field.name}\") <> '' AND {expr} IS NULL ORDER BY __row LIMIT 1"
        ).fetchone()
        if bad:
            raise UserError(
                f"{path}: row {bad[0]} (line {bad[0] + 1}), column {field.name}: "
                f"{bad[1]!r} is not a valid {sql_type}"
            )
        selects.append(
            f'CASE WHEN trim("{field.name}") = \'\' THEN NULL ELSE {expr} END AS "{field.name}"'
        )
    return con.sql(f"SELECT {', '.join(selects)} FROM raw ORDER BY __row").to_arrow_table()


def _typed(field: pa.Field) -> tuple[str, str]:
    """SQL converting the text column to the field's type (NULL where it cannot)."""
    col = f'"{field.name}"'
    if pa.types.is_timestamp(field.type):
        return f"TRY_CAST({col} AS TIMESTAMPTZ)", "ISO 8601 time such as 2026-01-05T10:00:00Z"
    if pa.types.is_list(field.type):
        return (
            f"string_split(regexp_replace(trim({col}), '\\s*,\\s*', ',', 'g'), ',')",
            "comma-separated list",
        )
    sql_type = _DUCKDB_TYPES[field.type]
    if pa.types.is_integer(field.type):  # TRY_CAST('1.5' AS INTEGER) would round to 2
        return (
            f"CASE WHEN regexp_full_match(trim({col}), '[+-]?[0-9]+') "
            f"THEN TRY_CAST({col} AS {sql_type}) END",
            sql_type,
        )
    return f"TRY_CAST({col} AS {sql_type})", sql_type
