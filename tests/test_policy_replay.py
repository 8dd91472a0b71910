"""`sing policy replay`: the rules over a scripted six hours, walked through the real ladder, and
the replay's verdicts next to the live Evaluator's (the same SQL must give the same answer)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from sing.cli.policy import cmd_replay
from sing.policy.evaluate import (
    INCOMPLETE,
    VIOLATING,
    DataNeeds,
    Evaluator,
    open_round,
)
from sing.policy.replay import hit_rows, judge, open_replay, replay, totals
from sing.policy.rules import load_rules
from sing.warehouse.store import Warehouse
from tests.policy_world import NOW, SAMPLE_S, add_job, add_samples, settings
from tests.test_policy_host import GIB, START, host_job, memory

SINCE = NOW - timedelta(hours=6)  # 06:00; the replay's rounds run 06:05 .. 12:00
IDLE_RULE = {
    "kind": "idle_gpus",
    "minutes": 60,
    "actions": ["notify", "warn", "cancel"],
    "warn_after_minutes": 60,
    "grace_minutes": 60,
    "exempt_users": ["dave"],
}


def at(hours: int, minutes: int = 0):
    return NOW.replace(hour=hours, minute=minutes)


@pytest.fixture
def wh(tmp_path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


def job(wh, job_id, user, util, start=SINCE, end=NOW, ended=True, sampled=None, **fields):
    """A 1-node job with GPUs at constant utilisations sampled from `start` to `end`; `ended`:
    its record ends at `end`; `sampled`: the GPUs with samples (default all)."""
    gpus = {("n1", i): u for i, u in enumerate(util)}
    record = {"end_time": end, "state": "COMPLETED"} if ended else {}
    add_job(wh, job_id, start, user=user, num_gpus=len(util), **record, **fields)
    add_samples(wh, job_id, start, end, {k: gpus[k] for k in sampled or gpus})


@pytest.fixture
def world(wh) -> Warehouse:
    job(wh, "idle", "alice", [0.0, 0.0])
    job(wh, "busy", "carol", [0.9, 0.8])
    job(wh, "exempt", "dave", [0.0, 0.0])
    job(wh, "half", "erin", [0.0, 0.0], sampled=[("n1", 0)])  # one GPU never heard from
    # bob's job idles until 08:10 (notified 07:00, warned 08:00), then works
    add_job(wh, "recovers", SINCE, user="bob", end_time=NOW, state="COMPLETED")
    add_samples(wh, "recovers", SINCE, at(8, 10), {("n1", 0): 0.0, ("n1", 1): 0.0})
    add_samples(wh, "recovers", at(8, 11), NOW, {("n1", 0): 0.9, ("n1", 1): 0.9})
    return wh


def run_replay(wh, rules=None, **policy):
    config = settings({"idle": rules or IDLE_RULE}, **policy)
    return replay(wh, config, load_rules(config), SINCE, NOW, SAMPLE_S)


def test_the_ladder_notifies_warns_and_cancels_an_idle_job_at_known_times(world):
    result = run_replay(world)
    rows = {row["job_id"]: row for row in hit_rows(result)}
    assert set(rows) == {"idle", "recovers"}  # busy, exempt and half-sampled: never hit
    idle = rows["idle"]
    # judged from 07:00 (one full window), warned an hour after, cancelled at the deadline
    assert (idle["notify_at"], idle["warn_at"], idle["cancel_at"]) == (at(7), at(8), at(9))
    assert idle["gpu_hours_freed"] == 2 * 3.0  # 2 GPUs, 09:00 to its recorded end at 12:00
    assert idle["mean_util"] == 0.0 and idle["coverage"] == 1.0
    recovers = rows["recovers"]
    assert (recovers["notify_at"], recovers["warn_at"], recovers["cancel_at"]) == (
        at(7),
        at(8),
        None,
    )
    assert recovers["ended"] == "recovered" and recovers["gpu_hours_freed"] == 0.0
    kinds = sorted((m["job_id"], m["kind"]) for m in result.messages)
    assert kinds == [
        ("idle", "cancelled"),
        ("idle", "notify"),
        ("idle", "warn"),
        ("recovers", "notify"),
        ("recovers", "warn"),
    ]
    sums = totals(result)
    assert (sums["jobs_notified"], sums["jobs_warned"], sums["jobs_cancelled"]) == (2, 2, 1)
    assert sums["messages"] == 5 and sums["gpu_hours_freed"] == 6.0


def test_a_half_sampled_job_is_incomplete_at_every_judged_round_never_hit(world):
    result = run_replay(world)
    (half,) = [u for u in result.unjudged if u["job_id"] == "half"]
    # judged from 07:00 to 11:55 every 5 minutes; half of its samples: under 0.8
    assert (half["outcome"], half["steps"], half["min_coverage"]) == (INCOMPLETE, 60, 0.5)
    assert totals(result)["incomplete_verdicts"] == 60
    assert totals(result)["stale_verdicts"] == 0


def test_dry_run_settings_are_ignored_and_nothing_is_written(world):
    before = sorted(p.relative_to(world.root) for p in world.root.rglob("*"))
    dry = run_replay(world, {**IDLE_RULE, "dry_run": True}, dry_run=True)
    assert totals(dry)["jobs_cancelled"] == 1
    assert sorted(p.relative_to(world.root) for p in world.root.rglob("*")) == before


def test_a_running_job_cancelled_frees_its_hours_up_to_the_replay_end(wh):
    job(wh, "open", "alice", [0.0] * 4, ended=False)
    (row,) = hit_rows(run_replay(wh))
    assert row["cancel_at"] == at(9) and row["gpu_hours_freed"] == 4 * 3.0


# A verdict and the figures behind it (mean utilisation rounded: sums added in another order).
JUDGED = (
    "outcome",
    "samples",
    "coverage",
    "gpus_sampled",
    "idle_gpus",
    "gpus_never_used",
    "idle_nodes",
    "rdma_bytes",
    "last_heard",
    "run_s",
)


# The host kinds' figures besides (CPU seconds rounded likewise).
HOST_JUDGED = ("host_samples", "host_last_heard", "alloc_cores", "host_mem_peak_bytes",
               "host_mem_req_bytes", "suggested_mem_bytes")  # fmt: skip


def judged(row: dict) -> tuple:
    mean, cpu = row["mean_util"], row["cpu_core_s"]
    return (
        *(row[k] for k in JUDGED + HOST_JUDGED),
        None if mean is None else round(mean, 9),
        None if cpu is None else round(cpu, 6),
    )


def live_and_replayed(wh, rule: dict, steps: list) -> tuple[dict, dict]:
    """{(step, job): verdict and figures} of one rule named 'r', by the live Evaluator at each
    step and by the replay's one query."""
    (loaded,) = load_rules(settings({"r": rule}))
    needs = DataNeeds(600, 0.8, SAMPLE_S)
    live = {}
    for step in steps:
        con = open_round(wh, [loaded], step, step.date())
        try:
            for v in Evaluator(con, step, needs, [loaded]).verdicts(loaded):
                live[(step, v.job["job_id"])] = judged(v.job | {"outcome": v.outcome})
        finally:
            con.close()
    con = open_replay(wh, [loaded], SINCE, 72, 300)
    try:
        judge(con, loaded, needs, SINCE, 300)
        rows = con.sql("SELECT * FROM verdicts").to_arrow_table().to_pylist()
    finally:
        con.close()
    replayed = {(r["step"], r["job_id"]): judged(r) for r in rows if r["step"] in steps}
    return live, replayed


@pytest.mark.parametrize(
    "rule",
    [
        {"kind": "idle_gpus", "minutes": 30},
        {"kind": "idle_gpus", "minutes": 45, "idle_gpu_share": 0.4},
        {"kind": "under_request", "min_run_hours": 1, "window": "since_start"},
        {"kind": "untouched_gpus", "minutes": 10},
        {"kind": "multinode_idle", "minutes": 60},
    ],
)
def test_the_replay_says_what_the_live_evaluator_says(wh, rule):
    """Running jobs (no recorded end, as the live engine sees them), judged at the replay's
    last round; sliding windows at earlier rounds too (the live since-start figures of a past
    moment would read the later samples as well: no live round ever sees those)."""
    job(wh, "idle", "alice", [0.0, 0.0], ended=False)
    job(wh, "mixed", "bob", [0.0, 0.5, 0.03], ended=False)
    job(wh, "busy", "carol", [0.9, 0.8], ended=False)
    job(wh, "young", "dave", [0.0], start=NOW - timedelta(minutes=40), ended=False)
    job(wh, "half", "erin", [0.0, 0.0], sampled=[("n1", 1)], ended=False)
    job(wh, "silent", "fay", [0.0], end=NOW - timedelta(minutes=30), ended=False)
    add_job(wh, "wide", SINCE, user="gus", num_gpus=2, num_nodes=2, nodes=["n2", "n3"])
    add_samples(wh, "wide", SINCE, NOW, {("n2", 0): 0.0, ("n3", 0): 0.7}, rdma_bytes_per_sample=5)
    sliding = rule.get("window") != "since_start" and rule["kind"] != "untouched_gpus"
    steps = [at(9), at(10, 25), NOW] if sliding else [NOW]
    live, replayed = live_and_replayed(wh, rule, steps)
    assert replayed == live
    assert VIOLATING in {
        v[0] for v in live.values()
    }  # a test that could not tell them apart proves nothing


def test_cli_json_has_rows_and_totals(world, capsys):
    class Args:
        since = SINCE
        until = NOW
        json = True
        warehouse = str(world.root)

    class Config:
        def section(self, name, cls):
            if name == "policy":
                return settings({"idle": IDLE_RULE})
            return cls(interval_s=SAMPLE_S)

        def warehouse_dir(self, given):
            return given

    assert cmd_replay(Args(), Config()) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["jobs_cancelled"] == 1
    assert [r["job_id"] for r in out["rows"]][0] in {"idle", "recovers"}


@pytest.mark.parametrize(
    "rule",
    [
        {"kind": "excess_memory", "minutes": 60},
        {"kind": "excess_cores_per_gpu", "minutes": 45},
        {"kind": "excess_cores_per_gpu", "window": "since_start"},
    ],
)
def test_the_replay_judges_the_host_kinds_as_the_live_evaluator(wh, rule):
    """The host kinds (CPU and memory from the jobs' cgroups) replayed round by round give the
    live verdicts and figures: a memory hog and a job asking 4x the memory it uses, cores held
    idle, a job busy later in its run, and a job with half its nodes' cgroups read."""
    host_job(wh, "hog", req_mem_bytes=64 * GIB, alloc_cpus=32, busy=1.0, **memory(4))
    host_job(wh, "fits", req_mem_bytes=64 * GIB, alloc_cpus=32, busy=30.0, **memory(40))
    host_job(wh, "wakes", alloc_cpus=32, busy=[(START, 1.0), (at(10), 30.0)], **memory(4, 64))
    host_job(wh, "half", nodes=("n4", "n5"), cgroup_nodes=("n4",), req_mem_bytes=64 * GIB,
             alloc_cpus=32, **memory(4))  # fmt: skip
    sliding = rule.get("window") != "since_start"
    steps = [at(9), at(10, 25), NOW] if sliding else [NOW]
    live, replayed = live_and_replayed(wh, rule, steps)
    assert replayed == live
    assert VIOLATING in {v[0] for v in live.values()}
