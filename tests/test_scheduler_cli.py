"""`sing simulate` end to end: trace files (simple CSV, the real Philly file), output, warehouse."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sing.cli import main
from sing.scheduler.workload import read_trace
from tests.shared_data import PHILLY, require

TRACE = (
    "job_id,user,submit_time,duration_s,num_gpus\n"
    "a,u1,0,10,2\nb,u2,1,10,4\nc,u1,2,3,1\nd,u2,3,20,2\n"
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_simulate_json_starts_and_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, starts, wh = write(tmp_path, TRACE), tmp_path / "starts.csv", tmp_path / "wh"
    argv = ["--warehouse", str(wh), "simulate", "--trace", str(trace), "--nodes", "1",
            "--gpus-per-node", "4", "--policy", "fcfs,sjf", "--json", "--starts-out", str(starts),
            "--store"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["policy"] for r in rows] == ["fcfs", "sjf"]
    # fcfs waits: 0, 9, 18, 17 (see test_scheduler_policies); sjf: 0, 24, 0, 2.
    assert rows[0]["mean_wait_s"] == pytest.approx(11.0)
    assert rows[1]["mean_wait_s"] == pytest.approx(6.5)
    assert rows[0]["max_wait_s"] == 18.0
    with starts.open() as f:
        got = {
            (r["policy"], r["job_id"]): (float(r["start_time"]), r["placement"])
            for r in csv.DictReader(f)
        }
    assert got["fcfs", "b"] == (10.0, "node0:0,1,2,3")
    assert got["sjf", "c"] == (2.0, "node0:2")
    from sing.warehouse.store import Warehouse

    stored = (
        Warehouse(wh)
        .connect()
        .sql("select policy, jobs, mean_wait_s from sim_runs order by policy")
    )
    assert stored.fetchall() == [("fcfs", 4, 11.0), ("sjf", 4, 6.5)]


def test_simulate_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path, TRACE)
    assert main(["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:6] == ["policy", "jobs", "offered", "%", "assigned", "%"]
    assert [line.split()[0] for line in lines[1:]] == ["fcfs", "sing", "easy", "sjf"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("job_id,user,submit\n", "missing column(s) submit_time, duration_s, num_gpus"),
        (TRACE + "e,u1,4,ten,1\n", "line 6: duration_s 'ten' is not a number"),
        (TRACE + "e,u1,4,10,1.5\n", "line 6: num_gpus '1.5' must be a whole number >= 0"),
        (TRACE + "e,u1,yesterday,10,1\n", "submit_time 'yesterday' is neither seconds nor an ISO"),
        (TRACE + "a,u1,4,10,1\n", "job_id values are not unique"),
    ],
)
def test_bad_traces_name_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    trace = write(tmp_path, text)
    assert main(["simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "4"]) == 1
    err = capsys.readouterr().err
    assert message in err and str(trace) in err


@pytest.mark.parametrize("native", [False, True])
def test_a_long_pure_replay_points_at_the_compiled_build(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    native: bool,
) -> None:
    """Only a pure-Python replay of many jobs says that `make native` would speed it up."""
    from sing import scheduler

    monkeypatch.setattr(scheduler, "NATIVE", native)
    long = tmp_path / "long.csv"
    rows = "".join(f"j{k},u{k % 7},{k},5,1\n" for k in range(10_000))
    long.write_text("job_id,user,submit_time,duration_s,num_gpus\n" + rows)
    for trace in (long, write(tmp_path, TRACE)):
        argv = ["simulate", "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "4"]
        assert main([*argv, "--policy", "fcfs"]) == 0
        hinted = "`make native` compiles it" in capsys.readouterr().err
        assert hinted == (not native and trace == long)


def test_bad_policy_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path, TRACE)
    argv = [
        "simulate",
        "--trace",
        str(trace),
        "--nodes",
        "1",
        "--gpus-per-node",
        "4",
        "--policy",
        "lifo",
    ]
    assert main(argv) == 1
    assert "choose from fcfs, sing, easy, sjf" in capsys.readouterr().err


def test_reads_the_real_philly_file() -> None:
    # Read by the Philly importer: sorted by arrival (the file is not), ids by line, the
    # virtual cluster as the tenant.
    w = read_trace(require(PHILLY))
    assert len(w) == 82_247 and len(set(w.user)) == 15
    assert w.job_id[0] == "philly-031568" and w.user[0] == "7f04ca"
    assert w.submit[0] == 1504521041.0  # 2017-09-04 10:30:41, UTC
    assert (w.duration[0], w.num_gpus[0]) == (2240194.0, 8)
    assert sorted(set(w.num_gpus)) == [1, 2, 4, 8, 12, 16, 24, 32, 64, 128]
    assert w.submit == sorted(w.submit)


def test_philly_week_on_64x8(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(require(PHILLY)), "--nodes", "64", "--gpus-per-node", "8",
            "--since", "2017-10-23", "--until", "2017-10-30", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["fcfs"]["jobs"] == 7748
    # The paper's shape: backfill keeps more GPUs busy while jobs wait and cuts the mean wait;
    # sjf has the lowest mean wait but the worst tail.
    assert rows["sing"]["busy_assignment"] > rows["fcfs"]["busy_assignment"]
    assert rows["sing"]["mean_wait_s"] < rows["fcfs"]["mean_wait_s"] / 5
    assert rows["sjf"]["mean_wait_s"] == min(r["mean_wait_s"] for r in rows.values())
    assert rows["sjf"]["max_wait_s"] == max(r["max_wait_s"] for r in rows.values())
    # The fairness index tells the policies apart (docs/scheduler.md lists the values).
    assert len({round(r["jain_fairness"], 3) for r in rows.values()}) == 4


def test_large_job_week_shows_the_backfill_gap(capsys: pytest.CaptureFixture[str]) -> None:
    # docs/scheduler.md, "The paper's shape": the week where >= 8-GPU jobs hold 76% of the
    # GPU-time, on a cluster matching its offered load. Backfill keeps 6-10 points more GPUs
    # busy while jobs wait (measured: fcfs 88.7%, sing 94.3%, easy 97.0%).
    argv = ["simulate", "--trace", str(require(PHILLY)), "--nodes", "32", "--gpus-per-node", "8",
            "--since", "2017-11-20", "--until", "2017-11-27", "--json"]  # fmt: skip
    assert main(argv) == 0
    busy = {r["policy"]: r["busy_assignment"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert 0.85 < busy["fcfs"] < 0.90
    assert busy["sing"] > busy["fcfs"] + 0.05
    assert busy["easy"] > busy["fcfs"] + 0.08


def test_the_default_bounds_the_maximum_wait_and_keeps_the_papers_gap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Issue 31 item 7, docs/scheduler.md "the paper's gap" and "the maximum wait against fcfs":
    # sing's default keeps >= 15 points more GPUs assigned than FCFS on the busy week (the paper:
    # ~96% against ~75%) while its maximum wait stays at most FCFS's, on the week and on the whole
    # file. Measured: week fcfs 78.0%, max 289.3 h; sing 93.5%, max 280.2 h, 1,248 starved
    # (fcfs 10,979); whole file max fcfs 397.6 h, sing 327.7 h.
    philly = ["simulate", "--trace", str(require(PHILLY)), "--policy", "fcfs,sing", "--json"]
    week = [*philly, "--nodes", "28", "--gpus-per-node", "8", "--since", "2017-10-17",
            "--until", "2017-10-24"]  # fmt: skip
    assert main(week) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    fcfs, sing = rows["fcfs"], rows["sing"]
    assert 0.76 < fcfs["gpu_assignment"] < 0.80
    assert sing["gpu_assignment"] >= fcfs["gpu_assignment"] + 0.15
    assert sing["max_wait_s"] <= fcfs["max_wait_s"]
    assert sing["starved_jobs"] < fcfs["starved_jobs"] / 5
    assert main([*philly, "--nodes", "64", "--gpus-per-node", "8"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["fcfs"]["jobs"] == 82_247
    assert rows["sing"]["max_wait_s"] <= rows["fcfs"]["max_wait_s"]
