"""SQL over a table's Parquet files, shared by the views and by maintenance."""

from __future__ import annotations

from pathlib import Path

import duckdb

from sing.schema import Table


def source_sql(con: duckdb.DuckDBPyConnection, spec: Table, paths: list[Path]) -> str:
    """SQL for the table's rows in `paths` with the schema's columns and types."""
    columns = ", ".join(q(f.name) for f in spec.schema)
    empty = f"_empty_{spec.name}"
    con.register(empty, spec.schema.empty_table())
    if not paths:
        return f"(SELECT {columns} FROM {empty})"
    # The empty table supplies typed NULLs for columns added after some files were written.
    return (
        f"(SELECT {columns} FROM (FROM {empty} UNION ALL BY NAME FROM read_parquet("
        f"{sql_list(paths)}, union_by_name = true, hive_partitioning = false)))"
    )


def sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
