"""The warehouse: DuckDB over a directory of immutable Parquet files.

Why this layout (docs/warehouse.md has the long form): DuckDB lets one process hold a database
file read-write and then no other process may even read it, yet the collector writes all day
while dashboards and CLI reports read. Here no process holds anything: writers add files
atomically (see `warehouse.files`), readers open an in-memory DuckDB with views over the files
that are live at that moment. A writer killed with SIGKILL loses only the file it was writing;
any number of readers run beside any number of writers; Spark, Trino or DuckDB elsewhere can read
the same Hive-style Parquet tree.

    ROOT/_meta.json                          schema version
    ROOT/<samples table>/day=YYYY-MM-DD/*.parquet
    ROOT/<record table>/*.parquet            versions of records; the newest per key wins
    ROOT/_rollups/<rollup>/day=YYYY-MM-DD/*.parquet
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from sing.errors import UserError
from warehouse import files, migrations
from warehouse.rollups import ROLLUPS, Rollup, rollups_of
from warehouse.schema import TABLES, Table, table

log = logging.getLogger(__name__)

ROLLUP_DIR = "_rollups"
# Superseded files stay this long after the file covering them appeared, so a query that
# listed them before the merge can still read them.
GRACE_S = 300.0
# Files younger than this are not merged yet: a writer takes its sequence number just before its
# rename, so a merge never covers a number still in flight.
SETTLE_S = 10.0
# A samples day of today is merged once it has this many small files.
MERGE_TODAY_AT = 48
# A record table is merged once it has this many files.
MERGE_RECORDS_AT = 16

MICROS_PER_DAY = 86_400_000_000


@dataclass
class CompactionResult:
    merged_files: int = 0
    rollup_days: int = 0
    deleted_files: int = 0


class Warehouse:
    """A warehouse directory: append batches, open read-only snapshots, compact, age out."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        migrations.upgrade(self)

    # ---- writing -------------------------------------------------------------------------

    def append(self, name: str, data: pa.Table | pl.DataFrame) -> int:
        """Write one batch atomically; returns rows written.

        Samples are split by UTC day (one file per day the batch touches); records get
        `recorded_at` = now where missing, so re-sending a record replaces the older version.
        """
        spec = table(name)
        batch = conform(spec, data)
        if batch.num_rows == 0:
            return 0
        if spec.is_samples:
            parts = [
                (self.table_dir(name) / f"day={day.isoformat()}", part)
                for day, part in split_by_day(batch, spec.time_column)  # type: ignore[arg-type]
            ]
        else:
            parts = [(self.table_dir(name), batch)]
        # All files are written before any is published, so a batch spanning several days
        # becomes visible whole, unless the process dies within the few renames at the end.
        written = [
            (directory, tmp)
            for directory, part in parts
            for tmp in files.write_temporaries(directory, part)
        ]
        for directory, tmp in written:
            files.commit_written(tmp, directory)
        return batch.num_rows

    # ---- reading -------------------------------------------------------------------------

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A new in-memory DuckDB connection with a view per table and rollup.

        The views are a snapshot of the files live now; open a fresh connection for fresh data
        (it costs a directory listing). Nothing through them can change the warehouse.
        """
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        for spec in TABLES.values():
            _create_table_view(con, spec, self._live_table_files(spec))
        for rollup in ROLLUPS.values():
            stored, hot = self._rollup_sources(rollup)
            _create_rollup_view(con, rollup, stored, hot)
        return con

    def newest_time(self, name: str) -> datetime | None:
        """The newest time in a samples table, read from its newest day's files only."""
        days = self.day_dirs(self.table_dir(name))
        if not days:
            return None
        paths = [f.path for f in files.live_files(list(days.values())[-1])]
        if not paths:
            return None
        column = _q(table(name).time_column or "ts")
        con = duckdb.connect()
        try:
            return con.execute(
                f"SELECT max({column}) FROM read_parquet({_sql_list(paths)})"
            ).fetchone()[0]
        finally:
            con.close()

    def table_dir(self, name: str) -> Path:
        return self.root / name

    def rollup_dir(self, name: str) -> Path:
        return self.root / ROLLUP_DIR / name

    def day_dirs(self, base: Path) -> dict[date, Path]:
        if not base.is_dir():
            return {}
        out = {}
        for d in base.iterdir():
            if d.is_dir() and d.name.startswith("day="):
                out[date.fromisoformat(d.name[4:])] = d
        return dict(sorted(out.items()))

    def _live_table_files(self, spec: Table) -> list[Path]:
        if not spec.is_samples:
            return [f.path for f in files.live_files(self.table_dir(spec.name))]
        return [
            f.path
            for d in self.day_dirs(self.table_dir(spec.name)).values()
            for f in files.live_files(d)
        ]

    def _rollup_sources(self, rollup: Rollup) -> tuple[list[Path], list[Path]]:
        """(stored rollup files, raw files of days whose rollup is missing or stale)."""
        stored: list[Path] = []
        hot: list[Path] = []
        raw_days = self.day_dirs(self.table_dir(rollup.source))
        rolled_days = self.day_dirs(self.rollup_dir(rollup.name))
        for day in sorted(set(raw_days) | set(rolled_days)):
            raw = files.live_files(raw_days[day]) if day in raw_days else []
            rolled = files.live_files(rolled_days[day]) if day in rolled_days else []
            usable = usable_rollups(rolled, raw)
            pending = not_rolled_up(raw, usable)
            if pending and len(pending) < len(raw):  # stale while its raw is here: all live
                usable, pending = [], raw
            stored.extend(r.path for r in usable)
            hot.extend(f.path for f in pending)
        return stored, hot

    # ---- maintenance ---------------------------------------------------------------------

    @contextmanager
    def _maintenance_lock(self) -> Iterator[bool]:
        """One compactor at a time; a second one skips instead of waiting."""
        with open(self.root / ".maintenance.lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def compact(self, now: datetime | None = None, settle_s: float = SETTLE_S) -> CompactionResult:
        """Merge small files, roll up closed days, delete superseded files after the grace time.

        Safe to run at any time beside writers and readers (the collector runs it periodically).
        `settle_s=0` is only for a sole writer that has finished (bulk loads, tests).
        """
        now = now or datetime.now(UTC)
        result = CompactionResult()
        with self._maintenance_lock() as held:
            if not held:
                return result
            settle_seq = files.next_sequence() - int(settle_s * 1e9)
            con = duckdb.connect()
            con.execute("SET TimeZone = 'UTC'")
            for spec in TABLES.values():
                if spec.is_samples:
                    self._compact_samples(con, spec, now.date(), settle_seq, result)
                else:
                    self._compact_records(con, spec, settle_seq, result)
            con.close()
            result.deleted_files = self._delete_superseded()
        return result

    def _compact_samples(
        self,
        con: duckdb.DuckDBPyConnection,
        spec: Table,
        today: date,
        settle_seq: int,
        result: CompactionResult,
    ) -> None:
        rollups = rollups_of(spec.name)
        for day, day_dir in self.day_dirs(self.table_dir(spec.name)).items():
            live = files.live_files(day_dir)
            settled = [f for f in live if f.last < settle_seq]
            closed = day < today
            if len(settled) > 1 and (closed or len(settled) >= MERGE_TODAY_AT):
                _merge(con, settled, day_dir, order_by=spec.time_column)
                result.merged_files += len(settled)
                live = files.live_files(day_dir)
            if not closed or len(live) != 1 or live[0].last >= settle_seq:
                continue
            for rollup in rollups:
                out = self.rollup_dir(rollup.name) / f"day={day.isoformat()}"
                if not not_rolled_up(live, usable_rollups(files.live_files(out), live)):
                    continue
                src = _source_sql(con, spec, [live[0].path])
                tmp = files.temporary_path(out)
                con.execute(
                    f"COPY ({rollup.select.replace('FROM src', f'FROM {src}')}) TO '{tmp}' "
                    "(FORMAT parquet, COMPRESSION zstd)"
                )
                files.commit_written(tmp, out, covering=live)
                result.rollup_days += 1

    def _compact_records(
        self, con: duckdb.DuckDBPyConnection, spec: Table, settle_seq: int, result: CompactionResult
    ) -> None:
        directory = self.table_dir(spec.name)
        settled = [f for f in files.live_files(directory) if f.last < settle_seq]
        if len(settled) >= MERGE_RECORDS_AT:
            _merge(con, settled, directory, dedupe_key=spec.key)
            result.merged_files += len(settled)

    def _delete_superseded(self) -> int:
        deleted = 0
        cutoff = time.time() - GRACE_S
        for directory in self._all_data_dirs():
            for old, cover in files.superseded_files(directory):
                if cover.path.stat().st_mtime < cutoff:
                    old.path.unlink(missing_ok=True)
                    deleted += 1
            files.remove_stale_temporaries(directory, older_than_s=GRACE_S)
        return deleted

    def _all_data_dirs(self) -> Iterator[Path]:
        for spec in TABLES.values():
            if spec.is_samples:
                yield from self.day_dirs(self.table_dir(spec.name)).values()
            else:
                yield self.table_dir(spec.name)
        for rollup in ROLLUPS.values():
            yield from self.day_dirs(self.rollup_dir(rollup.name)).values()

    def apply_retention(self, raw_days: int, now: datetime | None = None) -> list[Path]:
        """Drop raw sample days older than `raw_days` whose rollups are stored.

        Whole day directories go, since Parquet files (like DuckDB files) never shrink by
        deleting rows. Days without current rollups are kept, so no summary is ever lost.
        """
        now = now or datetime.now(UTC)
        horizon = (now - timedelta(days=raw_days)).date()
        removed = []
        for spec in TABLES.values():
            if not spec.is_samples:
                continue
            for day, day_dir in self.day_dirs(self.table_dir(spec.name)).items():
                if day >= horizon:
                    continue
                live = files.live_files(day_dir)
                if not any(
                    not_rolled_up(live, usable_rollups(files.live_files(d), live))
                    for d in (
                        self.rollup_dir(r.name) / f"day={day.isoformat()}"
                        for r in rollups_of(spec.name)
                    )
                ):
                    shutil.rmtree(day_dir)
                    removed.append(day_dir)
        return removed


def _inside(f: files.DataFile, r: files.DataFile) -> bool:
    return r.first <= f.first and f.last <= r.last


def usable_rollups(rolled: list[files.DataFile], raw: list[files.DataFile]) -> list[files.DataFile]:
    """Stored rollup files no live raw file straddles: each raw file is inside one or outside it.

    A rollup file covers the sequence range of the raw file it was built from; a raw file that
    overlaps that range without being inside it was merged from it plus later data, so the
    rollup is stale and the merged raw file is aggregated live instead."""
    return [
        r
        for r in rolled
        if not any(f.first <= r.last and r.first <= f.last and not _inside(f, r) for f in raw)
    ]


def not_rolled_up(raw: list[files.DataFile], usable: list[files.DataFile]) -> list[files.DataFile]:
    """Raw files no usable rollup summarises yet: the view aggregates these live."""
    return [f for f in raw if not any(_inside(f, r) for r in usable)]


def conform(spec: Table, data: pa.Table | pl.DataFrame) -> pa.Table:
    """Cast a batch to the table's schema: fill missing nullable columns, reject unknown ones."""
    if isinstance(data, pl.DataFrame):
        data = data.to_arrow()
    unknown = [c for c in data.column_names if c not in spec.schema.names]
    if unknown:
        raise UserError(
            f"table {spec.name}: unknown column(s) {', '.join(unknown)}; "
            f"columns are {', '.join(spec.schema.names)}"
        )
    columns = []
    for field in spec.schema:
        if field.name in data.column_names:
            column = data.column(field.name)
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise UserError(
                    f"table {spec.name}, column {field.name}: cannot convert {column.type} "
                    f"to {field.type}: {err}"
                ) from err
        elif field.name == "recorded_at":
            column = _recorded_now(data.num_rows, field.type)
        else:
            column = pa.nulls(data.num_rows, field.type)
        columns.append(column)
    batch = pa.Table.from_arrays(columns, schema=spec.schema)
    if "recorded_at" in spec.schema.names and batch.column("recorded_at").null_count:
        recorded = batch.column("recorded_at")
        filled = pc.if_else(
            pc.is_null(recorded), _recorded_now(batch.num_rows, recorded.type), recorded
        )
        batch = batch.set_column(spec.schema.get_field_index("recorded_at"), "recorded_at", filled)
    required = spec.key or (spec.time_column, "node")
    for name in required:
        nulls = batch.column(name).null_count
        if nulls:
            row = pc.index(pc.is_null(batch.column(name)), True).as_py()
            raise UserError(f"table {spec.name}: column {name} is empty in row {row + 1}")
    return batch


def _recorded_now(rows: int, dtype: pa.DataType) -> pa.Array:
    """Now, one microsecond apart per row, so a later row of a batch wins over an earlier one
    for the same key (a job sent RUNNING then COMPLETED in one batch ends COMPLETED)."""
    start = int(datetime.now(UTC).timestamp() * 1_000_000)
    return pa.array(np.arange(start, start + rows, dtype=np.int64)).cast(dtype)


def split_by_day(batch: pa.Table, time_column: str) -> Iterator[tuple[date, pa.Table]]:
    """Yield (UTC day, rows of that day); zero-copy slices when the batch is sorted by time."""
    micros = batch.column(time_column).cast(pa.int64()).to_numpy()
    days = micros // MICROS_PER_DAY
    if len(days) > 1 and np.any(days[1:] < days[:-1]):
        order = np.argsort(days, kind="stable")
        batch, days = batch.take(order), days[order]
    bounds = np.flatnonzero(np.diff(days)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(days)]))
    epoch = date(1970, 1, 1)
    for start, end in zip(starts, ends, strict=True):
        yield epoch + timedelta(days=int(days[start])), batch.slice(start, end - start)


def _merge(
    con: duckdb.DuckDBPyConnection,
    merged: list[files.DataFile],
    directory: Path,
    order_by: str | None = None,
    dedupe_key: tuple[str, ...] = (),
) -> None:
    source = f"read_parquet({_sql_list([f.path for f in merged])}, union_by_name = true)"
    query = f"SELECT * FROM {source}"
    if dedupe_key:
        query += f" QUALIFY row_number() OVER (PARTITION BY {', '.join(_q(k) for k in dedupe_key)}"
        query += " ORDER BY recorded_at DESC) = 1"
    if order_by:
        query += f" ORDER BY {_q(order_by)}"
    tmp = files.temporary_path(directory)
    con.execute(
        f"COPY ({query}) TO '{tmp}' "
        f"(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {files.ROW_GROUP_ROWS})"
    )
    files.commit_written(tmp, directory, covering=merged)


def _create_table_view(con: duckdb.DuckDBPyConnection, spec: Table, paths: list[Path]) -> None:
    source = _source_sql(con, spec, paths)
    if spec.is_samples:
        con.execute(f"CREATE VIEW {spec.name} AS SELECT * FROM {source}")
    else:
        keys = ", ".join(_q(k) for k in spec.key)
        con.execute(
            f"CREATE VIEW {spec.name} AS SELECT * FROM {source} "
            f"QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY recorded_at DESC) = 1"
        )


def _create_rollup_view(
    con: duckdb.DuckDBPyConnection, rollup: Rollup, stored: list[Path], hot: list[Path]
) -> None:
    live = rollup.select.replace("FROM src", f"FROM {_source_sql(con, table(rollup.source), hot)}")
    # Stored files are read by column name: files rolled up before a column was added lack it
    # and read as NULL there (readers treat such rows as written before the change).
    if stored:
        query = (
            f"SELECT * FROM read_parquet({_sql_list(stored)}, hive_partitioning = false, "
            "union_by_name = true) "
            f"UNION ALL BY NAME {live}"
        )
    else:
        query = live
    con.execute(f"CREATE VIEW {rollup.name} AS {query}")


def _source_sql(con: duckdb.DuckDBPyConnection, spec: Table, paths: list[Path]) -> str:
    """SQL for the table's rows in `paths` with the schema's columns and types."""
    columns = ", ".join(_q(f.name) for f in spec.schema)
    empty = f"_empty_{spec.name}"
    con.register(empty, spec.schema.empty_table())
    if not paths:
        return f"(SELECT {columns} FROM {empty})"
    # The empty table supplies typed NULLs for columns added after some files were written.
    return (
        f"(SELECT {columns} FROM (FROM {empty} UNION ALL BY NAME FROM read_parquet("
        f"{_sql_list(paths)}, union_by_name = true, hive_partitioning = false)))"
    )


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
