"""Maintenance of the Delta tables: compaction, rollup builds, retention, checkpoints, vacuum.

All of it runs under the warehouse's maintenance lock (one maintainer at a time; on object
storage also its lease, checked before each step: a maintainer that lost it stops), and whatever
removes files also holds the table's lock and decides on a snapshot refreshed inside it: delta-rs
re-adds files that a stale snapshot still lists, so two compactions must never overlap.
Merged and rolled-up files go through the same durable writer as appends (`delta.publish`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from sing.schema import TABLES, Table, table
from sing.warehouse import delta, files
from sing.warehouse.delta import LiveFile
from sing.warehouse.files import Location
from sing.warehouse.lease import LeaseLost
from sing.warehouse.rollups import KEPT, OF, ROLLUPS, Rollup, plan_day, rollups_of
from sing.warehouse.sql import copy_to_table_file, q, source_sql

if TYPE_CHECKING:
    from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)

# Removed files are deleted this long after their removal (whole hours: Delta's unit), longer
# than any reader's query; a connection older than this may find its files gone.
GRACE_S = 3600
# A samples day of today is merged once it has this many small files.
MERGE_TODAY_AT = 16
# A record table is merged once it has this many files.
MERGE_RECORDS_AT = 16  # (or at once while a file has string views: `_has_string_views`)
# A checkpoint once this many commits follow the last one: appends cost more as they grow.
CHECKPOINT_EVERY = 10


@dataclass
class CompactionResult:
    merged_files: int = 0
    rollup_days: int = 0
    deleted_files: int = 0


def compact(wh: Warehouse, now: datetime) -> CompactionResult:
    """Merge small files, roll up closed days, then checkpoint and vacuum every table."""
    result = CompactionResult()
    with wh.maintenance_lock() as held:
        if not held:
            return result
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        try:
            for spec in TABLES.values():
                with wh.table_lock(spec.name):
                    wh.check_maintainer()
                    _merge_small_files(wh, con, spec, now.date(), result)
                for rollup in rollups_of(spec.name):
                    wh.check_maintainer()
                    _build_rollup(wh, con, rollup, now.date(), result)
            for name in [*TABLES, *ROLLUPS]:
                wh.check_maintainer()
                result.deleted_files += tidy(wh, name)
        except LeaseLost as err:
            log.warning("%s: maintenance stopped: %s", wh.root, err)
        finally:
            con.close()
    return result


def _merge_small_files(
    wh: Warehouse,
    con: duckdb.DuckDBPyConnection,
    spec: Table,
    today: date,
    result: CompactionResult,
) -> None:
    """Samples: each closed day into one file (today once it has many); records: all files into
    one once there are many. One commit per merge: the new file added, its inputs removed."""
    dt = wh.open(spec.name)
    if dt is None:
        return
    if not spec.is_samples:
        live = delta.live_files(dt)
        if len(live) >= MERGE_RECORDS_AT or any(_has_string_views(f.path) for f in live):
            _merge(con, dt, spec, wh.table_dir(spec.name), None, live, order_by=spec.key)
            result.merged_files += len(live)
        return
    kept = _kept_sources(wh, spec.name)
    for day, day_files in _by_day(delta.live_files(dt, spec.time_column)).items():
        # A raw file whose summary retention already kept is about to go: never merge it.
        mergeable = [f for f in day_files if f.stem not in kept]
        if len(mergeable) > 1 and (day < today or len(mergeable) >= MERGE_TODAY_AT):
            order = (spec.time_column,) if spec.time_column else ()
            _merge(con, dt, spec, wh.table_dir(spec.name), day, mergeable, order_by=order)
            result.merged_files += len(mergeable)


@lru_cache(maxsize=4096)  # a file's schema never changes; a record table has a few live files
def _has_string_views(path: Location) -> bool:
    """Whether the file's embedded Arrow schema has string views, which delta-rs's merges wrote
    before sing wrote its own upserts (sing/warehouse/upsert.py) and Daft's Delta reader cannot
    read: such a record table is merged into one file of plain strings at once."""
    if isinstance(path, str):
        schema = pq.read_schema(files.key(path), filesystem=files.object_store())
    else:
        schema = pq.read_schema(path)
    return any(pa.types.is_string_view(field.type) for field in schema)


def _merge(
    con: duckdb.DuckDBPyConnection,
    dt: delta.DeltaTable,
    spec: Table,
    table_dir: Location,
    day: date | None,
    merged: list[LiveFile],
    order_by: tuple[str, ...],
) -> None:
    query = f"SELECT * FROM {source_sql(con, spec, [f.path for f in merged])}"
    if order_by:
        query += f" ORDER BY {', '.join(q(c) for c in order_by)}"
    add = copy_to_table_file(con, query, table_dir, day, spec.time_column)
    add.data_change = False
    removes = [delta.remove_action(f, data_change=False) for f in merged]
    delta.commit(dt, [add, *removes], "compact")
    delta.crash_point("compaction-committed")


def _build_rollup(
    wh: Warehouse,
    con: duckdb.DuckDBPyConnection,
    rollup: Rollup,
    today: date,
    result: CompactionResult,
) -> None:
    """For each closed day: an `of-` rollup file for every raw file not summarised yet, and the
    removal of `of-` files whose raw file compaction merged away, in one commit per day."""
    source = wh.open(rollup.source)
    if source is None:
        return
    spec = table(rollup.source)
    raw = _by_day(delta.live_files(source))
    rolled_dt = delta.ensure_table(
        wh.table_dir(rollup.name), rollup_schema(con, rollup), [delta.DAY]
    )
    rolled = _by_day(delta.live_files(rolled_dt))
    for day, day_raw in raw.items():
        if day >= today:
            continue
        day_rolled = rolled.get(day, [])
        kept = {r.stem.removeprefix(KEPT) for r in day_rolled if r.stem.startswith(KEPT)}
        pending = {f.stem: f for f in day_raw if f.stem not in kept}
        have = {r.stem.removeprefix(OF) for r in day_rolled if r.stem.startswith(OF)}
        adds = [
            _write_rollup_file(con, rollup, spec, wh.table_dir(rollup.name), day, f)
            for stem, f in pending.items()
            if stem not in have
        ]
        stale = [
            r for r in day_rolled if r.stem.startswith(OF) and r.stem[len(OF) :] not in pending
        ]
        if adds or stale:
            actions = [*adds, *(delta.remove_action(r) for r in stale)]
            delta.commit(rolled_dt, actions, "rollup", **{"sing.source_version": source.version()})
            delta.crash_point("rollup-committed")
            result.rollup_days += 1


def _write_rollup_file(
    con: duckdb.DuckDBPyConnection,
    rollup: Rollup,
    spec: Table,
    rollup_dir: Location,
    day: date,
    raw: LiveFile,
) -> delta.AddAction:
    tmp = delta.temporary_path(rollup_dir, day)
    select = rollup.select.replace("FROM src", f"FROM {source_sql(con, spec, [raw.path])}")
    # `day` is the partition: it lives in the path and the log, not in the file.
    con.execute(
        f"COPY (SELECT * EXCLUDE (day) FROM ({select})) TO '{tmp}' "
        "(FORMAT parquet, COMPRESSION zstd)"
    )
    return delta.publish(rollup_dir, day, tmp, None, name=f"{OF}{raw.stem}.parquet")


def rollup_schema(con: duckdb.DuckDBPyConnection, rollup: Rollup) -> pa.Schema:
    """The rollup's columns as DuckDB computes them, with `day` as the partition column."""
    select = rollup.select.replace("FROM src", f"FROM {source_sql(con, table(rollup.source), [])}")
    empty = con.sql(f"SELECT * EXCLUDE (day) FROM ({select}) LIMIT 0").to_arrow_table()
    return delta.table_schema(empty.schema, partitioned=True)


def apply_retention(wh: Warehouse, horizon: date) -> list[Location]:
    """Remove the raw files of sample days before `horizon` that every rollup summarises
    (raw telemetry only: the other samples tables are kept whole).

    Two commits per day, in an order that is exact at every moment: first each rollup's `of-`
    files become `kept-` files (a hard link under the new name), which readers count while the
    raw file is excluded; then the raw files are removed."""
    removed: list[Location] = []
    with wh.maintenance_lock() as held:
        if not held:
            return removed
        for spec in TABLES.values():
            if not (spec.is_samples and spec.raw) or wh.open(spec.name) is None:
                continue
            rollups = rollups_of(spec.name)
            for day, day_raw in _by_day(wh.live_files(spec.name)).items():
                if day >= horizon:
                    continue
                rolled = {r.name: _by_day(wh.live_files(r.name)).get(day, []) for r in rollups}
                if any(plan_day(day_raw, rolled[r.name])[1] or not rolled[r.name] for r in rollups):
                    continue  # some raw file not summarised yet: keep the day
                try:
                    wh.check_maintainer()
                except LeaseLost as err:
                    log.warning("%s: retention stopped: %s", wh.root, err)
                    return removed
                for rollup in rollups:
                    _keep_rollup(wh, rollup, day, rolled[rollup.name])
                with wh.table_lock(spec.name):
                    dt = wh.open(spec.name)
                    assert dt is not None
                    covered = {f.stem for f in day_raw}
                    gone = [f for f in delta.live_files(dt) if f.day == day and f.stem in covered]
                    delta.commit(dt, [delta.remove_action(f) for f in gone], "retention")
                removed.append(
                    files.join(wh.table_dir(spec.name), f"{delta.DAY}={day.isoformat()}")
                )
    return removed


def _keep_rollup(wh: Warehouse, rollup: Rollup, day: date, day_rolled: list[LiveFile]) -> None:
    current = [r for r in day_rolled if r.stem.startswith(OF)]
    if not current:
        return
    adds = []
    for r in current:
        kept = (
            r.relative.removesuffix(f"{r.stem}.parquet")
            + f"{KEPT}{r.stem.removeprefix(OF)}.parquet"
        )
        files.link(r.path, files.join(wh.table_dir(rollup.name), kept))
        adds.append(delta.copy_action(r, kept))
    dt = wh.open(rollup.name)
    assert dt is not None
    delta.commit(dt, [*adds, *(delta.remove_action(r) for r in current)], "retention")


def checkpoint_due(wh: Warehouse, names: Collection[str] | None = None) -> list[str]:
    """Checkpoint the tables (`names`, else all) whose logs have `CHECKPOINT_EVERY` commits
    since their last checkpoint; returns their names. Each commit re-reads the entries since
    the checkpoint, so a writer calls this after each round, for the tables it wrote, to keep
    commits cheap between compactions. It skips when a maintainer is at work (that one
    checkpoints too) and costs a few stats otherwise, a few object reads per table on object
    storage (the lock, and there the lease, is taken only when some log is long)."""
    done: list[str] = []
    tables = {
        name: delta.open_table(wh.table_dir(name), refresh=False)
        for name in (names if names is not None else [*TABLES, *ROLLUPS])
    }
    due = {
        name: dt
        for name, dt in tables.items()
        if dt is not None and delta.versions_since_checkpoint(dt) >= CHECKPOINT_EVERY
    }
    if not due:
        return done
    with wh.maintenance_lock(quiet=True) as held:
        if not held:
            return done
        for name, dt in due.items():
            try:
                wh.check_maintainer()
            except LeaseLost as err:
                log.warning("%s: checkpoints stopped: %s", wh.root, err)
                break
            if _checkpoint_if_long(wh, name, dt):
                done.append(name)
    return done


def _checkpoint_if_long(wh: Warehouse, name: str, dt: delta.DeltaTable) -> bool:
    """Checkpoint the table once `CHECKPOINT_EVERY` commits follow its last checkpoint."""
    if delta.versions_since_checkpoint(dt) < CHECKPOINT_EVERY:
        return False
    with wh.table_lock(name):
        delta.checkpoint(dt)
    return True


def tidy(wh: Warehouse, name: str) -> int:
    """Checkpoint a long log, drop expired log entries, vacuum removed and orphaned files and
    old temporaries; returns how many data files were deleted."""
    dt = wh.open(name)
    if dt is None:
        return 0
    _checkpoint_if_long(wh, name, dt)
    with wh.table_lock(name):
        dt.update_incremental()
        deleted = delta.vacuum(dt, GRACE_S // 3600)
    table_dir = wh.table_dir(name)
    if isinstance(table_dir, str):  # object storage: temporaries are in the local spool
        files.remove_stale_temporaries(files.spool_path().parent, delta.TMP_SUFFIX, GRACE_S)
        return len(deleted)
    files.remove_stale_temporaries(table_dir, delta.TMP_SUFFIX, GRACE_S)
    cutoff = time.time() - GRACE_S
    for leftover in (table_dir / "_delta_log").glob("*.json#*"):  # commits killed mid-way
        if leftover.stat().st_mtime < cutoff:
            leftover.unlink(missing_ok=True)
    return len(deleted)


def _kept_sources(wh: Warehouse, source: str) -> set[str]:
    return {
        f.stem.removeprefix(KEPT)
        for r in rollups_of(source)
        for f in wh.live_files(r.name)
        if f.stem.startswith(KEPT)
    }


def _by_day(live: list[LiveFile]) -> dict[date, list[LiveFile]]:
    out: dict[date, list[LiveFile]] = defaultdict(list)
    for f in live:
        if f.day is not None:
            out[f.day].append(f)
    return dict(sorted(out.items()))
