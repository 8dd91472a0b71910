"""Parsing Slurm's output into job records, on output captured from the real Slurm 22.05 harness.

tests/executors_data/*_v0.0.38.json were captured from tests/slurm_harness.py: job 1 (user
singtest, 2 typed GPUs, `exit 3`), job 2 (root, 2 nodes x 4 GPUs), job 3 (root, 1 GPU). The
v0.0.40-shaped job below is written from Slurm's newer data_parser shapes (number objects, state
lists); CI cannot run a newer Slurm, so it is the only check of that path.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sing.errors import UserError
from sing.executors.records import NodeRecord
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor
from sing.executors.slurm_parse import gpu_count, parse_sacct, parse_sinfo, parse_squeue, parse_tres
from sing.executors.sync import sync
from sing.warehouse.store import Warehouse

DATA = Path(__file__).parent / "executors_data"
SQUEUE = (DATA / "squeue_v0.0.38.json").read_text()
SACCT = (DATA / "sacct_v0.0.38.json").read_text()
SACCT_TEXT = (
    "1|singtest|3:0|cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2\n"
    "2|root|0:0|cpu=2,node=2,billing=2,gres/gpu=8,gres/gpu:a100=8\n"
    "3|root|0:0|cpu=1,node=1,billing=1,gres/gpu=1,gres/gpu:a100=1\n"
)


def at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def test_tres_typed_and_untyped_gpus_are_not_double_counted():
    both = parse_tres("cpu=2,node=2,billing=2,gres/gpu=8,gres/gpu:a100=8", "t")
    assert gpu_count(both) == 8
    assert gpu_count(parse_tres("cpu=1,gres/gpu:a100=2,gres/gpu:v100=1", "t")) == 3
    assert gpu_count(parse_tres("cpu=1,mem=4000M,node=1", "t")) is None  # names no GPU
    with pytest.raises(UserError, match="'gpu' is not NAME=COUNT"):
        parse_tres("cpu=1,gpu", "squeue")


def test_squeue_running_jobs_with_gpu_indices_per_node():
    records = {r.job_id: r for r in parse_squeue(SQUEUE, "campus")}
    two = records["2"]
    assert two.nodes == ("gpu-1", "gpu-2")
    assert two.gpus == {"gpu-1": (2, 3, 4, 5), "gpu-2": (0, 1, 2, 3)}
    assert (two.num_gpus, two.gpus_per_node) == (8, 4)
    assert two.start_time == at(1796000666) and two.end_time is None
    one = records["1"]
    assert (one.user, one.account, one.state, one.gpus) == (
        "singtest", "research", "RUNNING", {"gpu-1": (0, 1)},
    )  # fmt: skip
    assert records["3"].gpus == {"gpu-1": (6,)}


def test_sacct_takes_exit_codes_from_text_because_22_05_json_says_zero():
    raw = json.loads(SACCT)
    assert raw["jobs"][0]["exit_code"]["return_code"] == 0  # the 22.05 bug, as captured
    records = {r.job_id: r for r in parse_sacct(SACCT, SACCT_TEXT, "campus")}
    failed = records["1"]
    assert (failed.state, failed.exit_code, failed.user, failed.num_gpus) == (
        "FAILED",
        3,
        "singtest",
        2,
    )
    assert (failed.submit_time, failed.start_time, failed.end_time) == (
        at(1796000664), at(1796000666), at(1796000670),
    )  # fmt: skip
    assert records["2"].nodes == ("gpu-1", "gpu-2") and records["2"].num_gpus == 8
    assert records["3"].exit_code == 0 and records["3"].time_limit_s is None


def test_newer_json_shapes_number_objects_and_state_lists():
    job = {
        "job_id": 77, "name": "new", "user": "bob", "account": "lab", "partition": "gpu",
        "nodes": "n[01-02]", "comment": {"job": 'sing:{"interactive":true,"dependencies":{}}'},
        "state": {"current": ["TIMEOUT"], "reason": "None"},
        "time": {"submission": 100, "start": 160, "end": 400,
                 "limit": {"set": True, "infinite": False, "number": 4}},
        "tres": {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 2},
                               {"type": "gres", "name": "gpu:h100", "id": 1002, "count": 2}]},
    }  # fmt: skip
    dump = json.dumps({"meta": {"plugin": {"type": "data_parser/v0.0.40"}}, "jobs": [job]})
    (record,) = parse_sacct(dump, "77|bob|0:15|gres/gpu=2\n", "campus")
    assert (record.state, record.exit_code, record.time_limit_s) == ("TIMEOUT", 143, 240)
    assert (record.num_gpus, record.nodes, record.interactive) == (2, ("n01", "n02"), True)
    assert record.start_time == at(160)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda j: j["time"].pop("end"), r"job 1: field 'time\.end' is missing"),
        (lambda j: j["state"].update(current=3), r"job 1: field 'state\.current' should be a job"),
        (lambda j: j["time"].update(start="soon"), r"field 'time\.start' should be a number"),
        (lambda j: j.update(nodes="gpu-[1-"), r"field 'nodes': bad host list"),
    ],
)
def test_unknown_shapes_name_the_field(mangle, message):
    dump = json.loads(SACCT)
    mangle(dump["jobs"][0])
    with pytest.raises(UserError, match=message):
        parse_sacct(json.dumps(dump), SACCT_TEXT, "campus")


def test_truncated_or_malformed_output_is_a_clear_error():
    with pytest.raises(UserError, match="sacct --json: output is not valid JSON.*truncated"):
        parse_sacct(SACCT[: len(SACCT) // 2], SACCT_TEXT, "campus")
    with pytest.raises(UserError, match="no line for job 3; truncated"):
        parse_sacct(SACCT, "1|singtest|3:0|\n2|root|0:0|\n", "campus")
    with pytest.raises(UserError, match="sacct -P line 2: expected 4 fields"):
        parse_sacct(SACCT, "1|singtest|3:0|\n2|root|0:0\n", "campus")
    with pytest.raises(UserError, match="squeue --json: no 'jobs' list"):
        parse_squeue('{"meta": {}, "job": []}', "campus")


class Replay:
    """Answers Slurm commands with fixed output: recorded good output, then bad output."""

    def __init__(self, squeue: str, sacct_json: str, sacct_text: str) -> None:
        self.out = {"squeue": squeue, "sacct --json": sacct_json, "sacct -X": sacct_text}

    def __call__(self, argv: list[str], stdin: str | None = None) -> str:
        return self.out[argv[0] if argv[0] == "squeue" else " ".join(argv[:2])]


def test_sync_of_bad_output_writes_nothing_and_keeps_earlier_records(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    now = at(1796000700)
    good = SlurmExecutor("campus", ExecutorSettings(), Replay(SQUEUE, SACCT, SACCT_TEXT))
    result = sync(good, wh, now=now)
    assert (result.finished, result.running) == (3, 0)
    before = wh.connect().execute("SELECT * FROM jobs ORDER BY job_id").fetchall()
    assert [row[0] for row in before] == ["1", "2", "3"]

    for bad in (
        Replay(SQUEUE, SACCT[:-40], SACCT_TEXT),  # truncated sacct JSON
        Replay(SQUEUE[:100], SACCT, SACCT_TEXT),  # truncated squeue JSON
        Replay(SQUEUE, SACCT, SACCT_TEXT[:10]),  # truncated sacct -P text
    ):
        with pytest.raises(UserError):
            sync(SlurmExecutor("campus", ExecutorSettings(), bad), wh, now=now)
    after = wh.connect().execute("SELECT * FROM jobs ORDER BY job_id").fetchall()
    assert after == before


def test_sinfo_nodes_sum_gpu_gres_and_join_partitions() -> None:
    text = (
        "gpu-1|debug|gpu:a100:8\n"
        "gpu-2|debug|gpu:a100:8(S:0-1)\n"
        "gpu-2|long|gpu:a100:8(S:0-1)\n"
        "mixed|debug|gpu:a100:4(S:0),gpu:v100:2(S:1),shard:8\n"
        "untyped|debug|gpu:2\n"
        "cpu-1|debug|(null)\n"
    )
    assert parse_sinfo(text) == [
        NodeRecord("cpu-1", 0, None, "debug"),
        NodeRecord("gpu-1", 8, "a100", "debug"),
        NodeRecord("gpu-2", 8, "a100", "debug,long"),
        NodeRecord("mixed", 6, None, "debug"),  # two types: no single model
        NodeRecord("untyped", 2, None, "debug"),
    ]
    with pytest.raises(UserError, match="sinfo line 1: expected NODE|PARTITION|GRES"):
        parse_sinfo("gpu-1 debug gpu:a100:8\n")


def requeued_sacct(later_state: str, later_start: int | None) -> tuple[str, str]:
    """`sacct --duplicates` of job 1 requeued after its first run (22.05's record of it, as
    captured) and its next run in `later_state`: the runs oldest first, as sacct lists them."""
    raw = json.loads(SACCT)
    first = next(job for job in raw["jobs"] if job["job_id"] == 1)
    first["state"] = {"current": "REQUEUED", "reason": "None"}
    later = json.loads(json.dumps(first))
    later["state"]["current"] = later_state
    later["time"] |= {"start": later_start or 0, "end": 0}
    raw["jobs"] = [first, later]
    line = "1|singtest|0:0|cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2\n"
    return json.dumps(raw), line + (line if later_start else "1|singtest|0:0|\n")


def test_a_requeued_jobs_ended_run_stands_while_its_next_run_waits():
    """Slurm 24.11 without --duplicates lists only the pending record of a requeued job
    (tests/executors_data/slurm-24.11/sacct-requeued*), so sing asks for every run."""
    (record,) = parse_sacct(*requeued_sacct("PENDING", None), "campus")
    assert (record.state, record.num_gpus, record.end_time) == ("REQUEUED", 2, at(1796000670))


def test_slurm_24_11_gives_the_requeued_run_as_pending_with_a_flag():
    """24.11's `sacct --json --duplicates` after `scontrol requeue`, as seen on Debian 13's
    24.11.5 (tests/test_slurm_versions.py): one record, ["PENDING", "REQUEUED"], start and end
    set. It is the run that ended, not a pending job."""
    raw = json.loads(SACCT)
    (run,) = [job for job in raw["jobs"] if job["job_id"] == 1]
    run["state"] = {"current": ["PENDING", "REQUEUED"], "reason": "None"}
    raw["jobs"] = [run]
    line = "1|singtest|0:0|cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2\n"
    (record,) = parse_sacct(json.dumps(raw), line, "campus")
    assert (record.state, record.end_time) == ("REQUEUED", at(1796000670))


def test_each_ended_run_of_a_requeued_job_is_read_with_its_own_line():
    """Running again, the job is squeue's (`running`), as any running job; its ended run is
    still read, a run of its own. Both outputs list runs oldest first: the text's lines go to
    the runs in order (the first run here was killed by signal 9, the second exited 3)."""
    (first,) = parse_sacct(*requeued_sacct("RUNNING", 1796000700), "campus")
    assert (first.state, first.start_time, first.end_time) == (
        "REQUEUED", at(1796000666), at(1796000670),
    )  # fmt: skip
    dump, _ = requeued_sacct("COMPLETED", 1796000700)
    tres = "cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2"
    runs = parse_sacct(dump, f"1|singtest|0:9|{tres}\n1|singtest|3:0|{tres}\n", "campus")
    assert [(r.state, r.start_time, r.exit_code) for r in runs] == [
        ("REQUEUED", at(1796000666), 137),
        ("COMPLETED", at(1796000700), 3),
    ]


def running_again(start: int) -> str:
    """`squeue --json` (22.05, as captured) with job 1 alone, running again since `start`."""
    raw = json.loads(SQUEUE)
    raw["jobs"] = [job for job in raw["jobs"] if job["job_id"] == 1]
    raw["jobs"][0]["start_time"] = start
    return json.dumps(raw)


@pytest.mark.parametrize(
    "first_state", ["REQUEUED", ["PENDING", "REQUEUED"]], ids=["22.05", "24.11"]
)
def test_sync_keeps_a_requeued_jobs_runs_apart(tmp_path, first_state):
    """The running run is the job's `jobs` row; the ended one stays a `job_runs` row with its
    state and end, and syncing the same output again adds no row."""
    dump, text = requeued_sacct("RUNNING", 1796000700)
    raw = json.loads(dump)
    raw["jobs"][0]["state"]["current"] = first_state
    replay = Replay(running_again(1796000700), json.dumps(raw), text)
    wh = Warehouse(tmp_path / "wh")
    for _ in range(2):
        sync(SlurmExecutor("campus", ExecutorSettings(), replay), wh, now=at(1796000800))
    con = wh.connect()
    assert con.execute("SELECT state, start_time FROM jobs").fetchall() == [
        ("RUNNING", at(1796000700))
    ]
    runs = "SELECT state, start_time, end_time, nodes, num_gpus FROM job_runs ORDER BY start_time"
    assert con.execute(runs).fetchall() == [
        ("REQUEUED", at(1796000666), at(1796000670), ["gpu-1"], 2),
        ("RUNNING", at(1796000700), None, ["gpu-1"], 2),
    ]


def test_finished_asks_sacct_for_every_run_of_a_job():
    calls = []

    def runner(argv: list[str], stdin: str | None) -> str:
        calls.append(argv)
        return requeued_sacct("PENDING", None)[argv[1] != "--json"]

    (record,) = SlurmExecutor("campus", ExecutorSettings(), runner).finished(at(1796000600))
    assert record.state == "REQUEUED"
    assert all("--duplicates" in argv for argv in calls) and len(calls) == 2
