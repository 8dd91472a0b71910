"""Slurm 26.05 SLUIDs: parsed from squeue/sacct JSON, and a requeued job's two runs kept apart.

Fixtures: tests/executors_data/slurm-26.05/ (derived from SchedMD/slurm slurm-26-05-3-1, see
the README there): job 42 ran on gpu-1 (GPUs 0-1), was requeued, and ran again on gpu-2 (2-3).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from sing.errors import UserError
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor
from sing.executors.slurm_parse import parse_sacct, parse_squeue
from sing.executors.sync import sync
from sing.schema import table
from sing.sluid import normal_sluid
from sing.warehouse.store import Warehouse
from tests.test_executors_slurm_parse import Replay

DATA = Path(__file__).parent / "executors_data" / "slurm-26.05"
RUN1, RUN2 = "s4T9M8MZMKY000", "s4T9M8MZXRX000"
NO_JOBS = json.dumps({"jobs": [], "errors": []})


def read(name: str) -> str:
    return (DATA / name).read_text()


def at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def test_sluid_text_form_is_slurms_print_sluid() -> None:
    assert normal_sluid(RUN2) == RUN2
    assert normal_sluid("S4t9m8mzxrx000") == RUN2  # str2sluid takes either case
    for bad in ("s4T9M8MZXRX00", "s4T9M8MZXRXI00", "x4T9M8MZXRX000", "job_42"):
        assert normal_sluid(bad) is None  # short, I is not base32, no "s", a job id dir


def test_squeue_and_sacct_carry_the_current_runs_sluid() -> None:
    (one,) = parse_squeue(read("squeue_run1.json"), "campus")
    (two,) = parse_squeue(read("squeue_run2.json"), "campus")
    assert (one.job_id, one.sluid, one.gpus) == ("42", RUN1, {"gpu-1": (0, 1)})
    assert (two.job_id, two.sluid, two.start_time) == ("42", RUN2, at(1796000960))
    first, done = parse_sacct(read("sacct.json"), read("sacct.txt"), "campus")
    assert (first.sluid, first.state, first.nodes) == (RUN1, "REQUEUED", ("gpu-1",))
    assert (done.sluid, done.state, done.num_gpus) == (RUN2, "COMPLETED", 2)  # not original_sluid


def test_older_json_has_no_sluid_and_a_bad_one_is_named() -> None:
    older = Path(__file__).parent / "executors_data" / "squeue_v0.0.38.json"
    assert {r.sluid for r in parse_squeue(older.read_text(), "campus")} == {None}
    dump = json.loads(read("squeue_run2.json"))
    dump["jobs"][0]["step_id"]["sluid"] = ""  # DUMP_FUNC(SLUID) of an unset SLUID
    assert parse_squeue(json.dumps(dump), "campus")[0].sluid is None
    dump["jobs"][0]["step_id"]["sluid"] = "42"
    with pytest.raises(UserError, match=r"job 42: field 'step_id\.sluid' should be a SLUID"):
        parse_squeue(json.dumps(dump), "campus")


def test_a_requeued_jobs_runs_stay_apart(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    snapshots = [
        (read("squeue_run1.json"), NO_JOBS, "", 1796000700),  # run 1 running on gpu-1
        (NO_JOBS, NO_JOBS, "", 1796000930),  # requeued: pending, holds nothing
        (read("squeue_run2.json"), NO_JOBS, "", 1796001000),  # run 2 running on gpu-2
        (NO_JOBS, read("sacct.json"), read("sacct.txt"), 1796002800),  # run 2 ended
    ]
    for squeue, sacct_json, sacct_text, now in [*snapshots, snapshots[-1]]:  # the last twice
        replay = Replay(squeue, sacct_json, sacct_text)
        sync(SlurmExecutor("campus", ExecutorSettings(), replay), wh, now=at(now))
    con = wh.connect()
    runs = "SELECT sluid, state, start_time, end_time, nodes, num_gpus FROM job_runs"
    assert con.execute(f"{runs} ORDER BY start_time").fetchall() == [
        (RUN1, "REQUEUED", at(1796000600), at(1796000930), ["gpu-1"], 2),
        (RUN2, "COMPLETED", at(1796000960), at(1796002760), ["gpu-2"], 2),
    ]
    assert con.execute("SELECT job_id, sluid, start_time, end_time FROM jobs").fetchall() == [
        ("42", RUN2, at(1796000960), at(1796002760))
    ]
    rows = con.execute(
        "SELECT node, gpu_index, start_time, end_time FROM job_gpus ORDER BY node, gpu_index"
    ).fetchall()
    assert rows == [
        # run 1's GPUs: its own start, closed at run 2's start (the latest run 1 can have ended)
        ("gpu-1", 0, at(1796000600), at(1796000960)),
        ("gpu-1", 1, at(1796000600), at(1796000960)),
        # run 2's GPUs only get run 2's times when it ends
        ("gpu-2", 2, at(1796000960), at(1796002760)),
        ("gpu-2", 3, at(1796000960), at(1796002760)),
    ]


def test_a_warehouse_written_before_the_sluid_column_still_reads(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    old = table("jobs").schema.remove(table("jobs").schema.get_field_index("sluid"))
    row = {"job_id": "1", "cluster": "campus", "state": "COMPLETED", "recorded_at": at(100)}
    wh.append("jobs", pa.Table.from_pylist([row], schema=old))
    assert wh.connect().execute("SELECT job_id, sluid FROM jobs").fetchall() == [("1", None)]
