"""`sing simulate --from-warehouse --validate`: the site's own jobs, written into a warehouse by
`sing warehouse import` (no synthetic generator), replayed on its own node inventory and checked
against the waits it recorded, by hand-computed answers.

The cluster is gpu01 and gpu02, 8 A100 each (cpu01, with no GPU, is no part of it). Times are
seconds after 08:00 UTC; waits are start - submit:

| job | submit | start | end | GPUs | limit | what happened at the site |
|---|---|---|---|---|---|---|
| j1 | 0 | 0 | 3600 | 8 | 2 h | gpu01 |
| j2 | 60 | 60 | 1860 | 8 | 1 h | gpu02 |
| j3 | 120 | 3605 | 5405 | 2 x 8 | 1 h | the blocked head: both nodes, once j1 ended |
| j4 | 300 | 1890 | 2490 | 8 | 20 min | backfilled on gpu02 (ends by its limit before j3 starts) |
| j5 | 400 | 5410 | 6010 | 8 | 2 h | too long to backfill: after j3 |
| j6 | 500 | - | 700 | 8 | 1 h | cancelled while pending: never started |
| j7 | 6000 | 6010 | - | 8 | 2 h | still running at the last job sync, 10:00 |
| j8 | 10 | 10 | 20 | 0 | - | CPU only |

easy, replayed on the recorded run times: j1 0, j2 60, j3 at 3600 (j1's end), j4 at 1860 (j2's
end: it ends by its limit at 3060, before j3's reservation at j1's limit, 7200), j5 at 5400 (j3's
end). Simulated waits 0, 0, 3480, 1560, 5000 against recorded 0, 0, 3485, 1590, 5010: absolute
errors 0, 0, 5, 30, 10 s. fcfs holds j4 behind j3 (wait 5100: error 3510 s).
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sing.cli import main

JOBS = """\
job_id,cluster,user,account,partition,submit_time,start_time,end_time,state,exit_code,num_nodes,gpus_per_node,num_gpus,time_limit_s,nodes,recorded_at
j1,campus,ana,lab1,gpu,2026-03-02T08:00:00Z,2026-03-02T08:00:00Z,2026-03-02T09:00:00Z,COMPLETED,0,1,8,8,7200,gpu01,2026-03-02T10:00:00Z
j2,campus,ben,lab2,gpu,2026-03-02T08:01:00Z,2026-03-02T08:01:00Z,2026-03-02T08:31:00Z,COMPLETED,0,1,8,8,3600,gpu02,2026-03-02T10:00:00Z
j3,campus,ana,lab1,gpu,2026-03-02T08:02:00Z,2026-03-02T09:00:05Z,2026-03-02T09:30:05Z,COMPLETED,0,2,8,16,3600,"gpu01,gpu02",2026-03-02T10:00:00Z
j4,campus,cy,lab2,gpu,2026-03-02T08:05:00Z,2026-03-02T08:31:30Z,2026-03-02T08:41:30Z,COMPLETED,0,1,8,8,1200,gpu02,2026-03-02T10:00:00Z
j5,campus,ben,lab2,gpu,2026-03-02T08:06:40Z,2026-03-02T09:30:10Z,2026-03-02T09:40:10Z,FAILED,1,1,8,8,7200,gpu01,2026-03-02T10:00:00Z
j6,campus,cy,lab2,gpu,2026-03-02T08:08:20Z,,2026-03-02T08:11:40Z,CANCELLED,0,1,8,8,3600,,2026-03-02T10:00:00Z
j7,campus,ana,lab1,gpu,2026-03-02T09:40:00Z,2026-03-02T09:40:10Z,,RUNNING,,1,8,8,7200,gpu02,2026-03-02T10:00:00Z
j8,campus,cy,lab2,cpu,2026-03-02T08:00:10Z,2026-03-02T08:00:10Z,2026-03-02T08:00:20Z,COMPLETED,0,1,0,0,,cpu01,2026-03-02T10:00:00Z
"""
NODES = """\
node,gpus,gpu_model,partition,cluster,valid_from,source
gpu01,8,A100,gpu,campus,2026-03-01T00:00:00Z,sinfo
gpu02,8,A100,gpu,campus,2026-03-01T00:00:00Z,sinfo
cpu01,0,,cpu,campus,2026-03-01T00:00:00Z,sinfo
"""
RECORDED_WAITS = (0, 0, 3485, 1590, 5010)  # j1 to j5
EASY_WAITS = (0, 0, 3480, 1560, 5000)
ERRORS = (0, 0, 5, 30, 10)


@pytest.fixture
def site(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A warehouse holding the jobs and inventory above, through `sing warehouse import`."""
    wh = tmp_path / "wh"
    for table, text in (("nodes", NODES), ("jobs", JOBS)):
        path = tmp_path / f"{table}.csv"
        path.write_text(text)
        assert main(["--warehouse", str(wh), "warehouse", "import", table, str(path)]) == 0
    capsys.readouterr()
    return wh


def simulate(capsys: pytest.CaptureFixture[str], wh: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--warehouse", str(wh), "simulate", "--from-warehouse", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_validate_replays_the_site_under_easy_with_known_errors(
    site: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    starts = tmp_path / "starts.csv"
    code, out, err = simulate(capsys, site, "--validate", "--json", "--starts-out", str(starts))
    assert code == 0, err
    with starts.open() as f:
        started = {r["job_id"]: float(r["start_time"]) for r in csv.DictReader(f)}
    at = datetime(2026, 3, 2, 8, tzinfo=UTC).timestamp()
    assert {j: t - at for j, t in started.items()} == {
        "j1": 0,
        "j2": 60,
        "j3": 3600,
        "j4": 1860,
        "j5": 5400,
    }
    (row,) = json.loads(out)["rows"]
    assert row["policy"] == "easy" and row["jobs"] == 5
    assert row["recorded_mean_wait_s"] == pytest.approx(sum(RECORDED_WAITS) / 5)  # 2017 s
    assert row["simulated_mean_wait_s"] == pytest.approx(sum(EASY_WAITS) / 5)  # 2008 s
    assert row["mean_abs_error_s"] == pytest.approx(9)
    assert row["median_abs_error_s"] == pytest.approx(5)
    assert row["p99_abs_error_s"] == pytest.approx(10 + 0.96 * 20)  # between the top two
    assert row["mean_error_s"] == pytest.approx(-9)  # the replay starts jobs earlier
    assert row["within_10_min"] == 1.0
    # j6 never started and j7 still runs: out of the comparison, and said so
    assert (row["skipped_never_ran"], row["skipped_censored"], row["skipped_cpu_only"]) == (1, 1, 1)
    assert "skipped: 1 cpu-only, 1 never ran, 1 censored, 0 cannot fit" in err
    # the window ends at the last job sync (10:00), where j7 had run 1190 s on 8 GPUs, of
    # 91,120 GPU-seconds in all: not at the time the test runs
    assert row["censored_gpu_share"] == pytest.approx(1190 * 8 / 91_120)


def test_fcfs_is_farther_from_a_backfilling_site(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = simulate(capsys, site, "--validate", "--policy", "fcfs,easy", "--json")
    assert code == 0, err
    fcfs, easy = json.loads(out)["rows"]
    # fcfs starts j4 after j3, at 5400 (wait 5100, recorded 1590): 3510 s off
    assert fcfs["mean_abs_error_s"] == pytest.approx((0 + 0 + 5 + 3510 + 10) / 5)
    assert easy["mean_abs_error_s"] < fcfs["mean_abs_error_s"]


def test_the_table_shows_errors_in_minutes(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(capsys, site, "--validate")
    assert code == 0, err
    heading, line = out.splitlines()
    assert "MAE min" in heading and "p99 AE min" in heading and "bias min" in heading
    # waits 2017 s and 2008 s; errors 9 s, 5 s, 29.2 s, -9 s
    assert line.split()[:8] == ["easy", "5", "0.56", "0.56", "0.1", "0.1", "0.5", "-0.1"]


def test_a_window_censors_at_until_and_leaves_unstarted_jobs_out(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Up to 09:23:20 (5000 s): j3 still runs (censored), j5 has not started (never ran)."""
    window = ["--since", "2026-03-02T08:00", "--until", "2026-03-02T09:23:20Z"]
    code, out, err = simulate(capsys, site, *window, "--validate", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    # j1, j2 and j4; with no head in the way j4 starts at j2's end: 30 s early
    assert row["jobs"] == 3 and row["mean_abs_error_s"] == pytest.approx(10)
    assert (row["skipped_never_ran"], row["skipped_censored"]) == (2, 1)
    assert "censored: 1 jobs still running at the end" in err
    code, out, err = simulate(capsys, site, *window, "--validate", "--include-censored", "--json")
    (row,) = json.loads(out)["rows"]
    # j3 replayed, cut at 5000 s: the head again, started at j1's end (5 s early)
    assert row["jobs"] == 4 and row["mean_abs_error_s"] == pytest.approx((5 + 30) / 4)


def test_jobs_from_before_the_window_are_noted(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = simulate(capsys, site, "--since", "2026-03-02T08:03:20Z", "--json")
    assert code == 0, err
    # at 08:03:20 j1 and j2 ran and j3 waited; j8 (CPU only) had ended
    assert "note: 3 GPU jobs submitted before the window" in err
    rows = json.loads(out)["rows"]
    assert [r["policy"] for r in rows] == ["fcfs", "sing", "easy", "sjf"]
    assert {r["jobs"] for r in rows} == {2}  # j4, j5 (j6 never ran, j7 still runs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "86400s"], "with --from-warehouse, times are absolute or ago"),
        (["--since", "2026-03-03", "--until", "2026-03-02"], "must be after --since"),
    ],
)
def test_bad_windows_say_what_works(
    site: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = simulate(capsys, site, *args)
    assert code == 1 and message in err


def test_a_missing_or_empty_warehouse_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = simulate(capsys, tmp_path / "none")
    assert code == 1 and "no warehouse there" in err
    (tmp_path / "empty").mkdir()
    code, _, err = simulate(capsys, tmp_path / "empty")
    assert code == 1 and "the warehouse holds no jobs" in err
