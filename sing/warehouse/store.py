"""The warehouse: one Delta Lake table per table and rollup, queried through DuckDB.

Why Delta Lake (docs/warehouse.md has the long form): the table's log says which Parquet files
make up each version, so every engine that reads Delta (Spark, Trino, polars, pyarrow, DuckDB
over the listed files) sees exactly the rows sing sees, during and after compaction. Writers
commit whole batches atomically (`sing.warehouse.delta`); readers open an in-memory DuckDB with
views over the files of the newest version; nothing holds a database open, so any number of readers
run beside the collector.

ROOT is a local directory or an object-store URI (`s3://bucket/prefix`: docs/deploy.md). On
object storage there is nothing to repair (a PUT is whole), and the locks below are taken on
this host only; what makes writers on several hosts safe there is the store's conditional put,
checked when a writer first opens the warehouse (`check_conditional_put`), and what keeps
maintainers on several hosts apart is a lease taken by the same conditional put (`lease`).

    ROOT/_meta.json                                 schema version
    ROOT/<samples table>/_delta_log/, day=YYYY-MM-DD/*.parquet
    ROOT/<record table>/_delta_log/, *.parquet      one row per key (upserts are merges)
    ROOT/<rollup>/_delta_log/, day=YYYY-MM-DD/*.parquet
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

from sing.errors import UserError
from sing.schema import TABLES, Table, table
from sing.warehouse import delta, files, lease, maintenance, migrations
from sing.warehouse.delta import LiveFile
from sing.warehouse.files import Location
from sing.warehouse.maintenance import CompactionResult
from sing.warehouse.rollups import ROLLUPS, Rollup, plan_day
from sing.warehouse.sql import parquet_sql, q, source_sql
from sing.warehouse.upsert import upsert

if TYPE_CHECKING:  # polars is not imported at run time: the collector's process stays small
    import polars as pl

log = logging.getLogger(__name__)

MICROS_PER_DAY = 86_400_000_000
# Commit metadata naming the sample batches a commit holds (see `Warehouse.append`).
BATCHES = "sing.batches"
# How many of a table's newest commits `landed` reads at least: a retry comes a round or two
# later, after a commit or two of each other collector writing the warehouse.
RETRY_HISTORY = 256
# ...and further back, to this long before the oldest batch was made: with 30 collectors on 15 s
# rounds, 256 commits are two minutes, shorter than an outage. Several collectors' clocks may
# differ by up to this much (a commit's timestamp is its writer's clock).
CLOCK_SKEW_MS = 10 * 60 * 1000


def batch_id() -> str:
    """A new sample batch's id, for `append` and `landed`: when it was made (ms since the
    epoch, hex), then a random part."""
    return f"{time.time_ns() // 1_000_000:x}-{uuid.uuid4().hex}"


def _made_ms(batch: str) -> int:
    """When a batch (`batch_id`) was made, ms since the epoch."""
    return int(batch.partition("-")[0], 16)


class Warehouse:
    """A warehouse directory: append batches, open read-only snapshots, compact, age out."""

    # Library callers (tests, notebooks) get a missing directory created on opening. The `sing`
    # command turns this off: there the first write creates it, and a read command on a
    # mistyped path says so instead of answering nothing from a new empty warehouse.
    opening_creates: ClassVar[bool] = True

    def __init__(self, root: str | Path) -> None:
        """Open `root` without writing to it unless it is writable here.

        A missing directory is created (see `opening_creates`). A read-only one (a read-only
        mount, a user allowed to read only) is opened without the maintenance lock, repair or
        upgrade: those are for whoever may write. An object-store URI is opened for writing
        at the first write, not before: a reader may hold read-only credentials."""
        self._prepared = False
        self._lease: lease.Lease | None = None
        # How long the maintenance lease taken on object storage lasts unless renewed: how
        # long a maintainer killed while holding it keeps every other one out.
        self.maintenance_lease_s = lease.TTL_S
        if files.is_uri(root):
            self.root: Location = str(root).rstrip("/")
            return
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise UserError(
                f"warehouse {self.root} is a file, not a directory; "
                "give --warehouse (or SING_WAREHOUSE) a directory"
            )
        if not self.root.exists() and not self.opening_creates:
            return
        if self._read_only():
            migrations.check_readable(self)
        else:
            self._prepare_writing()

    @classmethod
    def existing(cls, root: Location, other_way: str = "") -> Warehouse:
        """The warehouse at `root` (a directory or an object-store URI) for a command that reads
        it: none there is an error naming the place, not an answer from an empty warehouse;
        `other_way`: what else the command could be given instead."""
        if not files.exists(root if files.is_uri(root) else Path(root)):
            raise UserError(
                f"{root}: no warehouse there (set --warehouse or [site] warehouse{other_way})"
            )
        return cls(root)

    def _read_only(self) -> bool:
        """True on a read-only mount (EROFS) or a directory this user may not write."""
        if isinstance(self.root, str):
            return False
        return self.root.exists() and not os.access(self.root, os.W_OK | os.X_OK)

    def require_writable(self) -> None:
        """Writers call this before long work, to fail (or create the warehouse) first."""
        self._prepare_writing()

    def _prepare_writing(self) -> None:
        """Create the directory, repair torn log tails and upgrade the schema: once, before
        the first write (or at opening, where the directory exists and is writable)."""
        if self._prepared:
            return
        if self._read_only():
            raise UserError(
                f"warehouse {self.root} is read-only here and this command writes to it; "
                "run it as a user who may write there, or on the host that owns it"
            )
        if isinstance(self.root, str):
            self._prepared = True
            check_conditional_put(self.root)
            migrations.upgrade(self)
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create warehouse {self.root}: {err.strerror}") from err
        self._prepared = True  # repair and upgrade take this warehouse's locks
        self._repair()
        migrations.upgrade(self)

    def require_existing(self) -> None:
        """Readers call this: answering from a directory that is not there would be silence."""
        there = (
            files.exists(files.join(self.root, migrations.META))
            if isinstance(self.root, str)
            else self.root.is_dir()
        )
        if not there:
            raise UserError(
                f"no warehouse at {self.root} (create one with `sing demo-data`, "
                "`sing collector run` or `sing warehouse import`, or give --warehouse)"
            )

    def _repair(self) -> None:
        """Cut off torn log tails a power loss left (`delta.repair_tail`), once per opening,
        unless a maintainer holds the warehouse right now."""
        with self.maintenance_lock() as held:
            if not held:
                return
            for name in [*TABLES, *ROLLUPS]:
                moved = delta.repair_tail(self.table_dir(name), self.root / ".quarantine" / name)
                if moved:
                    log.warning(
                        "%s: moved %d unacknowledged log entries to %s",
                        name,
                        len(moved),
                        moved[0].parent,
                    )

    # ---- writing -------------------------------------------------------------------------

    def append(
        self, name: str, data: pa.Table | pl.DataFrame, batch_ids: Collection[str] = ()
    ) -> int:
        """Write one batch as one commit; returns rows written.

        Samples are split by UTC day (one file per day the batch touches, all in one commit);
        records get `recorded_at` = now where missing and are merged on their key, so
        re-sending a record replaces the older version. `batch_ids` name the sample batches
        the commit holds, so a writer that retries after an error can ask which of them did
        land (`landed`): samples have no key, and one landed twice would count twice.
        """
        spec = table(name)
        batch = conform(spec, data)
        if batch.num_rows == 0:
            return 0
        self._prepare_writing()
        schema = delta.table_schema(spec.schema, partitioned=spec.is_samples)
        partition_by = [delta.DAY] if spec.is_samples else []
        # A samples append only adds files, so it needs no fresh snapshot; a merge refreshes
        # its own under the table's lock.
        dt = delta.ensure_table(self.table_dir(name), schema, partition_by, refresh=False)
        if spec.is_samples:
            parts = list(split_by_day(batch, spec.time_column))  # type: ignore[arg-type]
            actions = delta.write_files(self.table_dir(name), parts, spec.time_column)
            delta.commit(dt, actions, "append", **{BATCHES: ",".join(batch_ids)})
        else:
            with self.table_lock(name):
                upsert(dt, spec, newest_per_key(batch, spec.key))
        return batch.num_rows

    def landed(self, name: str, batch_ids: Collection[str]) -> set[str]:
        """Which of these sample batches a commit of the table holds: an append that raised
        after its log entry was written (an fsync that failed, a reply lost) did land. It reads
        the newest commits back to well before the oldest batch was made, however many other
        collectors committed since."""
        dt = delta.open_table(self.table_dir(name))
        if dt is None or not batch_ids:
            return set()
        since = min(map(_made_ms, batch_ids)) - CLOCK_SKEW_MS
        limit = RETRY_HISTORY
        while len(recent := dt.history(limit=limit)) == limit and recent[-1]["timestamp"] >= since:
            limit *= 4  # all newer than `since`: read further back
        found = {i for entry in recent for i in str(entry.get(BATCHES, "")).split(",")}
        return found & set(batch_ids)

    # ---- reading -------------------------------------------------------------------------

    def connect(
        self, days_from: Mapping[str, date | None] | None = None
    ) -> duckdb.DuckDBPyConnection:
        """A new in-memory DuckDB connection with a view per table and rollup.

        The views are a snapshot of the tables' newest versions; open a fresh connection for
        fresh data. Nothing through them can change the warehouse. `days_from` (table -> first
        UTC day, None for all) creates only those tables' views, samples and their rollups from
        that day on, so a question about the last hour never opens a year of files.
        """
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        self.add_views(con, dict.fromkeys(TABLES) if days_from is None else days_from)
        return con

    def add_views(
        self,
        con: duckdb.DuckDBPyConnection,
        days_from: Mapping[str, date | None],
        rollups: Collection[str] | None = None,
    ) -> dict[str, list[LiveFile]]:
        """Add `connect`'s views of more tables to an open connection: a reader that learns
        from one table which days of another it needs keeps one connection. `rollups` names
        the rollup views wanted (default: all of the chosen tables'): each costs a listing.
        Returns the live files each table's view reads."""
        self.require_existing()
        chosen = dict(days_from)
        snapshot = {
            name: [f for f in self.live_files(name) if _on_or_after(f.day, first)]
            for name, first in chosen.items()
        }
        for name in chosen:
            _create_table_view(con, table(name), [f.path for f in snapshot[name]])
        for rollup in ROLLUPS.values():
            if rollup.source in chosen and (rollups is None or rollup.name in rollups):
                self._add_rollup_view(con, rollup, snapshot[rollup.source], chosen[rollup.source])
        return snapshot

    def add_rollup_views(
        self, con: duckdb.DuckDBPyConnection, names: Collection[str], first: date | None
    ) -> None:
        """Add only the named rollups' views, from day `first` on, not their source tables':
        a view over a year of raw files reads every file's footer when it is created."""
        self.require_existing()
        raw: dict[str, list[LiveFile]] = {}
        for name in names:
            rollup = ROLLUPS[name]
            if rollup.source not in raw:
                live = self.live_files(rollup.source)
                raw[rollup.source] = [f for f in live if _on_or_after(f.day, first)]
            self._add_rollup_view(con, rollup, raw[rollup.source], first)

    def _add_rollup_view(
        self,
        con: duckdb.DuckDBPyConnection,
        rollup: Rollup,
        raw: list[LiveFile],
        first: date | None,
    ) -> None:
        stored, hot = self.rollup_sources(rollup, raw)
        stored = [f for f in stored if _on_or_after(f.day, first)]
        paths = [f.path for f in stored], [f.path for f in hot]
        _create_rollup_view(con, rollup, *paths, self.table_dir(rollup.name))

    def newest_time(self, name: str) -> datetime | None:
        """The newest time in a samples table, from the log's file stats (no data read)."""
        spec = table(name)
        live = self.live_files(name)
        if not live:
            return None
        newest_day = max(f.day or date.min for f in live)
        newest = [f for f in live if (f.day or date.min) == newest_day]
        if all(f.max_time is not None for f in newest):
            return max(f.max_time for f in newest)  # type: ignore[type-var]
        con = duckdb.connect()
        try:
            con.execute("SET TimeZone = 'UTC'")
            return con.execute(
                f"SELECT max({q(spec.time_column or 'ts')}) "
                f"FROM {parquet_sql(con, [f.path for f in newest], '')}"
            ).fetchone()[0]
        finally:
            con.close()

    def table_dir(self, name: str) -> Location:
        """Where a table or rollup lives: `<warehouse>/<name>/`, a Delta table."""
        return files.join(self.root, name)

    def open(self, name: str) -> DeltaTable | None:
        """The table's Delta snapshot at its newest version; None before its first write."""
        return delta.open_table(self.table_dir(name))

    def live_files(self, name: str) -> list[LiveFile]:
        dt = self.open(name)
        spec = TABLES.get(name)
        return delta.live_files(dt, spec.time_column if spec else None) if dt else []

    def rollup_sources(
        self, rollup: Rollup, raw: list[LiveFile] | None = None
    ) -> tuple[list[LiveFile], list[LiveFile]]:
        """(stored rollup files, raw files of days aggregated live), by `rollups.plan_day`."""
        raw_days = _by_day(self.live_files(rollup.source) if raw is None else raw)
        rolled_days = _by_day(self.live_files(rollup.name))
        stored: list[LiveFile] = []
        hot: list[LiveFile] = []
        for day in raw_days.keys() | rolled_days.keys():
            day_stored, day_hot = plan_day(raw_days.get(day, []), rolled_days.get(day, []))
            stored += day_stored
            hot += day_hot
        return stored, hot

    # ---- locks ---------------------------------------------------------------------------

    @contextmanager
    def table_lock(self, name: str) -> Iterator[None]:
        """Held by whoever replaces or removes a table's files (merges, compaction, retention),
        so each decides on the newest version; plain appends only add files and need none."""
        self._prepare_writing()
        locks = self._lock_dir() / ".locks"
        locks.mkdir(exist_ok=True)
        with open(locks / f"{name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextmanager
    def maintenance_lock(self, quiet: bool = False) -> Iterator[bool]:
        """One maintainer at a time; a second one skips instead of waiting. On object storage
        this host's lock is not enough: the maintainer also takes the warehouse's lease
        (`sing.warehouse.lease`), and skips, saying who holds it, when another host does: a
        warning, unless `quiet` (a writer's checkpoint after its round, which the maintainer
        at work writes too: every round of every other collector would warn)."""
        with open(self._lock_dir() / ".maintenance.lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                if isinstance(self.root, Path):
                    yield True
                    return
                taken = lease.acquire(self.root, lease.MAINTENANCE, self.maintenance_lease_s)
                if isinstance(taken, str):
                    level = logging.DEBUG if quiet else logging.WARNING
                    log.log(level, "%s: maintenance skipped: its lease is %s", self.root, taken)
                    yield False
                    return
                self._lease = taken
                try:
                    yield True
                finally:
                    self._lease = None
                    taken.release()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def check_maintainer(self) -> None:
        """Before each step that commits or deletes under the maintenance lock: raise
        `lease.LeaseLost` if this host's lease lapsed or another host took it."""
        if self._lease is not None:
            self._lease.check()

    def _lock_dir(self) -> Path:
        """The warehouse directory; for object storage, a directory of this host's, named by
        the URI (object stores have no locks: across hosts the maintenance lease does that)."""
        if isinstance(self.root, Path):
            return self.root
        name = hashlib.sha256(self.root.encode()).hexdigest()[:16]
        directory = Path(tempfile.gettempdir()) / f"sing-locks-{name}"
        directory.mkdir(exist_ok=True)
        return directory

    # ---- maintenance ---------------------------------------------------------------------

    def checkpoint_due(self, names: Collection[str] | None = None) -> list[str]:
        """Checkpoint the logs (of `names`, else all) that grew long since the last one (see
        `maintenance`)."""
        self._prepare_writing()
        return maintenance.checkpoint_due(self, names)

    def compact(
        self, now: datetime | None = None, settle_s: float | None = None
    ) -> CompactionResult:
        """Merge small files, roll up closed days, checkpoint the logs, vacuum removed files.

        Safe at any time beside writers and readers (the collector runs it periodically).
        `settle_s` is accepted for older callers and ignored: only committed files are merged.
        """
        self._prepare_writing()
        return maintenance.compact(self, now or datetime.now(UTC))

    def apply_retention(self, raw_days: int, now: datetime | None = None) -> list[Location]:
        """Remove raw sample days older than `raw_days` whose rollups are stored; returns their
        day directories. Days without current rollups are kept, so no summary is ever lost."""
        self._prepare_writing()
        horizon = ((now or datetime.now(UTC)) - timedelta(days=raw_days)).date()
        return maintenance.apply_retention(self, horizon)


@cache
def check_conditional_put(root: str) -> None:
    """Refuse to write to an object store that does not honour `If-None-Match: *`.

    delta-rs commits version n+1 by creating its log entry only if absent; a store that ignores
    the condition lets a second writer overwrite a commit, losing its rows silently. So before
    its first write a process commits twice to one version of a scratch table, from two
    snapshots, with no retry: the second must be refused."""
    probe = files.join(root, "_sing_probe", uuid.uuid4().hex)
    schema = pa.schema([pa.field("x", pa.int8())])
    first = DeltaTable.create(str(probe), schema, storage_options=files.storage_options())
    second = DeltaTable(str(probe), storage_options=files.storage_options())
    no_retry = CommitProperties(max_commit_retries=0)
    try:
        first.create_write_transaction([], "append", schema, commit_properties=no_retry)
        try:
            second.create_write_transaction([], "append", schema, commit_properties=no_retry)
        except CommitFailedError:
            return
        raise UserError(
            f"{root}: the object store overwrote a Delta commit that conditional put "
            "(If-None-Match: *) should have refused, so two writers could lose each other's "
            "rows; sing does not write there (see docs/deploy.md, object storage)"
        )
    finally:
        files.object_store().delete_dir(files.key(probe))  # type: ignore[arg-type]


def conform(spec: Table, data: pa.Table | pl.DataFrame) -> pa.Table:
    """Cast a batch to the table's schema: fill missing nullable columns, reject unknown ones."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif not isinstance(data, pa.Table):  # a polars DataFrame
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
    # Samples need their time, and their node where they have one (the audit trail has none).
    required = spec.key or [c for c in (spec.time_column, "node") if c in spec.schema.names]
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


def _on_or_after(day: date | None, first: date | None) -> bool:
    return first is None or day is None or day >= first


def _by_day(live: list[LiveFile]) -> dict[date | None, list[LiveFile]]:
    out: dict[date | None, list[LiveFile]] = {}
    for f in live:
        out.setdefault(f.day, []).append(f)
    return out


def newest_per_key(batch: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """One row per key, the newest `recorded_at` (of equals, the first in the batch; a NULL
    key part is a value like any other): a merge takes one source row per key. The rows kept
    stay in the batch's order. Arrow and numpy, no group-by: Arrow's loads pyarrow.dataset,
    and polars is not imported in the collector's process (bench/bench_collector.py)."""
    newest_first = pc.sort_indices(batch, [("recorded_at", "descending")])  # a stable sort
    codes = np.zeros(batch.num_rows, np.int64)  # one dense code per distinct key so far
    for name in key:
        column = batch.column(name).take(newest_first).combine_chunks()
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        part = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        codes = np.unique(codes * (len(encoded.dictionary) + 1) + part, return_inverse=True)[1]
    first = np.unique(codes, return_index=True)[1]  # each key's first row: its newest
    return batch.take(newest_first.take(pa.array(first, pa.int64())).sort())


def _create_table_view(con: duckdb.DuckDBPyConnection, spec: Table, paths: list[Location]) -> None:
    con.execute(f"CREATE VIEW {spec.name} AS SELECT * FROM {source_sql(con, spec, paths)}")


def _create_rollup_view(
    con: duckdb.DuckDBPyConnection,
    rollup: Rollup,
    stored: list[Location],
    hot: list[Location],
    home: Location,
) -> None:
    live = rollup.select.replace("FROM src", f"FROM {source_sql(con, table(rollup.source), hot)}")
    # Stored files all have the rollup's columns (this sing wrote them; the upgrade rewrote older
    # ones), so no union by name, which would read every file's footer at each connect; except
    # in a rollup that grows with sing/signals.py. Their `day` is the Delta partition, so it
    # comes from the path as in every Delta reader.
    if stored:
        by_name = ", union_by_name = true" if rollup.grows else ""
        found = parquet_sql(
            con,
            stored,
            f"hive_partitioning = true, hive_types = {{'day': DATE}}{by_name}",
            day_base=home,
            unify=rollup.grows,
        )
        query = f"SELECT * FROM {found} UNION ALL BY NAME {live}"
    else:
        query = live
    con.execute(f"CREATE VIEW {rollup.name} AS {query}")
