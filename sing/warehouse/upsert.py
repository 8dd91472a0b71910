"""Record upserts (jobs, nodes, ...): a newer version of a record replaces the stored one.

sing writes them as it writes appends and compactions: the stored rows of every file that holds
a replaced record, less those records, and the batch's winning rows go into one new Parquet file,
durable before one commit adds it and removes the files it replaces. (delta-rs's own MERGE
wrote its files with Arrow string views, which Daft's Delta reader cannot read, and fsynced
nothing: sing fsynced them after the commit.)

A batch row wins when no stored row of its key is as new (`recorded_at`; a stored row of unknown
age is kept), as delta-rs's `when_matched_update_all(s.recorded_at > t.recorded_at)` with
`when_not_matched_insert_all` did; keys match when equal or both NULL.

The caller holds the table's lock, so on one machine nothing commits between the snapshot read
here and the commit. Another machine can (a leader handover while the old leader still syncs
jobs): when its commit removed a file that ours replaces, delta-rs refuses ours as a concurrent
delete, and the upsert is done again on the newer snapshot. It would not refuse a concurrent
insert of the same key, as MERGE did, so every upsert also rewrites the table's smallest file,
its anchor: two upserts made on one snapshot always remove a file in common. (A table's first
upsert has no file to anchor on.)
"""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from sing.schema import Table
from sing.warehouse import delta
from sing.warehouse.sql import copy_to_table_file, q, source_sql


def upsert(dt: DeltaTable, spec: Table, batch: pa.Table) -> None:
    """Write `batch` (one row per key) over the records of `dt`; returns once the commit, if
    any row won, is durable."""
    for attempt in range(1, delta.RACE_ATTEMPTS + 1):
        dt.update_incremental()
        try:
            _upsert_on_snapshot(dt, spec, batch)
            return
        except CommitFailedError:
            if attempt == delta.RACE_ATTEMPTS:
                raise
            time.sleep(0.05 * attempt)


def _upsert_on_snapshot(dt: DeltaTable, spec: Table, batch: pa.Table) -> None:
    """One try on the snapshot `dt` holds: the winning rows, the files they replace (and the
    anchor), one new file, one commit; nothing when no row wins."""
    live = delta.live_files(dt)
    keys = ", ".join(q(k) for k in spec.key)
    same_key = " AND ".join(f"s.{q(k)} IS NOT DISTINCT FROM t.{q(k)}" for k in spec.key)
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("batch", batch)
        stored = (
            " UNION ALL ".join(
                f"SELECT {i} AS file, {keys}, recorded_at FROM {source_sql(con, spec, [f.path])}"
                for i, f in enumerate(live)
            )
            or f"SELECT NULL::INTEGER AS file, {keys}, recorded_at FROM batch LIMIT 0"
        )
        con.execute(f"CREATE TEMP TABLE stored AS {stored}")
        con.execute(
            "CREATE TEMP TABLE winners AS SELECT * FROM batch s WHERE NOT EXISTS (SELECT 1 FROM "
            f"stored t WHERE {same_key} AND NOT coalesce(s.recorded_at > t.recorded_at, false))"
        )
        if not con.execute("SELECT count(*) FROM winners").fetchone()[0]:  # type: ignore[index]
            return
        replaced = [
            live[i]
            for (i,) in con.execute(
                f"SELECT DISTINCT t.file FROM stored t JOIN winners s ON {same_key} ORDER BY 1"
            ).fetchall()
        ]
        anchor = min(live, key=lambda f: (f.size, f.relative), default=None)
        if anchor is not None and anchor not in replaced:
            replaced.append(anchor)
        rows = "SELECT * FROM winners"
        if replaced:
            kept = source_sql(con, spec, [f.path for f in replaced])
            rows = (
                f"SELECT * FROM {kept} t WHERE NOT EXISTS "
                f"(SELECT 1 FROM winners s WHERE {same_key}) UNION ALL BY NAME {rows}"
            )
        columns = ", ".join(q(f.name) for f in spec.schema)
        query = f"SELECT {columns} FROM ({rows}) ORDER BY {keys}"
        add = copy_to_table_file(con, query, delta.location(dt), None, spec.time_column)
        removes = [delta.remove_action(f) for f in replaced]
        delta.commit(dt, [add, *removes], "upsert")
