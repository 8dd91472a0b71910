"""GPU counts and job states from every source Slurm gives (issue 28, items 1 and 2).

Slurm puts GPUs into a job's TRES only when `gres/gpu` is in `AccountingStorageTRES`, not the
default: then squeue's `tres_alloc_str` and sacct's `tres.allocated` / AllocTRES name no GPU
while `gres_detail` still names the indices. The records below are written in the shapes of
Slurm's data_parser (SchedMD/slurm src/plugins/data_parser/v0.0.4x/parsers.c): 21.08 and
22.05 (v0.0.37/38: plain numbers, state strings), 23.02 to 25.11 (v0.0.39 to v0.0.44: number
objects, state lists with the base state first and flags after it).
"""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from sing.cli.doctor import check_gpu_accounting
from sing.config import Config
from sing.executors.base import CommandError
from sing.executors.records import JobRecord
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor
from sing.executors.slurm_parse import JobState, job_state, parse_sacct, parse_squeue
from sing.executors.sync import sync
from sing.warehouse.store import Warehouse
from tests.test_executors_slurm_parse import SACCT, SACCT_TEXT, SQUEUE, Replay, at

DATA = Path(__file__).parent / "executors_data"
NO_GPU_TRES = "cpu=4,mem=16G,node=1,billing=4"
# data_parser version -> whether numbers are {set, infinite, number} and states lists.
SHAPES = {"v0.0.37": False, "v0.0.38": False, "v0.0.39": True, "v0.0.41": True, "v0.0.44": True}


def number(value: int, new: bool) -> Any:
    return {"set": True, "infinite": False, "number": value} if new else value


def squeue_job(
    new: bool,
    state: str | list[str] = "RUNNING",
    tres: str = NO_GPU_TRES,
    gres_detail: list[str] | None = None,
    nodes: str = "gpu-1",
    job_id: int = 42,
) -> dict[str, Any]:
    """One `squeue --json` job in the shape of an old (plain) or new (objects) data_parser."""
    if new and isinstance(state, str):
        state = [state]
    return {
        "job_id": job_id,
        "job_state": state,
        "user_name": "alice",
        "account": "lab",
        "partition": "gpu",
        "name": "train",
        "nodes": nodes,
        "submit_time": number(1796000000, new),
        "start_time": number(1796000060, new),
        "time_limit": number(60, new),
        "tres_alloc_str": tres,
        "tres_per_node": "gres/gpu:4" if new else "gres:gpu:4",
        "gres_detail": ["gpu:a100:4(IDX:0-3)"] if gres_detail is None else gres_detail,
    }


def squeue(*jobs: dict[str, Any]) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


@pytest.mark.parametrize("version", SHAPES)
def test_gres_detail_counts_where_the_tres_names_no_gpu(version, caplog):
    """The reviewer's case: TRES without gres/gpu beside `gpu:a100:4(IDX:0-3)` was 0 GPUs."""
    caplog.set_level(logging.WARNING, "sing.executors.slurm_parse")
    (record,) = parse_squeue(squeue(squeue_job(SHAPES[version])), "campus")
    assert (record.num_gpus, record.gpus, record.gpus_per_node) == (4, {"gpu-1": (0, 1, 2, 3)}, 4)
    (warning,) = caplog.messages
    assert "job 42: tres_alloc_str none, gres_detail 4" in warning
    assert "sing doctor head" in warning


@pytest.mark.parametrize(
    ("tres", "detail", "nodes", "gpus", "warns"),
    [
        ("cpu=2,gres/gpu=4", ["gpu:a100:4(IDX:0-3)"], "gpu-1", 4, False),  # they agree
        ("cpu=2,gres/gpu:a100=4", ["gpu:a100:4(IDX:0-3)"], "gpu-1", 4, False),  # typed only
        ("cpu=2,gres/gpu=0", ["gpu(IDX:0,2)"], "gpu-1", 2, True),  # TRES says 0: indices count
        (NO_GPU_TRES, ["gpu:2(IDX:0-1)", "gpu:h100:3(IDX:1,3,5)"], "n[1-2]", 5, True),
        (NO_GPU_TRES, ["gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:4)"], "gpu-1", 3, True),  # 2 types
        ("cpu=8,gres/gpu=8,gres/gpu:a100=8", ["gpu:a100:4(IDX:N/A)", "gpu:a100:4(IDX:0-3)"],
         "n[1-2]", 8, True),  # an index list missing: the TRES is the larger figure
        (NO_GPU_TRES, [], "gpu-1", 0, False),  # a CPU job
    ],
)  # fmt: skip
def test_the_largest_gpu_figure_is_kept(tres, detail, nodes, gpus, warns, caplog):
    caplog.set_level(logging.WARNING, "sing.executors.slurm_parse")
    job = squeue_job(True, tres=tres, gres_detail=detail, nodes=nodes)
    (record,) = parse_squeue(squeue(job), "campus")
    assert record.num_gpus == gpus
    assert bool(caplog.messages) == warns, caplog.messages


def test_one_warning_per_listing_names_the_first_jobs_and_counts_the_rest(caplog):
    caplog.set_level(logging.WARNING, "sing.executors.slurm_parse")
    jobs = [squeue_job(True, job_id=100 + i) for i in range(82)]
    records = parse_squeue(squeue(*jobs), "campus")
    assert {r.num_gpus for r in records} == {4}
    (warning,) = caplog.messages
    assert warning.startswith("squeue --json: 82 job(s) with GPU figures that disagree")
    assert "job 100: tres_alloc_str none, gres_detail 4" in warning and "77 more" in warning


def test_repository_fixtures_without_gres_gpu_accounting_keep_their_gpus(caplog):
    """The captured 22.05 output, with gres/gpu taken out of its TRES as an untracked site
    would show it: the same counts as the accounted original, which logs nothing."""
    caplog.set_level(logging.WARNING, "sing.executors.slurm_parse")
    accounted = {r.job_id: r.num_gpus for r in parse_squeue(SQUEUE, "campus")}
    assert accounted == {"1": 2, "2": 8, "3": 1} and not caplog.messages
    dump = json.loads(SQUEUE)
    for job in dump["jobs"]:
        job["tres_alloc_str"] = ",".join(
            t for t in job["tres_alloc_str"].split(",") if not t.startswith("gres/gpu")
        )
    untracked = {r.job_id: r.num_gpus for r in parse_squeue(json.dumps(dump), "campus")}
    assert untracked == accounted
    assert "job 2: tres_alloc_str none, gres_detail 8" in caplog.messages[0]


def untracked_sacct() -> tuple[str, str]:
    """The captured sacct output with gres/gpu out of both its JSON and its AllocTRES text."""
    dump = json.loads(SACCT)
    for job in dump["jobs"]:
        job["tres"]["allocated"] = [t for t in job["tres"]["allocated"] if t["type"] != "gres"]
    text = "".join(line.split("gres/gpu")[0].rstrip(",") + "\n" for line in SACCT_TEXT.splitlines())
    return json.dumps(dump), text


def test_sacct_json_and_text_tres_are_cross_checked(caplog):
    caplog.set_level(logging.WARNING, "sing.executors.slurm_parse")
    counts = {r.job_id: r.num_gpus for r in parse_sacct(SACCT, SACCT_TEXT, "campus")}
    assert counts == {"1": 2, "2": 8, "3": 1} and not caplog.messages
    dump, text = untracked_sacct()
    assert {r.num_gpus for r in parse_sacct(dump, text, "campus")} == {0}  # nothing says GPUs
    text_only = text.replace("1|singtest|3:0|cpu=1", "1|singtest|3:0|cpu=1,gres/gpu:a100=2")
    counts = {r.job_id: r.num_gpus for r in parse_sacct(dump, text_only, "campus")}
    assert counts == {"1": 2, "2": 0, "3": 0}
    assert "job 1: tres.allocated none, AllocTRES 2" in caplog.messages[0]


def test_finished_jobs_keep_the_gpus_seen_while_they_ran(tmp_path):
    """sacct of an untracked site says 0 GPUs for an ended job; the sync keeps the indices and
    the count that squeue's gres_detail gave while it ran."""
    wh = Warehouse(tmp_path / "wh")
    detail = ["gpu:a100:4(IDX:2-5)", "gpu:a100:4(IDX:0-3)"]
    running = squeue(squeue_job(True, job_id=2, nodes="gpu-[1-2]", gres_detail=detail))
    empty = json.dumps({"meta": {}, "errors": [], "jobs": []})
    executor = SlurmExecutor("campus", ExecutorSettings(), Replay(running, empty, ""))
    sync(executor, wh, now=at(1796000100))
    dump, text = untracked_sacct()
    executor = SlurmExecutor("campus", ExecutorSettings(), Replay(squeue(), dump, text))
    sync(executor, wh, now=at(1796000700))
    rows = (
        wh.connect()
        .execute("SELECT job_id, state, num_gpus, gpus_per_node FROM jobs ORDER BY job_id")
        .fetchall()
    )
    assert rows == [("1", "FAILED", 0, 0), ("2", "COMPLETED", 8, 4), ("3", "COMPLETED", 0, 0)]
    (ended,) = (
        wh.connect()
        .execute("SELECT count(*) FROM job_gpus WHERE job_id = '2' AND end_time IS NOT NULL")
        .fetchone()
    )
    assert ended == 8


@pytest.mark.parametrize(
    ("value", "state"),
    [
        (["CANCELLED", "COMPLETING"], JobState("CANCELLED", frozenset({"COMPLETING"}))),
        (["RUNNING", "COMPLETING"], JobState("RUNNING", frozenset({"COMPLETING"}))),
        (["COMPLETED", "COMPLETING"], JobState("COMPLETED", frozenset({"COMPLETING"}))),
        ("COMPLETING", JobState("COMPLETING")),  # 21.08/22.05 name the flag, not the base
        ("CG", JobState("COMPLETING")),  # text output's code
        ("CANCELLED by 1000", JobState("CANCELLED")),
        (["PENDING", "REQUEUED"], JobState("PENDING", frozenset({"REQUEUED"}))),
        ("r", JobState("RUNNING")),
    ],
)
def test_state_lists_are_read_whole(value, state):
    assert job_state(value) == state
    assert state.holding == (state.name in ("RUNNING", "COMPLETING"))


@pytest.mark.parametrize("bad", [[], "", [" "], [3], {"current": "RUNNING"}, None])
def test_what_is_no_state_is_refused(bad):
    assert job_state(bad) is None


@pytest.mark.parametrize(
    ("version", "value", "base"),
    [
        ("v0.0.44", ["CANCELLED", "COMPLETING"], "CANCELLED"),
        ("v0.0.41", ["RUNNING", "COMPLETING"], "RUNNING"),
        ("v0.0.39", ["COMPLETED", "COMPLETING"], "COMPLETED"),
        ("v0.0.38", "COMPLETING", None),
        ("v0.0.37", "CG", None),
    ],
)
def test_completing_jobs_stay_running_and_keep_their_base_state(version, value, base):
    """A job whose epilog still holds its GPUs was dropped from running() (only the first
    element of the state list was read)."""
    listing = squeue(
        squeue_job(SHAPES[version], state=value),
        squeue_job(SHAPES[version], state="COMPLETED", job_id=43),
    )
    executor = SlurmExecutor("campus", ExecutorSettings(), Replay(listing, "", ""))
    (record,) = executor.running()
    assert (record.job_id, record.state, record.base_state) == ("42", "COMPLETING", base)
    assert not record.finished and record.num_gpus == 4
    assert JobRecord.from_json(record.to_json()) == record  # the local executor's state files


def test_sacct_leaves_a_completing_job_to_squeue():
    dump = json.loads(SACCT)
    dump["jobs"][0]["state"]["current"] = ["CANCELLED", "COMPLETING"]
    assert [r.job_id for r in parse_sacct(json.dumps(dump), SACCT_TEXT, "campus")] == ["2", "3"]


SHOW_CONFIG = """Configuration data as of 2026-01-01T00:00:00
AccountingStorageHost   = head
AccountingStorageTRES   = {tres}
AccountingStorageType   = accounting_storage/slurmdbd
"""


@pytest.mark.parametrize(
    ("tres", "status", "line"),
    [
        ("cpu,mem,energy,node,billing,fs/disk,vmem,pages", "WARN",
         "AccountingStorageTRES=gres/gpu"),  # Slurm's default
        ("cpu,mem,energy,node,billing,fs/disk,vmem,pages,license/matlab", "WARN",
         "AccountingStorageTRES=license/matlab,gres/gpu"),  # keeps the site's own
        ("cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/gpu:a100", "OK", None),
    ],
)  # fmt: skip
def test_doctor_head_says_the_line_that_makes_slurm_account_gpus(tres, status, line):
    asked = []

    def scontrol(argv: list[str], stdin: str | None) -> str:
        asked.append(argv)
        return SHOW_CONFIG.format(tres=tres)

    config = Config({"executor": {"kind": "slurm"}})
    finding = check_gpu_accounting(Namespace(warehouse=None), config, run=scontrol)
    assert asked == [["scontrol", "show", "config"]]
    assert finding.status == status, finding
    if line:
        assert finding.detail.endswith(f"add this line to slurm.conf, then restart slurmdbd and "
                                       f"slurmctld: {line}")  # fmt: skip
    local = check_gpu_accounting(Namespace(warehouse=None), Config({}), run=scontrol)
    assert (local.status, len(asked)) == ("OK", 1)  # not Slurm: nothing asked


def test_doctor_head_warns_when_scontrol_cannot_answer():
    def down(argv: list[str], stdin: str | None) -> str:
        raise CommandError("scontrol", "timeout", "scontrol show timed out after 30 s")

    finding = check_gpu_accounting(Namespace(), Config({"executor": {"kind": "slurm"}}), down)
    assert finding.status == "WARN" and "timed out" in finding.detail
