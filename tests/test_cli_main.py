"""The `sing` command itself: a reader that goes away, and global options on either side of the
command. Run as a user runs it: the installed `sing` in a real pipe."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sing.cli import build_parser
from sing.warehouse.store import Warehouse
from tests.test_analytics import SING, add_job, at, run_sing


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    wh = Warehouse(tmp_path / "wh")
    for n in range(3):
        add_job(wh, f"J{n}", ["n1"], 2, at(n), at(n + 1))
    return wh


def test_closed_pipe_ends_quietly_with_sigpipe_status(wh: Warehouse) -> None:
    """The reader is gone before sing writes a byte, so every write meets a broken pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.run(
        [str(SING), "--warehouse", str(wh.root), "report", "jobs", "--now", at(4).isoformat()],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env={**os.environ, "SING_CONFIG": ""},
    )
    os.close(write_end)
    assert proc.stderr == ""  # no traceback, no "Exception ignored" at exit
    assert proc.returncode == 141  # 128 + SIGPIPE, as a tool killed by SIGPIPE


def test_head_gets_the_heading_line(wh: Warehouse) -> None:
    proc = subprocess.run(
        ["bash", "-c", f'"{SING}" --warehouse "{wh.root}" report jobs | head -1'],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SING_CONFIG": ""},
    )
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.split()[:3] == ["job", "user", "account"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--warehouse", "A", "report", "cluster"], "A"),
        (["report", "cluster", "--warehouse", "B"], "B"),
        (["--warehouse", "A", "report", "cluster", "--warehouse", "B"], "B"),  # the later wins
        (["report", "cluster"], None),
    ],
)
def test_warehouse_before_or_after_the_command(argv: list[str], expected: str | None) -> None:
    assert build_parser("report").parse_args(argv).warehouse == expected


@pytest.mark.parametrize(
    ("argv", "config", "verbose"),
    [
        (["-v", "--config", "x.toml", "jobs", "list"], "x.toml", True),
        (["jobs", "list", "-v", "--config", "x.toml"], "x.toml", True),
        (["jobs", "--verbose", "list"], None, True),
        (["jobs", "list"], None, False),
    ],
)
def test_config_and_verbose_on_either_side(argv: list[str], config: str | None, verbose: bool):
    args = build_parser("jobs").parse_args(argv)
    assert (args.config, args.verbose) == (config, verbose)


def test_options_after_the_command_reach_it(wh: Warehouse, tmp_path: Path) -> None:
    window = ("--since", at(0).isoformat(), "--now", at(4).isoformat(), "--json")
    before = run_sing("--warehouse", str(wh.root), "report", "cluster", *window)
    after = run_sing("report", "cluster", *window, "--warehouse", str(wh.root))
    assert before.returncode == after.returncode == 0, after.stderr
    rows = json.loads(after.stdout)["rows"]
    assert rows == json.loads(before.stdout)["rows"]
    assert rows[0]["allocated_gpu_hours"] == pytest.approx(6.0)  # 3 jobs x 2 GPUs x 1 h

    bad = tmp_path / "bad.toml"
    bad.write_text("[thresold]\n")
    out = run_sing("report", "cluster", "--config", str(bad), "--warehouse", str(wh.root))
    assert out.returncode == 2
    assert out.stderr.startswith(f"sing: configuration error: {bad}: unknown section [thresold]")
