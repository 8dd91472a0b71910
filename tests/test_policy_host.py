"""The host kinds, excess_memory and excess_cores_per_gpu, on jobs whose cgroups the collector's
own rows read: each fires, stays quiet, waits for data it lacks (stale, incomplete, unknown),
and a dry run only records; their messages say peak vs requested and what to ask for."""

from __future__ import annotations

from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import pytest

from sing.cli.policy import verdict_reason
from sing.config import ConfigError
from sing.executors.local import LocalExecutor
from sing.policy.evaluate import INCOMPLETE, OK, STALE, UNKNOWN, VIOLATING
from sing.policy.postman import Templates
from sing.policy.rules import load_rules
from sing.warehouse.audit import events
from sing.warehouse.store import Warehouse
from tests.policy_world import (
    NOW,
    RecordingPostman,
    add_job,
    add_samples,
    cgroup_readings,
    collect,
    engine,
    settings,
)
from tests.test_policy_rules import verdicts

GIB = 2**30
START = NOW - timedelta(hours=5)
MEMORY = {"kind": "excess_memory", "minutes": 60}  # under 25 % of a request of 32 GiB or more
CORES = {"kind": "excess_cores_per_gpu", "minutes": 60}  # over 8 cores per GPU, under 25 % busy


@pytest.fixture
def wh(tmp_path) -> Warehouse:
    return Warehouse(tmp_path / "wh")


def host_job(wh, job_id, *, nodes=("n1",), cgroup_nodes=None, gpus=2, busy=1.0, **cgroup):
    """A running job on `nodes` (GPUs at 50 % on the first), its cgroups read on
    `cgroup_nodes` (default: all) with `busy` cores (or [(from, cores)]) in use. `cgroup`:
    the record's alloc_cpus, req_mem_bytes, and the cgroups' values."""
    record = {k: cgroup.pop(k) for k in ("alloc_cpus", "req_mem_bytes") if k in cgroup}
    add_job(wh, job_id, START, num_gpus=gpus, num_nodes=len(nodes), nodes=list(nodes), **record)
    if gpus:
        add_samples(wh, job_id, START, NOW, {(nodes[0], i): 0.5 for i in range(gpus)})
    rates = busy if isinstance(busy, list) else [(START, busy)]
    readings = []
    for node in nodes if cgroup_nodes is None else cgroup_nodes:
        readings += cgroup_readings(job_id, node, START, NOW, rates, **cgroup)
    collect(wh, readings)


def memory(peak_gib, limit_gib=None):
    peak = int(peak_gib * GIB)
    limit = int(limit_gib * GIB) if limit_gib else None
    return {"mem_used_bytes": peak, "mem_peak_bytes": peak, "mem_limit_bytes": limit}


def test_excess_memory_fires_under_a_quarter_of_a_large_request(wh):
    host_job(wh, "1", req_mem_bytes=64 * GIB, **memory(4))  # 6 % of 64 GiB
    host_job(wh, "2", req_mem_bytes=64 * GIB, **memory(40))  # 62 %
    host_job(wh, "3", req_mem_bytes=16 * GIB, **memory(1))  # a request under 32 GiB
    host_job(wh, "4", **memory(8, limit_gib=128))  # no ReqMem: the cgroup's limit, 6 %
    host_job(wh, "5", **memory(8))  # neither: the request is unknown
    host_job(wh, "6", gpus=0, req_mem_bytes=256 * GIB, **memory(10))  # a CPU job counts too
    assert verdicts(wh, MEMORY) == {
        "1": VIOLATING, "2": OK, "3": OK, "4": VIOLATING, "5": UNKNOWN, "6": VIOLATING,
    }  # fmt: skip
    # a larger share of the request: the 62 % job still uses enough at 0.6, not at 0.7
    assert verdicts(wh, {**MEMORY, "request_share": 0.7})["2"] == VIOLATING


def test_excess_memory_waits_without_cgroup_samples_or_with_half_the_nodes(wh):
    host_job(wh, "1", req_mem_bytes=64 * GIB, cgroup_nodes=(), **memory(4))  # no cgroups read
    # two nodes, only one read: 50 % of the expected samples
    host_job(wh, "2", nodes=("n2", "n3"), cgroup_nodes=("n2",), req_mem_bytes=128 * GIB,
             **memory(4))  # fmt: skip
    assert verdicts(wh, MEMORY) == {"1": STALE, "2": INCOMPLETE}


def test_excess_cores_per_gpu_fires_on_idle_cores_beyond_the_site_limit(wh):
    host_job(wh, "1", alloc_cpus=32, busy=2.0)  # 16 per GPU, 6 % busy
    host_job(wh, "2", alloc_cpus=32, busy=24.0)  # 75 % busy
    host_job(wh, "3", alloc_cpus=16, busy=1.0)  # 8 per GPU: within the limit
    host_job(wh, "4", cpuset_cpus=32, busy=2.0)  # no AllocCPUS: the cpuset's 32
    host_job(wh, "5", busy=2.0)  # neither: unknown
    host_job(wh, "6", alloc_cpus=32, cgroup_nodes=(), busy=2.0)  # no cgroups read: stale
    host_job(wh, "7", gpus=0, alloc_cpus=32, busy=1.0)  # no GPU: not this rule's
    assert verdicts(wh, CORES) == {
        "1": VIOLATING, "2": OK, "3": OK, "4": VIOLATING, "5": UNKNOWN, "6": STALE,
    }  # fmt: skip
    assert verdicts(wh, {**CORES, "max_cores_per_gpu": 16})["1"] == OK


def test_excess_cores_sliding_window_vs_since_start(wh):
    # 24 of 32 cores busy for four hours, then 1 for the last hour
    host_job(wh, "1", alloc_cpus=32, busy=[(START, 24.0), (NOW - timedelta(hours=1), 1.0)])
    assert verdicts(wh, CORES) == {"1": VIOLATING}  # 1 of 32 over the last hour
    # since the start: (24 x 4 h + 1 x 1 h) / 5 h = 19.4 of 32 cores, 61 %
    assert verdicts(wh, {**CORES, "window": "since_start"}) == {"1": OK}


def test_the_evidence_holds_the_known_figures(wh):
    host_job(wh, "1", alloc_cpus=32, busy=2.0, req_mem_bytes=64 * GIB, **memory(6))
    (rule,) = load_rules(settings({"r": MEMORY}))
    policy = engine(wh, settings({"r": MEMORY}), _executor(wh), RecordingPostman())
    (d,) = policy.decide(NOW)  # what `sing policy check` shows
    e = d.evidence
    assert (e["host_mem_peak_bytes"], e["host_mem_req_bytes"]) == (6 * GIB, 64 * GIB)
    assert e["suggested_mem_bytes"] == 8 * GIB  # 6 GiB and a quarter: 7.5, up to 8
    assert (e["alloc_cores"], e["mean_cores_used"]) == (32, pytest.approx(2.0))
    assert e["cpu_efficiency"] == pytest.approx(2 / 32)
    assert e["coverage"] == 1.0 and rule.kind == "excess_memory"


def _executor(wh: Warehouse) -> LocalExecutor:
    return LocalExecutor("campus", wh.root.parent / "state", gpus=[0, 1], node="n1")


def test_a_dry_run_records_the_verdict_and_message_and_sends_nothing(wh):
    host_job(wh, "1", req_mem_bytes=64 * GIB, **memory(4))
    postman = RecordingPostman()
    dry = settings({"mem": {**MEMORY, "actions": ["notify"]}})  # dry run: the default
    policy = engine(wh, dry, _executor(wh), postman)
    (decision,) = policy.run(NOW).decisions
    assert (decision.verdict, decision.action, decision.dry_run) == (VIOLATING, "notify", True)
    assert postman.sent == []
    con = wh.connect()
    trail = events(con).reverse().to_dicts()
    con.close()
    assert [(r["event"], r["outcome"], r["dry_run"]) for r in trail] == [
        ("evaluation", "violating", True),
        ("message", "notify", True),
    ]
    assert '"host_mem_peak_bytes": 4294967296' in trail[0]["detail"]


def test_the_notice_says_peak_vs_requested_and_what_to_ask_for(wh):
    host_job(wh, "1", req_mem_bytes=64 * GIB, **memory(4))
    postman = RecordingPostman()
    real = settings({"mem": {**MEMORY, "dry_run": False}}, dry_run=False)
    engine(wh, real, _executor(wh), postman).run(NOW)
    (message,) = postman.sent
    rendered = Templates(None, ZoneInfo("UTC")).render(message)
    assert rendered.subject == "[sing] Job 1 on campus is wasting memory"
    assert "Peak host memory      4.0 GiB of 64.0 GiB requested" in rendered.text
    assert "about 8.0 GiB per node (--mem=8G)" in rendered.text
    assert "peak host memory stays under 25% of the memory it requested" in rendered.text
    assert "<td>4.0 GiB of 64.0 GiB requested</td>" in rendered.html


def test_the_new_keys_are_checked():
    rules = load_rules(settings({"c": {**CORES, "max_cores_per_gpu": 4, "request_share": 0.1}}))
    assert (rules[0].max_cores_per_gpu, rules[0].request_share) == (4, 0.1)
    with pytest.raises(ConfigError, match="max_cores_per_gpu"):
        load_rules(settings({"c": {**CORES, "max_cores_per_gpu": -1}}))
    with pytest.raises(ConfigError, match="min_request_gib"):
        load_rules(settings({"m": {**MEMORY, "min_request_gib": "lots"}}))
    assert NOW.tzinfo is UTC


def test_check_says_why_in_words(wh):
    host_job(wh, "1", req_mem_bytes=64 * GIB, cgroup_nodes=(), **memory(4))  # no cgroups read
    host_job(wh, "2", req_mem_bytes=64 * GIB, alloc_cpus=32, busy=2.0, **memory(4))
    host_job(wh, "3", **memory(8))  # no request known
    rules = {"mem": MEMORY, "cores": CORES}
    decisions = engine(wh, settings(rules), _executor(wh), RecordingPostman()).decide(NOW)
    said = {(d.rule.name, d.job["job_id"]): verdict_reason(d) for d in decisions}
    assert said[("mem", "1")].startswith("no cgroup sample of the job in the rule's window")
    assert said[("mem", "2")] == (
        "peak host memory 4.0 GiB of 64.0 GiB requested; about 8 GiB per node would do"
    )
    assert said[("mem", "3")].startswith("requested or peak memory unknown")
    assert said[("cores", "2")] == "2.0 of 32 CPU cores in use (6%) for 2 GPU(s)"
