"""Durable Parquet files: the one writer every table uses, and fsync.

A file is written under a temporary name, fsynced, renamed into place and its directory fsynced
(`sing.warehouse.delta.publish`), so a file that the table log names is whole on disk, even after a
power loss. Temporaries of writers killed mid-write are hidden (a leading dot) and deleted by
maintenance.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP_ROWS = 131_072  # small enough for ts zone maps to prune a job's window inside a day
PARALLEL_WRITE_ROWS = 1_000_000  # a batch this big is written as parallel files
WRITER_THREADS = min(2, os.cpu_count() or 1)


def write_parquet(table: pa.Table, path: Path) -> None:
    """Dictionary encoding only for text columns (on floats and timestamps it costs half the
    write time and saves nothing), zstd level 1."""
    text = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=1,
        use_dictionary=text,
        row_group_size=ROW_GROUP_ROWS,
    )


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes renames in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: Path, suffix: str, older_than_s: float) -> int:
    """Delete hidden temporary files (`.*<suffix>`) under `directory` left by killed writers."""
    removed = 0
    if not directory.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    for p in directory.rglob(f".*{suffix}"):
        try:
            stale = p.stat().st_mtime < cutoff
        except FileNotFoundError:  # a writer renamed it into place meanwhile
            continue
        if stale:
            p.unlink(missing_ok=True)
            removed += 1
    return removed


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold off Ctrl-C (SIGINT, and SIGTERM) while a few steps that belong together run, so an
    interrupt comes after all of them, never between two (a commit and its record).

    The handlers are swapped rather than the signals masked: a mask holds for one thread only,
    and a signal sent to the process reaches any thread that does not mask it (delta-rs and
    Arrow run their own), whose C handler then has Python raise in the main thread anyway.
    Python runs signal handlers in the main thread only, so elsewhere this is a no-op and the
    steps just run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])  # now, to the handler that was there before
