"""The Delta tables' guarantees with real processes: a writer or compactor SIGKILLed at every step
of a commit loses at most its unacknowledged batch; fsyncs come in the order that makes a
returned commit survive power loss; the log stays bounded; merges keep one row per key.

This file doubles as the worker program: `python -m tests.test_warehouse_delta ROLE ...`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sing.schema import table
from sing.warehouse import delta, maintenance
from sing.warehouse.store import Warehouse, conform, newest_per_key
from sing.warehouse.upsert import upsert

REPO = Path(__file__).resolve().parent.parent
BASE = datetime(2026, 1, 1, 23, 0, tzinfo=UTC)
ROWS = 64


def samples(index: int) -> pa.Table:
    """Batch `index`: ROWS samples a second apart stamped with the batch id, four batches a day
    from 23:00; the fourth spans midnight."""
    minute = 59 if index % 4 == 3 else (index % 4) * 10
    ts = BASE + timedelta(days=index // 4, minutes=minute)
    times = [ts + timedelta(seconds=r) for r in range(ROWS)]
    return pa.table(
        {
            "ts": pa.array(times, pa.timestamp("us", tz="UTC")),
            "node": [f"n{r % 4}" for r in range(ROWS)],
            "gpu_index": pa.array([r % 8 for r in range(ROWS)], pa.int16()),
            "gpu_uuid": [f"b{index}"] * ROWS,
            "job_id": [f"j{index % 5}"] * ROWS,
        }
    )


def job(index: int) -> pa.Table:
    return pa.table({"job_id": [f"j{index}", "shared"], "cluster": ["c", "c"]})


# ---- the worker processes --------------------------------------------------------------------


def run_writer(root: str, kind: str, first: int, count: int) -> None:
    """Append batches first.. first+count-1; print each index once append() has returned."""
    wh = Warehouse(root)
    for index in range(first, first + count):
        if kind == "samples":
            wh.append("gpu_samples", samples(index))
        else:
            wh.append("jobs", job(index))
        print(index, flush=True)


def run_compact(root: str) -> None:
    Warehouse(root).compact(now=datetime(2026, 3, 1, tzinfo=UTC))
    print("done", flush=True)


def spawn(role: str, *args: object, crash_at: str = "") -> subprocess.CompletedProcess:
    env = os.environ | {"SING_TEST_CRASH_AT": crash_at}
    return subprocess.run(
        [sys.executable, "-m", "tests.test_warehouse_delta", role, *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---- helpers -----------------------------------------------------------------------------------


def outside_counts(root: Path, name: str) -> list[int]:
    """Rows of a table through polars, pyarrow, and DuckDB over the files the log lists."""
    path = str(root / name)
    uris = DeltaTable(path).file_uris()
    con = duckdb.connect()
    duck = con.execute(f"SELECT count(*) FROM read_parquet({uris!r}, hive_partitioning = false)")
    return [
        pl.read_delta(path).height,
        DeltaTable(path).to_pyarrow_dataset().count_rows(),
        duck.fetchone()[0],
    ]


def batch_ids(wh: Warehouse) -> set[int]:
    """Batch ids present, each checked whole and once."""
    con = wh.connect()
    bad = con.execute(
        "SELECT gpu_uuid, count(*) FROM gpu_samples GROUP BY ALL HAVING count(*) <> ?", [ROWS]
    ).fetchall()
    assert bad == [], f"partial or doubled batches: {bad}"
    total, ids = con.execute(
        "SELECT count(*), count(DISTINCT gpu_uuid) FROM gpu_samples"
    ).fetchone()
    assert outside_counts(wh.root, "gpu_samples") == [total] * 3
    return {
        int(u[1:]) for (u,) in con.execute("SELECT DISTINCT gpu_uuid FROM gpu_samples").fetchall()
    }


# ---- a writer killed at every step of a commit -------------------------------------------------

SAMPLE_STEPS = ["data-written", "data-renamed", "data-fsynced", "committed", "log-synced"]


@pytest.mark.parametrize("step", SAMPLE_STEPS)
def test_sample_writer_killed_at_each_step_loses_only_its_unacknowledged_batch(
    tmp_path: Path, step: str
) -> None:
    root = tmp_path / "wh"
    wh = Warehouse(root)
    wh.append("gpu_samples", samples(0))  # the table exists, so every step below is an append's
    # The 3rd time the step is reached, the writer dies: two batches were acknowledged.
    out = spawn("writer", root, "samples", 1, 5, crash_at=f"{step}:3")
    assert out.returncode == -signal.SIGKILL, out.stderr
    acknowledged = {0, *map(int, out.stdout.split())}
    present = batch_ids(Warehouse(root))
    assert acknowledged <= present, f"acknowledged batches lost: {acknowledged - present}"
    assert present - acknowledged <= {max(acknowledged) + 1}, "only the in-flight batch may land"
    # The warehouse goes on: appends, compaction, and the debris is cleaned up.
    wh.append("gpu_samples", samples(99))
    maintenance.GRACE_S = 0
    try:
        wh.compact(now=datetime(2026, 3, 1, tzinfo=UTC))
    finally:
        maintenance.GRACE_S = 3600
    assert batch_ids(wh) == present | {99}
    assert not list(root.rglob("*.tmp")), "temporaries of the killed writer removed"
    on_disk = set((root / "gpu_samples").glob("day=*/*.parquet"))
    assert on_disk == {f.path for f in wh.live_files("gpu_samples")}, "orphans vacuumed"


@pytest.mark.parametrize("step", ["data-renamed", "committed", "log-synced"])
def test_record_writer_killed_mid_merge_keeps_one_row_per_key(tmp_path: Path, step: str) -> None:
    root = tmp_path / "wh"
    Warehouse(root).append("jobs", job(0))
    out = spawn("writer", root, "jobs", 1, 5, crash_at=f"{step}:3")
    assert out.returncode == -signal.SIGKILL, out.stderr
    acknowledged = {0, *map(int, out.stdout.split())}
    wh = Warehouse(root)
    jobs = {j for (j,) in wh.connect().execute("SELECT job_id FROM jobs").fetchall()}
    assert {f"j{i}" for i in acknowledged} | {"shared"} <= jobs
    assert len(jobs) - len(acknowledged) - 1 <= 1, "only the in-flight merge may land"
    assert outside_counts(root, "jobs") == [len(jobs)] * 3  # "shared": still one row
    wh.append("jobs", job(50))
    assert outside_counts(root, "jobs") == [len(jobs) + 1] * 3


@pytest.mark.parametrize(
    "step",
    ["data-written", "compaction-committed", "rollup-committed", "checkpoint-written", "vacuumed"],
)
def test_compactor_killed_at_each_step_leaves_exact_data(tmp_path: Path, step: str) -> None:
    root = tmp_path / "wh"
    wh = Warehouse(root)
    for index in range(12):
        wh.append("gpu_samples", samples(index))
    before = batch_ids(wh)
    out = spawn("compact", root, crash_at=f"{step}:1")
    assert out.returncode == -signal.SIGKILL, (out.stdout, out.stderr)
    assert batch_ids(Warehouse(root)) == before
    rolled = "SELECT sum(samples) FROM job_gpu_usage"
    Warehouse(root).compact(now=datetime(2026, 3, 1, tzinfo=UTC))
    assert batch_ids(Warehouse(root)) == before
    assert Warehouse(root).connect().execute(rolled).fetchone() == (12 * ROWS,)


# ---- durability order --------------------------------------------------------------------------


def test_append_fsyncs_data_before_commit_and_log_before_returning(
    tmp_path: Path, monkeypatch
) -> None:
    """What makes a returned append survive power loss: the data file and its directory are
    durable before the commit names them; the log entry and `_delta_log/` before return."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("gpu_samples", samples(0))
    events: list[str] = []
    real_fsync, real_commit = delta.files.fsync_path, DeltaTable.create_write_transaction

    def fsync(path: Path) -> None:
        kind = "log" if path.name.endswith(".json") else "data" if path.is_file() else "dir"
        events.append(f"fsync {kind} {path.name if kind == 'dir' else ''}".strip())
        real_fsync(path)

    def commit(self, *args, **kwargs):
        events.append("commit")
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(delta.files, "fsync_path", fsync)
    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)
    wh.append("gpu_samples", samples(3))  # spans midnight: two data files, one commit
    assert events == [
        "fsync data",
        "fsync dir day=2026-01-01",
        "fsync data",
        "fsync dir day=2026-01-02",
        "commit",
        "fsync log",
        "fsync dir _delta_log",
    ]


def test_merge_files_and_log_are_fsynced_before_append_returns(tmp_path: Path, monkeypatch) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", job(0))
    synced: list[Path] = []
    real_fsync = delta.files.fsync_path
    monkeypatch.setattr(delta.files, "fsync_path", lambda p: (synced.append(p), real_fsync(p)))
    wh.append("jobs", job(1))
    dt = wh.open("jobs")
    newest = {f.path for f in delta.live_files(dt)} - set(synced)
    assert newest == set(), f"files of the merge not fsynced: {newest}"
    assert synced[-2:] == [delta.log_entry(wh.table_dir("jobs"), dt.version()), synced[-1]]
    assert synced[-1].name == "_delta_log"


# ---- power loss: what fsync order leaves possible, repaired on opening ---------------------------


def newest_entry(root: Path, name: str) -> Path:
    return max((root / name / "_delta_log").glob("*.json"))


def test_a_torn_newest_log_entry_is_cut_off_on_opening(tmp_path: Path) -> None:
    """After a power loss the newest entry of a commit that never returned may be empty."""
    root = tmp_path / "wh"
    wh = Warehouse(root)
    for index in range(3):
        wh.append("gpu_samples", samples(index))
    torn = newest_entry(root, "gpu_samples")
    torn.write_bytes(b"")
    reopened = Warehouse(root)
    assert (root / ".quarantine" / "gpu_samples" / torn.name).exists()
    assert batch_ids(reopened) == {0, 1}  # the acknowledged prefix, whole, for every reader
    reopened.append("gpu_samples", samples(7))
    assert batch_ids(reopened) == {0, 1, 7}


def test_a_merge_whose_data_did_not_reach_the_disk_is_cut_off(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    wh = Warehouse(root)
    wh.append("jobs", job(0))
    wh.append("jobs", job(1))
    entry = newest_entry(root, "jobs")
    added = [line for line in entry.read_text().splitlines() if '"add"' in line]
    (root / "jobs" / json.loads(added[0])["add"]["path"]).unlink()
    reopened = Warehouse(root)
    jobs = reopened.connect().execute("SELECT job_id FROM jobs ORDER BY 1").fetchall()
    assert jobs == [("j0",), ("shared",)]
    assert outside_counts(root, "jobs") == [2] * 3


def test_a_torn_checkpoint_falls_back_to_the_log(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    wh = Warehouse(root)
    for index in range(12):
        wh.append("gpu_samples", samples(index))
    maintenance.tidy(wh, "gpu_samples")
    (checkpoint,) = (root / "gpu_samples" / "_delta_log").glob("*.checkpoint.parquet")
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    delta._tables.clear()  # as a fresh process after the power loss
    assert batch_ids(Warehouse(root)) == set(range(12))
    assert not checkpoint.exists()


# ---- records -----------------------------------------------------------------------------------


def test_merge_into_a_big_table_keeps_one_row_per_key(tmp_path: Path) -> None:
    """Over 8192 rows (delta-rs 1.6.0 wrongly saw duplicate source rows there), a key of three
    columns, and an older recorded_at loses."""
    wh = Warehouse(tmp_path / "wh")
    ids = [f"{i}" for i in range(10_000)]
    wh.append(
        "jobs", pa.table({"job_id": ids, "cluster": ["c"] * len(ids), "state": ["R"] * 10_000})
    )
    wh.append(
        "jobs", pa.table({"job_id": ids[:9000], "cluster": ["c"] * 9000, "state": ["D"] * 9000})
    )
    old = datetime(2020, 1, 1, tzinfo=UTC)
    stale = {"job_id": ["1"], "cluster": ["c"], "state": ["OLD"], "recorded_at": [old]}
    wh.append("jobs", pa.table(stale))
    node = {"node": ["n1"], "cluster": ["c"], "gpus": pa.array([4], pa.int16())}
    node["valid_from"] = pa.array([old], pa.timestamp("us", tz="UTC"))
    wh.append("nodes", pa.table(node))
    wh.append("nodes", pa.table(node | {"gpus": pa.array([8], pa.int16())}))
    con = wh.connect()
    assert con.execute("SELECT state, count(*) FROM jobs GROUP BY ALL ORDER BY 1").fetchall() == [
        ("D", 9000),
        ("R", 1000),
    ]
    assert con.execute("SELECT gpus FROM nodes").fetchall() == [(8,)]
    assert outside_counts(wh.root, "jobs") == [10_000] * 3


@contextmanager
def first_refresh_stale(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The first snapshot refresh inside the block does nothing, as if it came just before
    another machine's commit; the versions each refresh found are listed."""
    refreshes: list[int] = []
    real_refresh = DeltaTable.update_incremental

    def refresh_too_early(self: DeltaTable) -> None:
        refreshes.append(self.version())
        if len(refreshes) > 1:
            real_refresh(self)

    monkeypatch.setattr(DeltaTable, "update_incremental", refresh_too_early)
    try:
        yield refreshes
    finally:
        monkeypatch.undo()


def test_a_merge_that_loses_a_race_to_another_machine_is_retried(
    tmp_path: Path, monkeypatch
) -> None:
    """On shared storage the table lock does not reach another machine: when its merge lands
    between our refresh and our commit, delta-rs refuses ours (both replace the same file) and
    sing does it again on the newer snapshot, so neither machine's rows are lost."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", job(0))
    ours = wh.open("jobs")
    elsewhere = DeltaTable(str(wh.table_dir("jobs")))  # the other machine's view of the table
    upsert(elsewhere, table("jobs"), conform(table("jobs"), job(1)))
    with first_refresh_stale(monkeypatch) as refreshes:
        upsert(ours, table("jobs"), conform(table("jobs"), job(2)))
    assert refreshes[:2] == [1, 1], "the first attempt ran on the stale snapshot and was refused"
    rows = pl.read_delta(str(wh.table_dir("jobs"))).sort("job_id")["job_id"].to_list()
    assert rows == ["j0", "j1", "j2", "shared"]


def test_two_machines_inserting_the_same_new_key_keep_one_row(tmp_path: Path, monkeypatch) -> None:
    """A leader handover while the old leader still syncs: both machines upsert a job that
    neither snapshot holds. The second commit is refused (both rewrite the table's smallest
    file) and done again on the newer snapshot, so the key keeps one row, the newer."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", job(0))
    ours = wh.open("jobs")
    elsewhere = DeltaTable(str(wh.table_dir("jobs")))
    spec = table("jobs")

    def new_job(state: str, minute: int) -> pa.Table:
        at = datetime(2030, 1, 1, 0, minute, tzinfo=UTC)
        return conform(spec, pa.table({"job_id": ["j9"], "cluster": ["c"], "state": [state],
                                       "recorded_at": [at]}))  # fmt: skip

    upsert(elsewhere, spec, new_job("RUNNING", 1))
    with first_refresh_stale(monkeypatch) as refreshes:
        upsert(ours, spec, new_job("COMPLETED", 2))
    assert refreshes[:2] == [1, 1], "the first attempt ran on the stale snapshot and was refused"
    query = "SELECT job_id, state FROM jobs ORDER BY 1"
    assert wh.connect().execute(query).fetchall() == [
        ("j0", None), ("j9", "COMPLETED"), ("shared", None)
    ]  # fmt: skip


def test_a_cached_table_is_reloaded_once_a_newer_checkpoint_exists(tmp_path: Path) -> None:
    """A `DeltaTable` kept current by incremental updates alone slows down with each one, so
    sing swaps it for a fresh object after every checkpoint; `checkpoint_due` writes them
    between compactions, only for tables with enough commits since the last."""
    wh = Warehouse(tmp_path / "wh")
    for index in range(maintenance.CHECKPOINT_EVERY - 2):  # with the creation: one short
        wh.append("gpu_samples", samples(index))
    cached = wh.open("gpu_samples")
    assert wh.checkpoint_due() == [] and wh.open("gpu_samples") is cached
    wh.append("gpu_samples", samples(maintenance.CHECKPOINT_EVERY - 2))
    wh.append("jobs", job(0))
    assert wh.checkpoint_due(["jobs", "scrapes"]) == []  # a round that wrote only these
    assert wh.checkpoint_due() == ["gpu_samples"]
    fresh = wh.open("gpu_samples")
    assert fresh is not cached
    assert fresh.version() == delta.last_checkpoint(wh.table_dir("gpu_samples"))
    assert delta.versions_since_checkpoint(fresh) == 0
    assert outside_counts(wh.root, "gpu_samples") == [(maintenance.CHECKPOINT_EVERY - 1) * ROWS] * 3


def test_a_process_that_merged_exits_cleanly(tmp_path: Path) -> None:
    """delta-rs's own MERGE, which sing's upserts used before sing/warehouse/upsert.py, could
    abort the interpreter at exit ("terminate called without an active exception") unless the
    tables were dropped first; a process of sing's upserts exits cleanly."""
    root = tmp_path / "wh"
    for run in range(4):
        out = spawn("writer", root, "jobs", run * 10, 3)
        assert out.returncode == 0, out.stderr


# ---- the log stays bounded ----------------------------------------------------------------------


def test_log_stays_bounded_under_many_small_commits(tmp_path: Path) -> None:
    """The collector's 15 s commits, shortened: a checkpoint every 10 commits or more, and log
    entries (and checkpoints) older than a day are dropped back to the newest checkpoint before
    that day, as the Delta protocol allows. So the log holds about one day of entries."""
    wh = Warehouse(tmp_path / "wh")
    log_dir = wh.table_dir("gpu_samples") / "_delta_log"
    for index in range(120):
        wh.append("gpu_samples", samples(index))
        if index % 20 == 19:
            maintenance.tidy(wh, "gpu_samples")
    assert len(list(log_dir.glob("*.json"))) > 100
    day_ago = time.time() - 2 * 86_400
    for entry in log_dir.glob("0*"):  # every entry and checkpoint so far is two days old
        os.utime(entry, (day_ago, day_ago))
    for index in range(120, 135):
        wh.append("gpu_samples", samples(index))
    maintenance.tidy(wh, "gpu_samples")
    assert len(list(log_dir.glob("*.json"))) <= 3 * maintenance.CHECKPOINT_EVERY
    assert len(list(log_dir.glob("*.checkpoint.parquet"))) <= 2
    assert Warehouse(wh.root).connect().execute("SELECT count(*) FROM gpu_samples").fetchone() == (
        135 * ROWS,
    )
    assert outside_counts(wh.root, "gpu_samples") == [135 * ROWS] * 3


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "writer":
        run_writer(args[0], args[1], int(args[2]), int(args[3]))
    elif role == "compact":
        run_compact(args[0])


@pytest.mark.parametrize("name, column", [("jobs", "sluid"), ("gpu_samples", "gpu_uuid")])
def test_a_column_added_to_the_schema_reaches_a_table_created_without_it(
    tmp_path: Path, name: str, column: str
) -> None:
    """A warehouse made by an older sing lacks the column; the first write adds it, so a merge
    keeps it (delta-rs drops a source column its target lacks) and a Delta reader sees it."""
    wh = Warehouse(tmp_path / "wh")
    spec = table(name)
    older = pa.schema([f for f in spec.schema if f.name != column])
    delta.ensure_table(
        wh.table_dir(name),
        delta.table_schema(older, partitioned=spec.is_samples),
        [delta.DAY] if spec.is_samples else [],
    )
    value = "s0G2J8K4P1XY05" if name == "jobs" else "GPU-1234"
    row = {"cluster": "campus", "node": "n1", "gpu_index": 0, "ts": BASE, "job_id": "7"}
    wh.append(
        name,
        pa.Table.from_pylist([row | {column: value}]).select(
            [c for c in [*row, column] if c in spec.schema.names]
        ),
    )
    (stored,) = wh.connect({name: None}).execute(f"SELECT {column} FROM {name}").fetchone()
    assert stored == value
    fields = {f.name for f in DeltaTable(str(wh.table_dir(name))).schema().fields}
    assert column in fields


def test_upserts_give_a_references_rows_in_files_of_plain_strings(tmp_path: Path) -> None:
    """Forty random upserts of the nodes table give the rows a dict keyed by record gives: a
    row no newer than the stored one loses, whichever batch it comes in. Every
    live file has plain strings: Daft's Delta reader cannot read Arrow's string views, which
    delta-rs's merges wrote."""
    rng = random.Random(33)
    wh = Warehouse(tmp_path / "wh")
    base = datetime(2026, 1, 1, tzinfo=UTC)
    reference: dict[tuple, tuple] = {}
    for _ in range(40):
        batch: dict[tuple, tuple] = {}
        for _ in range(rng.randint(1, 6)):
            key = (f"n{rng.randint(0, 7)}", base + timedelta(days=rng.randint(0, 2)))
            batch[key] = (rng.randint(0, 8), base + timedelta(minutes=rng.randint(0, 40)))
        wh.append("nodes", pa.table({
            "cluster": ["c"] * len(batch),
            "node": [node for node, _ in batch],
            "valid_from": pa.array([since for _, since in batch], pa.timestamp("us", "UTC")),
            "gpus": pa.array([gpus for gpus, _ in batch.values()], pa.int16()),
            "recorded_at": [at for _, at in batch.values()],
        }))  # fmt: skip
        for key, (gpus, at) in batch.items():
            if key not in reference or at > reference[key][1]:
                reference[key] = (gpus, at)
    query = "SELECT node, valid_from, gpus, recorded_at FROM nodes"
    stored = wh.connect().execute(query).fetchall()
    assert sorted(stored, key=str) == sorted(
        ((*key, *value) for key, value in reference.items()), key=str
    )
    assert outside_counts(wh.root, "nodes") == [len(reference)] * 3
    for f in wh.live_files("nodes"):
        schema = pq.read_schema(f.path)
        assert not [field for field in schema if pa.types.is_string_view(field.type)], f.path


def test_compaction_rewrites_a_record_tables_files_of_string_views(tmp_path: Path) -> None:
    """A warehouse from before sing wrote its own upserts holds files of delta-rs's merges,
    with Arrow string views that Daft cannot read: the next compaction merges such a table into
    one file of plain strings at once, well before it has MERGE_RECORDS_AT files."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", job(0))
    dt = wh.open("jobs")
    (  # an upsert as sing made them before: delta-rs's MERGE
        dt.merge(conform(table("jobs"), job(1)), "t.job_id = s.job_id AND t.cluster = s.cluster",
                 source_alias="s", target_alias="t")
        .when_matched_update_all().when_not_matched_insert_all().execute()
    )  # fmt: skip

    def views() -> list[bool]:
        return [
            any(pa.types.is_string_view(field.type) for field in pq.read_schema(f.path))
            for f in wh.live_files("jobs")
        ]

    assert True in views() and len(views()) < maintenance.MERGE_RECORDS_AT
    wh.compact()
    assert views() == [False]
    query = "SELECT job_id FROM jobs ORDER BY 1"
    assert wh.connect().execute(query).fetchall() == [("j0",), ("j1",), ("shared",)]
    assert outside_counts(wh.root, "jobs") == [3] * 3


def test_an_upsert_matches_a_null_key_part_to_a_null_one(tmp_path: Path) -> None:
    """Rows from before a key column was filled (an upgraded warehouse) have NULL there: such
    a row is replaced by a newer row whose key is NULL there too, and by no other."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", job(0))
    spec = table("jobs")
    dt = wh.open("jobs")

    def jobs(cluster: str | None, state: str, minute: int) -> pa.Table:
        row = {"job_id": "7", "cluster": cluster, "state": state,
               "recorded_at": datetime(2026, 1, 1, 0, minute, tzinfo=UTC)}  # fmt: skip
        return pa.Table.from_pylist([row], spec.schema)

    upsert(dt, spec, jobs(None, "OLD", 1))
    upsert(dt, spec, jobs(None, "NEW", 2))
    upsert(dt, spec, jobs("c", "OTHER", 3))
    upsert(dt, spec, jobs(None, "STALE", 0))
    query = "SELECT cluster, state FROM jobs WHERE job_id = '7' ORDER BY 1 NULLS FIRST"
    assert wh.connect().execute(query).fetchall() == [(None, "NEW"), ("c", "OTHER")]


def test_a_merge_takes_the_newest_row_of_each_key_nulls_and_ties_included() -> None:
    """The source rows a merge takes: per key (a NULL cluster a key like any other), the newest
    `recorded_at`, and of two equally new rows the one sent first; in the batch's order."""
    batch = pa.table(
        {
            "cluster": ["a", "a", "a", None, None, "b"],
            "job_id": ["1", "1", "2", "3", "3", "1"],
            "recorded_at": [1, 5, 2, 7, 7, 3],
            "sent": ["1a-old", "1a-new", "2a", "3-first", "3-second", "1b"],
        }
    )
    kept = newest_per_key(batch, ("cluster", "job_id"))
    assert kept.column("sent").to_pylist() == ["1a-new", "2a", "3-first", "1b"]


def test_append_takes_an_arrow_record_batch_and_a_polars_frame(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.append("jobs", pa.record_batch({"job_id": ["1"], "cluster": ["c"]}))
    wh.append("jobs", pl.DataFrame({"job_id": ["2"], "cluster": ["c"]}))
    assert wh.connect().execute("SELECT job_id FROM jobs ORDER BY 1").fetchall() == [("1",), ("2",)]
