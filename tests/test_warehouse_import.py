"""`sing warehouse import` and `sing warehouse sql`: typed loading with errors naming file, row and
column (nothing half-loaded), Parquet import, and SQL that can only read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.cli.warehouse import run_read_only
from sing.errors import UserError
from sing.jobids import lowest_job
from sing.warehouse import migrations
from sing.warehouse.importer import Imported, import_file
from sing.warehouse.store import Warehouse

SING = Path(sys.executable).parent / "sing"

JOBS_CSV = """\
job_id,cluster,user,partition,submit_time,start_time,end_time,state,exit_code,num_nodes,gpus_per_node,num_gpus,time_limit_s,nodes
101,campus,alice,gpu,2026-01-05T09:58:00Z,2026-01-05T10:00:00Z,2026-01-05T12:30:00Z,COMPLETED,0,2,8,16,86400,"node01,node02"
102,campus,bob,gpu,2026-01-05T10:05:00Z,2026-01-05T10:06:30Z,,RUNNING,,1,1,1,3600,node03
103,campus,carol,gpu,2026-01-05T23:59:59+01:00,,,PENDING,,1,4,4,7200,
"""


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def sing(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run the installed `sing` command as a user would (no site config file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SING_")}
    return subprocess.run(
        [str(SING), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


def test_csv_with_iso_times_and_node_lists_loads_typed(wh: Warehouse, tmp_path: Path) -> None:
    assert import_file(wh, "jobs", write(tmp_path / "jobs.csv", JOBS_CSV)).rows == 3
    rows = (
        wh.connect()
        .execute(
            "SELECT job_id, user, submit_time, start_time, end_time, state, exit_code, "
            "num_nodes, num_gpus, time_limit_s, nodes FROM jobs ORDER BY job_id"
        )
        .fetchall()
    )
    assert rows == [
        (
            "101",
            "alice",
            utc(2026, 1, 5, 9, 58),
            utc(2026, 1, 5, 10),
            utc(2026, 1, 5, 12, 30),
            "COMPLETED",
            0,
            2,
            16,
            86400,
            ["node01", "node02"],
        ),
        ("102", "bob", utc(2026, 1, 5, 10, 5), utc(2026, 1, 5, 10, 6, 30), None, "RUNNING")
        + (None, 1, 1, 3600, ["node03"]),
        # +01:00 is converted to UTC; empty cells are NULL, not "" or [].
        ("103", "carol", utc(2026, 1, 5, 22, 59, 59), None, None, "PENDING", None, 1, 4, 7200)
        + (None,),
    ]


@pytest.mark.parametrize(
    ("row", "column", "bad"),
    [
        (2, "num_gpus", "four"),
        (3, "start_time", "yesterday"),
        (1, "exit_code", "1.5"),  # a fraction is not an integer: no silent rounding to 2
    ],
)
def test_bad_csv_value_names_file_row_column_and_writes_nothing(
    wh: Warehouse, tmp_path: Path, row: int, column: str, bad: str
) -> None:
    lines = JOBS_CSV.splitlines()
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = bad
    lines[row] = ",".join(cells)
    path = write(tmp_path / "bad.csv", "\n".join(lines) + "\n")
    with pytest.raises(UserError) as err:
        import_file(wh, "jobs", path)
    message = str(err.value)
    assert str(path) in message and f"row {row}" in message and column in message
    assert repr(bad) in message
    assert not wh.table_dir("jobs").exists()
    assert wh.connect().execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_csv_row_without_its_key_is_rejected_whole(wh: Warehouse, tmp_path: Path) -> None:
    path = write(tmp_path / "nokey.csv", JOBS_CSV.replace("\n102,", "\n,"))
    with pytest.raises(UserError, match=r"nokey\.csv: table jobs: column job_id is empty in row 2"):
        import_file(wh, "jobs", path)
    assert not wh.table_dir("jobs").exists()


def test_csv_with_unknown_column_is_rejected(wh: Warehouse, tmp_path: Path) -> None:
    path = write(tmp_path / "extra.csv", "job_id,cluster,gpu_count\n1,c,4\n")
    with pytest.raises(
        UserError, match=r"extra\.csv: unknown column\(s\) gpu_count for table jobs"
    ):
        import_file(wh, "jobs", path)


def test_parquet_import_casts_to_schema_and_splits_days(wh: Warehouse, tmp_path: Path) -> None:
    # Plain int64/float64 columns as another tool would write them; 2 days, 3 rows.
    data = pa.table(
        {
            "ts": [utc(2026, 1, 5, 23, 59, 45), utc(2026, 1, 6, 0, 0), utc(2026, 1, 6, 0, 0, 15)],
            "node": ["n1", "n1", "n2"],
            "gpu_index": [0, 1, 7],
            "util": [0.25, 0.5, 1.0],
            "mem_used_bytes": [1, 2, 3],
            "job_id": ["9", "9", "10"],
        }
    )
    path = tmp_path / "samples.parquet"
    pq.write_table(data, path)
    assert import_file(wh, "gpu_samples", path).rows == 3
    assert len({f.day for f in wh.live_files("gpu_samples")}) == 2
    con = wh.connect()
    rows = con.execute(
        "SELECT node, gpu_index, util, mem_used_bytes, job_id FROM gpu_samples ORDER BY ts, node"
    ).fetchall()
    assert rows == [("n1", 0, 0.25, 1, "9"), ("n1", 1, 0.5, 2, "9"), ("n2", 7, 1.0, 3, "10")]
    assert con.execute("SELECT sum(util_sum) FROM job_gpu_usage WHERE job_id = '9'").fetchone() == (
        0.75,
    )


def test_unreadable_parquet_is_a_clear_error(wh: Warehouse, tmp_path: Path) -> None:
    path = write(tmp_path / "broken.parquet", "not parquet at all")
    with pytest.raises(UserError, match=r"broken\.parquet: not a readable Parquet file"):
        import_file(wh, "gpu_samples", path)


@pytest.mark.parametrize(
    "statement",
    [
        "COPY (SELECT 1) TO '{out}'",
        "CREATE TABLE t AS SELECT 1 AS x",
        "INSERT INTO jobs (job_id) VALUES ('x')",
        "ATTACH '{out}' AS other",
        "SELECT 1; DROP VIEW jobs",
        "EXPORT DATABASE '{out}'",
        # EXPLAIN ANALYZE runs its statement: it must not smuggle a COPY through.
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{out}'",
    ],
)
def test_sql_rejects_statements_that_write(wh: Warehouse, tmp_path: Path, statement: str) -> None:
    out = tmp_path / "escaped"
    with pytest.raises(UserError, match="only read-only queries"):
        run_read_only(wh.connect(), statement.format(out=out))
    assert not out.exists()


def test_sql_runs_one_select(wh: Warehouse) -> None:
    rows, columns = run_read_only(wh.connect(), "SELECT 6 * 7 AS answer")
    assert (rows, columns) == ([(42,)], ["answer"])
    with pytest.raises(UserError, match="query failed"):
        run_read_only(wh.connect(), "SELECT * FROM no_such_table")


def test_cli_import_then_sql_json(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    csv = write(tmp_path / "jobs.csv", JOBS_CSV)
    done = sing("--warehouse", str(root), "warehouse", "import", "jobs", str(csv), cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "imported 3 rows into jobs"), done.stderr
    query = "SELECT job_id, nodes, start_time, num_gpus FROM jobs ORDER BY job_id"
    done = sing("--warehouse", str(root), "warehouse", "sql", query, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == [
        {"job_id": "101", "nodes": ["node01", "node02"], "start_time": "2026-01-05T10:00:00+00:00"}
        | {"num_gpus": 16},
        {"job_id": "102", "nodes": ["node03"], "start_time": "2026-01-05T10:06:30+00:00"}
        | {"num_gpus": 1},
        {"job_id": "103", "nodes": None, "start_time": None, "num_gpus": 4},
    ]


def test_cli_errors_are_one_line_and_change_nothing(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    bad = write(tmp_path / "bad.csv", JOBS_CSV.replace(",16,86400", ",sixteen,86400"))
    done = sing("--warehouse", str(root), "warehouse", "import", "jobs", str(bad), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"sing: {bad}: row 1 (line 2), column num_gpus: 'sixteen'")
    assert "Traceback" not in done.stderr
    assert not root.exists(), "a refused import creates no warehouse"

    root.mkdir()
    done = sing(
        "--warehouse", str(root), "warehouse", "sql", "CREATE TABLE t (x INT)", cwd=tmp_path
    )
    assert (done.returncode, done.stderr.strip()) == (
        1,
        "sing: only read-only queries are allowed, not CREATE",
    )

    (root / migrations.META).write_text(json.dumps({"schema_version": 99}))
    done = sing("--warehouse", str(root), "warehouse", "sql", "SELECT 1", cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, "a too-new warehouse should be a one-line error"
    assert "schema version 99" in done.stderr


def test_imported_file_is_queryable_by_plain_duckdb(wh: Warehouse, tmp_path: Path) -> None:
    """The tree is ordinary Hive-style Parquet: another engine reads it without sing."""
    import_file(wh, "jobs", write(tmp_path / "jobs.csv", JOBS_CSV))
    rows = duckdb.sql(
        f"SELECT job_id FROM read_parquet('{wh.root}/jobs/*.parquet') ORDER BY job_id"
    ).fetchall()
    assert rows == [("101",), ("102",), ("103",)]


# ---- samples without job ids or deltas: completed as the collector writes them --------------

JOB_GPUS_CSV = """\
job_id,cluster,node,gpu_index,start_time,end_time
10,campus,n1,0,2026-01-05T10:00:00Z,2026-01-05T11:00:00Z
10,campus,n1,1,2026-01-05T10:00:00Z,2026-01-05T11:00:00Z
9,campus,n1,2,2026-01-05T10:00:00Z,
9,campus,n1,3,2026-01-05T10:00:00Z,
"""


def test_gpu_samples_without_job_ids_are_attributed_from_job_gpus(
    wh: Warehouse, tmp_path: Path
) -> None:
    """GPU 0 is job 10's until 11:00 (end exclusive), GPU 2 job 9's (still running), GPU 4 no
    job's; the energy counter restarts between the 2nd and 3rd sample of GPU 0 (deltas: the
    first sample has none, a counter that went down counts from 0)."""
    import_file(wh, "job_gpus", write(tmp_path / "job_gpus.csv", JOB_GPUS_CSV))
    samples = write(
        tmp_path / "samples.csv",
        "ts,node,gpu_index,util,energy_j\n"
        "2026-01-05T10:00:00Z,n1,0,0.5,1000\n"
        "2026-01-05T10:00:15Z,n1,0,0.5,2000\n"
        "2026-01-05T10:00:30Z,n1,0,0.5,300\n"
        "2026-01-05T11:00:00Z,n1,0,0.5,1300\n"
        "2026-01-05T11:00:00Z,n1,2,0.5,10\n"
        "2026-01-05T11:00:00Z,n1,4,0.5,10\n",
    )
    assert import_file(wh, "gpu_samples", samples) == Imported(rows=6, attributed=4)
    rows = (
        wh.connect()
        .execute(
            "SELECT strftime(ts, '%H:%M:%S'), gpu_index, job_id, cluster, energy_delta_j "
            "FROM gpu_samples ORDER BY gpu_index, ts"
        )
        .fetchall()
    )
    assert rows == [
        ("10:00:00", 0, "10", "campus", None),
        ("10:00:15", 0, "10", "campus", 1000.0),
        ("10:00:30", 0, "10", "campus", 300.0),
        ("11:00:00", 0, None, "campus", 1000.0),
        ("11:00:00", 2, "9", "campus", None),
        ("11:00:00", 4, None, "campus", None),
    ]


def test_a_shared_gpu_goes_to_the_lowest_array_job_as_the_collector_stamps_it(
    wh: Warehouse, tmp_path: Path
) -> None:
    """Array jobs 10_10 and 10_2 share GPU 0: the sample is 10_2's (10_2 < 10_10 as numbers),
    the job the collector's `lowest_job` stamps; the SQL order used to put 10_10 first."""
    gpus = "job_id,cluster,node,gpu_index,start_time,end_time\n" + "".join(
        f"{job},campus,n1,0,2026-01-05T10:00:00Z,\n" for job in ("10_10", "10_2")
    )
    import_file(wh, "job_gpus", write(tmp_path / "job_gpus.csv", gpus))
    samples = write(tmp_path / "s.csv", "ts,node,gpu_index,util\n2026-01-05T10:30:00Z,n1,0,0.5\n")
    assert import_file(wh, "gpu_samples", samples).attributed == 1
    (job,) = wh.connect().execute("SELECT job_id FROM gpu_samples").fetchone()
    assert job == lowest_job({"10_10", "10_2"}) == "10_2"


def test_rdma_samples_take_the_job_holding_most_gpus_lowest_numeric_id_on_ties(
    wh: Warehouse, tmp_path: Path
) -> None:
    """Jobs 10 and 9 hold 2 GPUs each of n1: the tie goes to 9 (as a number, 9 < 10). A NULL
    counter (saturated) has no delta, nor has the next sample (its previous one is unknown)."""
    import_file(wh, "job_gpus", write(tmp_path / "job_gpus.csv", JOB_GPUS_CSV))
    samples = write(
        tmp_path / "rdma.csv",
        "ts,node,device,port,tx_bytes,rx_bytes\n"
        "2026-01-05T10:00:00Z,n1,mlx5_0,1,100,100\n"
        "2026-01-05T10:00:15Z,n1,mlx5_0,1,,300\n"
        "2026-01-05T10:00:30Z,n1,mlx5_0,1,500,50\n",
    )
    assert import_file(wh, "rdma_samples", samples).attributed == 3
    rows = (
        wh.connect()
        .execute("SELECT job_id, tx_delta_bytes, rx_delta_bytes FROM rdma_samples ORDER BY ts")
        .fetchall()
    )
    assert rows == [("9", None, None), ("9", None, 200), ("9", None, 50)]


def test_samples_without_job_ids_or_allocations_are_refused(wh: Warehouse, tmp_path: Path) -> None:
    samples = write(tmp_path / "s.csv", "ts,node,gpu_index,util\n2026-02-01T10:00:00Z,n1,0,0.5\n")
    with pytest.raises(UserError, match="import jobs/job_gpus first or add a job_id column"):
        import_file(wh, "gpu_samples", samples)
    # Allocations that ended in January do not cover February's samples either.
    ended = "\n".join(JOB_GPUS_CSV.splitlines()[:3]) + "\n"
    import_file(wh, "job_gpus", write(tmp_path / "job_gpus.csv", ended))
    with pytest.raises(UserError, match=r"1 row\(s\) have no job_id .* 2026-02-01 10:00:00"):
        import_file(wh, "gpu_samples", samples)
    assert not wh.table_dir("gpu_samples").exists()


def test_samples_without_cluster_in_a_multi_cluster_warehouse_are_refused(
    wh: Warehouse, tmp_path: Path
) -> None:
    import_file(wh, "job_gpus", write(tmp_path / "a.csv", JOB_GPUS_CSV))
    import_file(wh, "job_gpus", write(tmp_path / "b.csv", JOB_GPUS_CSV.replace("campus", "lab")))
    samples = write(tmp_path / "s.csv", "ts,node,gpu_index,job_id\n2026-01-05T10:00:00Z,n1,0,9\n")
    with pytest.raises(UserError, match=r"several \(campus, lab\): add a cluster column"):
        import_file(wh, "gpu_samples", samples)
