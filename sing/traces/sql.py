"""The DuckDB connection every trace step uses: in memory, UTC, quiet."""

from __future__ import annotations

import duckdb


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # no bar on a terminal mid-command output
    return con
