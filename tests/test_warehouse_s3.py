"""The warehouse on object storage, against a real S3 server (SeaweedFS) on loopback: writes,
reads, maintenance, a writer killed mid-append, writers racing, and outside engines (Ray Data,
Daft, Spark SQL through PySpark's Spark Connect client) reading sing's figures."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from pyarrow.fs import FileSelector

from sing.cli.doctor import check_warehouse
from sing.config import Config
from sing.errors import UserError
from sing.warehouse import analytics, delta, files, lease, maintenance
from sing.warehouse.importer import import_file
from sing.warehouse.migrations import CURRENT_VERSION
from sing.warehouse.store import Warehouse
from tests import daemons, s3_server
from tests.ports import free_port
from tests.s3_server import S3Server
from tests.test_collector_shards import leadership_moves

pytestmark = s3_server.NEEDS_WEED

DAY = datetime(2025, 12, 1, tzinfo=UTC)
GIB = 1 << 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server.seaweedfs(tmp_path_factory.mktemp("weed")) as running:
        yield running


@pytest.fixture
def s3(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A warehouse URI in a fresh bucket, with this process pointed at the server."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    yield f"s3://{server.new_bucket()}/warehouse"


def samples(start: datetime, n: int, node: str = "n1") -> pl.DataFrame:
    """n samples 15 s apart of GPU 0 on `node`, held by job j-<node>."""
    return pl.DataFrame(
        {
            "ts": [start + timedelta(seconds=15 * i) for i in range(n)],
            "node": node,
            "gpu_index": 0,
            "job_id": f"j-{node}",
            "util": [0.5] * n,
            "mem_used_bytes": GIB,
            "mem_total_bytes": 80 * GIB,
            "power_w": 300.0,
        }
    )


def jobs(state: str) -> pl.DataFrame:
    start = DAY + timedelta(hours=1)
    rows = [
        ("j-n1", "alice", "physics", 8, start, start + timedelta(hours=3)),
        ("j-n2", "bob", "biology", 2, start, start + timedelta(hours=10)),
        ("j-n3", "alice", "physics", 4, start + timedelta(hours=5), None),
    ]
    return pl.DataFrame(
        [
            {
                "job_id": job,
                "cluster": "c",
                "user": user,
                "account": account,
                "num_gpus": gpus,
                "submit_time": begin - timedelta(minutes=5),
                "start_time": begin,
                "end_time": end if state == "COMPLETED" else None,
                "state": state,
            }
            for job, user, account, gpus, begin, end in rows
        ]
    )


def fill(wh: Warehouse) -> None:
    """Twelve sample appends over two days, and jobs upserted twice."""
    for hour in range(6):
        for node in ("n1", "n2"):
            wh.append("gpu_samples", samples(DAY + timedelta(hours=hour * 5), 40, node))
    wh.append("jobs", jobs("RUNNING"))
    wh.append("jobs", jobs("COMPLETED"))


def figures(wh: Warehouse) -> dict[str, object]:
    con = wh.connect()
    users, jain = analytics.fairness(con, DAY, DAY + timedelta(days=2), DAY + timedelta(days=2))
    return {
        "samples": con.execute("SELECT count(*), sum(util) FROM gpu_samples").fetchone(),
        "per_day": con.execute(
            "SELECT ts::DATE, count(*) FROM gpu_samples GROUP BY 1 ORDER BY 1"
        ).fetchall(),
        "jobs": con.execute("SELECT job_id, state FROM jobs ORDER BY 1").fetchall(),
        "rollup": con.execute(
            "SELECT day, sum(samples) FROM gpu_hourly GROUP BY 1 ORDER BY 1"
        ).fetchall(),
        "fairness": users.select("user", "jobs", "gpu_hours").rows(),
        "jain": jain,
    }


def test_seaweedfs_honours_if_none_match_even_when_racing(server: S3Server) -> None:
    """What delta-rs's commits rely on: a PUT with If-None-Match: * creates a key only once,
    and of 16 such PUTs at once exactly one wins."""
    from concurrent.futures import ThreadPoolExecutor

    bucket = server.new_bucket()
    once = {"If-None-Match": "*"}
    assert server.put(f"{bucket}/k", b"a", once) == 200
    assert server.put(f"{bucket}/k", b"b", once) == 412
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda i: server.put(f"{bucket}/race", b"%d" % i, once), range(16)))
    assert sorted(codes) == [200] + [412] * 15


def test_the_s3_client_follows_the_variables_it_was_made_from(
    server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client made under other `AWS_*` variables is never handed out: it would send this
    warehouse's requests to AWS itself (seen once, a client cached while no endpoint was set)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    to_aws = files.object_store()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    bucket = server.new_bucket()
    files.write_text(f"s3://{bucket}/probe", "here")
    assert files.object_store() is not to_aws
    assert files.object_store() is files.object_store()
    assert files.read_text(f"s3://{bucket}/probe") == "here"


def test_writes_reads_and_maintenance_give_the_local_figures(s3: str, tmp_path: Path) -> None:
    local, remote = Warehouse(tmp_path / "wh"), Warehouse(s3)
    fill(local)
    fill(remote)
    expected = figures(local)
    assert expected["samples"] == (480, 240.0)
    assert figures(remote) == expected
    assert remote.newest_time("gpu_samples") == local.newest_time("gpu_samples")

    now = DAY + timedelta(days=3)
    result = remote.compact(now)
    assert result == local.compact(now)
    assert (result.merged_files, result.deleted_files) == (12, 0)  # removed, kept for readers
    with pytest.MonkeyPatch.context() as later:  # past the grace period, vacuum deletes them
        later.setattr(maintenance, "GRACE_S", 0)
        deleted = remote.compact(now).deleted_files
        assert deleted == local.compact(now).deleted_files == 13  # 12 merged, 1 jobs upserted
    assert figures(remote) == expected
    assert [f.rows for f in remote.live_files("gpu_samples")] == [400, 80]
    store = files.object_store()
    on_s3 = [
        i.path
        for i in store.get_file_info(FileSelector(files.key(f"{s3}/gpu_samples"), recursive=True))
        if i.path.endswith(".parquet") and "_delta_log" not in i.path
    ]
    assert len(on_s3) == len(remote.live_files("gpu_samples"))


def test_checkpoints_keep_the_log_short(s3: str) -> None:
    wh = Warehouse(s3)
    for i in range(12):
        wh.append("gpu_samples", samples(DAY + timedelta(minutes=i), 1))
    assert "gpu_samples" in wh.checkpoint_due()
    assert delta.last_checkpoint(wh.table_dir("gpu_samples")) >= 10
    assert wh.connect().execute("SELECT count(*) FROM gpu_samples").fetchone() == (12,)


WRITER = """
import sys
from datetime import UTC, datetime, timedelta
from sing.warehouse.store import Warehouse
from tests.test_warehouse_s3 import DAY, samples
wh = Warehouse(sys.argv[1])
for i in range(int(sys.argv[2])):
    wh.append("gpu_samples", samples(DAY + timedelta(hours=i), 10, sys.argv[3]))
    print(i, flush=True)
"""


def writer(s3: str, appends: int, node: str, crash_at: str = "") -> subprocess.Popen:
    env = os.environ | {"SING_TEST_CRASH_AT": crash_at}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, s3, str(appends), node],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )


@pytest.mark.parametrize("step", ["data-written:3", "data-uploaded:3", "committed:3"])
def test_a_writer_killed_mid_append_loses_nothing_committed(s3: str, step: str) -> None:
    process = writer(s3, 5, "n1", crash_at=step)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL
    acknowledged = len(out.split())
    assert acknowledged == 2
    wh = Warehouse(s3)
    (rows,) = wh.connect().execute("SELECT count(*) FROM gpu_samples").fetchone()
    # The killed append committed or not, whole: never part of it.
    assert rows in (10 * acknowledged, 10 * (acknowledged + 1))
    assert rows == 10 * (acknowledged + (step == "committed:3"))
    wh.append("gpu_samples", samples(DAY + timedelta(days=1), 10))
    wh.compact(DAY + timedelta(days=3))
    assert wh.connect().execute("SELECT count(*) FROM gpu_samples").fetchone() == (rows + 10,)


def test_writers_on_two_processes_lose_no_commit(s3: str) -> None:
    """Both commit blind appends to the same table at once: conditional put makes the loser of
    each race retry at the next version instead of overwriting the winner's entry."""
    Warehouse(s3).append("gpu_samples", samples(DAY, 1, "n0"))
    racers = [writer(s3, 8, node) for node in ("n1", "n2")]
    for process in racers:
        process.communicate(timeout=180)
        assert process.returncode == 0
    wh = Warehouse(s3)
    counts = wh.connect().execute("SELECT node, count(*) FROM gpu_samples GROUP BY 1 ORDER BY 1")
    assert counts.fetchall() == [("n0", 1), ("n1", 80), ("n2", 80)]
    assert wh.open("gpu_samples").version() == 1 + 16


MAINTAINER = """
import logging, sys, time
from datetime import timedelta
from sing.warehouse import lease
from sing.warehouse.store import Warehouse
from tests.test_warehouse_s3 import DAY
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
lease.TTL_S = float(sys.argv[2])
check = lease.Lease.check
def slow_check(self):  # each step a little longer, so the holds overlap others' tries
    time.sleep(float(sys.argv[4]))
    check(self)
lease.Lease.check = slow_check
wh = Warehouse(sys.argv[1])
wh.require_writable()
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
print("merged", wh.compact(DAY + timedelta(days=3)).merged_files, flush=True)
"""


def maintainer(
    s3: str,
    tmp_path: Path,
    host: str,
    ttl_s: float,
    start: float,
    step_s: float = 0.3,
    crash_at: str = "",
) -> subprocess.Popen:
    """A process as on another host: its own temporary directory, so its own flocks."""
    (tmp_path / host).mkdir()
    env = os.environ | {"TMPDIR": str(tmp_path / host), "SING_TEST_CRASH_AT": crash_at}
    return subprocess.Popen(
        [sys.executable, "-c", MAINTAINER, s3, str(ttl_s), str(start), str(step_s)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )


def test_of_two_hosts_compacting_at_once_one_holds_the_lease(s3: str, tmp_path: Path) -> None:
    """Two maintainers on two "hosts" (no shared flock) start together: the lease's conditional
    put lets exactly one compact; the other skips, saying who holds the lease."""
    wh = Warehouse(s3)
    fill(wh)
    expected = figures(wh)
    start = time.time() + 3
    racers = [maintainer(s3, tmp_path, host, 600, start) for host in ("a", "b")]
    outs = [p.communicate(timeout=180)[0] for p in racers]
    assert [p.returncode for p in racers] == [0, 0]
    merged = sorted(out.strip().splitlines()[-1] for out in outs)
    assert merged == ["merged 0", "merged 12"], outs
    skipped = next(out for out in outs if "merged 0" in out)
    assert "maintenance skipped: its lease is " in skipped
    winner = racers[[("merged 12" in out) for out in outs].index(True)]
    assert f"pid {winner.pid} until" in skipped
    assert figures(Warehouse(s3)) == expected


def test_a_held_lease_is_renewed_and_makes_others_skip(
    s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder with a 3 s lease renews it while it works (over 10 s): another host skips with
    the holder's name meanwhile, and maintains once the lease is released."""
    wh = Warehouse(s3)
    fill(wh)
    holder = maintainer(s3, tmp_path, "a", 3, 0, step_s=0.6)
    deadline = time.monotonic() + 60
    while lease.MAINTENANCE not in _lease_holders(s3) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(4)  # past the first lease's expiry: only renewal keeps it
    assert holder.poll() is None
    with caplog.at_level(logging.WARNING):
        assert wh.compact(DAY + timedelta(days=3)) == maintenance.CompactionResult()
    assert f"maintenance skipped: its lease is held by {socket.gethostname()} pid {holder.pid}" in (
        caplog.text
    )
    assert holder.communicate(timeout=120)[0].strip().endswith("merged 12")
    monkeypatch.setattr(lease, "TTL_S", 600.0)
    with wh.maintenance_lock() as held:  # released: taken at once
        assert held


LEASE_HOLDER = """
import sys
from sing.warehouse import lease
taken = lease.acquire(sys.argv[1], lease.MAINTENANCE, 600)
print("held" if not isinstance(taken, str) else taken, flush=True)
sys.stdin.read()  # until the test closes it
taken.release()
"""


def test_a_writers_checkpoint_skips_quietly_while_another_host_maintains(
    s3: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After each round a collector checkpoints the tables it wrote whose logs grew long. While
    another host holds the maintenance lease it skips that without a warning (every round of
    every other collector would log one); a compaction still says who holds the lease."""
    wh = Warehouse(s3)
    for hour in range(maintenance.CHECKPOINT_EVERY + 1):  # a log long enough to checkpoint
        wh.append("gpu_samples", samples(DAY + timedelta(hours=hour), 4))
    (tmp_path / "b").mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", LEASE_HOLDER, s3],
        env=os.environ | {"TMPDIR": str(tmp_path / "b")},  # as on another host: its own flocks
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.DEBUG, logger="sing.warehouse"):
            assert wh.checkpoint_due(["gpu_samples"]) == []
        skips = [r.levelname for r in caplog.records if "maintenance skipped" in r.getMessage()]
        assert skips == ["DEBUG"]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sing.warehouse"):
            assert wh.compact(DAY + timedelta(days=3)) == maintenance.CompactionResult()
        assert f"maintenance skipped: its lease is held by {socket.gethostname()} pid " in (
            caplog.text
        )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
    assert wh.checkpoint_due(["gpu_samples"]) == ["gpu_samples"]  # released: taken at once


def test_a_dead_holders_lease_is_taken_over_once_expired(
    s3: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A maintainer killed mid-compaction leaves its lease behind: others skip until it
    expires (6 s here), then one takes it over and finishes the work."""
    wh = Warehouse(s3)
    fill(wh)
    expected = figures(wh)
    dead = maintainer(s3, tmp_path, "a", 6, 0, step_s=0, crash_at="compaction-committed:1")
    dead.communicate(timeout=120)
    assert dead.returncode == -signal.SIGKILL
    with caplog.at_level(logging.WARNING):
        assert wh.compact(DAY + timedelta(days=3)) == maintenance.CompactionResult()
    assert f"pid {dead.pid} until" in caplog.text
    time.sleep(6)
    result = wh.compact(DAY + timedelta(days=3))
    assert result.merged_files == 2 and result.rollup_days > 0  # the killed one merged day 1 (10)
    assert figures(wh) == expected


def test_a_lapsed_holder_stops_before_its_next_step(
    s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder that could not renew in time (paused) finds its lease taken over and stops."""
    Warehouse(s3).require_writable()
    monkeypatch.setattr(lease, "TTL_S", 2.0)
    with monkeypatch.context() as paused:
        paused.setattr(lease.Lease, "renew", lambda self: None)  # no renewal lands
        first = lease.acquire(s3)
        assert isinstance(first, lease.Lease)
        assert lease.acquire(s3) == f"held by {first.entry.describe()}"
        time.sleep(2.2)
        second = lease.acquire(s3)
        assert isinstance(second, lease.Lease)
    with pytest.raises(lease.LeaseLost):
        first.check()
    first.release()
    second.check()
    second.release()
    third = lease.acquire(s3)
    assert isinstance(third, lease.Lease)  # released: free at once
    third.release()  # else its renewals outlive the test (and the S3 server)


def _lease_holders(s3: str) -> str:
    store = files.object_store()
    selector = FileSelector(files.key(s3), recursive=True, allow_not_found=True)
    return " ".join(i.path for i in store.get_file_info(selector) if "_delta_log" in i.path)


def daft_reader(s3: str, server: S3Server):
    """Daft, and its S3 settings, over a filled and compacted warehouse; with sing's figures."""
    daft = pytest.importorskip("daft", reason="Daft is not installed (pip install 'sing[engines]')")
    wh = Warehouse(s3)
    fill(wh)
    wh.compact(DAY + timedelta(days=3))
    io = daft.io.IOConfig(
        s3=daft.io.S3Config(
            endpoint_url=server.endpoint,
            key_id="sing-test",
            access_key="sing-test",
            region_name="us-east-1",
            force_virtual_addressing=False,
            use_ssl=False,
        )
    )
    return daft, io, figures(wh)


def test_daft_reads_sings_counts(s3: str, server: S3Server) -> None:
    """An outside engine reads the Delta tables from the object store: sing's rows per day."""
    daft, io, mine = daft_reader(s3, server)
    per_day = (
        daft.read_deltalake(f"{s3}/gpu_samples", io_config=io)
        .groupby("day")
        .agg(daft.col("ts").count().alias("n"))
        .sort("day")
        .to_pydict()
    )
    assert list(zip(per_day["day"], per_day["n"], strict=True)) == mine["per_day"]


def test_daft_gives_the_fairness_reports_gpu_hours(s3: str, server: S3Server) -> None:
    """The usage query in Daft over the jobs table, read by Daft's own Delta reader: files of
    sing's upserts among them, with plain strings (delta-rs's merges wrote Arrow string views,
    which Daft cannot read)."""
    daft, io, mine = daft_reader(s3, server)
    jobs = daft.read_deltalake(f"{s3}/jobs", io_config=io)
    # The fairness report's GPU-hours: each job's GPUs times its time inside the window.
    since, until = (int(t.timestamp() * 1e6) for t in (DAY, DAY + timedelta(days=2)))
    col, micros = daft.col, daft.DataType.int64()
    start = col("start_time").cast(micros)
    end = col("end_time").cast(micros).fill_null(until)
    inside = end.clip(since, until) - start.clip(since, until)
    usage = (
        jobs.where(col("start_time").not_null() & (start < until) & (end > since))
        .with_column("gpu_hours", col("num_gpus") * inside / 3.6e9)
        .groupby("user")
        .agg(col("job_id").count().alias("jobs"), col("gpu_hours").sum())
        .sort("gpu_hours", desc=True)
        .to_pydict()
    )
    got = list(zip(usage["user"], usage["jobs"], usage["gpu_hours"], strict=True))
    assert [(u, j, pytest.approx(h)) for u, j, h in got] == mine["fairness"]


@pytest.fixture(scope="module")
def ray_data() -> Iterator[object]:
    """A local Ray cluster of one CPU (Ray Data runs the same plan on many nodes), stopped after
    the module's tests: no Ray process outlives them."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'sing[engines]')")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)  # fmt: skip
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.default_hash_shuffle_parallelism = 2  # 200 aggregation tasks by default: slow here
    try:
        yield ray.data
    finally:
        ray.shutdown()


def test_ray_data_gives_the_fairness_reports_gpu_hours(s3: str, server: S3Server, ray_data) -> None:
    """Ray Data reads the Delta tables' active files through delta-rs and Arrow: rows per day
    and the fairness report's GPU-hours per user, sing's figures."""
    import pyarrow.compute as pc
    from pyarrow.fs import S3FileSystem, SubTreeFileSystem

    wh = Warehouse(s3)
    fill(wh)
    wh.compact(DAY + timedelta(days=3))
    mine = figures(wh)
    options = server.env()
    store = S3FileSystem(access_key=options["AWS_ACCESS_KEY_ID"],
                         secret_key=options["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                         endpoint_override=server.endpoint, scheme="http")  # fmt: skip

    def read(table: str):
        """The table's files are named relative to it: the filesystem is rooted there."""
        uri = f"{s3}/{table}"
        rooted = SubTreeFileSystem(uri.removeprefix("s3://"), store)
        return ray_data.read_delta(uri, filesystem=rooted, storage_options=options)

    per_day = read("gpu_samples").groupby("day").count().sort("day").take_all()
    assert [(r["day"], r["count()"]) for r in per_day] == mine["per_day"]

    since, until = (int(t.timestamp() * 1e6) for t in (DAY, DAY + timedelta(days=2)))

    def gpu_hours(jobs):
        """Each job's GPUs times its time inside the window, in hours (the fairness report's)."""
        start = pc.cast(jobs["start_time"], "int64")  # microseconds
        end = pc.fill_null(pc.cast(jobs["end_time"], "int64"), until)
        inside = pc.subtract(pc.min_element_wise(end, until), pc.max_element_wise(start, since))
        held = pc.and_(pc.is_valid(start), pc.and_(pc.less(start, until), pc.greater(end, since)))
        hours = pc.multiply(jobs["num_gpus"], pc.divide(pc.cast(inside, "double"), 3.6e9))
        return jobs.append_column("gpu_hours", hours).filter(held).select(["user", "gpu_hours"])

    usage = (
        read("jobs")
        .map_batches(gpu_hours, batch_format="pyarrow")
        .groupby("user")
        .aggregate(
            ray_data.aggregate.Count(alias_name="jobs"),
            ray_data.aggregate.Sum("gpu_hours", alias_name="gpu_hours"),
        )  # fmt: skip
        .sort("gpu_hours", descending=True)
        .take_all()
    )
    got = [(r["user"], r["jobs"], r["gpu_hours"]) for r in usage]
    assert [(u, j, pytest.approx(h)) for u, j, h in got] == mine["fairness"]


def sail() -> str | None:
    """Sail's `sail` (PyPI `pysail`, in the engines extra): a Spark Connect server."""
    return shutil.which("sail", path=sysconfig.get_path("scripts")) or shutil.which("sail")


@pytest.fixture
def spark(server: S3Server, tmp_path: Path) -> Iterator[object]:
    """A Spark session of PySpark's Spark Connect client, on a Spark Connect server on loopback
    (Sail: Apache Spark's Delta Lake connector comes only from Maven Central, which this CI cannot
    reach; docs/deploy.md). The server reads S3 with the standard AWS variables."""
    pytest.importorskip("pyspark.sql.connect.session", reason="pip install 'sing[engines]'")
    if sail() is None:
        pytest.skip("Sail is not installed (pip install 'sing[engines]')")
    from pyspark.sql import SparkSession

    port = free_port()
    argv = [sail(), "spark", "server", "--ip", "127.0.0.1", "--port", str(port)]
    env = os.environ | server.env() | {"RUST_LOG": "warn"}
    process = daemons.spawn(argv, tmp_path / "sail.log", env, daemons.owner_mark(str(tmp_path)))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "sail.log"
                ).read_text()
                time.sleep(0.1)
        session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        try:
            yield session
        finally:
            session.stop()
    finally:
        daemons.stop(process)


# The fairness report's GPU-hours in Spark SQL: each job's GPUs times its time in the window.
USAGE_SQL = """
SELECT user, count(*) AS jobs,
       sum(num_gpus * (unix_micros(least(coalesce(end_time, :until), :until))
                       - unix_micros(greatest(start_time, :since))) / 3.6e9) AS gpu_hours
FROM jobs
WHERE start_time IS NOT NULL AND start_time < :until AND coalesce(end_time, :until) > :since
GROUP BY user ORDER BY gpu_hours DESC
"""


def test_spark_sql_gives_sings_counts_and_gpu_hours(s3: str, spark) -> None:
    """PySpark reads the Delta tables on S3 (`format("delta")`) and Spark SQL computes rows per
    day and the fairness report's GPU-hours per user: sing's figures. The same code runs on
    Apache Spark with Delta Lake and Hadoop's `s3a://` (docs/deploy.md)."""
    wh = Warehouse(s3)
    fill(wh)
    wh.compact(DAY + timedelta(days=3))
    mine = figures(wh)
    s3a = s3.replace("s3://", "s3a://", 1)  # Hadoop's scheme, which Sail reads too
    samples = spark.read.format("delta").load(f"{s3a}/gpu_samples")
    per_day = samples.groupBy("day").count().orderBy("day").collect()
    assert [(r["day"], r["count"]) for r in per_day] == mine["per_day"]

    spark.read.format("delta").load(f"{s3a}/jobs").createOrReplaceTempView("jobs")
    window = {"since": DAY, "until": DAY + timedelta(days=2)}
    usage = spark.sql(USAGE_SQL, args=window).collect()
    got = [(r["user"], r["jobs"], r["gpu_hours"]) for r in usage]
    assert [(u, j, pytest.approx(h)) for u, j, h in got] == mine["fairness"]


def test_retention_on_s3_keeps_the_local_figures(s3: str, tmp_path: Path) -> None:
    """Raw days past the horizon go once their rollups are kept (`kept-` copies of the rollup
    files: an object store has no hard links), and every report reads what it read locally."""
    local, remote = Warehouse(tmp_path / "wh"), Warehouse(s3)
    now = DAY + timedelta(days=3)
    for wh in (local, remote):
        fill(wh)
        wh.compact(now)
    before = figures(local)
    removed = remote.apply_retention(1, now)
    assert [str(r).rsplit("/", 1)[-1] for r in removed] == ["day=2025-12-01", "day=2025-12-02"]
    assert len(local.apply_retention(1, now)) == 2
    after = figures(remote)
    assert after == figures(local)
    assert after["samples"] == (0, None) and remote.live_files("gpu_samples") == []
    assert (after["rollup"], after["fairness"]) == (before["rollup"], before["fairness"])


def sing_on(warehouse: str, *argv: str) -> dict:
    """`sing --warehouse W ARGV --json` in its own process (the S3 settings from this one's
    environment), its rows less their timings."""
    out = subprocess.run(
        [sys.executable, "-m", "sing.cli", "--warehouse", warehouse, *argv, "--json"],
        capture_output=True, text=True, timeout=300, check=True, env=os.environ,
    ).stdout  # fmt: skip
    return [{k: v for k, v in row.items() if k != "jobs_per_s"} for row in json.loads(out)["rows"]]


def test_the_commands_read_s3_as_they_read_a_directory(s3: str, tmp_path: Path) -> None:
    """`sing job` (filters on strings of merged and compacted files, which delta-rs writes as
    Arrow views), `sing simulate --from-warehouse` and `sing doctor`'s warehouse check on S3
    give what they give on local disk."""
    local = Warehouse(tmp_path / "wh")
    for wh in (local, Warehouse(s3)):
        fill(wh)
        wh.compact(DAY + timedelta(days=3))
    replay = ["simulate", "--from-warehouse", "--since", "2025-12-01", "--until", "2025-12-03",
              "--nodes", "1", "--gpus-per-node", "16"]  # fmt: skip
    for argv in (["job", "j-n1", "--now", "2025-12-04"], replay):
        assert sing_on(s3, *argv) == sing_on(str(tmp_path / "wh"), *argv), argv
    assert sing_on(s3, "job", "j-n1")[0]["samples"] == 240  # a count, not a decimal's text
    finding = check_warehouse(argparse.Namespace(warehouse=s3), Config({}))
    assert (finding.status, finding.detail) == (
        "OK",
        f"{s3} writable, schema v{CURRENT_VERSION}, 3 jobs",
    )


def test_an_import_is_recorded_on_s3_and_not_repeated(s3: str, tmp_path: Path) -> None:
    """`sing warehouse import` keeps its record of each file's content beside the tables, in
    the bucket: the same file again is refused and writes nothing."""
    source = tmp_path / "jobs.parquet"
    jobs("COMPLETED").write_parquet(source)
    wh = Warehouse(s3)
    assert import_file(wh, "jobs", source).rows == 3
    with pytest.raises(UserError, match="this content was already imported into jobs"):
        import_file(wh, "jobs", source)
    assert wh.connect().execute("SELECT count(*) FROM jobs").fetchone() == (3,)


def test_the_leader_lease_moves_between_collectors_on_s3(
    s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collectors' leader lease on object storage, as on local disk
    (tests/test_collector_shards.py): taken by conditional put, handed over, failing closed."""
    leadership_moves(s3, monkeypatch)
