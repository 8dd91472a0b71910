"""Run the `sing` command as another, unprivileged user (`nobody`).

The test interpreter lives under a directory only root may enter, so `runuser ... python`
cannot start it. A fresh interpreter instead loads sing's command modules as root, then drops to
`nobody` and runs the real `sing.cli.main`, with that user's real permissions from there on.
(Forking the test process would not do: delta-rs's runtime refuses to run in a forked child.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import importlib, os, pwd, sys
import sing.cli
for command in sing.cli.COMMANDS.values():
    importlib.import_module(command.module)
nobody = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)
os.chdir("/")
sys.exit(sing.cli.main(sys.argv[1:]))
"""


def sing_as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """`sing ARGV` as user nobody; its rc and output."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SING_")}
    return subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        env=env | {"HOME": "/nonexistent"},
    )
