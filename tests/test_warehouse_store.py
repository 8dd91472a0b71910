"""The warehouse store on hand-checkable data: appends, upserts, rollups, compaction, retention,
migrations. Every number asserted here was worked out by hand from the rows written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sing.errors import UserError
from sing.schema import table
from sing.warehouse import delta, files, maintenance, migrations
from sing.warehouse.store import ROLLUPS, Warehouse, conform

REPO = Path(__file__).resolve().parent.parent
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


def day_files(wh: Warehouse, name: str, day: date = DAY) -> list[delta.LiveFile]:
    """The live files of one day of a table or rollup, as its Delta log lists them."""
    return [f for f in wh.live_files(name) if f.day == day]


def add_existing_file(wh: Warehouse, name: str, data: pa.Table, day: date) -> None:
    """Commit a Parquet file written by someone else (an older sing) into a samples table."""
    spec = table(name)
    dt = delta.ensure_table(wh.table_dir(name), delta.table_schema(spec.schema, True), ["day"])
    path = delta.temporary_path(wh.table_dir(name), day).with_name("old.parquet")
    pq.write_table(data, path)
    delta.commit(dt, [delta.add_action(wh.table_dir(name), path, day, "ts")], "append")


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


# ---- append / connect ----------------------------------------------------------------------


def test_batch_spanning_midnight_is_one_commit_in_two_day_partitions(wh: Warehouse) -> None:
    late, early = at(23, 59, 45, date(2026, 1, 1)), at(0, 0, 0, date(2026, 1, 2))
    batch = pa.table({"ts": [early, late, early], "node": ["a", "b", "c"], "gpu_index": [0, 1, 2]})
    assert wh.append("gpu_samples", batch) == 3
    assert wh.open("gpu_samples").version() == 1  # version 0 created the table
    (first_file,) = day_files(wh, "gpu_samples", date(2026, 1, 1))
    (second_file,) = day_files(wh, "gpu_samples", date(2026, 1, 2))
    assert first_file.path.parent == day_dir(wh, "gpu_samples", date(2026, 1, 1))
    first = pq.read_table(first_file.path)
    second = pq.read_table(second_file.path)
    assert "day" not in first.column_names  # the partition lives in the path and the log
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
    ts = pa.array([at(1, day=old_day)], pa.timestamp("us", tz="UTC"))
    old = pa.table({"ts": ts, "node": ["n1"], "gpu_index": pa.array([0], pa.int16())})
    add_existing_file(
        wh, "gpu_samples", old.append_column("util", pa.array([0.5], pa.float32())), old_day
    )
    wh.append("gpu_samples", gpu_rows((at(10), "n1", 0, "j1", 0.25, 0.2, GIB, 50.0, 1.0)))
    assert pl.read_delta(str(wh.table_dir("gpu_samples"))).height == 2  # NULLs for outsiders too
    wh.compact(settle_s=0)
    con = wh.connect()
    assert con.execute("SELECT sum(samples), sum(util_sum) FROM gpu_hourly").fetchone() == (2, 0.75)
    assert day_files(wh, "gpu_hourly", old_day), "old day not rolled up"


# ---- rollups -------------------------------------------------------------------------------


def test_rollups_by_hand_identical_live_and_after_compaction(wh: Warehouse) -> None:
    load_tiny_day(wh)
    assert len(day_files(wh, "gpu_samples")) == 3
    assert not wh.table_dir("job_gpu_usage").exists()
    assert_tiny_day_rollups(wh)  # live aggregation over the raw files

    result = wh.compact(settle_s=0)
    assert result.merged_files == 3 + 3  # gpu and rdma parts
    assert result.rollup_days == 5  # one day for each of the five rollups
    (merged,) = day_files(wh, "gpu_samples")
    for name in ("job_gpu_usage", "gpu_hourly", "job_rdma_usage", "node_rdma_hourly"):
        (rolled,) = day_files(wh, name)
        assert (
            rolled.stem == f"of-{merged.stem}" if "gpu" in name else rolled.stem.startswith("of-")
        )
    assert_tiny_day_rollups(wh)  # now read from the stored rollup files

    stored, hot = wh.rollup_sources(ROLLUPS["job_gpu_usage"])
    assert (len(stored), hot) == (1, [])
    # Any Delta reader sees the stored rollup with its day partition.
    outside = pl.read_delta(str(wh.table_dir("job_rdma_usage")))
    assert outside.select("job_id", "node", "day", "samples").rows() == [("j1", "n1", DAY, 2)]


def test_late_sample_makes_rollup_stale_until_next_compaction(wh: Warehouse) -> None:
    load_tiny_day(wh)
    wh.compact(settle_s=0)
    rolled = day_files(wh, "job_gpu_usage")
    before = {f.path for f in day_files(wh, "gpu_samples")}
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
    (late,) = [f for f in day_files(wh, "gpu_samples") if f.path not in before]
    hot = wh.rollup_sources(ROLLUPS["job_gpu_usage"])[1]
    assert late in hot and len(hot) == 2  # the whole day is aggregated live, one row per key

    result = wh.compact(settle_s=0)
    assert result.rollup_days == 3  # job_gpu_usage, gpu_hourly and job_gpu_signals of that day
    assert day_files(wh, "job_gpu_usage") != rolled
    stored, hot = wh.rollup_sources(ROLLUPS["job_gpu_usage"])
    assert (len(stored), hot) == (1, [])
    assert n1_gpu0() == (4, 1.75, 30 * GIB, 5.0)
    hourly = wh.connect().execute(
        "SELECT samples, util_sum FROM gpu_hourly WHERE node = 'n1' AND gpu_index = 0 AND hour = ?",
        [at(10)],
    )
    assert hourly.fetchone() == (3, 1.75)


# ---- compaction ----------------------------------------------------------------------------


def parquet_on_disk(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.parquet"))


def test_many_small_files_merge_into_one_file_in_one_commit(wh: Warehouse, monkeypatch) -> None:
    for i in range(30):
        ts = at(i // 4, (i % 4) * 15)
        wh.append("gpu_samples", gpu_rows((ts, f"n{i % 3}", i % 8, None, i / 100, None, i, 1.0, i)))
    directory = day_dir(wh, "gpu_samples")
    parts = day_files(wh, "gpu_samples")
    query = "SELECT * FROM gpu_samples ORDER BY ts, node"
    before = wh.connect().execute(query).fetchall()
    assert len(parts) == 30 and len(before) == 30
    version = wh.open("gpu_samples").version()

    result = wh.compact(settle_s=0)
    assert (result.merged_files, result.deleted_files) == (30, 0)
    (merged,) = day_files(wh, "gpu_samples")
    assert wh.open("gpu_samples").version() == version + 1  # one commit swapped the files
    assert len(parquet_on_disk(directory)) == 31  # the parts wait out the grace time
    assert wh.connect().execute(query).fetchall() == before
    assert pl.read_delta(str(wh.table_dir("gpu_samples"))).height == 30  # outsiders too
    merged_ts = pq.read_table(merged.path).column("ts").to_pylist()
    assert merged_ts == sorted(merged_ts), "merged day is sorted by time"

    assert wh.compact(settle_s=0).deleted_files == 0  # still inside GRACE_S
    monkeypatch.setattr(maintenance, "GRACE_S", 0)
    assert wh.compact(settle_s=0).deleted_files == 30
    assert parquet_on_disk(directory) == [merged.path]
    assert wh.connect().execute(query).fetchall() == before


def test_todays_files_are_merged_only_once_there_are_many(wh: Warehouse) -> None:
    for minute in range(3):
        wh.append("gpu_samples", gpu_rows((at(10, minute), "n1", 0, None, 0.5, None, 1, 1.0, 1.0)))
    assert wh.compact(now=at(12)).merged_files == 0
    assert len(day_files(wh, "gpu_samples")) == 3


def test_record_tables_merge_and_keep_the_newest_version(wh: Warehouse) -> None:
    n = maintenance.MERGE_RECORDS_AT
    for i in range(n):
        state = "COMPLETED" if i == n - 1 else f"STEP{i}"
        wh.append("jobs", pl.DataFrame({"job_id": ["1", f"x{i}"], "cluster": "c", "state": state}))
        # A merge keeps one row per key: outside readers never see old versions.
        assert pl.read_delta(str(wh.table_dir("jobs"))).height == 2 + i
    files_before = len(wh.live_files("jobs"))
    assert wh.compact(settle_s=0).merged_files == (files_before if files_before >= n else 0)
    stored = pl.read_delta(str(wh.table_dir("jobs")))
    assert stored.height == 1 + n
    assert stored.filter(pl.col("job_id") == "1")["state"].to_list() == ["COMPLETED"]
    con = wh.connect()
    assert con.execute("SELECT state FROM jobs WHERE job_id = '1'").fetchall() == [("COMPLETED",)]
    assert con.execute("SELECT count(*) FROM jobs").fetchone() == (1 + n,)


def test_files_of_a_killed_writer_are_ignored_then_removed(wh: Warehouse, monkeypatch) -> None:
    load_tiny_day(wh)
    wh.append("jobs", pl.DataFrame({"job_id": ["1"], "cluster": ["c"]}))
    good = pq.read_table(day_files(wh, "gpu_samples")[0].path)
    for day in (DAY, None):
        table_dir = wh.table_dir("gpu_samples" if day else "jobs")
        # What a SIGKILL leaves: the first bytes of a file under a temporary name, and a whole
        # file renamed into place whose commit never happened.
        tmp = delta.temporary_path(table_dir, day)
        pq.write_table(good, tmp)
        tmp.write_bytes(tmp.read_bytes()[:100])
        pq.write_table(good, tmp.with_name("part-orphan.parquet"))
    con = wh.connect()
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (len(SAMPLES),)
    assert con.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
    assert DeltaTable(str(wh.table_dir("gpu_samples"))).to_pyarrow_dataset().count_rows() == 6
    wh.compact(settle_s=0)
    assert_tiny_day_rollups(wh)
    monkeypatch.setattr(maintenance, "GRACE_S", 0)
    wh.compact(settle_s=0)
    leftovers = [p for p in wh.root.rglob("*") if "orphan" in p.name or p.suffix == ".tmp"]
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
    assert day_files(wh, "gpu_samples") == []
    assert [f.stem[:5] for f in day_files(wh, "job_gpu_usage")] == ["kept-"]
    con = wh.connect()
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (1,)  # only Jan 20
    assert_tiny_day_rollups(wh)  # the summaries outlive the raw samples
    assert con.execute("SELECT util_sum FROM job_gpu_usage WHERE job_id = 'j2'").fetchone() == (
        0.75,
    )


def test_retention_keeps_the_audit_trail_and_health_history(wh: Warehouse) -> None:
    """The tables that are the only record of what happened keep every day."""
    load_tiny_day(wh)
    ts = pa.array([at(9)], pa.timestamp("us", tz="UTC"))
    for name, extra in (
        ("policy_events", {"event": ["action"]}),
        ("health_samples", {"node": ["n1"], "signal": ["xid_79"], "value": [1.0]}),
        ("incident_notes", {"incident_id": ["INC-1"], "event": ["opened"]}),
    ):
        wh.append(name, pa.table({"ts": ts, "cluster": ["lab"], **extra}))
    wh.compact(settle_s=0)
    removed = wh.apply_retention(raw_days=7, now=datetime(2026, 2, 1, tzinfo=UTC))
    assert removed == [day_dir(wh, "gpu_samples"), day_dir(wh, "rdma_samples")]
    con = wh.connect()
    for name in ("policy_events", "health_samples", "incident_notes"):
        assert con.execute(f"SELECT count(*) FROM {name}").fetchone() == (1,), name


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


def write_legacy(directory: Path, data: pa.Table, first: int, last: int) -> None:
    """A file as the old format named it: the range of write sequence numbers it holds."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, directory / f"{first:020d}-{last:020d}-{first:08x}.parquet")


def old_format_warehouse(root: Path, version: int = 2) -> None:
    """The tiny day as the old format left it: three scrape files superseded by their merge
    (which gained a physical `day` column), two versions of a job, a dead temporary, and the
    stored rollup of a day whose raw samples retention had deleted."""
    scrapes = sorted({r[0] for r in SAMPLES})
    gpu_dir = root / "gpu_samples" / f"day={DAY.isoformat()}"
    parts = [
        conform(table("gpu_samples"), gpu_rows(*(r for r in SAMPLES if r[0] == ts)))
        for ts in scrapes
    ]
    for seq, part in enumerate(parts, start=1):
        write_legacy(gpu_dir, part, seq, seq)
    merged = pa.concat_tables(parts)
    merged = merged.append_column("day", pa.array([DAY] * merged.num_rows, pa.date32()))
    write_legacy(gpu_dir, merged, 1, 3)
    (gpu_dir / ".tmp-dead.parquet").write_bytes(b"PAR1 cut short")
    for seq, (ts, node, job, tx, rx) in enumerate(RDMA, start=10):
        rdma = {"ts": [ts], "node": [node], "device": ["mlx5_0"], "port": [1], "job_id": [job]}
        rdma |= {"tx_delta_bytes": [tx], "rx_delta_bytes": [rx]}
        rows = conform(table("rdma_samples"), pa.table(rdma))
        write_legacy(root / "rdma_samples" / f"day={DAY.isoformat()}", rows, seq, seq)
    for seq, state in enumerate(["RUNNING", "COMPLETED"], start=20):
        job = {"job_id": ["7"], "cluster": ["c"], "state": [state], "recorded_at": [at(seq - 10)]}
        write_legacy(root / "jobs", conform(table("jobs"), pa.table(job)), seq, seq)
    gone = date(2025, 12, 1)
    hour = pa.array([datetime(2025, 12, 1, 3, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    kept = {"hour": hour, "cluster": ["c"], "node": ["n9"], "tx_bytes": [5], "rx_bytes": [7]}
    write_legacy(root / "_rollups" / "node_rdma_hourly" / f"day={gone}", pa.table(kept), 30, 30)
    (root / migrations.META).write_text(json.dumps({"schema_version": version}))


def assert_converted(root: Path) -> None:
    wh = Warehouse(root)
    assert migrations.read_version(wh) == migrations.CURRENT_VERSION == 3
    assert not (root / "_rollups").exists()
    assert_tiny_day_rollups(wh)
    con = wh.connect()
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (len(SAMPLES),)
    assert con.execute("SELECT state FROM jobs").fetchall() == [("COMPLETED",)]
    assert con.execute(
        "SELECT tx_bytes, rx_bytes FROM node_rdma_hourly WHERE day = DATE '2025-12-01'"
    ).fetchall() == [(5, 7)]
    for name, rows in (("gpu_samples", len(SAMPLES)), ("jobs", 1), ("rdma_samples", 3)):
        assert pl.read_delta(str(root / name)).height == rows, name
    assert DeltaTable(str(root / "gpu_samples")).to_pyarrow_dataset().count_rows() == 6
    gpu_dir = root / "gpu_samples" / f"day={DAY.isoformat()}"
    assert not list(gpu_dir.glob(".tmp-*"))


@pytest.mark.parametrize("version", [1, 2])
def test_old_format_warehouse_is_converted_in_place(tmp_path: Path, version: int) -> None:
    old_format_warehouse(tmp_path / "old", version)
    assert_converted(tmp_path / "old")


@pytest.mark.parametrize("step", ["upgrade-adopting:3", "upgrade-adopted:5", "data-renamed:1"])
def test_an_interrupted_upgrade_resumes_and_keeps_every_row(tmp_path: Path, step: str) -> None:
    root = tmp_path / "old"
    old_format_warehouse(root)
    script = f"from sing.warehouse.store import Warehouse; Warehouse({str(root)!r})"
    env = os.environ | {"SING_TEST_CRASH_AT": step}
    killed = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert migrations.read_version_of(root) == 2
    assert_converted(root)


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


def outside_counts(root: Path, name: str) -> tuple[int, int, int]:
    """Rows of a table as three engines that are not sing read it: polars, pyarrow, and DuckDB
    over the files the Delta log lists."""
    path = str(root / name)
    uris = DeltaTable(path).file_uris()
    con = duckdb.connect()
    duck = con.execute(f"SELECT count(*) FROM read_parquet({uris!r}, hive_partitioning = false)")
    return (
        pl.read_delta(path).height,
        DeltaTable(path).to_pyarrow_dataset().count_rows(),
        duck.fetchone()[0],
    )


def test_outside_engines_count_what_sing_counts_during_and_after_compaction(
    wh: Warehouse, monkeypatch
) -> None:
    """The issue's double counting: merged files and their parts coexist until vacuum, and
    records had several versions. Read through the log, every engine agrees with sing."""
    load_tiny_day(wh)
    wh.append("job_host_samples", pa.table({"ts": [at(10)], "node": ["n1"], "job_id": ["j1"]}))
    for state in ("RUNNING", "COMPLETED"):
        wh.append("jobs", pl.DataFrame({"job_id": ["7"], "cluster": ["c"], "state": [state]}))
    wh.compact(settle_s=0)  # parts removed from the log, still on disk (grace)
    wh.append("gpu_samples", gpu_rows((at(12), "n1", 0, "j1", 0.25, 0.2, GIB, 1.0, 1.0)))
    assert len(parquet_on_disk(day_dir(wh, "gpu_samples"))) == 5  # 3 parts, merged, late one
    raw = ("gpu_samples", "rdma_samples", "jobs")
    con = wh.connect()
    for name in raw:
        (sing,) = con.execute(f"SELECT count(*) FROM {name}").fetchone()
        assert outside_counts(wh.root, name) == (sing, sing, sing), name
    monkeypatch.setattr(maintenance, "GRACE_S", 0)
    wh.compact(settle_s=0)  # merges the late sample in, rebuilds the day's rollups, vacuums
    assert len(parquet_on_disk(day_dir(wh, "gpu_samples"))) == 1
    assert outside_counts(wh.root, "gpu_samples") == (7, 7, 7)
    assert outside_counts(wh.root, "jobs") == (1, 1, 1)
    con = wh.connect()
    for name in ROLLUPS:  # every day closed and stored: the rollup tables are the whole view
        (sing,) = con.execute(f"SELECT count(*) FROM {name}").fetchone()
        assert outside_counts(wh.root, name) == (sing, sing, sing), name


def test_cleanup_skips_a_temporary_renamed_into_place_meanwhile(
    tmp_path: Path, monkeypatch
) -> None:
    """A writer may rename its temporary between the compactor's listing and its stat()."""
    gone = tmp_path / ".part-renamed.tmp"  # listed, then renamed away
    stale = tmp_path / ".part-stale.tmp"
    stale.write_bytes(b"left by a killed writer")
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: iter([gone, stale]))
    assert files.remove_stale_temporaries(tmp_path, ".tmp", older_than_s=-1) == 1
    assert not stale.exists()
