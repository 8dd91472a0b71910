"""`sing report workload` on a warehouse and a release whose figures are worked out by hand below.

The warehouse's jobs are written here with `Warehouse.append`, as the collector writes them; the
release is written by `sing trace import --format helios` from a hand-written cluster log, and
another by `sing trace export` (a secret time origin). Quantiles are nearest-rank: of n sorted
values, the q-quantile is the ceil(q n)-th.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.warehouse.store import Warehouse
from tests.test_analytics import run_sing
from tests.test_cli_reports import table

MON = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday: the window is its week
H = timedelta(hours=1)
NOW = MON + 2 * 24 * H + 12 * H  # Wednesday 12:00, job D still running


def job(
    job_id: str,
    submit: datetime,
    start: datetime | None,
    end: datetime | None,
    gpus: int,
    nodes: int,
    state: str = "COMPLETED",
    cluster: str = "campus",
) -> dict:
    return {"job_id": job_id, "cluster": cluster, "user": "alice", "account": "physics",
            "partition": "gpu", "state": state, "submit_time": submit, "start_time": start,
            "end_time": end, "num_gpus": gpus, "num_nodes": nodes}  # fmt: skip


# job: submit, start, end (Monday-relative hours), GPUs, nodes. Worked out:
#   run time (finished GPU jobs A, B, C): 2 h, 1 h, 2 h -> sorted 3600, 7200, 7200 s
#   queue (started GPU jobs A, B, C, D): 30, 0, 30, 60 min -> 0, 1800, 1800, 3600 s
#   GPUs (A, B, C, D): 2, 8, 1, 4 -> 1, 2, 4, 8; nodes 1, 2, 1, 1 -> 1, 1, 1, 2
#   offered GPU-h by submit hour: A 2x2 + B 8x1 at Mon 10:00, C 1x2 at Tue 23:00, D 4x2 (held
#     until now) at Wed 09:00: 22 in all
#   running GPU-h: G 1 (Mon 00-01, clipped), A 1+2+1 (Mon 10, 11, 12), B 8 (Mon 10), C 0.5
#     (Tue 23) + 1 + 0.5 (Wed 00, 01), D 4+4 (Wed 10, 11): 23 in all
JOBS = [
    job("A", MON + 10 * H, MON + 10.5 * H, MON + 12.5 * H, 2, 1),
    job("B", MON + 10 * H, MON + 10 * H, MON + 11 * H, 8, 2),
    job("C", MON + 47 * H, MON + 47.5 * H, MON + 49.5 * H, 1, 1, "FAILED"),
    job("D", MON + 57 * H, MON + 58 * H, None, 4, 1, "RUNNING"),
    job("E", MON + 9 * H, MON + 9 * H, MON + 10 * H, 0, 1),  # CPU-only
    job("F", MON + 80 * H, None, None, 1, 0, "PENDING"),  # never started
    job("G", MON - 2 * H, MON - H, MON + H, 1, 1),  # submitted before the window
    job("X", MON + 7 * 24 * H, MON + 7 * 24 * H, MON + 7 * 24 * H + H, 1, 1),  # after it
    job("A", MON + 36 * H, MON + 36 * H, MON + 37 * H, 0, 1, cluster="lab"),  # another cluster
]

# A Helios cluster log in China Standard Time (UTC+8); in UTC: t1 and t2 submitted Mon 10:00,
# t1 runs 10-12 on 4 GPUs, t2 11:00-11:30 on 16 GPUs over 2 nodes, t3 Tue 01-05 on 1 GPU.
#   run 1800, 7200, 14400 s; queue 0, 3600, 0 s; GPUs 4, 16, 1; nodes 1, 2, 1
#   offered: Mon 10:00 4x2 + 16x0.5 = 16, Tue 01:00 1x4 = 4 (20)
#   running: 10:00 4, 11:00 4 + 8, Tue 01-04 1 each (20)
HELIOS_LOG = """\
job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time
t1,u1,vc1,4,8,1,COMPLETED,2020-04-06 18:00:00,2020-04-06 18:00:00,2020-04-06 20:00:00
t2,u2,vc1,16,32,2,COMPLETED,2020-04-06 18:00:00,2020-04-06 19:00:00,2020-04-06 19:30:00
t3,u1,vc2,1,4,1,FAILED,2020-04-07 09:00:00,2020-04-07 09:00:00,2020-04-07 13:00:00
t4,u3,vc2,0,4,1,COMPLETED,2020-04-07 10:00:00,2020-04-07 10:00:00,2020-04-07 11:00:00
t5,u3,vc2,2,4,1,CANCELLED,2020-04-08 08:00:00,,
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(warehouse root, release directory)."""
    root = tmp_path_factory.mktemp("workload")
    wh = Warehouse(root / "warehouse")
    wh.append("jobs", pa.Table.from_pylist(JOBS))
    log = root / "cluster_log.csv"
    log.write_text(HELIOS_LOG)
    release = root / "helios-mini"
    out = run_sing("trace", "import", "--format", "helios", str(log), "--out", str(release))
    assert out.returncode == 0, out.stderr
    return wh.root, release


def workload(root: Path, *args: str) -> dict:
    out = run_sing("--warehouse", str(root), "report", "workload", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def window() -> list[str]:
    return ["--since", MON.isoformat(), "--until", (MON + 7 * 24 * H).isoformat(),
            "--now", NOW.isoformat(), "--cluster", "campus"]  # fmt: skip


def stats(source: dict) -> dict[str, dict]:
    return {row["metric"]: row for row in source["stats"]}


def at(source: dict, metric: str) -> dict[float, float]:
    return {r["point"]: r["share"] for r in source["at_points"] if r["metric"] == metric}


def load(source: dict, scale: str, kind: str) -> dict[int, float]:
    """Non-empty slots of a load scale: slot -> GPU-hours."""
    rows = [r for r in source["load"] if r["scale"] == scale]
    assert len(rows) == {"hour": 24, "weekday": 7}[scale]
    return {r["slot"]: r[f"{kind}_gpu_hours"] for r in rows if r[f"{kind}_gpu_hours"]}


def test_the_clusters_distributions_match_the_hand_worked_figures(site) -> None:
    root, _ = site
    cluster = workload(root, *window())["rows"][0]
    assert cluster["name"] == "campus"
    assert cluster["counts"] == {"jobs": 6, "gpu_jobs": 5, "cpu_only": 1, "never_started": 1}
    s = stats(cluster)
    run, queue, gpus, nodes = s["run_s"], s["queue_s"], s["gpus"], s["nodes"]
    assert (run["jobs"], run["mean"]) == (3, 6000)
    assert [run[p] for p in ("p10", "p25", "p50", "p75", "p90", "p99")] == [3600, 3600] + [7200] * 4
    assert (queue["jobs"], queue["mean"]) == (4, 1800)
    assert [queue[p] for p in ("p10", "p25", "p50", "p75", "p90")] == [0, 0, 1800, 1800, 3600]
    assert (gpus["mean"], gpus["p50"], gpus["p75"], gpus["p90"]) == (3.75, 2, 4, 8)
    assert (nodes["mean"], nodes["p50"], nodes["p75"], nodes["p90"]) == (1.25, 1, 1, 2)
    assert at(cluster, "run_s")[3600] == pytest.approx(1 / 3)
    assert at(cluster, "run_s")[600] == 0 and at(cluster, "run_s")[36_000] == 1
    assert at(cluster, "queue_s")[0] == 0.25 and at(cluster, "queue_s")[3600] == 1
    assert [at(cluster, "gpus")[g] for g in (1, 2, 4, 8)] == [0.25, 0.5, 0.75, 1]
    curve = [r for r in cluster["curve"] if r["metric"] == "gpus"]
    assert len(curve) == 101 and curve[0]["value"] == 1 and curve[-1]["value"] == 8
    assert next(r["value"] for r in curve if r["share"] == 0.5) == 2


def test_the_clusters_load_by_hour_and_weekday(site) -> None:
    root, _ = site
    cluster = workload(root, *window())["rows"][0]
    assert load(cluster, "hour", "offered") == {9: 8, 10: 12, 23: 2}
    assert load(cluster, "weekday", "offered") == {1: 12, 2: 2, 3: 8}
    assert load(cluster, "hour", "running") == {0: 2, 1: 0.5, 10: 13, 11: 6, 12: 1, 23: 0.5}
    assert load(cluster, "weekday", "running") == {1: 13, 2: 0.5, 3: 9.5}
    shares = {r["slot"]: r["running_share"] for r in cluster["load"] if r["scale"] == "hour"}
    assert shares[10] == pytest.approx(13 / 23) and sum(shares.values()) == pytest.approx(1)


def test_an_imported_release_beside_the_cluster(site) -> None:
    root, release = site
    report = workload(root, *window(), "--trace", str(release))
    names = [s["name"] for s in report["rows"]]
    assert names == ["campus", "helios-mini"]
    trace = report["rows"][1]
    assert trace["counts"] == {"jobs": 5, "gpu_jobs": 4, "cpu_only": 1, "never_started": 1}
    s = stats(trace)
    assert (s["run_s"]["jobs"], s["run_s"]["mean"]) == (3, 7800)
    assert (s["run_s"]["p10"], s["run_s"]["p50"], s["run_s"]["p90"]) == (1800, 7200, 14400)
    assert (s["queue_s"]["mean"], s["queue_s"]["p50"], s["queue_s"]["p75"]) == (1200, 0, 3600)
    assert (s["gpus"]["mean"], s["gpus"]["p50"], s["gpus"]["p99"]) == (7, 4, 16)
    assert (s["nodes"]["p50"], s["nodes"]["p90"]) == (1, 2)
    assert at(trace, "queue_s")[0] == pytest.approx(2 / 3)
    assert load(trace, "hour", "offered") == {1: 4, 10: 16}
    assert load(trace, "weekday", "offered") == {1: 16, 2: 4}
    assert load(trace, "hour", "running") == {1: 1, 2: 1, 3: 1, 4: 1, 10: 4, 11: 12}
    assert load(trace, "weekday", "running") == {1: 16, 2: 4}


def test_one_cluster_or_all(site) -> None:
    root, _ = site
    lab = workload(root, *window()[:-1], "lab")["rows"][0]
    assert lab["name"] == "lab"
    assert lab["counts"] == {"jobs": 1, "gpu_jobs": 0, "cpu_only": 1, "never_started": 0}
    assert stats(lab)["run_s"]["jobs"] == 0 and stats(lab)["run_s"]["p50"] is None
    every = workload(root, *window()[:-2])["rows"][0]
    assert every["counts"] == {"jobs": 7, "gpu_jobs": 5, "cpu_only": 2, "never_started": 1}


def test_the_tables_for_people(site) -> None:
    root, release = site
    out = run_sing("--warehouse", str(root), "report", "workload", *window(), "--trace",
                   str(release))  # fmt: skip
    assert out.returncode == 0, out.stderr
    blocks = {b.split("\n", 1)[0]: b.split("\n", 1)[1] for b in out.stdout.split("\n\n")[1:]}
    run = {r["source"]: r for r in table(blocks["run time (GPU jobs that finished)"])}
    assert (run["campus"]["p50 h"], run["helios-mini"]["p50 h"]) == ("2.00", "2.00")
    assert (run["campus"]["mean h"], run["helios-mini"]["<=1 h %"]) == ("1.67", "33.3")
    queue = {r["source"]: r for r in table(blocks["queue time (GPU jobs that started)"])}
    assert (queue["campus"]["p90 min"], queue["helios-mini"]["<=0 min %"]) == ("60.0", "66.7")
    nodes = {r["source"]: r for r in table(blocks["nodes per job (GPU jobs that started)"])}
    assert (nodes["campus"]["p90 nodes"], nodes["campus"]["mean nodes"]) == ("2", "1.25")
    by_hour = next(v for k, v in blocks.items() if k.startswith("GPU-hours by hour"))
    hours = {r["hour (UTC)"]: r for r in table(by_hour)}
    assert hours["11:00"]["helios-mini running %"] == "60.0"
    assert hours["10:00"]["campus offered %"] == "54.5"  # 12 of 22


def test_a_release_from_a_secret_time_origin_has_no_hour_or_weekday(site, tmp_path: Path) -> None:
    root, _ = site
    release = tmp_path / "exported"
    config = tmp_path / "k1.toml"  # every job kept: a release that keeps none is refused
    config.write_text("[trace]\nk = 1\n")
    out = run_sing("--config", str(config), "--warehouse", str(root), "trace", "export",
                   "--since", MON.isoformat(), "--until", (MON + 7 * 24 * H).isoformat(),
                   "--out", str(release))  # fmt: skip
    assert out.returncode == 0, out.stderr
    trace = workload(root, "--no-cluster", "--trace", str(release))["rows"][0]
    assert trace["load"] is None and "secret origin" in trace["note"]
    assert trace["counts"]["jobs"] == pq.read_metadata(release / "jobs.parquet").num_rows


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--period", "2026-03", "--since", "2026-03-01"], "either --period or --since"),
        (["--no-cluster"], "--no-cluster needs at least one --trace"),
        (["--trace", "/nonexistent-release"], "not a trace directory"),
    ],
)
def test_bad_requests_are_named(site, args: list[str], message: str) -> None:
    root, _ = site
    out = run_sing("--warehouse", str(root), "report", "workload", *args)
    assert out.returncode == 1 and message in out.stderr, out.stderr


def test_a_missing_warehouse_is_named(tmp_path: Path) -> None:
    out = run_sing("--warehouse", str(tmp_path / "none"), "report", "workload")
    assert out.returncode == 1 and "--no-cluster" in out.stderr, out.stderr


def test_a_damaged_release_is_named(site, tmp_path: Path) -> None:
    root, release = site
    damaged = tmp_path / "damaged"
    shutil.copytree(release, damaged)
    package = json.loads((damaged / "datapackage.json").read_text())
    (damaged / "datapackage.json").write_text(json.dumps({**package, "release_start": "soon"}))
    out = run_sing("--warehouse", str(root), "report", "workload", "--trace", str(damaged))
    assert out.returncode == 1, out.stderr
    assert (
        "release_start 'soon' is not an ISO 8601 time" in out.stderr and str(damaged) in out.stderr
    )
    (damaged / "jobs.parquet").unlink()
    out = run_sing("--warehouse", str(root), "report", "workload", "--trace", str(damaged))
    assert out.returncode == 1 and "no jobs.parquet" in out.stderr, out.stderr
