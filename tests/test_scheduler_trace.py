"""`sing simulate` on any trace: releases written by `sing trace import`, node lists, windows in
seconds, skip counts, the low-load warning, "n/a" and --validate, through the real CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sing.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
# Three GPU jobs (1 GPU; 8 GPUs; 16 GPUs on 2 nodes) and one CPU-only job that never ran; the
# GPU jobs waited 30 s, 600 s and 0 s for their recorded starts.
HELIOS = FIXTURES / "helios_cluster_log.csv"
MIXED = "node,gpus,gpu_model\na1,8,A100\nt1,2,T4\nt2,2,T4\n"
SIMPLE = (
    "job_id,user,submit_time,duration_s,num_gpus,gpu_request,gpu_model_request\n"
    "big,u1,0,100,8,8,A100\n"
    "q1,u2,10,100,1,0.25,T4\n"
    "q2,u2,20,100,1,0.5,T4\n"
    "q3,u3,30,100,1,0.5,T4\n"
    "cpu,u3,40,100,0,0,\n"
    "h100,u1,50,100,1,1,H100\n"
    "huge,u1,60,100,16,16,\n"
    "late,u1,7200,100,2,2,\n"
)


def release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "helios"
    assert main(["trace", "import", "--format", "helios", str(HELIOS), "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("target", ["", "jobs.parquet", "jobs.csv"])
def test_simulate_reads_a_release_its_parquet_or_its_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    trace = release(tmp_path, capsys) / target
    code, out, err = simulate(
        capsys, "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "8", "--json"
    )
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["policy"] for r in rows] == ["fcfs", "sing", "easy", "sjf"]
    assert {r["jobs"] for r in rows} == {3}
    assert {r["skipped_cpu_only"] for r in rows} == {1}
    assert "skipped: 1 cpu-only, 0 never ran, 0 censored, 0 cannot fit" in err


def test_a_release_without_node_list_needs_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = simulate(capsys, "--trace", str(release(tmp_path, capsys)))
    assert code == 1 and "carries no node list" in err and "--cluster FILE" in err


def test_a_pod_list_release_runs_on_its_own_node_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seven pods on 5 nodes (2 P100, 8 V100M32, 4 + 1 V100M16, one CPU-only node): one pod is
    # CPU-only, two were never scheduled, pod 1 (0.46 GPU) was still running at the trace end
    # (censored: its run time is only a lower bound); pod 3 asks for V100M16 or V100M32.
    out, starts = tmp_path / "pods", tmp_path / "starts.csv"
    argv = ["trace", "import", "--format", "pods", str(FIXTURES / "openb_pod_list.csv"),
            "--nodes", str(FIXTURES / "openb_node_list.csv"), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    code, out_, err = simulate(
        capsys, "--trace", str(out), "--policy", "fcfs", "--json", "--starts-out", str(starts)
    )
    assert code == 0, err
    assert "skipped: 1 cpu-only, 2 never ran, 1 censored, 0 cannot fit" in err
    (row,) = json.loads(out_)["rows"]
    assert (row["jobs"], row["skipped_never_ran"], row["skipped_censored"]) == (3, 2, 1)
    assert row["busy_assignment"] is None
    with starts.open() as f:
        placed = {r["job_id"]: (r["num_gpus"], r["placement"]) for r in csv.DictReader(f)}
    assert placed == {
        "openb-pod-0000": ("1", "openb-node-0000:0"),
        "openb-pod-0002": ("8", "openb-node-0001:0,1,2,3,4,5,6,7"),
        "openb-pod-0003": ("1", "openb-node-0003:0"),  # V100M16 (best fit: the 1-GPU node)
    }
    code, out_, _ = simulate(capsys, "--trace", str(out), "--validate", "--json")
    (check,) = json.loads(out_)["rows"]
    # recorded waits 0, 60, 0 s; the simulated cluster starts all three at once
    assert check["jobs"] == 3 and check["mean_abs_error_s"] == pytest.approx(20)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "2"], "needs both --nodes and --gpus-per-node"),
        (["--nodes", "2", "--gpus-per-node", "8", "--cluster", "c.csv"], "not both"),
        (["--nodes", "0", "--gpus-per-node", "8"], "must be >= 1"),
        (["--cluster", "missing.csv"], "cannot read cluster file"),
    ],
)
def test_the_cluster_options_must_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    trace = file(tmp_path, "t.csv", SIMPLE)
    code, _, err = simulate(capsys, "--trace", str(trace), *args)
    assert code == 1 and message in err


def test_bad_cluster_file_names_the_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = file(tmp_path, "t.csv", SIMPLE)
    cluster = file(tmp_path, "c.csv", "node,gpus,gpu_model\na1,8,A100\na2,eight,A100\n")
    code, _, err = simulate(capsys, "--trace", str(trace), "--cluster", str(cluster))
    assert code == 1 and "row 3" in err and "'eight'" in err


def test_mixed_cluster_models_shares_and_skip_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = file(tmp_path, "t.csv", SIMPLE), file(tmp_path, "c.csv", MIXED)
    starts = tmp_path / "starts.csv"
    code, out, err = simulate(
        capsys, "--trace", str(trace), "--cluster", str(cluster), "--policy", "fcfs",
        "--starts-out", str(starts), "--json",
    )  # fmt: skip
    assert code == 0, err
    reasons = "model H100 missing: 1, too large: 1"
    assert f"skipped: 1 cpu-only, 0 never ran, 0 censored, 2 cannot fit ({reasons})" in err
    (row,) = json.loads(out)["rows"]
    assert (row["jobs"], row["skipped_cannot_fit"], row["skipped_cpu_only"]) == (5, 2, 1)
    with starts.open() as f:
        placed = {r["job_id"]: (float(r["start_time"]), r["placement"]) for r in csv.DictReader(f)}
    # 0.25 + 0.5 share GPU 0 of t1; 0.5 more would straddle it, so it takes GPU 1 of t1
    assert placed == {
        "big": (0.0, "a1:0,1,2,3,4,5,6,7"),
        "q1": (10.0, "t1:0"),
        "q2": (20.0, "t1:0"),
        "q3": (30.0, "t1:1"),
        "late": (7200.0, "a1:0,1"),
    }


def test_windows_in_seconds_from_the_trace_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = file(tmp_path, "t.csv", SIMPLE), file(tmp_path, "c.csv", MIXED)
    base = ["--trace", str(trace), "--cluster", str(cluster), "--policy", "fcfs", "--json"]
    _, out, _ = simulate(capsys, *base, "--since", "15s", "--until", "3600s")
    assert json.loads(out)["rows"][0]["jobs"] == 2  # q2, q3 (cpu, h100 and huge are skipped)
    _, out, _ = simulate(capsys, *base, "--since", "1970-01-01T00:00:20")
    assert json.loads(out)["rows"][0]["jobs"] == 3  # q2, q3, late
    code, _, err = simulate(capsys, *base, "--since", "15 s")
    assert code == 1 and "nor seconds from the trace start (e.g. 86400s)" in err


def test_quiet_note_only_when_the_replay_measured_little_queueing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = file(tmp_path, "t.csv", SIMPLE), file(tmp_path, "c.csv", MIXED)
    code, out, err = simulate(capsys, "--trace", str(trace), "--cluster", str(cluster), "--json")
    rows = json.loads(out)["rows"]
    # (800 + 25 + 50 + 50 + 200) GPU-s / (12 GPUs x 7,200 s) = 0.013, and no job waited
    assert rows[0]["offered_load"] == pytest.approx(1125 / (12 * 7200))
    assert code == 0 and {r["waited_share"] for r in rows} == {0.0}
    assert "note: queues rarely formed: at most 0.0 % of the jobs waited under any policy" in err
    assert "offered load" not in err


# 3 x 8 GPUs: a 1-GPU job holds a node for 200 h, so a 24-GPU job waits for it under fcfs, and 20
# short jobs behind that one wait with it; the last job comes 1,000 h after the first.
BLOCKED = (
    "job_id,user,submit_time,duration_s,num_gpus\nlong,a,0,720000,1\nwhole,b,10,3600,24\n"
    + "".join(f"s{k},c,{20 + k},60,1\n" for k in range(20))
    + "late,c,3600000,60,1\n"
)


def test_low_offered_load_with_long_queues_gets_no_quiet_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = file(tmp_path, "blocked.csv", BLOCKED)
    base = ["--trace", str(trace), "--nodes", "3", "--gpus-per-node", "8", "--json"]
    code, out, err = simulate(capsys, *base)
    rows = {r["policy"]: r for r in json.loads(out)["rows"]}
    assert code == 0, err
    assert "rarely form" not in err and "offered load" not in err
    # (720,000 + 24 x 3,600 + 21 x 60) GPU-s / (24 GPUs x 3,600,000 s): 0.009, a load that the
    # old note (an offered load below 0.3) called "queues rarely form"
    assert rows["fcfs"]["offered_load"] == pytest.approx(807_660 / (24 * 3_600_000))
    # fcfs: 'whole' waits 200 h for 'long', the 20 short jobs ~201 h behind it; sjf starts those
    assert rows["fcfs"]["waited_share"] == pytest.approx(21 / 23)
    assert rows["fcfs"]["mean_wait_s"] / 3600 > 150 and rows["sjf"]["mean_wait_s"] / 3600 < 10


def test_undefined_figures_are_na_in_tables_and_null_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = file(tmp_path, "t.csv", SIMPLE), file(tmp_path, "c.csv", MIXED)
    base = ["--trace", str(trace), "--cluster", str(cluster), "--policy", "fcfs"]
    code, out, err = simulate(capsys, *base, "--since", "7000s")  # one job: a zero-length window
    assert code == 0, err
    heading, line = out.splitlines()
    assert heading.split()[:6] == ["policy", "jobs", "offered", "%", "assigned", "%"]
    # assigned, busy: no window to assign in, no queue (the offered load is of --since..--until)
    assert line.split()[:2] == ["fcfs", "1"] and line.split()[3:5] == ["n/a", "n/a"]
    _, out, err = simulate(capsys, *base, "--since", "9000s", "--json")  # no job at all
    (row,) = json.loads(out)["rows"]
    assert row["jobs"] == 0 and row["mean_wait_s"] is None and row["gpu_assignment"] is None
    assert "no jobs to replay in this window" in err
    _, out, _ = simulate(capsys, *base, "--since", "9000s")
    assert "0.0" not in out.splitlines()[1] and out.splitlines()[1].count("n/a") == 13


def test_validate_against_recorded_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = release(tmp_path, capsys)
    code, out, err = simulate(
        capsys, "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "8", "--validate",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    # fcfs on an empty 2 x 8 cluster starts every job at once; they waited 30, 600 and 0 s
    assert row["policy"] == "fcfs" and row["jobs"] == 3
    assert row["recorded_mean_wait_s"] == pytest.approx(210.0)
    assert (row["mean_abs_error_s"], row["median_abs_error_s"]) == (pytest.approx(210.0), 30.0)
    assert row["within_10_min"] == 1.0 and row["correlation"] is None
    code, out, _ = simulate(
        capsys, "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "8", "--validate"
    )
    assert out.splitlines()[1].split()[:2] == ["fcfs", "3"] and "n/a" in out
    code, _, err = simulate(
        capsys, "--trace", str(file(tmp_path, "t.csv", SIMPLE)), "--nodes", "2",
        "--gpus-per-node", "8", "--validate",
    )  # fmt: skip
    assert code == 1 and "no job with a recorded start time" in err


def test_censored_share_is_printed_and_include_censored_replays_them_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pod 1 (0.46 GPU, 9,870 s) is alive at the end: 4,540.2 of the 37,960.2 GPU-seconds."""
    out = tmp_path / "pods"
    argv = ["trace", "import", "--format", "pods", str(FIXTURES / "openb_pod_list.csv"),
            "--nodes", str(FIXTURES / "openb_node_list.csv"), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    code, out_, err = simulate(capsys, "--trace", str(out), "--policy", "fcfs", "--json")
    assert code == 0, err
    assert "censored: 1 jobs still running at the end hold 12.0 % of the GPU-time" in err
    assert "left out; --include-censored replays them cut at the end" in err
    (row,) = json.loads(out_)["rows"]
    assert row["censored_gpu_share"] == pytest.approx(0.46 * 9870 / 37_960.2)
    assert (row["jobs"], row["skipped_censored"], row["censored_replayed"]) == (3, 1, False)
    starts = tmp_path / "starts.csv"
    code, out_, err = simulate(
        capsys, "--trace", str(out), "--policy", "fcfs", "--include-censored", "--json",
        "--starts-out", str(starts),
    )  # fmt: skip
    assert code == 0, err
    assert "replayed cut at the end (--include-censored)" in err
    (row,) = json.loads(out_)["rows"]
    assert (row["jobs"], row["skipped_censored"], row["censored_replayed"]) == (4, 0, True)
    with starts.open() as f:
        cut = next(r for r in csv.DictReader(f) if r["job_id"] == "openb-pod-0001")
    assert float(cut["end_time"]) - float(cut["start_time"]) == 9870.0  # cut at the end


def test_swf_log_simulates_as_its_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An archive-style SWF log replays directly with the figures of its imported release,
    on the cluster its header gives (MaxNodes 8, MaxProcs 8)."""
    log = FIXTURES / "ipsc_like.swf"
    assert main(["trace", "import", "--format", "swf", str(log), "--out", str(tmp_path / "t")]) == 0
    assert "one SWF processor = one GPU-equivalent slot" in capsys.readouterr().out
    figures = []
    for trace in (log, tmp_path / "t"):
        code, out, err = simulate(capsys, "--trace", str(trace), "--json")
        assert code == 0, err
        assert "skipped: 1 cpu-only, 1 never ran, 0 censored, 0 cannot fit" in err
        figures.append([{k: v for k, v in r.items() if k != "jobs_per_s"} for r in out_rows(out)])
    assert figures[0] == figures[1]
    fcfs = figures[0][0]
    # jobs 1, 2, 4, 5: 100 x 4 + 200 x 8 + 30 x 2 + 50 x 1 slot-seconds over 8 slots x 400 s
    assert (fcfs["jobs"], fcfs["offered_load"]) == (4, pytest.approx(2110 / (8 * 400)))


def out_rows(out: str) -> list[dict]:
    return json.loads(out)["rows"]
