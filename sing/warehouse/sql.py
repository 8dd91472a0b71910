"""SQL over a table's Parquet files, shared by the views and by maintenance, and the durable
files its queries write."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa
from deltalake.transaction import AddAction

from sing.schema import Table
from sing.warehouse import delta, files
from sing.warehouse.files import Location


def source_sql(con: duckdb.DuckDBPyConnection, spec: Table, paths: Sequence[Location]) -> str:
    """SQL for the table's rows in `paths` with the schema's columns and types."""
    columns = ", ".join(q(f.name) for f in spec.schema)
    empty = f"_empty_{spec.name}"
    con.register(empty, spec.schema.empty_table())
    if not paths:
        return f"(SELECT {columns} FROM {empty})"
    # The empty table supplies typed NULLs for columns added after some files were written.
    found = parquet_sql(con, paths, "union_by_name = true, hive_partitioning = false", spec.schema)
    return f"(SELECT {columns} FROM (FROM {empty} UNION ALL BY NAME FROM {found}))"


def copy_to_table_file(
    con: duckdb.DuckDBPyConnection,
    query: str,
    table_dir: Location,
    day: date | None,
    time_column: str | None,
) -> AddAction:
    """The rows of `query` as a new data file of the table, durable under its final name
    (`delta.publish`); the caller commits it."""
    tmp = delta.temporary_path(table_dir, day)
    con.execute(
        f"COPY ({query}) TO '{tmp}' "
        f"(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {files.ROW_GROUP_ROWS})"
    )
    return delta.publish(table_dir, day, tmp, time_column)


def parquet_sql(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[Location],
    options: str,
    schema: pa.Schema | None = None,
    day_base: Location | None = None,
    unify: bool = False,
) -> str:
    """`read_parquet(paths, options)` over local files. Object-store files are registered as
    an Arrow dataset instead (`files.parquet_dataset`) with the same meaning: `schema` the
    columns read (else the first file's, or all files' with `unify`), `day_base` the table
    whose `day=` directories are the partition."""
    if not paths or not files.is_uri(paths[0]):
        return f"read_parquet({sql_list(paths)}{', ' if options else ''}{options})"
    uris = [str(p) for p in paths]
    dataset = files.parquet_dataset(uris, schema, str(day_base) if day_base else None)
    if unify:
        found = pa.unify_schemas(
            [files.with_string_views(f.physical_schema) for f in dataset.get_fragments()]
        )
        if day_base and "day" not in found.names:
            found = found.append(pa.field("day", pa.date32()))
        dataset = files.parquet_dataset(uris, found, str(day_base) if day_base else None)
    name = f"_files_{uuid.uuid4().hex}"
    con.register(name, dataset)
    return name


def sql_list(paths: Sequence[Location | Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
