"""Progress lines: on a terminal (a real pseudo-terminal) a long command shows how far it got;
piped, it prints nothing extra, so what scripts read stays the same."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
from pathlib import Path

from sing.progress import Progress
from tests.test_analytics import SING, run_sing

TRACE = "job_id,user,submit_time,duration_s,num_gpus\na,u1,0,10,2\nb,u2,1,10,4\nc,u1,2,3,1\n"
DEMO = ("demo-data", "--nodes", "1", "--gpus-per-node", "2", "--days", "2")


def on_terminal(*args: str) -> tuple[int, str, str]:
    """Run `sing ARGS` with stderr on a pseudo-terminal; its exit code, stdout, terminal text."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [str(SING), *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        env={**os.environ, "SING_CONFIG": ""},
    )
    os.close(follower)
    try:
        terminal = read_terminal(leader)
    except AssertionError:
        proc.kill()
        raise
    return proc.wait(timeout=60), proc.stdout.read().decode(), terminal


def read_terminal(leader: int) -> str:
    """All a pseudo-terminal shows until every writer has closed it; read as it comes, so a full
    terminal buffer never blocks the writer."""
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        assert ready, f"no output and no end for 120 s; so far {seen!r}"
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the last writer closed its end
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    return seen.decode()


def test_demo_data_and_trace_export_show_progress_on_a_terminal(tmp_path: Path) -> None:
    wh = ("--warehouse", str(tmp_path / "wh"))
    code, stdout, terminal = on_terminal(*wh, *DEMO, "--end", "2026-01-03T00:00:00")
    assert code == 0 and stdout.startswith("wrote {'jobs'")
    assert "\r\x1b[Kdemo-data: 0/48 h of history (0 %)" in terminal
    assert "demo-data: 48/48 h of history (100 %)" in terminal
    assert terminal.endswith("\r\n")  # the last state stays; the prompt starts on a new line

    window = ("--since", "2026-01-01", "--until", "2026-01-03")
    out = tmp_path / "trace"
    config = tmp_path / "k1.toml"  # every job kept: a release that keeps none is refused
    config.write_text("[trace]\nk = 1\n")
    wh = (*wh, "--config", str(config))
    code, stdout, terminal = on_terminal(*wh, "trace", "export", *window, "--out", str(out))
    assert code == 0 and stdout.startswith(f"wrote {out}")
    assert re.fullmatch(r"(\r\x1b\[Ktrace export: \d+ s)+\r\n", terminal), terminal
    piped = run_sing(*wh, "trace", "export", *window, "--out", str(tmp_path / "again"))
    assert piped.returncode == 0 and piped.stderr == ""


def test_demo_data_piped_prints_no_progress(tmp_path: Path) -> None:
    out = run_sing("--warehouse", str(tmp_path / "wh"), *DEMO)
    assert out.returncode == 0 and out.stdout.startswith("wrote {'jobs'")
    assert out.stderr == ""


def test_simulate_counts_policies_on_a_terminal(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    args = ("simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "4")
    code, stdout, terminal = on_terminal(*args, "--policy", "fcfs,sjf")
    assert code == 0 and stdout.split()[:2] == ["policy", "jobs"]
    assert "simulate: 0/2 policies (0 %)" in terminal and "fcfs, 3 jobs" in terminal
    assert "simulate: 1/2 policies (50 %)" in terminal and "sjf, 3 jobs" in terminal
    assert "simulate: 2/2 policies (100 %)" in terminal
    piped = run_sing(*args)
    assert piped.returncode == 0 and piped.stderr == ""


def test_progress_draws_only_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    with open(follower, "w") as terminal, Progress("work", 4, "steps", terminal) as progress:
        progress.update(3, note="step four")
    text = read_terminal(leader)
    assert text.startswith("\r\x1b[Kwork: 0/4 steps (0 %), 0 s")
    assert "\r\x1b[Kwork: 3/4 steps (75 %), 0 s  step four" in text
    assert text.endswith("\r\n")

    text_file = io.StringIO()
    with Progress("work", total=4, stream=text_file) as progress:
        progress.update(4)
    assert text_file.getvalue() == ""
