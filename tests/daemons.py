"""Daemons the tests start (Slurm, MariaDB, munge, exporters, collectors), reaped on any exit.

Each starts in its own session, so its process group holds it and whatever it forks, and is
recorded here until stopped. Whatever is still recorded when the pytest process ends is killed:
at interpreter exit (atexit) and on SIGTERM, SIGINT or SIGHUP (the handler kills, then hands
the signal on to the handler that was there before, or to the default action).

A run killed with SIGKILL can clean nothing up. So every daemon carries `OWNER_VARIABLE` in its
environment (inherited by all it forks, daemonized or not): the pid and start time of the
process that owns it, and a tag (the Slurm harness uses its scratch directory). `reap_orphans()`,
called when a harness starts, kills the marked processes whose owner is gone, and never those of
a copy of the suite that is still running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

OWNER_VARIABLE = "TESTS_DAEMON_OWNER"
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_started: dict[int, subprocess.Popen] = {}  # process group id -> its leader
_previous_handlers: dict[int, object] = {}
_exit_hooks_installed = False


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with the pid, it names one process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name in (...) may hold spaces


def owner_mark(tag: str) -> str:
    """The marker value for daemons this process owns: `pid:start:tag`."""
    return f"{os.getpid()}:{_start_time(os.getpid())}:{tag}"


def spawn(
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    mark: str | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Start `argv` in its own session, stdout and stderr appended to `log`.

    With `mark` (from `owner_mark`) the daemon is this process's: marked, recorded and killed
    on any exit. Without, it is left to outlive us (`python -m tests.slurm_harness up`)."""
    env = dict(os.environ if env is None else env)
    if mark is not None:
        env[OWNER_VARIABLE] = mark
        _install_exit_hooks()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    if mark is not None:
        _started[process.pid] = process
    return process


def stop(process: subprocess.Popen, timeout: float = 15) -> int:
    """SIGTERM to the daemon's process group, SIGKILL to what is left of it after `timeout` s;
    the leader's exit status."""
    _kill_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    _kill_group(process.pid, signal.SIGKILL)  # the leader, or members that outlived it
    status = process.wait(timeout=10)
    _started.pop(process.pid, None)
    return status


def stop_all(timeout: float = 5) -> None:
    """Stop every daemon still recorded: SIGTERM to all groups, SIGKILL after `timeout` s."""
    processes = list(_started.values())
    for process in processes:
        _kill_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.1)
    for process in processes:
        _kill_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        _started.pop(process.pid, None)


def reap_orphans() -> list[int]:
    """Kill the marked processes whose owner has exited (a run killed with SIGKILL); returns
    their pids. Processes of owners still alive, this one and other copies of the suite, stay."""

    def orphaned(mark: str) -> bool:
        pid, start, _tag = mark.split(":", 2)
        return not pid.isdigit() or _start_time(int(pid)) != start

    return reap(orphaned)


def reap(condition: Callable[[str], bool]) -> list[int]:
    """SIGKILL every process whose `OWNER_VARIABLE` value meets `condition`; returns their pids."""
    killed = []
    for pid, mark in _marked_processes():
        if condition(mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def _marked_processes() -> list[tuple[int, str]]:
    """(pid, marker) of the processes we can read that carry `OWNER_VARIABLE`."""
    prefix = f"{OWNER_VARIABLE}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        for variable in environ.split(b"\0"):
            if variable.startswith(prefix):
                found.append((int(entry.name), variable[len(prefix) :].decode(errors="replace")))
    return found


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _install_exit_hooks() -> None:
    """Once per process: atexit, and signal handlers where Python allows them (main thread)."""
    global _exit_hooks_installed
    if _exit_hooks_installed:
        return
    _exit_hooks_installed = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:  # e.g. SIGHUP under nohup: keep ignoring it
            continue
        _previous_handlers[sig] = previous
        signal.signal(sig, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all(timeout=2)
    previous = _previous_handlers.get(signum)
    if callable(previous):
        previous(signum, frame)  # SIGINT: Python's KeyboardInterrupt, so pytest still reports
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
