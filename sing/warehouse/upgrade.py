"""The upgrade of a warehouse of the old file format (version 2) to Delta tables, in place.

A table is converted iff it is a Delta table: its creation is one commit that adopts every row
(sample files at their existing paths; records rewritten as one row per key; the rollups of days
whose raw samples retention removed, as `kept-` files). So an interrupted upgrade shows the old
data or the whole new table, never half, and running it again goes on where it stopped. Files
the old format no longer needs go only after their table's creation is durable.
"""

from __future__ import annotations

import fcntl
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions

from sing.schema import TABLES, Table
from sing.warehouse import delta, legacy, maintenance
from sing.warehouse.rollups import KEPT, ROLLUPS, Rollup
from sing.warehouse.sql import q, source_sql, sql_list

if TYPE_CHECKING:
    from sing.warehouse.store import Warehouse


def to_delta(wh: Warehouse) -> None:
    """Convert every table; rollups first, since which of their days to keep depends on the
    old raw day directories."""
    with open(wh.root / ".upgrade.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        try:
            for rollup in ROLLUPS.values():
                _convert_rollup(wh, con, rollup)
            shutil.rmtree(wh.root / legacy.ROLLUP_DIR, ignore_errors=True)
            for spec in TABLES.values():
                if spec.is_samples:
                    _convert_samples(wh, spec)
                else:
                    _convert_records(wh, con, spec)
                _remove_old_files(wh.table_dir(spec.name))
        finally:
            con.close()
    wh.compact()  # rolls up every day whose rollup was not kept


def _convert_samples(wh: Warehouse, spec: Table) -> None:
    table_dir = wh.table_dir(spec.name)
    if not table_dir.is_dir() or DeltaTable.is_deltatable(str(table_dir)):
        return
    adds = [
        delta.add_action(table_dir, f.path, day, spec.time_column)
        for day, day_dir in legacy.day_dirs(table_dir).items()
        for f in legacy.live_files(day_dir)
    ]
    _create(table_dir, delta.table_schema(spec.schema, partitioned=True), adds, [delta.DAY])


def _convert_records(wh: Warehouse, con: duckdb.DuckDBPyConnection, spec: Table) -> None:
    table_dir = wh.table_dir(spec.name)
    if not table_dir.is_dir() or DeltaTable.is_deltatable(str(table_dir)):
        return
    live = [f.path for f in legacy.live_files(table_dir)]
    adds = []
    if live:
        keys = ", ".join(q(k) for k in spec.key)
        tmp = delta.temporary_path(table_dir, None)
        con.execute(
            f"COPY (SELECT * FROM {source_sql(con, spec, live)} QUALIFY row_number() OVER "
            f"(PARTITION BY {keys} ORDER BY recorded_at DESC) = 1) TO '{tmp}' (FORMAT parquet)"
        )
        adds.append(delta.publish(table_dir, None, tmp, None))
    _create(table_dir, spec.schema, adds, [])


def _convert_rollup(wh: Warehouse, con: duckdb.DuckDBPyConnection, rollup: Rollup) -> None:
    """Keep the stored rollup of each day whose raw samples are gone; the others are rebuilt."""
    table_dir = wh.table_dir(rollup.name)
    if DeltaTable.is_deltatable(str(table_dir)):
        return
    schema = maintenance.rollup_schema(con, rollup)
    columns = [f for f in schema if f.name != delta.DAY]
    con.register("_empty_rollup", schema.remove(schema.get_field_index(delta.DAY)).empty_table())
    raw_days = legacy.day_dirs(wh.table_dir(rollup.source))
    adds = []
    old_days = legacy.day_dirs(wh.root / legacy.ROLLUP_DIR / rollup.name)
    for day, day_dir in old_days.items():
        stored = [f.path for f in legacy.live_files(day_dir)]
        if not stored or _has_raw(raw_days.get(day)):
            continue
        tmp = delta.temporary_path(table_dir, day)
        names = ", ".join(q(f.name) for f in columns)
        con.execute(
            f"COPY (SELECT {names} FROM (FROM _empty_rollup UNION ALL BY NAME FROM read_parquet("
            f"{sql_list(stored)}, union_by_name = true, hive_partitioning = false))) "
            f"TO '{tmp}' (FORMAT parquet, COMPRESSION zstd)"
        )
        name = f"{KEPT}legacy-{uuid.uuid4().hex[:8]}.parquet"
        adds.append(delta.publish(table_dir, day, tmp, None, name=name))
    _create(table_dir, schema, adds, [delta.DAY])


def _has_raw(day_dir: Path | None) -> bool:
    return day_dir is not None and bool(legacy.live_files(day_dir))


def _create(
    table_dir: Path, schema: pa.Schema, adds: list[AddAction], partition_by: list[str]
) -> None:
    """The one commit that makes the converted table exist, then durable."""
    table_dir.mkdir(parents=True, exist_ok=True)
    delta.crash_point("upgrade-adopting")
    create_table_with_add_actions(
        str(table_dir),
        Schema.from_arrow(schema),
        adds,
        mode="error",
        partition_by=partition_by or None,
        configuration=delta.CONFIG,
        commit_properties=CommitProperties(custom_metadata={"sing.op": "upgrade"}),
        post_commithook_properties=delta.NO_HOOKS,
    )
    dt = delta.open_table(table_dir)
    assert dt is not None
    delta.sync_log(dt)
    delta.crash_point("upgrade-adopted")


def _remove_old_files(table_dir: Path) -> None:
    """Delete old-format files the new log does not refer to (superseded files, versions of
    records, temporaries of killed writers)."""
    dt = delta.open_table(table_dir)
    if dt is None:
        return
    referenced = {f.path for f in delta.live_files(dt)}
    for directory in [table_dir, *legacy.day_dirs(table_dir).values()]:
        for old in legacy.data_files(directory):
            if old.path not in referenced:
                old.path.unlink()
        for tmp in directory.glob(".tmp-*"):
            tmp.unlink()
