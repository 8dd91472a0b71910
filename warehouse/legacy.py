"""Immutable Parquet files and the rule that says which of them are live.

Every write is one new Parquet file, written under a temporary name, fsynced and renamed into
place, so a reader sees either the whole file or nothing, and a writer killed mid-write leaves
only a temporary file that readers ignore.

A file is named `<first>-<last>-<tag>.parquet`: the range of write sequence numbers (nanosecond
clock readings taken just before the rename) of the data it holds. Compaction merges files into
one whose range covers theirs; from the moment it is renamed in, the covered files are superseded
and readers skip them, so the data is never counted twice nor missing, with no lock between
readers and writers. Superseded files are deleted after a grace period, long enough for any
query that listed them to finish.
"""

from __future__ import annotations

import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SUFFIX = ".parquet"
TMP_PREFIX = ".tmp-"
ROW_GROUP_ROWS = 131_072  # small enough for ts zone maps to prune a job's window inside a day
PARALLEL_WRITE_ROWS = 1_000_000  # a batch this big is written as parallel files
WRITER_THREADS = min(2, os.cpu_count() or 1)


@dataclass(frozen=True, order=True)
class DataFile:
    first: int
    last: int
    tag: str
    path: Path

    @classmethod
    def parse(cls, path: Path) -> DataFile | None:
        if path.name.startswith(TMP_PREFIX) or path.suffix != SUFFIX:
            return None
        parts = path.stem.split("-")
        if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
            return None
        return cls(int(parts[0]), int(parts[1]), parts[2], path)

    def covers(self, other: DataFile) -> bool:
        """True if this file supersedes `other`: its range holds other's and is strictly larger."""
        return (
            self.first <= other.first
            and other.last <= self.last
            and (self.last - self.first) > (other.last - other.first)
        )


def data_files(directory: Path) -> list[DataFile]:
    if not directory.is_dir():
        return []
    found = (DataFile.parse(p) for p in directory.iterdir())
    return sorted(f for f in found if f is not None)


def live_files(directory: Path) -> list[DataFile]:
    """The files readers use: every file not superseded by a covering (merged) file."""
    files = data_files(directory)
    merged = [f for f in files if f.last > f.first]
    return [f for f in files if not any(m.covers(f) for m in merged)]


def superseded_files(directory: Path) -> list[tuple[DataFile, DataFile]]:
    """(superseded file, the live file covering it) pairs, for deletion after a grace period."""
    files = data_files(directory)
    live = live_files(directory)
    out = []
    for f in files:
        if f in live:
            continue
        cover = next(m for m in live if m.covers(f))
        out.append((f, cover))
    return out


def next_sequence() -> int:
    return time.time_ns()


def write_temporaries(directory: Path, table: pa.Table) -> list[Path]:
    """Write `table` as one or more files under temporary names; `commit_written` publishes each.

    Dictionary encoding only for text columns (on floats and timestamps it costs half the write
    time and saves nothing), zstd level 1. A big batch is cut in parts written by parallel
    threads (pyarrow releases the GIL), one file each.
    """
    parts = max(1, min(WRITER_THREADS, table.num_rows // PARALLEL_WRITE_ROWS))
    size = -(-table.num_rows // parts)
    chunks = [table.slice(i * size, size) for i in range(parts)]
    paths = [temporary_path(directory) for _ in chunks]
    if parts == 1:
        _write_parquet(chunks[0], paths[0])
    else:
        with ThreadPoolExecutor(parts) as pool:
            list(pool.map(_write_parquet, chunks, paths))
    return paths


def _write_parquet(table: pa.Table, path: Path) -> None:
    text = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=1,
        use_dictionary=text,
        row_group_size=ROW_GROUP_ROWS,
    )


def commit_written(tmp: Path, directory: Path, covering: list[DataFile] | None = None) -> DataFile:
    """Rename a finished temporary file into place.

    Without `covering` it gets a fresh sequence number; a merge passes the files it merged and
    gets exactly their range, so it can never supersede a file it did not read.
    """
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    if covering:
        first, last = min(f.first for f in covering), max(f.last for f in covering)
    else:
        first = last = next_sequence()
    final = directory / f"{first:020d}-{last:020d}-{secrets.token_hex(4)}{SUFFIX}"
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return DataFile.parse(final)  # type: ignore[return-value]


def temporary_path(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{TMP_PREFIX}{secrets.token_hex(4)}{SUFFIX}"


def remove_stale_temporaries(directory: Path, older_than_s: float) -> int:
    """Delete temporary files left by killed writers."""
    removed = 0
    if not directory.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    for p in directory.iterdir():
        if not p.name.startswith(TMP_PREFIX):
            continue
        try:
            stale = p.stat().st_mtime < cutoff
        except FileNotFoundError:  # a writer renamed it into place meanwhile
            continue
        if stale:
            p.unlink(missing_ok=True)
            removed += 1
    return removed
