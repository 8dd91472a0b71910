"""Delta Lake tables on local disk: the only module that talks to deltalake (delta-rs).

Why sing writes its own data files: delta-rs 1.6 never fsyncs. So sing writes each Parquet file
itself (fsync, rename, fsync of the directory), commits the files with one
`create_write_transaction`, then fsyncs the new log entry and `_delta_log/`. A log entry thus
only ever points at durable data, and once a commit returns, it and every commit before it
survive a power loss. Record upserts are written the same way (sing/warehouse/upsert.py); only
vacuum's commits are delta-rs's own, and they add no data file: their log entries are fsynced
right after (`sync_log`).

Checkpoints and log clean-up are never left to commit hooks (`NO_HOOKS`): maintenance writes
them after fsync, so a checkpoint never summarises entries that could still be lost.

On object storage (a table location `s3://...`, `files.is_uri`) a completed PUT is durable, so
the fsync steps fall away: data files are uploaded whole under their final names before the
commit names them, and delta-rs writes each log entry by conditional put (`files.storage_options`).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, PostCommitHookProperties
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from sing.digits import ascii_digits
from sing.warehouse import files
from sing.warehouse.files import Location

# Old log entries go once a checkpoint covers them and they are a day old; removed data files
# are deleted by vacuum an hour after their removal (longer than any reader's query).
CONFIG = {
    "delta.logRetentionDuration": "interval 1 days",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
    "delta.enableExpiredLogCleanup": "false",
    "delta.checkpointInterval": "10",  # for outside writers; sing checkpoints in maintenance
}
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
DAY = "day"
DATA_PREFIX = "part-"
TMP_SUFFIX = ".tmp"
RACE_ATTEMPTS = 5  # a commit that loses a race with another machine is tried this often

_tables: dict[Location, DeltaTable] = {}
_synced: dict[Path, int] = {}  # per table: every log entry up to this version is fsynced
_loaded_from: dict[
    Location, int
] = {}  # per table: the checkpoint its cached object was loaded from


@dataclass(frozen=True)
class LiveFile:
    """One data file of the table's current snapshot."""

    path: Location  # absolute
    relative: str  # as the log names it
    day: date | None
    size: int
    rows: int
    max_time: object  # the time column's maximum from the file's stats, if any
    stem: str  # the file name without `.parquet`: what rollup files name their raw file by


# ---- crash points for tests ----------------------------------------------------------------

_CRASH_AT = os.environ.get("SING_TEST_CRASH_AT", "")
_crash_counts: dict[str, int] = {}


def crash_point(step: str) -> None:
    """SIGKILL this process at the n-th `step` when SING_TEST_CRASH_AT=step:n (tests only)."""
    if not _CRASH_AT:
        return
    name, _, nth = _CRASH_AT.partition(":")
    if name != step:
        return
    _crash_counts[step] = _crash_counts.get(step, 0) + 1
    if _crash_counts[step] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


# ---- opening -------------------------------------------------------------------------------


def open_table(path: Location, refresh: bool = True) -> DeltaTable | None:
    """The table at `path` (cached per process), or None if none yet; at its newest version
    unless `refresh` is off, which a blind append can afford (it conflicts with nothing).

    The cached object is replaced by a fresh one whenever a newer checkpoint exists: a
    `DeltaTable` kept up to date by `update_incremental` alone gets slower with every update
    (after a year of daily files and 365 updates, 65 ms per commit and per update, against
    10 and 4 ms for a fresh object), while a fresh one loads the checkpoint and a few entries."""
    checkpoint = last_checkpoint(path)
    dt = _tables.get(path)
    if dt is None or _loaded_from.get(path, -1) < checkpoint:
        if not DeltaTable.is_deltatable(str(path), storage_options=_options(path)):
            return None
        dt = _tables[path] = DeltaTable(str(path), storage_options=_options(path))
        _loaded_from[path] = checkpoint
        if isinstance(path, Path):
            _synced.setdefault(path, dt.version())
    elif refresh:
        dt.update_incremental()
    return dt


def _options(path: Location) -> dict[str, str] | None:
    return files.storage_options() if files.is_uri(path) else None


def location(dt: DeltaTable) -> Location:
    """Where the table lives: a local directory, or its object-store URI."""
    uri = dt.table_uri.rstrip("/")
    return uri if files.is_uri(uri) else Path(uri.removeprefix("file://"))


def ensure_table(
    path: Location, schema: pa.Schema, partition_by: list[str], refresh: bool = True
) -> DeltaTable:
    """Open the table, creating it empty first if it does not exist, with any column that
    `schema` has and the table lacks added (see `add_new_columns`)."""
    dt = open_table(path, refresh)
    if dt is not None:
        add_new_columns(dt, schema)
        return dt
    try:
        DeltaTable.create(
            str(path),
            schema,
            mode="ignore",
            partition_by=partition_by or None,
            configuration=CONFIG,
            post_commithook_properties=NO_HOOKS,
            storage_options=_options(path),
        )
    except Exception:  # another process created it meanwhile
        if not DeltaTable.is_deltatable(str(path), storage_options=_options(path)):
            raise
    if isinstance(path, Path):
        _synced[path] = -1
    dt = open_table(path)
    assert dt is not None
    sync_log(dt)
    return dt


def add_new_columns(dt: DeltaTable, schema: pa.Schema) -> None:
    """Give the table the columns sing's schema gained since it was created. Adding a column
    needs no upgrade step (sing/warehouse/migrations.py), but a Delta reader (Spark, Trino) sees
    only the columns of the table's Delta schema; so the first write adds them, all nullable.
    Another writer adding them first is a conflict: refresh, recheck."""
    for attempt in range(1, RACE_ATTEMPTS + 1):
        have = {field.name for field in dt.schema().fields}
        new = [field for field in schema if field.name not in have]
        if not new:
            return
        try:
            dt.alter.add_columns(
                [Field.from_arrow(field.with_nullable(True)) for field in new],
                post_commithook_properties=NO_HOOKS,
            )
        except (CommitFailedError, DeltaError):
            if attempt == RACE_ATTEMPTS:
                raise  # not a race another writer won: the error itself says what
            dt.update_incremental()
            continue
        sync_log(dt)
        return


def table_schema(schema: pa.Schema, partitioned: bool) -> pa.Schema:
    """The Delta schema: the table's columns, plus `day` for tables partitioned by day."""
    return schema.append(pa.field(DAY, pa.date32())) if partitioned else schema


# ---- writing data files ----------------------------------------------------------------------


def write_files(
    table_dir: Location, parts: list[tuple[date | None, pa.Table]], time_column: str | None
) -> list[AddAction]:
    """Write each (day, rows) part as durable Parquet files; big parts in parallel threads."""
    jobs = []
    for day, part in parts:
        pieces = max(1, min(files.WRITER_THREADS, part.num_rows // files.PARALLEL_WRITE_ROWS))
        size = -(-part.num_rows // pieces)
        jobs += [(day, part.slice(i * size, size)) for i in range(pieces)]
    if len(jobs) == 1 or all(p.num_rows < files.PARALLEL_WRITE_ROWS for _, p in jobs):
        return [write_file(table_dir, day, part, time_column) for day, part in jobs]
    with ThreadPoolExecutor(files.WRITER_THREADS) as pool:
        return list(pool.map(lambda j: write_file(table_dir, j[0], j[1], time_column), jobs))


def write_file(
    table_dir: Location, day: date | None, rows: pa.Table, time_column: str | None
) -> AddAction:
    """One Parquet file, durable under its final name before anything refers to it."""
    tmp = temporary_path(table_dir, day)
    files.write_parquet(rows, tmp)
    return publish(table_dir, day, tmp, time_column)


def temporary_path(table_dir: Location, day: date | None) -> Path:
    """Where a file is written before `publish`: beside its final place, or in a local spool
    for object storage."""
    if isinstance(table_dir, str):
        return files.spool_path()
    directory = table_dir / f"{DAY}={day.isoformat()}" if day else table_dir
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f".{DATA_PREFIX}{uuid.uuid4().hex}{TMP_SUFFIX}"


def publish(
    table_dir: Location,
    day: date | None,
    tmp: Path,
    time_column: str | None,
    name: str | None = None,
) -> AddAction:
    """Rename a finished temporary file to its final name, then fsync it and its directory
    (on object storage: upload it under its final name, which shows it whole or not at all).

    Renaming first lets one journal commit carry both the data and the new name (ext4 commits
    both on the file's fsync, so the directory's fsync finds little left to do). A file whose
    name is in place but whose data was lost to a power cut is harmless: no log entry names it
    yet, and vacuum deletes such orphans."""
    crash_point("data-written")
    final = tmp.with_name(name or tmp.name[1:].removesuffix(TMP_SUFFIX) + ".parquet")
    if isinstance(table_dir, str):
        relative = f"{DAY}={day.isoformat()}/{final.name}" if day else final.name
        action = file_action(relative, tmp, day, time_column)
        files.upload(tmp, files.join(table_dir, relative))  # type: ignore[arg-type]
        tmp.unlink()
        crash_point("data-uploaded")
        return action
    os.replace(tmp, final)
    crash_point("data-renamed")
    files.fsync_path(final)
    crash_point("data-fsynced")
    files.fsync_path(final.parent)
    return add_action(table_dir, final, day, time_column)


def add_action(table_dir: Path, path: Path, day: date | None, time_column: str | None) -> AddAction:
    """The log's record of a file of the table: size, partition, and stats."""
    return file_action(path.relative_to(table_dir).as_posix(), path, day, time_column)


def file_action(relative: str, local: Path, day: date | None, time_column: str | None) -> AddAction:
    """The log's record of the file `relative`, read from its local copy `local`: size,
    partition, and stats (row count, time range)."""
    meta = pq.read_metadata(local)
    stats: dict = {"numRecords": meta.num_rows}
    if time_column and meta.num_rows:
        index = meta.schema.to_arrow_schema().get_field_index(time_column)
        if index >= 0:
            ranges = [
                meta.row_group(i).column(index).statistics for i in range(meta.num_row_groups)
            ]
            if all(s is not None and s.has_min_max for s in ranges):
                fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
                stats["minValues"] = {time_column: min(s.min for s in ranges).strftime(fmt)}
                stats["maxValues"] = {time_column: max(s.max for s in ranges).strftime(fmt)}
    return AddAction(
        path=relative,
        size=local.stat().st_size,
        partition_values={DAY: day.isoformat()} if day else {},
        modification_time=now_ms(),
        data_change=True,
        stats=json.dumps(stats),
    )


def copy_action(f: LiveFile, relative: str) -> AddAction:
    """The log's record of a copy of a live file under another name."""
    return AddAction(
        path=relative,
        size=f.size,
        partition_values={DAY: f.day.isoformat()} if f.day else {},
        modification_time=now_ms(),
        data_change=True,
        stats=json.dumps({"numRecords": f.rows}),
    )


def now_ms() -> int:
    """The clock of add and remove actions. A removed file is deleted by vacuum once its
    removal is older than the grace period, so a test shifts this clock to shorten the grace
    below Delta's whole hours."""
    return int(time.time() * 1000)


def remove_action(f: LiveFile, data_change: bool = True) -> RemoveAction:
    return RemoveAction(
        f.relative,
        data_change,
        now_ms(),
        f.size,
        {DAY: f.day.isoformat()} if f.day else {},
    )


# ---- committing --------------------------------------------------------------------------------


def commit(dt: DeltaTable, actions: list[AddAction | RemoveAction], op: str, **meta: object) -> int:
    """Commit actions on files already durable; returns once the log entry is durable too."""
    dt.create_write_transaction(
        actions,
        mode="append",
        schema=dt.schema(),
        partition_by=dt.metadata().partition_columns or None,
        commit_properties=CommitProperties(custom_metadata={"sing.op": op} | meta),
        post_commithook_properties=NO_HOOKS,
    )
    crash_point("committed")
    return sync_log(dt)


def sync_log(dt: DeltaTable) -> int:
    """Move `dt` to the newest version and fsync every log entry not yet known durable."""
    dt.update_incremental()
    root = location(dt)
    version = dt.version()
    if isinstance(root, str):
        crash_point("log-synced")
        return version
    first = _synced.get(root, -1) + 1
    for v in range(first, version + 1):
        files.fsync_path(log_entry(root, v))
    if first <= version:
        files.fsync_path(root / "_delta_log")
    _synced[root] = max(_synced.get(root, -1), version)
    crash_point("log-synced")
    return version


def log_entry(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


# ---- reading the snapshot ------------------------------------------------------------------------


def live_files(dt: DeltaTable, time_column: str | None = None) -> list[LiveFile]:
    """The data files of the snapshot `dt` holds, with partition day and stats."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    root = location(dt)
    column = actions.column
    days = (
        column(f"partition.{DAY}").to_pylist()
        if f"partition.{DAY}" in actions.column_names
        else None
    )
    maxima = (
        column(f"max.{time_column}").to_pylist()
        if time_column and f"max.{time_column}" in actions.column_names
        else None
    )
    out = []
    for i, relative in enumerate(column("path").to_pylist()):
        day = days[i] if days else None
        out.append(
            LiveFile(
                path=files.join(root, relative),
                relative=relative,
                day=date.fromisoformat(str(day)) if day is not None else None,
                size=column("size_bytes")[i].as_py(),
                rows=column("num_records")[i].as_py() or 0,
                max_time=maxima[i] if maxima else None,
                stem=relative.rsplit("/", 1)[-1].removesuffix(".parquet"),
            )
        )
    return sorted(out, key=lambda f: (f.day or date.min, f.relative))


# ---- recovery after a power loss ----------------------------------------------------------------


def repair_tail(table_dir: Path, quarantine: Path) -> list[Path]:
    """Move a torn tail of the log (left by a power loss) to `quarantine`; returns what moved.

    Every commit that returned was fsynced with all before it, so only a tail of commits that
    never returned can be torn: an entry that does not parse, or that adds a file missing or
    shorter than the log says (a merge's data not yet on disk). From the first such entry on,
    every entry goes; none of them was acknowledged. On a running system nothing is torn
    (delta-rs publishes each entry whole, and data precedes its entry), so this only reads."""
    log_dir = table_dir / "_delta_log"
    first = _sound_checkpoint(log_dir) + 1
    entries = sorted(
        p for p in log_dir.glob("*.json") if ascii_digits(p.stem) and int(p.stem) >= first
    )
    parsed: list[list[dict] | None] = []
    for entry in entries:
        try:
            parsed.append([json.loads(line) for line in entry.read_text().splitlines() if line])
        except ValueError:
            parsed.append(None)
    removed_later = {
        a["remove"]["path"] for actions in parsed if actions for a in actions if "remove" in a
    }
    torn = next((i for i, a in enumerate(parsed) if _torn(table_dir, a, removed_later)), None)
    if torn is None:
        return []
    quarantine.mkdir(parents=True, exist_ok=True)
    moved = [quarantine / entry.name for entry in entries[torn:]]
    for entry, target in zip(entries[torn:], moved, strict=True):
        os.replace(entry, target)
    files.fsync_path(log_dir)
    _tables.pop(table_dir, None)
    _synced.pop(table_dir, None)
    return moved


def _sound_checkpoint(log_dir: Path) -> int:
    """The version of the last checkpoint, or -1. Torn checkpoints are deleted with the pointer
    to them; the json entries they summarised are still there (`checkpoint` drops old entries
    only after the checkpoint is durable)."""
    last = log_dir / "_last_checkpoint"
    try:
        version = json.loads(last.read_text())["version"]
        for part in log_dir.glob(f"{version:020d}.checkpoint*.parquet"):
            pq.read_metadata(part)
        return version
    except FileNotFoundError:
        return -1
    except (ValueError, KeyError, OSError, pa.ArrowInvalid):
        for part in log_dir.glob("*.checkpoint*.parquet"):
            try:
                pq.read_metadata(part)
            except (OSError, pa.ArrowInvalid):
                part.unlink()
        last.unlink()
        files.fsync_path(log_dir)
        return -1


def _torn(table_dir: Path, actions: list[dict] | None, removed_later: set[str]) -> bool:
    if not actions:
        return True
    return any(
        "add" in a and a["add"]["path"] not in removed_later and not _whole(table_dir, a["add"])
        for a in actions
    )


def _whole(table_dir: Path, add: dict) -> bool:
    try:
        return (table_dir / add["path"]).stat().st_size == add["size"]
    except FileNotFoundError:
        return False


# ---- maintenance of the log and of removed files -----------------------------------------------


def checkpoint(dt: DeltaTable) -> None:
    """Write a checkpoint of the durable log, then drop json entries it made redundant."""
    root = location(dt)
    sync_log(dt)
    dt.create_checkpoint()
    if isinstance(root, str):
        dt.cleanup_metadata()
        return
    for path in (root / "_delta_log").glob(f"{dt.version():020d}.checkpoint*.parquet"):
        files.fsync_path(path)
    files.fsync_path(root / "_delta_log" / "_last_checkpoint")
    files.fsync_path(root / "_delta_log")
    crash_point("checkpoint-written")
    dt.cleanup_metadata()


def versions_since_checkpoint(dt: DeltaTable) -> int:
    """Commits after the last checkpoint, counted on disk (other writers' too, without
    refreshing `dt`)."""
    root = location(dt)
    done = last_checkpoint(root)
    newest = max(dt.version(), done)
    while files.exists(files.join(root, "_delta_log", f"{newest + 1:020d}.json")):
        newest += 1
    return newest - done


def last_checkpoint(table: Location) -> int:
    """The version of the newest checkpoint (from `_last_checkpoint`), or -1."""
    try:
        return json.loads(files.read_text(files.join(table, "_delta_log", "_last_checkpoint")))[
            "version"
        ]
    except (TypeError, ValueError, KeyError):
        return -1


def vacuum(dt: DeltaTable, grace_hours: int) -> list[str]:
    """Delete files removed more than `grace_hours` ago and files no version refers to (left
    by writers killed between rename and commit)."""
    deleted = dt.vacuum(
        retention_hours=grace_hours,
        dry_run=False,
        enforce_retention_duration=False,
        full=True,
        post_commithook_properties=NO_HOOKS,
    )
    sync_log(dt)
    crash_point("vacuumed")
    return deleted
