"""Each job's CPU, host memory and I/O from its cgroups: the collector's reading of the series
(sing's exporter, Princeton's cgroup_exporter fork, treydock/cgroup_exporter), the deltas and
their resets, the per-job figures, and end to end from a fake node through real processes to
`sing job --json` with known answers."""

from __future__ import annotations

import json
import math
import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from sing.collector.convert import WANTED, read_node
from sing.collector.counters import CounterDeltas
from sing.collector.promtext import parse
from sing.collector.rows import RoundRows
from sing.warehouse import analytics
from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.ports import free_port
from tests.test_analytics import GIB, add_host_samples, add_job, at
from tests.test_collector_scrape import REPO, http_get, running, sing, wait_for

GOLDEN = Path(__file__).parent / "fixtures" / "exporter" / "golden.prom"


# ---- the series, from each exporter ------------------------------------------------------------


def host_of(page: str) -> dict:
    return read_node(parse(page, WANTED)).host


def test_sings_own_page_gives_each_jobs_columns() -> None:
    """The golden page's cgroups (tests/test_exporter_cgroups.py checks them against files)."""
    host = host_of(GOLDEN.read_text())
    assert host == {
        "2002": {
            "cpu_s": 7388.123456,
            "cpuset_cpus": 8,
            "mem_used_bytes": 6442450944,
            "mem_peak_bytes": 8589934592,
            "mem_limit_bytes": 274877906944,
            "io_read_bytes": 3145728,
            "io_write_bytes": 4096,
        },
        "6006": {"cpu_s": 3.0, "cpuset_cpus": 2},
        "5005": {"cpu_s": 1.5, "mem_used_bytes": 1048576, "sluid": "s4T9M8MZXRX000"},
    }  # fmt: skip  (the run no mapping names has no jobid: left out)


def test_princetons_cgroup_exporter_fork_job_series_only() -> None:
    """jobstats' exporter labels jobid, step and task; the job's own series have neither."""
    page = "\n".join([
        'cgroup_cpu_total_seconds{jobid="77",step="",task=""} 120.5',
        'cgroup_cpu_total_seconds{jobid="77",step="0",task=""} 100.0',
        'cgroup_cpu_total_seconds{jobid="77",step="0",task="3"} 20.0',
        'cgroup_cpus{jobid="77",step="",task=""} 4',
        'cgroup_memory_rss_bytes{jobid="77",step="",task=""} 1e9',
        'cgroup_memory_total_bytes{jobid="77",step="",task=""} 8.589934592e+09',
    ]) + "\n"  # fmt: skip
    assert host_of(page) == {
        "77": {"cpu_s": 120.5, "cpuset_cpus": 4, "mem_limit_bytes": 8589934592}
    }


def test_treydocks_cgroup_exporter_by_cgroup_path_and_cgroup_info() -> None:
    """Series by cgroup path, the job in cgroup_info; a user's slice is no job; its 0 for no
    cpuset and 2^64-1 for no limit are unknown; user + system where there is no total."""
    job = "/system.slice/slurmstepd.scope/job_12"
    page = "\n".join([
        f'cgroup_cpu_user_seconds{{cgroup="{job}"}} 10.25',
        f'cgroup_cpu_system_seconds{{cgroup="{job}"}} 0.75',
        f'cgroup_cpus{{cgroup="{job}"}} 0',
        f'cgroup_info{{cgroup="{job}",jobid="12",uid="1000",username="alice"}} 1',
        f'cgroup_memory_used_bytes{{cgroup="{job}"}} 315392',
        f'cgroup_memory_total_bytes{{cgroup="{job}"}} 1.8446744073709552e+19',
        'cgroup_memory_used_bytes{cgroup="/user.slice/user-1000.slice"} 6.9e+06',
        'cgroup_info{cgroup="/user.slice/user-1000.slice",jobid="",uid="1000",username="a"} 1',
    ]) + "\n"  # fmt: skip
    assert host_of(page) == {"12": {"cpu_s": 11.0, "mem_used_bytes": 315392}}


def test_deltas_count_a_requeued_runs_cgroup_from_zero_and_forget_ended_jobs() -> None:
    deltas = CounterDeltas()
    rounds = [{"7": 100.0, "8": 5.0}, {"7": 400.0, "8": 6.0}, {"7": 50.0}, {"7": 350.0}]
    written = []
    for k, cpu in enumerate(rounds):
        rows = RoundRows(deltas)
        reading = read_node([])
        reading.host = {job: {"cpu_s": value} for job, value in cpu.items()}
        rows.add_node(at(k), "c", "n1", reading)
        table = rows.tables()["job_host_samples"]
        written += zip(table["job_id"].to_pylist(), table["cpu_delta_s"].to_pylist(), strict=True)
    assert written == [
        ("7", None), ("8", None), ("7", 300.0), ("8", 1.0), ("7", 50.0), ("7", 300.0),
    ]  # fmt: skip
    assert len(deltas) == 1  # job 8 left the node: its counter is forgotten


# ---- per-job figures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """Job H: two nodes, 2 h; h-0 runs 6 of 8 cores, h-1 2 of 8; 8 and 2 GiB peaks of 32 GiB
    limits. Job P: two nodes but only p-0's cgroup was read."""
    wh = Warehouse(tmp_path_factory.mktemp("host") / "wh")
    add_job(wh, "H", ["h-0", "h-1"], 4, at(0), at(2))
    add_host_samples(wh, "H", "h-0", at(0), at(2), 6.0, cpus=8, mem_peak=8 * GIB,
                     mem_limit=32 * GIB, io_per_sample=10**6)  # fmt: skip
    add_host_samples(wh, "H", "h-1", at(0), at(2), 2.0, cpus=8, mem_peak=2 * GIB,
                     mem_limit=32 * GIB, io_per_sample=10**6)  # fmt: skip
    add_job(wh, "P", ["p-0", "p-1"], 4, at(0), at(2))
    add_host_samples(wh, "P", "p-0", at(0), at(2), 6.0, cpus=8, mem_peak=GIB, mem_limit=32 * GIB)
    return wh


def host_figures(wh: Warehouse, sql: str = analytics.JOB_HOST_SQL) -> dict:
    con = wh.connect()
    rows = con.sql(sql, params={"now": at(24)}).pl().to_dicts()
    return {row["job_id"]: row for row in rows}


def test_job_figures_sum_the_nodes_and_weigh_the_allocation(wh: Warehouse) -> None:
    h = host_figures(wh)["H"]
    assert h["cpu_core_s"] == pytest.approx(8 * 7200)  # 6 + 2 cores for 2 h
    assert (h["alloc_cores"], h["mean_cores_used"]) == (16, pytest.approx(8.0))
    assert h["cpu_efficiency"] == pytest.approx(0.5)
    assert (h["host_mem_peak_bytes"], h["node_mem_peak_bytes"]) == (10 * GIB, 8 * GIB)
    assert (h["host_mem_req_bytes"], h["node_mem_req_bytes"]) == (64 * GIB, 32 * GIB)
    assert h["suggested_mem_bytes"] == 16 * GIB  # 8 GiB and a quarter: up to 16
    assert h["io_read_bytes"] == h["io_write_bytes"] == 2 * 8 * 10**6


def test_a_node_without_readings_makes_the_job_sums_unknown(wh: Warehouse) -> None:
    p = host_figures(wh)["P"]
    assert p["cpu_core_s"] is None and p["cpu_efficiency"] is None
    assert p["host_mem_peak_bytes"] is None and p["node_mem_peak_bytes"] == GIB


def test_a_reset_and_a_gap_in_the_deltas(tmp_path: Path) -> None:
    """A requeued run's new cgroup counts from zero (first value plus deltas); a gap with no
    deltas falls back to the counter's highest value rather than losing the gap's seconds."""
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "R", ["r-0"], 1, at(0), at(1))
    rows = [(0, 100.0, None), (1, 400.0, 300.0), (2, 50.0, 50.0), (3, 350.0, 300.0)]
    add_job(wh, "G", ["g-0"], 1, at(0), at(1))
    gap = [(0, 100.0, None), (1, 200.0, 100.0), (2, 900.0, None), (3, 1000.0, 100.0)]
    wh.append("job_host_samples", pl.DataFrame([
        {"ts": at(k / 4), "cluster": "test", "node": f"{job.lower()}-0", "job_id": job,
         "cpu_s": cpu, "cpu_delta_s": delta}
        for job, samples in (("R", rows), ("G", gap)) for k, cpu, delta in samples
    ]))  # fmt: skip
    figures = host_figures(wh)
    assert figures["R"]["cpu_core_s"] == 750.0  # 100 + 300 + 50 + 300
    assert figures["G"]["cpu_core_s"] == 1000.0  # not 100 + 100 + 100


def test_figures_are_the_same_live_after_compaction_and_after_retention(tmp_path: Path) -> None:
    """The per-day rollup stored when a day closes, and kept once retention removed the raw
    samples, gives the figures the live aggregation gave (a job across midnight)."""
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "M", ["m-0"], 1, at(13), at(15))  # 23:00 to 01:00 UTC
    add_host_samples(wh, "M", "m-0", at(13), at(15), 3.0, cpus=4, mem_peak=GIB, io_per_sample=7)
    live = host_figures(wh)["M"]
    assert live["cpu_core_s"] == pytest.approx(3 * 7200)
    wh.compact(settle_s=0)
    assert host_figures(wh)["M"] == live
    assert wh.apply_retention(raw_days=1, now=at(24 * 30))  # both days' raw files go
    assert wh.connect().execute("SELECT count(*) FROM job_host_samples").fetchone() == (0,)
    assert host_figures(wh)["M"] == live


def test_the_job_records_cores_and_memory_win_over_the_cgroups(wh: Warehouse) -> None:
    """With `jobs.alloc_cpus` and `jobs.req_mem_bytes` (the executors' sacct fields) the
    figures weigh what Slurm allocated, not the cpusets' and limits' sums."""
    con = wh.connect()
    con.execute("CREATE TABLE recorded AS SELECT * FROM jobs")
    con.execute("DROP VIEW jobs")
    con.execute(
        f"CREATE VIEW jobs AS SELECT * REPLACE (32 AS alloc_cpus, {128 * GIB} AS req_mem_bytes) "
        "FROM recorded"
    )
    sql = analytics.job_host_sql({*analytics.JOBS_COLUMNS, "alloc_cpus", "req_mem_bytes"})
    h = next(r for r in con.sql(sql, params={"now": at(24)}).pl().to_dicts() if r["job_id"] == "H")
    assert (h["alloc_cores"], h["cpu_efficiency"]) == (32, pytest.approx(0.25))
    assert (h["host_mem_req_bytes"], h["node_mem_req_bytes"]) == (128 * GIB, 64 * GIB)


def test_the_job_page_shows_the_same_figures_and_notes(
    wh: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard's Job page (and My jobs' detail, the same section) reads `sing job`'s
    report: job H's CPU efficiency, cores in use and peak host memory."""
    config = wh.root.parent / "sing.toml"
    config.write_text('[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n')
    monkeypatch.setenv("SING_WAREHOUSE", str(wh.root))
    monkeypatch.setenv("SING_CONFIG", str(config))
    shown = metrics(open_app("alice", "job", query={"job": "H"}))
    assert shown["CPU efficiency"] == "50%"
    assert shown["CPU cores in use"] == "8.0 of 16"
    assert shown["Peak host memory"] == "10.0 GiB"
    assert shown["Disk read / written"] == "16.0 MB / 16.0 MB"


def test_my_jobs_lists_each_jobs_cpu_efficiency_and_host_memory(
    wh: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The My jobs table gives each job `sing job`'s CPU efficiency and peak host memory
    against its request, as jobstats' job list does; unknown (P: one node's cgroups only)
    stays empty."""
    config = wh.root.parent / "sing.toml"
    config.write_text('[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n')
    monkeypatch.setenv("SING_WAREHOUSE", str(wh.root))
    monkeypatch.setenv("SING_CONFIG", str(config))
    table = open_app("alice", "my_jobs").dataframe[0].value
    rows = {
        job.removeprefix("job?job="): (cpu, mem)
        for job, cpu, mem in zip(
            table["job"], table["cpu_efficiency"], table["host_mem_ratio"], strict=True
        )
    }
    assert rows["H"] == (pytest.approx(0.5), pytest.approx(10 / 64))  # 10 of 64 GiB
    assert all(value is None or math.isnan(value) for value in rows["P"])  # empty cells


# ---- end to end ----------------------------------------------------------------------------

# One GPU running job 101, whose cgroup (v2, 26.05's SLUID layout) has 4 cores and a 32 GiB
# limit; the test scripts its CPU counter scrape by scrape through the state file.
NODE_YAML = """\
model: NVIDIA H200
count: 1
defaults: {util: 0.5, memory_used: 1.0e+11, power_w: 300, energy_j: 0}
gpus:
  0: {job_id: "101", user: alice}
cgroup:
  layout: v2_sluid
  jobs:
    "101": {cpus: 4, memory_used: 4.0e+9, memory_peak: 6442450944, memory_limit: 34359738368}
"""


def test_fake_node_to_sing_job_gives_the_known_cpu_efficiency_and_peak_memory(
    tmp_path: Path,
) -> None:
    """The CPU counter reads 100 s, 400 s, then 50 s (the job requeued: a new cgroup) and
    350 s at four `sing collector --once` rounds: 750 CPU seconds in all. Over a 750 s run on
    4 cores that is a CPU efficiency of 25 %; the peak is 6 GiB of 32 GiB."""
    (tmp_path / "node.yaml").write_text(NODE_YAML)
    state = tmp_path / "state.json"
    port = free_port()
    argv = sing(
        "exporter", "--fake", str(tmp_path / "node.yaml"), "--fake-state", str(state),
        "--cache-seconds=0.05", "--web.listen-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    wh = tmp_path / "wh"
    collect = sing("--warehouse", str(wh), "collector", "--once", "--target", f"127.0.0.1:{port}")
    with running(argv, tmp_path / "exporter.log"):
        for k, cpu_s in enumerate((100, 400, 50, 350)):
            state.write_text(json.dumps({"cgroup": {"jobs": {"101": {"cpu_user_s": cpu_s}}}}))
            os.utime(state, ns=(0, (k + 1) * 10**18))  # read again: its mtime changed
            wait_for(
                lambda cpu_s=cpu_s: (
                    f'jobid="101",sluid="s0000000000101"}} {cpu_s}.0\n'
                    in http_get(f"http://127.0.0.1:{port}/metrics")
                ),
                what=f"the exporter to read {cpu_s} CPU seconds",
            )
            collected = subprocess.run(collect, capture_output=True, text=True, timeout=120,
                                       cwd=REPO)  # fmt: skip
            assert collected.returncode == 0, collected.stderr
    con = Warehouse(wh).connect()
    samples = con.execute(
        "SELECT cpu_s, cpu_delta_s, sluid, cluster, node, ts FROM job_host_samples ORDER BY ts"
    ).fetchall()
    assert [(s[0], s[1], s[2]) for s in samples] == [
        (100.0, None, "s0000000000101"),
        (400.0, 300.0, "s0000000000101"),
        (50.0, 50.0, "s0000000000101"),
        (350.0, 300.0, "s0000000000101"),
    ]  # fmt: skip  (each --once process took the counter from the warehouse: no delta lost)
    _, _, _, cluster, node, first = samples[0]
    start: datetime = first - timedelta(seconds=1)
    job = {
        "job_id": "101", "cluster": cluster, "user": "alice", "account": "physics",
        "partition": "gpu", "state": "COMPLETED", "submit_time": start, "start_time": start,
        "end_time": start + timedelta(seconds=750), "num_nodes": 1, "num_gpus": 1,
        "nodes": [node],
    }  # fmt: skip
    Warehouse(wh).append("jobs", pl.DataFrame([job]))

    shown = subprocess.run(
        sing("--warehouse", str(wh), "job", "101", "--json"),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)["rows"][0]
    assert report["cpu_core_s"] == pytest.approx(750.0)
    assert report["alloc_cores"] == 4
    assert report["cpu_efficiency"] == pytest.approx(0.25)
    assert report["host_mem_peak_bytes"] == 6 * GIB
    assert report["host_mem_req_bytes"] == 32 * GIB
    assert report["suggested_mem_bytes"] == 8 * GIB
    screen = subprocess.run(
        sing("--warehouse", str(wh), "job", "101"),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    ).stdout  # fmt: skip
    assert "CPU efficiency   [#####...............]  25% (1.0 of 4 cores in use)\n" in screen
    assert "Peak host memory 6.0 GiB of 32.0 GiB requested\n" in screen
    gpu_coverage, *notes = report["notes"]  # 4 GPU samples in a 750 s run: a partial picture
    assert gpu_coverage.startswith("These figures rest on part of the job's data")
    assert notes == [
        "This job used about 1.0 of its 4 CPU cores (CPU efficiency 25%). Ask for fewer cores "
        "next time (e.g. --cpus-per-task), or check that your code uses them (threads, "
        "data-loader workers).",
        "Peak host memory was 6.0 GiB per node of the 32 GiB requested: ask for about 8 GiB next "
        "time (--mem=8G), which leaves a quarter to spare.",
    ]
