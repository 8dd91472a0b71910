"""The local executor: real processes, real GPU locks, records synced into a real warehouse."""

from __future__ import annotations

import dataclasses
import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest

from sing.cli import main
from sing.executors.local import LocalExecutor
from sing.executors.profile import JobProfile
from sing.executors.records import JobRecord, NodeRecord, to_tables
from sing.executors.sync import sync, watermark
from sing.warehouse.store import Warehouse


def profile(commands: str, gpus: int = 1, **fields) -> JobProfile:
    return JobProfile(name="t", commands=commands, gpus_per_node=gpus, **fields)


def wait_finished(executor: LocalExecutor, ids: list[str], timeout: float = 30) -> list[JobRecord]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = {r.job_id: r for r in executor.records()}
        if all(records[i].finished for i in ids):
            return [records[i] for i in ids]
        time.sleep(0.1)
    raise AssertionError(f"jobs {ids} did not finish: {executor.records()}")


@pytest.fixture
def executor(tmp_path) -> LocalExecutor:
    return LocalExecutor("campus", tmp_path / "state", gpus=[0, 1, 2], node="box")


def test_concurrent_jobs_never_share_a_gpu_and_start_in_order(executor, tmp_path):
    log = tmp_path / "seen.txt"
    job = f'echo "$SING_JOB_ID $CUDA_VISIBLE_DEVICES" >> {log}; sleep 0.6'
    sizes = [2, 1, 1, 2, 1, 1]  # 3 GPUs: the 2-GPU jobs force waiting
    ids = [executor.submit(profile(job, gpus)) for gpus in sizes]
    records = wait_finished(executor, ids)

    assert all(r.state == "COMPLETED" and r.exit_code == 0 for r in records)
    assert [len(r.gpus["box"]) for r in records] == sizes
    seen = dict(line.split() for line in log.read_text().splitlines())
    assert {i: seen[i] for i in ids} == {
        r.job_id: ",".join(map(str, r.gpus["box"])) for r in records
    }
    for a, b in itertools.combinations(records, 2):
        overlap = a.start_time < b.end_time and b.start_time < a.end_time
        if overlap:
            assert not set(a.gpus["box"]) & set(b.gpus["box"]), (a, b)
    starts = [r.start_time for r in records]
    assert starts == sorted(starts), "first in, first out"
    assert any(  # the pool really was contended: some job waited for GPUs
        (r.start_time - r.submit_time) > timedelta(seconds=0.4) for r in records
    )


def test_failed_cancelled_and_timed_out_jobs(executor):
    failed = executor.submit(profile("exit 3"))
    slow = executor.submit(profile("sleep 30", gpus=3))
    waiting = executor.submit(profile("echo never", gpus=3))
    timed = executor.submit(profile("sleep 30", gpus=0, time_limit_s=1))
    deadline = time.monotonic() + 10
    while executor._read(slow).state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    executor.cancel(waiting)
    executor.cancel(slow)
    records = {r.job_id: r for r in wait_finished(executor, [failed, slow, waiting, timed])}

    assert (records[failed].state, records[failed].exit_code) == ("FAILED", 3)
    assert (records[slow].state, records[slow].exit_code) == ("CANCELLED", 143)
    assert records[slow].gpus == {"box": (0, 1, 2)}
    assert records[waiting].state == "CANCELLED" and records[waiting].start_time is None
    assert (records[timed].state, records[timed].exit_code) == ("TIMEOUT", 143)
    elapsed = records[timed].end_time - records[timed].start_time
    assert timedelta(seconds=1) <= elapsed < timedelta(seconds=5)


def test_inventory_is_this_node_with_its_gpu_pool(executor):
    assert executor.inventory() == [NodeRecord("box", 3, None, "local")]


def test_sync_is_incremental_and_idempotent(executor, tmp_path):
    wh = Warehouse(tmp_path / "wh")
    first = executor.submit(dataclasses.replace(profile("exit 0", gpus=2), interactive=True))
    wait_finished(executor, [first])
    running = executor.submit(profile("sleep 30"))
    while executor._read(running).state != "RUNNING":
        time.sleep(0.05)

    result = sync(executor, wh)
    assert (result.finished, result.running, result.gpu_rows) == (1, 1, 3)
    sync(executor, wh)  # again: nothing new, nothing doubled
    con = wh.connect()
    rows = con.execute(
        "SELECT job_id, state, num_gpus, gpus_per_node, num_nodes, nodes, interactive, "
        "end_time IS NULL, user FROM jobs ORDER BY job_id"
    ).fetchall()
    assert [r[:8] for r in rows] == [
        (first, "COMPLETED", 2, 2, 1, ["box"], True, False),
        (running, "RUNNING", 1, 1, 1, ["box"], False, True),
    ]
    gpus = con.execute("SELECT job_id, node, gpu_index FROM job_gpus ORDER BY ALL").fetchall()
    assert gpus == [(first, "box", 0), (first, "box", 1), (running, "box", 0)]
    # Every record carries its cluster, so joins with samples can key on it.
    clusters = "SELECT cluster, count(*) FROM {} GROUP BY ALL"
    assert con.execute(clusters.format("jobs")).fetchall() == [("campus", 2)]
    assert con.execute(clusters.format("job_gpus")).fetchall() == [("campus", 3)]
    stored_end = con.execute("SELECT end_time FROM jobs WHERE job_id = ?", [first]).fetchone()[0]
    assert stored_end.utcoffset() == timedelta(0)
    assert watermark(wh, "campus") == executor._read(first).end_time

    executor.cancel(running)
    wait_finished(executor, [running])
    sync(executor, wh)
    con = wh.connect()
    state, end = con.execute(
        "SELECT state, end_time FROM jobs WHERE job_id = ?", [running]
    ).fetchone()
    assert state == "CANCELLED" and end is not None
    gpu_end = con.execute("SELECT end_time FROM job_gpus WHERE job_id = ?", [running]).fetchone()[0]
    assert gpu_end == end
    assert con.execute("SELECT count(*) FROM jobs").fetchone()[0] == 2


def test_cli_run_local_returns_the_job_exit_code_and_lists_it(tmp_path, capsys):
    config = tmp_path / "sing.toml"
    config.write_text('[executor]\nlocal_gpus = [0, 1]\nlocal_node = "box"\n')
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "name: hello\ngpus_per_node: 2\nenvironment: {pip: []}\n"
        "entry: {commands: 'test \"$CUDA_VISIBLE_DEVICES\" = 0,1 && exit 5'}\n"
    )
    base = ["--config", str(config), "--warehouse", str(tmp_path / "wh")]
    assert main([*base, "run", "--local", str(prof)]) == 5
    assert main([*base, "jobs", "sync"]) == 0
    capsys.readouterr()
    assert main([*base, "jobs", "list", "--state", "failed"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:8] == [
        "job", "user", "partition", "name", "state", "exit", "nodes", "GPUs",
    ]  # fmt: skip
    assert row.split()[3:9] == ["hello", "FAILED", "5", "1", "2", "box"]
    assert (tmp_path / "var/local-jobs/jobs/1.json").is_file()  # relative to the config file
    assert datetime.now(UTC) - watermark(Warehouse(tmp_path / "wh"), "campus") < timedelta(
        minutes=1
    )


def test_jobs_list_orders_equal_submit_times_by_numeric_id(tmp_path, capsys):
    submitted = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    jobs = [JobRecord(i, "campus", "COMPLETED", submit_time=submitted) for i in ("9", "10", "100")]
    Warehouse(tmp_path / "wh").append("jobs", to_tables(jobs, recorded_at=submitted)[0])
    assert main(["--warehouse", str(tmp_path / "wh"), "jobs", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["100", "10", "9"]  # newest first, as numbers
