"""Concurrency and crash safety with real processes: writers, readers and compactors run as
separate Python processes on one warehouse, and writers/compactors are killed with SIGKILL.

Every batch is B rows sharing one timestamp and one batch id (stored in gpu_uuid), so a reader
can check from counts alone that it sees whole batches, each once: rows == B * distinct batches.

This file doubles as the worker program: `python -m tests.test_warehouse_concurrency ROLE ...`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sing.warehouse import delta, maintenance
from sing.warehouse.store import Warehouse

REPO = Path(__file__).resolve().parent.parent
BASE = datetime(2026, 1, 1, tzinfo=UTC)  # long closed days: the compactor merges them at once
STEP = timedelta(minutes=30)  # 48 batches per UTC day
COUNT_SQL = "SELECT count(*), count(DISTINCT gpu_uuid) FROM gpu_samples"
ROLLUP_SQL = "SELECT coalesce(sum(samples), 0) FROM job_gpu_usage"


def batch(index: int, rows: int) -> pa.Table:
    """Batch `index`: `rows` GPUs of one scrape, all stamped with the batch id."""
    return pa.table(
        {
            "ts": pa.array([BASE + index * STEP] * rows, pa.timestamp("us", tz="UTC")),
            "node": [f"n{r // 8:03d}" for r in range(rows)],
            "gpu_index": pa.array([r % 8 for r in range(rows)], pa.int16()),
            "gpu_uuid": [f"b{index}"] * rows,
            "util": pa.array([(index + r) % 100 / 100 for r in range(rows)], pa.float32()),
            "job_id": [f"j{index % 7}"] * rows,
        }
    )


# ---- the worker processes --------------------------------------------------------------------


def run_writer(root: str, first: int, rows: int, seconds: float, at_least: int = 0) -> None:
    """Append batches first, first+1, ... for `seconds`, and at least `at_least` of them;
    print each index once append() has returned."""
    wh = Warehouse(root)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    index = first
    while time.monotonic() < deadline or index < first + at_least:
        wh.append("gpu_samples", batch(index, rows))
        print(index, flush=True)
        index += 1


def run_reader(root: str, rows: int, stop_file: str) -> None:
    """Connect afresh and count, again and again; one final count after the stop file appears.
    Each round also counts as an outside engine would, through the Delta log with polars."""
    last = (0, 0)
    while True:
        stopping = os.path.exists(stop_file)
        con = Warehouse(root).connect()
        total, batches = con.execute(COUNT_SQL).fetchone()
        rolled = con.execute(ROLLUP_SQL).fetchone()[0]
        con.close()
        assert total == rows * batches, f"partial or doubled batch: {total} rows, {batches} ids"
        path = os.path.join(root, "gpu_samples")
        if DeltaTable.is_deltatable(path):  # from the writer's first append on
            outside = pl.read_delta(path).select(pl.len(), pl.col("gpu_uuid").n_unique())
            (seen, ids) = outside.row(0)
            assert seen == rows * ids, f"outside reader: {seen} rows in {ids} batches"
        assert rolled % rows == 0, f"rollup counts {rolled} samples, not whole batches"
        assert total >= last[0] and rolled >= last[1], f"went back: {last} -> {total, rolled}"
        last = (total, rolled)
        print(total, rolled, flush=True)
        if stopping:
            return


def run_compactor(root: str, stop_file: str, grace_s: str) -> None:
    """compact() in a loop: merges, rollups, checkpoints and vacuum. Removals are stamped
    3600 - grace_s seconds early, so vacuum (which waits an hour) deletes files grace_s after
    their removal, while readers still run."""
    early_ms = (3600 - float(grace_s)) * 1000
    delta.now_ms = lambda: int(time.time() * 1000 - early_ms)
    wh = Warehouse(root)
    print("ready", flush=True)
    while not os.path.exists(stop_file):
        result = wh.compact()
        print(result.merged_files, result.rollup_days, result.deleted_files, flush=True)
        time.sleep(0.05)


def run_compact_once(root: str) -> None:
    wh = Warehouse(root)
    print("ready", flush=True)
    wh.compact(settle_s=0)
    print("done", flush=True)


# ---- helpers for the tests -------------------------------------------------------------------


def spawn(role: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.test_warehouse_concurrency", role, *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 90) -> list[str]:
    """Wait for a worker that should exit cleanly; return its output lines."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed:\n{err}"
    return out.split()


def kill_after(
    proc: subprocess.Popen, delay: float, after_lines: int = 0, may_finish: bool = False
) -> list[str]:
    """SIGKILL a worker `delay` s after it said ready and printed `after_lines` more lines;
    return what it printed (after "ready") before dying. With `may_finish`, a worker that was
    quicker than the kill may have exited cleanly."""
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    seen = [proc.stdout.readline().strip() for _ in range(after_lines)]
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL or (may_finish and proc.returncode == 0)
    return seen + out.split()


def counted(wh: Warehouse) -> tuple[int, int, set[int]]:
    """(rows, distinct batches, batch ids) as a fresh reader sees them."""
    con = wh.connect()
    total, batches = con.execute(COUNT_SQL).fetchone()
    ids = {
        int(u[1:]) for (u,) in con.execute("SELECT DISTINCT gpu_uuid FROM gpu_samples").fetchall()
    }
    return total, batches, ids


def assert_exact(wh: Warehouse, rows: int, committed: set[int]) -> set[int]:
    """Every committed batch present, whole and once; returns the ids present."""
    total, batches, ids = counted(wh)
    assert total == rows * batches, f"partial or doubled batch: {total} rows in {batches} batches"
    assert committed <= ids, f"committed batches lost: {sorted(committed - ids)[:10]}"
    per_batch = wh.connect().execute(
        "SELECT gpu_uuid, count(*) FROM gpu_samples GROUP BY ALL HAVING count(*) <> ?", [rows]
    )
    assert per_batch.fetchall() == []
    return ids


def readers_report(lines: list[str]) -> list[tuple[int, int]]:
    pairs = [(int(a), int(b)) for a, b in zip(lines[::2], lines[1::2], strict=True)]
    assert len(pairs) >= 3, f"reader barely ran: {pairs}"
    return pairs


# ---- the tests -------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_readers_see_whole_batches_while_a_writer_and_a_compactor_run(tmp_path: Path) -> None:
    """(a) + (c): 1 writer, 2 readers, 1 compactor looping compact(), whose vacuum deletes the
    files it removed GRACE_S earlier while the readers go on: counts exact throughout, and no
    reader's query (each shorter than the grace) loses a file."""
    root, stop, rows, grace_s = tmp_path / "wh", tmp_path / "stop", 128, 4
    Warehouse(root)
    writer = spawn("writer", root, 0, rows, 8.0, 60)  # more than a day of 48 batches
    readers = [spawn("reader", root, rows, stop) for _ in range(2)]
    compactor = spawn("compactor", root, stop, grace_s)
    committed = {int(i) for i in finish(writer)[1:]}
    assert compactor.stdout.readline().strip() == "ready"
    compactions = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(c[2] for c in compactions) == 0:
        compactions.append(tuple(map(int, compactor.stdout.readline().split())))
    time.sleep(1)  # the readers read on after the deletions
    stop.touch()
    lines = finish(compactor)
    compactions += [tuple(map(int, lines[i : i + 3])) for i in range(0, len(lines), 3)]
    final = rows * len(committed)
    for reader in readers:
        seen = readers_report(finish(reader))
        assert seen[-1] == (final, final), "last count after the writer stopped is all of it"
        assert len({total for total, _ in seen}) > 2, "reader should have watched rows arrive"
    assert committed == set(range(len(committed))) and len(committed) > 48  # spans days
    merged, rolled, deleted = (sum(c[i] for c in compactions) for i in range(3))
    assert merged > 0 and rolled > 0
    assert deleted > 0, "vacuum deleted removed files while the readers ran"
    assert assert_exact(Warehouse(root), rows, committed) == committed


@pytest.mark.timeout(120)
def test_writer_killed_mid_stream_loses_at_most_its_in_flight_batch(tmp_path: Path) -> None:
    """(b): SIGKILL a writer at random moments, 8 times; committed batches all survive."""
    root, rows = tmp_path / "wh", 2000
    wh = Warehouse(root)
    rng = random.Random(7)
    committed: set[int] = set()
    for run in range(8):
        first = run * 1_000_000  # fresh ids: an unreported in-flight batch never collides
        writer = spawn("writer", root, first, rows, 60.0)
        printed = kill_after(writer, rng.uniform(0.0, 0.3), after_lines=1)  # mid-stream
        committed |= {int(i) for i in printed}
        present = assert_exact(wh, rows, committed)
        unreported = {i for i in present - committed if i >= first}
        assert len(unreported) <= 1, "only the in-flight batch may land unreported"
    assert len(committed) > 8
    # The warehouse still takes appends and compacts with the debris of the kills around.
    wh.append("gpu_samples", batch(99_999_999, rows))
    wh.compact(settle_s=0)
    assert assert_exact(wh, rows, committed | {99_999_999})


@pytest.mark.timeout(120)
def test_three_writers_at_once_one_killed_lose_and_double_nothing(tmp_path: Path) -> None:
    """Three writer processes append to one table at once, as sharded collectors do; one is
    killed mid-stream: every batch the others and it reported is stored whole and once."""
    root, rows = tmp_path / "wh", 256
    wh = Warehouse(root)
    wh.append("gpu_samples", batch(99_999_999, rows))  # the table exists before the race
    writers = [spawn("writer", root, w * 1_000_000, rows, 4.0, 20) for w in range(3)]
    printed = kill_after(writers[0], 0.5, after_lines=1, may_finish=True)
    committed = {int(i) for i in printed} | {99_999_999}
    for writer in writers[1:]:
        committed |= {int(i) for i in finish(writer)[1:]}
    present = assert_exact(wh, rows, committed)
    assert len(present - committed) <= 1, "only the killed writer's in-flight batch unreported"
    assert len(committed) > 40


@pytest.mark.timeout(120)
def test_compactor_killed_mid_merge_leaves_exact_data(tmp_path: Path, monkeypatch) -> None:
    """(d): SIGKILL compact() at random moments during merges; data stays exact, then heals."""
    root, rows = tmp_path / "wh", 4000
    wh = Warehouse(root)
    rng = random.Random(11)
    killed = 0
    for round_ in range(5):
        for index in range(40 * round_, 40 * (round_ + 1)):  # 40 more small files to merge
            wh.append("gpu_samples", batch(index, rows))
        printed = kill_after(spawn("compact_once", root), rng.uniform(0.0, 0.3), may_finish=True)
        killed += "done" not in printed
        assert assert_exact(wh, rows, set()) == set(range(40 * (round_ + 1)))
    assert killed, "at least one compaction was killed mid-way"
    monkeypatch.setattr(maintenance, "GRACE_S", 0)  # and old temporaries count as stale at once
    wh.compact(settle_s=0)
    assert assert_exact(wh, rows, set()) == set(range(200))
    assert not list(root.rglob(f"*{delta.TMP_SUFFIX}")), "killed merges' temporaries cleaned"
    for day_dir in wh.table_dir("gpu_samples").glob("day=*"):
        assert len(list(day_dir.glob("*.parquet"))) == 1, "orphans and merged inputs vacuumed"
    rolled = wh.connect().execute(ROLLUP_SQL).fetchone()[0]
    assert rolled == 200 * rows


def test_a_batch_spanning_midnight_is_all_or_nothing(tmp_path: Path, monkeypatch) -> None:
    """append() promises one atomic batch; a crash between its day files must not leave half."""
    wh = Warehouse(tmp_path / "wh")
    data = pa.concat_tables([batch(47, 8), batch(48, 8)])  # 23:30 and 00:00 the next day
    real_write = delta.write_file
    calls = []

    def crash_on_second_day(table_dir: Path, day, rows: pa.Table, time_column):
        calls.append(day)
        if len(calls) == 2:
            raise OSError("killed")  # the writer dies while writing the second day's file
        return real_write(table_dir, day, rows, time_column)

    monkeypatch.setattr(delta, "write_file", crash_on_second_day)
    with pytest.raises(OSError):
        wh.append("gpu_samples", data)
    assert counted(wh)[0] == 0, "half of a batch is visible"
    wh.append("gpu_samples", data)
    assert counted(wh)[0] == 16, "the retried batch is counted once"


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "writer":
        run_writer(args[0], int(args[1]), int(args[2]), float(args[3]), *map(int, args[4:]))
    elif role == "reader":
        run_reader(args[0], int(args[1]), args[2])
    elif role == "compactor":
        run_compactor(args[0], args[1], args[2])
    elif role == "compact_once":
        run_compact_once(args[0])
