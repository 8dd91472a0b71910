"""Bad environments and bad input through the real `sing` command: one line, what to do, no
traceback (issue 29 item 1). The walk covers every command the argparse tree has, found from the
tree itself, so a command added later is walked too."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sing.cli import COMMANDS as COMMAND_TABLE
from sing.cli import build_parser, main
from tests.cli_as_user import sing_as_nobody

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SING_")}


def sing(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sing.cli", *args], capture_output=True, text=True, cwd=cwd, env=ENV
    )


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command, checked to be no traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sing: "), done.stderr
    return lines[0]


def test_warehouse_path_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "wh"
    path.write_text("not a warehouse\n")
    line = one_line_error(sing("report", "usage", "--warehouse", str(path), cwd=tmp_path))
    assert line == (
        f"sing: warehouse {path} is a file, not a directory; "
        "give --warehouse (or SING_WAREHOUSE) a directory"
    )
    assert path.read_text() == "not a warehouse\n"


@pytest.mark.parametrize("argv", [["report", "usage"], ["job", "7"], ["jobs", "list"]])
def test_read_command_on_missing_warehouse_says_so_and_creates_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    root = tmp_path / "typo"
    line = one_line_error(sing(*argv, "--warehouse", str(root), cwd=tmp_path))
    assert line.startswith(f"sing: no warehouse at {root} (create one with `sing demo-data`")
    assert not root.exists()


def test_unreadable_warehouse_is_permission_denied_in_one_line(tmp_path: Path) -> None:
    """A user who may not read the warehouse: as `nobody`, the directory root's alone."""
    root = tmp_path / "wh"
    root.mkdir()
    (root / "_meta.json").write_text('{"schema_version": 3}\n')
    root.chmod(0o700)
    tmp_path.chmod(0o755)
    done = sing_as_nobody("job", "7", "--warehouse", str(root))
    line = one_line_error(done)  # type: ignore[arg-type]
    assert line.startswith(f"sing: permission denied: {root}")
    assert line.endswith("; ask for access, or give another --warehouse")


def test_ctrl_c_is_one_line_and_rc_130(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sing.cli", "demo-data", "--days", "30", "--warehouse", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=ENV,
    )
    _wait_for(lambda: any(root.glob(".demo-data-*/gpu_samples")), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == (
        "sing: interrupted; what was not finished was not written (run it again)"
    )


def _wait_for(ready, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the command never got there"
        time.sleep(0.05)


# ---- the walk over every command -------------------------------------------------------------


def _leaves(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[list[str]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, [*path, name])


# `sing --help` lists the commands without loading them: each command's tree comes with its module.
COMMANDS = [
    leaf for name in COMMAND_TABLE for leaf in _leaves(build_parser(name), []) if leaf[0] == name
]


def test_the_walk_finds_the_whole_tree() -> None:
    """Guards the walk itself: it must reach nested actions and plain commands alike."""
    assert ["warehouse", "import"] in COMMANDS and ["doctor"] in COMMANDS
    assert len(COMMANDS) > 30


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_helps_and_refuses_a_bad_argument_without_traceback(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as helped:
        main([*command, "--help"])
    out = capsys.readouterr()
    assert helped.value.code == 0 and "usage: sing" in out.out
    assert "Traceback" not in out.out + out.err

    with pytest.raises(SystemExit) as refused:
        main([*command, "--no-such-option"])
    out = capsys.readouterr()
    assert refused.value.code != 0
    assert "unrecognized arguments: --no-such-option" in out.err or "error:" in out.err
    assert "Traceback" not in out.out + out.err
