"""The warehouse store on hand-checkable data: appends, upserts, rollups, compaction, retention,
migrations. Every number asserted here was worked out by hand from the rows written."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.errors import UserError
from warehouse import files, migrations, store
from warehouse.store import Warehouse

GIB = 2**30
DAY = date(2026, 1, 5)  # long closed: compact() rolls it up


def at(hour: int, minute: int = 0, second: int = 0, day: date = DAY) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)


def gpu_rows(*rows: tuple) -> pl.DataFrame:
    """(ts, node, gpu_index, job_id, util, sm_active, mem_used, power_w, energy_j) per row."""
    names = ["ts", "node", "gpu_index", "job_id", "util", "sm_active", "mem_used_bytes"]
    names += ["power_w", "energy_j"]
    return pl.DataFrame([dict(zip(names, r, strict=True)) for r in rows]).with_columns(
        mem_total_bytes=pl.lit(80 * GIB)
    )


# The tiny day every rollup test uses. Job j1 holds n1's GPUs 0 and 1; n2's GPU 0 has no job.
SAMPLES = [
    (at(10, 0, 0), "n1", 0, "j1", 0.5, 0.4, 10 * GIB, 100.0, 1000.0),
    (at(10, 0, 15), "n1", 0, "j1", 1.0, 0.8, 20 * GIB, 300.0, 4000.0),
    (at(11, 0, 0), "n1", 0, "j1", 0.0, 0.0, 5 * GIB, 50.0, 4750.0),
    (at(10, 0, 0), "n1", 1, "j1", 0.0, None, 1 * GIB, 60.0, 10.0),
    (at(10, 0, 15), "n1", 1, "j1", 0.005, None, 1 * GIB, 60.0, 910.0),
    (at(10, 0, 0), "n2", 0, None, 0.9, 0.9, 40 * GIB, 400.0, 0.0),
]
RDMA = [  # (ts, node, job_id, tx_delta, rx_delta)
    (at(10, 0, 0), "n1", "j1", 100, 200),
    (at(10, 0, 15), "n1", "j1", 1000, 2000),
    (at(10, 0, 0), "n2", None, 5, 7),
]

# By hand from SAMPLES (IDLE_SAMPLE_UTIL = 0.01, so utils 0.0 and 0.005 are idle samples).
JOB_GPU_USAGE = [
    # node, gpu, samples, util_sum, util_max, sm_sum, sm_samples, idle, mem_peak, e_min, e_max,
    # power_sum, first_ts, last_ts
    ("n1", 0, 3, 1.5, 1.0, 1.2, 3, 1, 20 * GIB, 1000.0, 4750.0, 450.0, at(10), at(11)),
    ("n1", 1, 2, 0.005, 0.005, None, 0, 2, 1 * GIB, 10.0, 910.0, 120.0, at(10), at(10, 0, 15)),
]
GPU_HOURLY = [  # hour, node, gpu, samples, assigned_samples, util_sum, power_sum
    (at(10), "n1", 0, 2, 2, 1.5, 400.0),
    (at(10), "n1", 1, 2, 2, 0.005, 120.0),
    (at(10), "n2", 0, 1, 0, 0.9, 400.0),
    (at(11), "n1", 0, 1, 1, 0.0, 50.0),
]
JOB_RDMA_USAGE = [("j1", "n1", DAY, 2, 1100, 2200)]


def load_tiny_day(wh: Warehouse) -> None:
    """Write SAMPLES and RDMA as one batch per scrape (several small files per day)."""
    for ts in sorted({r[0] for r in SAMPLES}):
        wh.append("gpu_samples", gpu_rows(*(r for r in SAMPLES if r[0] == ts)))
    for ts, node, job, tx, rx in RDMA:
        rdma = {"ts": [ts], "node": [node], "device": ["mlx5_0"], "port": [1], "job_id": [job]}
        rdma |= {"tx_delta_bytes": [tx], "rx_delta_bytes": [rx]}
        wh.append("rdma_samples", pa.table(rdma))


def rollup_rows(wh: Warehouse) -> dict[str, list[tuple]]:
    con = wh.connect()
    return {
        "job_gpu_usage": con.execute(
            "SELECT node, gpu_index, samples, util_sum, util_max, sm_sum, sm_samples, "
            "idle_samples, mem_peak_bytes, energy_min_j, energy_max_j, power_sum, first_ts, "
            "last_ts FROM job_gpu_usage WHERE job_id = 'j1' ORDER BY node, gpu_index"
        ).fetchall(),
        "gpu_hourly": con.execute(
            "SELECT hour, node, gpu_index, samples, assigned_samples, util_sum, power_sum "
            "FROM gpu_hourly WHERE hour::DATE = ? ORDER BY hour, node, gpu_index",
            [DAY],
        ).fetchall(),
        "job_rdma_usage": con.execute(
            "SELECT job_id, node, day, samples, tx_bytes, rx_bytes FROM job_rdma_usage"
        ).fetchall(),
    }


def assert_rows(actual: list[tuple], expected: list[tuple]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        # float32 columns summed: compare floats to 6 digits, everything else exactly.
        close = [pytest.approx(w, rel=1e-6) if isinstance(w, float) else w for w in want]
        assert list(got) == close, (got, want)


def assert_tiny_day_rollups(wh: Warehouse) -> None:
    rows = rollup_rows(wh)
    assert_rows(rows["job_gpu_usage"], JOB_GPU_USAGE)
    assert_rows(rows["gpu_hourly"], GPU_HOURLY)
    assert rows["job_rdma_usage"] == JOB_RDMA_USAGE


def day_dir(wh: Warehouse, name: str, day: date = DAY) -> Path:
    return wh.table_dir(name) / f"day={day.isoformat()}"


def rollup_day_dir(wh: Warehouse, name: str, day: date = DAY) -> Path:
    return wh.rollup_dir(name) / f"day={day.isoformat()}"


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


# ---- append / connect ----------------------------------------------------------------------


def test_batch_spanning_midnight_lands_in_two_day_dirs(wh: Warehouse) -> None:
    late, early = at(23, 59, 45, date(2026, 1, 1)), at(0, 0, 0, date(2026, 1, 2))
    batch = pa.table({"ts": [early, late, early], "node": ["a", "b", "c"], "gpu_index": [0, 1, 2]})
    assert wh.append("gpu_samples", batch) == 3
    assert sorted(wh.day_dirs(wh.table_dir("gpu_samples"))) == [date(2026, 1, 1), date(2026, 1, 2)]
    first = pq.read_table(files.live_files(day_dir(wh, "gpu_samples", date(2026, 1, 1)))[0].path)
    second = pq.read_table(files.live_files(day_dir(wh, "gpu_samples", date(2026, 1, 2)))[0].path)
    assert first.column("node").to_pylist() == ["b"]
    assert sorted(second.column("node").to_pylist()) == ["a", "c"]
    rows = wh.connect().execute("SELECT node, ts FROM gpu_samples ORDER BY node").fetchall()
    assert rows == [("a", early), ("b", late), ("c", early)]


def test_missing_nullable_columns_are_filled_with_nulls(wh: Warehouse) -> None:
    wh.append("gpu_samples", pl.DataFrame({"ts": [at(10)], "node": ["n1"], "gpu_index": [3]}))
    con = wh.connect()
    row = con.execute("SELECT gpu_index, util, power_w, job_id FROM gpu_samples").fetchone()
    assert row == (3, None, None, None)
    types = dict(
        con.execute("SELECT column_name, column_type FROM (DESCRIBE gpu_samples)").fetchall()
    )
    assert types["ts"] == "TIMESTAMP WITH TIME ZONE"
    assert types["util"] == "FLOAT" and types["mem_used_bytes"] == "BIGINT"


def test_unknown_column_is_rejected_and_nothing_written(wh: Warehouse) -> None:
    batch = pa.table({"ts": [at(10)], "node": ["n1"], "utilisation": [0.5]})
    with pytest.raises(UserError, match="gpu_samples: unknown column.*utilisation"):
        wh.append("gpu_samples", batch)
    assert not wh.table_dir("gpu_samples").exists()


def test_null_key_is_rejected_naming_the_row(wh: Warehouse) -> None:
    jobs = pa.table({"job_id": ["1", None, "3"], "cluster": ["c", "c", "c"]})
    with pytest.raises(UserError, match="jobs: column job_id is empty in row 2"):
        wh.append("jobs", jobs)
    samples = pa.table({"ts": [at(10), None], "node": ["n1", "n1"]})
    with pytest.raises(UserError, match="gpu_samples: column ts is empty in row 2"):
        wh.append("gpu_samples", samples)
    assert wh.connect().execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_value_of_wrong_type_names_the_column(wh: Warehouse) -> None:
    batch = pa.table({"ts": [at(10)], "node": ["n1"], "gpu_index": [70000]})
    with pytest.raises(UserError, match="column gpu_index: cannot convert"):
        wh.append("gpu_samples", batch)


def test_record_upsert_newest_version_wins_and_recorded_at_is_filled(wh: Warehouse) -> None:
    before = datetime.now(UTC)
    wh.append("jobs", pl.DataFrame({"job_id": ["7"], "cluster": ["c"], "state": ["RUNNING"]}))
    wh.append("jobs", pl.DataFrame({"job_id": ["8"], "cluster": ["c"], "state": ["PENDING"]}))
    wh.append("jobs", pl.DataFrame({"job_id": ["7"], "cluster": ["c"], "state": ["COMPLETED"]}))
    # The same job id on another cluster is another job.
    wh.append("jobs", pl.DataFrame({"job_id": ["7"], "cluster": ["d"], "state": ["FAILED"]}))
    rows = (
        wh.connect()
        .execute("SELECT cluster, job_id, state, recorded_at FROM jobs ORDER BY cluster, job_id")
        .fetchall()
    )
    assert [r[:3] for r in rows] == [
        ("c", "7", "COMPLETED"),
        ("c", "8", "PENDING"),
        ("d", "7", "FAILED"),
    ]
    assert all(before <= r[3] <= datetime.now(UTC) for r in rows)
    # An explicit recorded_at decides, not the order of arrival.
    old = pa.table(
        {"job_id": ["7"], "cluster": ["c"], "state": ["RUNNING"], "recorded_at": [before]}
    )
    wh.append("jobs", old)
    assert wh.connect().execute(
        "SELECT state FROM jobs WHERE job_id = '7' AND cluster = 'c'"
    ).fetchall() == [("COMPLETED",)]


def test_a_file_written_before_a_column_was_added_stays_readable_and_compactable(
    wh: Warehouse,
) -> None:
    """schema.py promises that adding a column needs no migration: old files lack it."""
    old_day = date(2026, 1, 1)
    directory = day_dir(wh, "gpu_samples", old_day)
    ts = pa.array([at(1, day=old_day)], pa.timestamp("us", tz="UTC"))
    old = pa.table({"ts": ts, "node": ["n1"], "gpu_index": pa.array([0], pa.int16())})
    tmp = files.temporary_path(directory)
    pq.write_table(old.append_column("util", pa.array([0.5], pa.float32())), tmp)
    files.commit_written(tmp, directory)
    wh.append("gpu_samples", gpu_rows((at(10), "n1", 0, "j1", 0.25, 0.2, GIB, 50.0, 1.0)))
    wh.compact(settle_s=0)
    con = wh.connect()
    assert con.execute("SELECT sum(samples), sum(util_sum) FROM gpu_hourly").fetchone() == (2, 0.75)
    assert files.live_files(rollup_day_dir(wh, "gpu_hourly", old_day)), "old day not rolled up"


# ---- rollups -------------------------------------------------------------------------------


def test_rollups_by_hand_identical_live_and_after_compaction(wh: Warehouse) -> None:
    load_tiny_day(wh)
    assert len(files.live_files(day_dir(wh, "gpu_samples"))) == 3
    assert not wh.rollup_dir("job_gpu_usage").exists()
    assert_tiny_day_rollups(wh)  # live aggregation over the raw files

    result = wh.compact(settle_s=0)
    assert result.merged_files == 3 + 3  # gpu and rdma parts
    assert result.rollup_days == 4  # one day for each of the four rollups
    assert len(files.live_files(day_dir(wh, "gpu_samples"))) == 1
    for name in ("job_gpu_usage", "gpu_hourly", "job_rdma_usage", "node_rdma_hourly"):
        assert len(files.live_files(rollup_day_dir(wh, name))) == 1, name
    assert_tiny_day_rollups(wh)  # now read from the stored rollup files

    stored, hot = wh._rollup_sources(store.ROLLUPS["job_gpu_usage"])
    assert (len(stored), hot) == (1, [])


def test_late_sample_makes_rollup_stale_until_next_compaction(wh: Warehouse) -> None:
    load_tiny_day(wh)
    wh.compact(settle_s=0)
    rolled = files.live_files(rollup_day_dir(wh, "job_gpu_usage"))
    wh.append("gpu_samples", gpu_rows((at(10, 30), "n1", 0, "j1", 0.25, 0.2, 30 * GIB, 10.0, 5.0)))

    def n1_gpu0() -> tuple:
        return (
            wh.connect()
            .execute(
                "SELECT samples, util_sum, mem_peak_bytes, energy_min_j FROM job_gpu_usage "
                "WHERE node = 'n1' AND gpu_index = 0"
            )
            .fetchone()
        )

    assert n1_gpu0() == (4, 1.75, 30 * GIB, 5.0)  # the late sample is aggregated live
    late = max(files.live_files(day_dir(wh, "gpu_samples")))
    assert late.path in wh._rollup_sources(store.ROLLUPS["job_gpu_usage"])[1]

    result = wh.compact(settle_s=0)
    assert result.rollup_days == 2  # job_gpu_usage and gpu_hourly of that day
    assert files.live_files(rollup_day_dir(wh, "job_gpu_usage")) != rolled
    stored, hot = wh._rollup_sources(store.ROLLUPS["job_gpu_usage"])
    assert (len(stored), hot) == (1, [])
    assert n1_gpu0() == (4, 1.75, 30 * GIB, 5.0)
    hourly = wh.connect().execute(
        "SELECT samples, util_sum FROM gpu_hourly WHERE node = 'n1' AND gpu_index = 0 AND hour = ?",
        [at(10)],
    )
    assert hourly.fetchone() == (3, 1.75)


# ---- compaction ----------------------------------------------------------------------------


def test_many_small_files_merge_into_one_covering_file(wh: Warehouse, monkeypatch) -> None:
    for i in range(30):
        ts = at(i // 4, (i % 4) * 15)
        wh.append("gpu_samples", gpu_rows((ts, f"n{i % 3}", i % 8, None, i / 100, None, i, 1.0, i)))
    directory = day_dir(wh, "gpu_samples")
    parts = files.live_files(directory)
    query = "SELECT * FROM gpu_samples ORDER BY ts, node"
    before = wh.connect().execute(query).fetchall()
    assert len(parts) == 30 and len(before) == 30

    result = wh.compact(settle_s=0)
    assert (result.merged_files, result.deleted_files) == (30, 0)
    (merged,) = files.live_files(directory)
    assert (merged.first, merged.last) == (parts[0].first, parts[-1].last)
    assert all(merged.covers(p) for p in parts)
    assert len(files.data_files(directory)) == 31  # the parts wait out the grace time
    assert wh.connect().execute(query).fetchall() == before
    merged_ts = pq.read_table(merged.path).column("ts").to_pylist()
    assert merged_ts == sorted(merged_ts), "merged day is sorted by time"

    assert wh.compact(settle_s=0).deleted_files == 0  # still inside GRACE_S
    monkeypatch.setattr(store, "GRACE_S", 0.0)
    assert wh.compact(settle_s=0).deleted_files == 30
    assert files.data_files(directory) == [merged]
    assert wh.connect().execute(query).fetchall() == before


def test_unsettled_files_are_not_merged(wh: Warehouse) -> None:
    for minute in range(3):
        wh.append("gpu_samples", gpu_rows((at(10, minute), "n1", 0, None, 0.5, None, 1, 1.0, 1.0)))
    assert wh.compact(settle_s=3600).merged_files == 0
    assert len(files.live_files(day_dir(wh, "gpu_samples"))) == 3


def test_record_tables_merge_and_keep_the_newest_version(wh: Warehouse) -> None:
    for i in range(store.MERGE_RECORDS_AT):
        state = "COMPLETED" if i == store.MERGE_RECORDS_AT - 1 else f"STEP{i}"
        wh.append("jobs", pl.DataFrame({"job_id": ["1", f"x{i}"], "cluster": "c", "state": state}))
    assert wh.compact(settle_s=0).merged_files == store.MERGE_RECORDS_AT
    (merged,) = files.live_files(wh.table_dir("jobs"))
    stored = pq.read_table(merged.path)
    assert stored.num_rows == 1 + store.MERGE_RECORDS_AT  # older versions of job 1 dropped
    con = wh.connect()
    assert con.execute("SELECT state FROM jobs WHERE job_id = '1'").fetchall() == [("COMPLETED",)]
    assert con.execute("SELECT count(*) FROM jobs").fetchone() == (1 + store.MERGE_RECORDS_AT,)


def test_stale_temporary_file_from_a_killed_writer_is_ignored(wh: Warehouse, monkeypatch) -> None:
    load_tiny_day(wh)
    wh.append("jobs", pl.DataFrame({"job_id": ["1"], "cluster": ["c"]}))
    good = pq.read_table(files.live_files(day_dir(wh, "gpu_samples"))[0].path)
    for directory in (day_dir(wh, "gpu_samples"), wh.table_dir("jobs")):
        # What a SIGKILL mid-write leaves: the first bytes of a Parquet file, under a temp name.
        tmp = files.temporary_path(directory)
        pq.write_table(good, tmp)
        tmp.write_bytes(tmp.read_bytes()[:100])
    con = wh.connect()
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (len(SAMPLES),)
    assert con.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
    wh.compact(settle_s=0)
    assert_tiny_day_rollups(wh)
    monkeypatch.setattr(store, "GRACE_S", 0.0)
    wh.compact(settle_s=0)
    leftovers = [p for p in wh.root.rglob(f"{files.TMP_PREFIX}*")]
    assert leftovers == []


# ---- retention -----------------------------------------------------------------------------


def test_retention_drops_raw_days_only_when_rolled_up(wh: Warehouse) -> None:
    load_tiny_day(wh)
    newer = date(2026, 1, 20)
    wh.append("gpu_samples", gpu_rows((at(9, day=newer), "n1", 0, "j2", 0.75, 0.5, GIB, 1.0, 1.0)))
    now = datetime(2026, 1, 21, tzinfo=UTC)
    assert wh.apply_retention(raw_days=7, now=now) == []  # nothing rolled up yet: keep all

    wh.compact(settle_s=0)
    removed = wh.apply_retention(raw_days=7, now=now)
    assert removed == [day_dir(wh, "gpu_samples"), day_dir(wh, "rdma_samples")]
    con = wh.connect()
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (1,)  # only Jan 20
    assert_tiny_day_rollups(wh)  # the summaries outlive the raw samples
    assert con.execute("SELECT util_sum FROM job_gpu_usage WHERE job_id = 'j2'").fetchone() == (
        0.75,
    )


def test_retention_keeps_a_day_whose_rollup_is_stale(wh: Warehouse) -> None:
    load_tiny_day(wh)
    wh.compact(settle_s=0)
    wh.append("gpu_samples", gpu_rows((at(12), "n1", 0, "j1", 0.25, 0.2, GIB, 1.0, 1.0)))
    now = datetime(2026, 2, 1, tzinfo=UTC)
    assert wh.apply_retention(raw_days=7, now=now) == [day_dir(wh, "rdma_samples")]
    assert wh.connect().execute("SELECT count(*) FROM gpu_samples").fetchone() == (7,)


def test_late_sample_after_retention_keeps_the_rolled_up_numbers(wh: Warehouse) -> None:
    """A backfilled sample for an aged-out day must add to its rollup, not replace it."""
    load_tiny_day(wh)
    wh.compact(settle_s=0)
    wh.apply_retention(raw_days=7, now=datetime(2026, 2, 1, tzinfo=UTC))
    wh.append("gpu_samples", gpu_rows((at(12), "n1", 0, "j1", 0.25, 0.2, GIB, 1.0, 1.0)))
    query = (
        "SELECT sum(samples), sum(util_sum) FROM job_gpu_usage WHERE node = 'n1' AND gpu_index = 0"
    )
    assert wh.connect().execute(query).fetchone() == (4, 1.75)
    wh.compact(settle_s=0)
    assert wh.connect().execute(query).fetchone() == (4, 1.75)


# ---- migrations ----------------------------------------------------------------------------


def test_version_1_warehouse_is_upgraded_and_gets_rollups(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "old"
    wh = Warehouse(root)
    # A version-1 warehouse was written long ago: its files carry old sequence numbers.
    clock = iter(range(10**18, 10**18 + 10**6))
    with monkeypatch.context() as m:
        m.setattr(files, "next_sequence", lambda: next(clock))
        load_tiny_day(wh)
    (root / migrations.META).write_text(json.dumps({"schema_version": 1}))
    assert not wh.rollup_dir("job_gpu_usage").exists()

    upgraded = Warehouse(root)
    assert migrations.read_version(upgraded) == migrations.CURRENT_VERSION == 2
    assert len(files.live_files(rollup_day_dir(upgraded, "job_gpu_usage"))) == 1
    assert len(files.live_files(day_dir(upgraded, "gpu_samples"))) == 1
    assert_tiny_day_rollups(upgraded)


def test_new_warehouse_starts_at_current_version(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "new")
    meta = json.loads((wh.root / migrations.META).read_text())
    assert meta == {"schema_version": migrations.CURRENT_VERSION}


def test_newer_warehouse_than_supported_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "future"
    root.mkdir()
    (root / migrations.META).write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(Exception, match="schema version 99, newer than this sing"):
        Warehouse(root)
    assert json.loads((root / migrations.META).read_text()) == {"schema_version": 99}


# ---- other engines -------------------------------------------------------------------------


def test_documented_external_reader_sql_counts_each_row_once(wh: Warehouse) -> None:
    """docs/warehouse.md tells Spark/Trino/DuckDB users how to skip superseded files: keep it true
    while a merged file and its parts coexist (grace window) and a dead temporary lies around."""
    load_tiny_day(wh)
    wh.compact(settle_s=0)
    wh.append("gpu_samples", gpu_rows((at(12), "n1", 0, "j1", 0.25, 0.2, GIB, 1.0, 1.0)))
    files.temporary_path(day_dir(wh, "gpu_samples")).write_bytes(b"PAR1 cut short")
    assert len(files.data_files(day_dir(wh, "gpu_samples"))) == 5  # 3 parts, merged, late one
    doc = (Path(__file__).parent.parent / "docs" / "warehouse.md").read_text()
    sql = doc.split("```sql\n")[1].split("```")[0].replace("ROOT", str(wh.root))
    assert duckdb.sql(sql).fetchall() == [(len(SAMPLES) + 1,)]


def test_cleanup_skips_a_temporary_renamed_into_place_meanwhile(
    tmp_path: Path, monkeypatch
) -> None:
    """A writer may rename its temporary between the compactor's listing and its stat()."""
    gone = tmp_path / f"{files.TMP_PREFIX}renamed.parquet"  # listed, then renamed away
    stale = tmp_path / f"{files.TMP_PREFIX}stale.parquet"
    stale.write_bytes(b"left by a killed writer")
    monkeypatch.setattr(Path, "iterdir", lambda self: iter([gone, stale]))
    assert files.remove_stale_temporaries(tmp_path, older_than_s=-1) == 1
    assert not stale.exists()
