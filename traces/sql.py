"""The DuckDB connection every trace step uses: in memory, UTC, quiet.

Opening an in-memory DuckDB database costs about 30 ms here (its catalog of built-in functions
is built each time), more than a small trace's whole import, and one command opens several. Each
thread therefore keeps one database and every step gets its own connection to it (a cursor):
what a step registers or sets lives in its connection and goes with it, so steps stay isolated.
"""

from __future__ import annotations

import threading

import duckdb

_per_thread = threading.local()


def connect() -> duckdb.DuckDBPyConnection:
    database = getattr(_per_thread, "database", None)
    if database is None:
        database = _per_thread.database = duckdb.connect()
    con = database.cursor()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # no bar on a terminal mid-command output
    return con
