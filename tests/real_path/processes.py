"""Processes the test starts (exporters, the collector): logged to files, each in its own
process group, killed with the group on teardown and on any exit of pytest (tests/daemons.py)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests import daemons

T = TypeVar("T")


class Service:
    """One long-running command in its own session, its output in `log`."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.log = argv, log
        self.process = daemons.spawn(argv, log, env, mark=daemons.owner_mark(str(log)))

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM to its process group, SIGKILL after `timeout` s; returns the exit status."""
        return daemons.stop(self.process, timeout)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def wait_for(check: Callable[[], T], what: str, timeout: float, services: list[Service] = ()) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` (and any service that
    died meanwhile, with the end of its log) when `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        dead = [s for s in services if not s.alive()]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {' '.join(s.argv[:4])} ...:\n{s.tail()}" for s in services)
            reason = "a process exited" if dead else f"timed out after {timeout} s"
            raise AssertionError(f"{reason} waiting for {what}\n{logs}")
        time.sleep(0.3)


def run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """A short command's stdout; its failure raises with stderr."""
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr}")
    return result.stdout
