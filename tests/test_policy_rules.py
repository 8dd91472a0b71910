"""The rules' verdicts on scripted jobs: each kind, each exemption, sliding vs since-start windows,
stale data; and the rule tables' validation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sing.config import ConfigError
from sing.policy.evaluate import (
    EXEMPT,
    INCOMPLETE,
    OK,
    STALE,
    VIOLATING,
    DataNeeds,
    Evaluator,
    open_round,
)
from sing.policy.rules import load_rules
from sing.warehouse.store import Warehouse
from tests.policy_world import NOW, SAMPLE_S, add_job, add_samples, settings

START = NOW - timedelta(hours=5)


@pytest.fixture
def wh(tmp_path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


def verdicts(
    wh: Warehouse, rule: dict, now=NOW, max_age_s: float = 600, min_coverage: float = 0.8
) -> dict[str, str]:
    """{job id: outcome} of one rule named 'r'."""
    (loaded,) = load_rules(settings({"r": rule}))
    con = open_round(wh, [loaded], now, now.date())
    try:
        judged = Evaluator(con, now, DataNeeds(max_age_s, min_coverage, SAMPLE_S)).verdicts(loaded)
        return {v.job["job_id"]: v.outcome for v in judged}
    finally:
        con.close()


def job(wh, job_id, util, start=START, end=NOW, **fields):
    """A running job with GPUs at constant utilisations, sampled from `start` to `end`."""
    gpus = {("n1", i): u for i, u in enumerate(util)}
    add_job(wh, job_id, start, num_gpus=len(util), **fields)
    add_samples(wh, job_id, start, end, gpus)


def test_idle_gpus_every_gpu_by_default_or_a_share(wh):
    job(wh, "1", [0.0, 0.01])  # every GPU idle
    job(wh, "2", [0.0, 0.9])  # half idle
    job(wh, "3", [0.6, 0.9])  # busy
    assert verdicts(wh, {"kind": "idle_gpus"}) == {"1": VIOLATING, "2": OK, "3": OK}
    # 40 % of the GPUs may idle: the half-idle job is over that
    shared = {"kind": "idle_gpus", "idle_gpu_share": 0.4}
    assert verdicts(wh, shared) == {"1": VIOLATING, "2": VIOLATING, "3": OK}


def test_sliding_window_sees_the_last_minutes_since_start_sees_the_whole_job(wh):
    # busy for four hours, idle for the last hour
    add_job(wh, "1", START)
    add_samples(wh, "1", START, NOW - timedelta(minutes=61), {("n1", 0): 0.9, ("n1", 1): 0.9})
    add_samples(wh, "1", NOW - timedelta(minutes=60), NOW, {("n1", 0): 0.0, ("n1", 1): 0.0})
    assert verdicts(wh, {"kind": "idle_gpus", "minutes": 45}) == {"1": VIOLATING}
    assert verdicts(wh, {"kind": "idle_gpus", "minutes": 45, "window": "since_start"}) == {"1": OK}
    # a window longer than the idle spell takes the busy part in
    assert verdicts(wh, {"kind": "idle_gpus", "minutes": 180}) == {"1": OK}


def test_a_job_younger_than_the_window_is_not_judged_yet(wh):
    job(wh, "1", [0.0, 0.0], start=NOW - timedelta(minutes=20))
    assert verdicts(wh, {"kind": "idle_gpus", "minutes": 60}) == {"1": OK}
    assert verdicts(wh, {"kind": "idle_gpus", "minutes": 15}) == {"1": VIOLATING}


def test_untouched_gpus_counts_gpus_never_used_since_the_start(wh):
    add_job(wh, "1", START, num_gpus=2)
    # GPU 1 worked early on, then idled: it was touched
    add_samples(wh, "1", START, START + timedelta(minutes=10), {("n1", 0): 0.0, ("n1", 1): 0.8})
    add_samples(wh, "1", START + timedelta(minutes=11), NOW, {("n1", 0): 0.0, ("n1", 1): 0.0})
    job(wh, "2", [0.3, 0.4])
    rule = {"kind": "untouched_gpus", "minutes": 30}
    assert verdicts(wh, rule) == {"1": VIOLATING, "2": OK}
    assert verdicts(wh, {**rule, "idle_gpu_share": 0.5}) == {"1": OK, "2": OK}


def test_multinode_idle_idle_node_or_no_rdma_traffic(wh):
    start = START
    two_nodes = {"num_nodes": 2, "num_gpus": 2, "nodes": ["n1", "n2"]}
    busy = {("n1", 0): 0.9, ("n2", 0): 0.9}
    # 1: both nodes busy and talking; 2: node n2 idle; 3: busy but silent; 4: one node only
    add_job(wh, "1", start, **two_nodes)
    add_samples(wh, "1", start, NOW, busy, rdma_bytes_per_sample=10**9)
    add_job(wh, "2", start, **two_nodes)
    add_samples(wh, "2", start, NOW, {("n1", 0): 0.9, ("n2", 0): 0.0}, rdma_bytes_per_sample=10**9)
    add_job(wh, "3", start, **two_nodes)
    add_samples(wh, "3", start, NOW, busy, rdma_bytes_per_sample=1000)
    job(wh, "4", [0.0])
    rule = {"kind": "multinode_idle", "min_rdma_bytes_per_node_hour": 1e9}
    assert verdicts(wh, rule) == {"1": OK, "2": VIOLATING, "3": VIOLATING}


def test_under_request_long_jobs_using_a_small_share(wh):
    job(wh, "1", [0.1, 0.1, 0.1, 0.1])  # mean 10 %
    job(wh, "2", [0.9, 0.0, 0.0, 0.0])  # one GPU of four in use
    job(wh, "3", [0.6, 0.5, 0.7, 0.6])
    job(wh, "4", [0.1], start=NOW - timedelta(hours=2))  # not long enough yet
    rule = {"kind": "under_request", "min_run_hours": 4, "window": "since_start"}
    assert verdicts(wh, rule) == {"1": VIOLATING, "2": VIOLATING, "3": OK, "4": OK}


@pytest.mark.parametrize(
    ("exemption", "fields"),
    [
        ({"exempt_users": ["alice"]}, {"user": "alice"}),
        ({"exempt_accounts": ["physics"]}, {"account": "physics"}),
        ({"exempt_partitions": ["debug"]}, {"partition": "debug"}),
        ({"exempt_qos": ["long"]}, {"qos": "long"}),
        ({"exempt_names": ["jupyter-*"]}, {"name": "jupyter-alice"}),
        ({"exempt_interactive_hours": 4}, {"interactive": True, "time_limit_s": 2 * 3600}),
    ],
)
def test_each_exemption_spares_its_job_only(wh, exemption, fields):
    job(wh, "1", [0.0, 0.0], **fields)
    job(
        wh,
        "2",
        [0.0, 0.0],
        user="bob",
        account="chem",
        partition="gpu",
        name="train",
        interactive=True,
        time_limit_s=8 * 3600,
        qos="normal",
    )
    assert verdicts(wh, {"kind": "idle_gpus", **exemption}) == {"1": EXEMPT, "2": VIOLATING}


def test_stale_samples_wait(wh):
    job(wh, "1", [0.0, 0.0], end=NOW - timedelta(minutes=15))  # exporter silent for 15 min
    job(wh, "2", [0.0, 0.0])
    job(wh, "3", [0.0, 0.0], end=START)  # one sample, long ago: nothing in the window
    rule = {"kind": "idle_gpus", "minutes": 60}
    assert verdicts(wh, rule, max_age_s=600) == {"1": STALE, "2": VIOLATING, "3": STALE}
    # fresh enough for 30 min, but 45 of the window's 60 minutes are 75% of its samples
    assert verdicts(wh, rule, max_age_s=1800)["1"] == INCOMPLETE
    assert verdicts(wh, rule, max_age_s=1800, min_coverage=0.7)["1"] == VIOLATING


def test_ended_jobs_and_other_clusters_jobs_are_apart(wh):
    job(wh, "1", [0.0, 0.0], end_time=NOW - timedelta(minutes=5), state="COMPLETED")
    job(wh, "2", [0.0, 0.0])
    # the same job id on another cluster, busy: its samples never mix with campus job 2
    add_job(wh, "2", START, cluster="other")
    add_samples(wh, "2", START, NOW, {("m1", 0): 0.9, ("m1", 1): 0.9}, cluster="other")
    (loaded,) = load_rules(settings({"r": {"kind": "idle_gpus"}}))
    con = open_round(wh, [loaded], NOW, NOW.date())
    judged = Evaluator(con, NOW, DataNeeds(600, 0.8, SAMPLE_S)).verdicts(loaded)
    got = {(v.job["cluster"], v.job["job_id"]): v.outcome for v in judged}
    assert got == {("campus", "2"): VIOLATING, ("other", "2"): OK}


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"kind": "idle"}, "kind = 'idle'"),
        ({"kind": "idle_gpus", "window": "daily"}, "window = 'daily'"),
        ({"kind": "idle_gpus", "actions": ["warn", "notify"]}, "order"),
        ({"kind": "idle_gpus", "actions": ["notify", "cancel"]}, "'cancel' needs 'warn'"),
        ({"kind": "idle_gpus", "actions": ["email"]}, "subset"),
        ({"kind": "idle_gpus", "threshold": 5}, "threshold = 5"),
        ({"kind": "idle_gpus", "grace_minutes": -1}, "grace_minutes"),
        ({"kind": "idle_gpus", "treshold": 0.1}, "did you mean 'threshold'"),
        ({"kind": "idle_gpus", "exempt_users": "alice"}, "must be a list"),
    ],
)
def test_bad_rules_are_refused_naming_the_rule_and_key(rule, message):
    with pytest.raises(ConfigError, match="idle-rule") as err:
        load_rules(settings({"idle-rule": rule}))
    assert message in str(err.value)


def test_disabled_rules_are_not_loaded():
    rules = load_rules(
        settings({"a": {"kind": "idle_gpus"}, "b": {"kind": "idle_gpus", "enabled": False}})
    )
    assert [r.name for r in rules] == ["a"]


def test_a_round_opens_only_the_days_it_reads(wh):
    old = NOW - timedelta(days=30)
    job(wh, "1", [0.0, 0.0], start=old, end=old + timedelta(hours=1))
    job(wh, "2", [0.0, 0.0])
    wh.compact(now=NOW + timedelta(days=1))  # the old day is rolled up and stored
    con = wh.connect({"jobs": None, "gpu_samples": NOW.date()})
    try:
        views = {name for (name,) in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        assert {"jobs", "gpu_samples", "job_gpu_usage", "gpu_hourly"} <= views
        assert not {"rdma_samples", "policy_events", "nodes"} & views
        for view in ("gpu_samples", "job_gpu_usage"):
            (ids,) = con.execute(f"SELECT list(DISTINCT job_id) FROM {view}").fetchone()
            assert ids == ["2"], view
    finally:
        con.close()
    (everything,) = (
        wh.connect().execute("SELECT count(DISTINCT job_id) FROM job_gpu_usage").fetchone()
    )
    assert everything == 2
