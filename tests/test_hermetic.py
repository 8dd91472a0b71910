"""The suite is hermetic: the caller's SING_* variables never reach the code under test, services
take free ports, and every daemon a test starts dies with the pytest process that started it,
however that process ends (tests/conftest.py, tests/ports.py, tests/daemons.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import daemons
from tests.ports import free_port_block, free_ports

REPO = Path(__file__).resolve().parents[1]

# Run by a child pytest with tests/conftest.py as its conftest, under a polluted environment.
INNER_TESTS = '''
import os
import subprocess
import sys
from pathlib import Path

import pytest

SING = [sys.executable, "-m", "sing.cli"]
BOGUS = Path(os.environ["BOGUS"])


def sing_variables(env):
    return sorted(name for name in env if name.startswith("SING_"))


@pytest.fixture(scope="session")
def env_of_a_session_daemon():
    """What a process started by a session-scoped fixture sees ."""
    out = subprocess.run(["env", "-0"], capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.split("\\0") if "=" in line)


def test_session_fixtures_start_clean(env_of_a_session_daemon):
    assert sing_variables(env_of_a_session_daemon) == ["SING_HYPOTHESIS_PROFILE"]


def test_the_sing_cli_uses_only_what_it_is_given(tmp_path):
    assert sing_variables(os.environ) == ["SING_HYPOTHESIS_PROFILE"]
    config = tmp_path / "sing.toml"
    config.write_text('[site]\\nwarehouse = "own-warehouse"\\n')
    for args, own in ((["--config", str(config)], "own-warehouse"),
                      (["--warehouse", str(tmp_path / "wh")], "wh")):
        result = subprocess.run(
            [*SING, *args, "warehouse", "sql", "select 41 + 1"],
            capture_output=True, text=True, cwd=tmp_path,
        )  # a read command: it names the missing warehouse it was given, and creates none
        assert result.returncode == 1 and f"no warehouse at {tmp_path / own} " in result.stderr
        (tmp_path / own).mkdir()
        result = subprocess.run(
            [*SING, *args, "warehouse", "sql", "select 41 + 1"],
            capture_output=True, text=True, cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert "42" in result.stdout
    assert not BOGUS.exists()

'''


def test_the_callers_sing_variables_never_reach_tests(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    bogus = tmp_path / "callers-site"
    env = {
        **os.environ,
        "SING_WAREHOUSE": str(bogus / "warehouse"),
        "SING_CONFIG": str(bogus / "sing.toml"),
        "SING_DASHBOARD_DEMO": "1",
        "SING_HYPOTHESIS_PROFILE": "dev",  # the suite's own knob: kept
        "BOGUS": str(bogus),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'inner'}", "--rootdir", str(tmp_path),
         str(tmp_path / "test_inner.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout
    assert not bogus.exists()


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    base = free_port_block(3)
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for s, port in zip((a, b, c), range(base, base + 3), strict=True):
            s.bind(("127.0.0.1", port))


# A pytest stand-in: starts a daemon (a shell that forks a grandchild) the way the harnesses do,
# says the pids, then waits to be stopped (or for a line on stdin, then exits normally).
OWNER = """
import sys, time
from pathlib import Path
from tests import daemons

log = Path(sys.argv[1])
process = daemons.spawn(["sh", "-c", "sleep 300 & echo $! > grandchild; wait"], log,
                        mark=daemons.owner_mark("hermetic-test"), cwd=log.parent)
pidfile = log.parent / "grandchild"
while not pidfile.exists() or not pidfile.read_text().strip():
    time.sleep(0.05)
print(process.pid, pidfile.read_text().strip(), flush=True)
sys.stdin.readline()
"""


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait long for a reaper in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_owner(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "daemon.log")],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    pids = [int(pid) for pid in owner.stdout.readline().split()]
    assert len(pids) == 2 and all(running(pid) for pid in pids)
    return owner, pids


def gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("ending", ["exit", "SIGTERM", "SIGINT", "SIGHUP"])
def test_daemons_die_with_their_owner_however_it_ends(tmp_path: Path, ending: str) -> None:
    owner, pids = start_owner(tmp_path)
    try:
        if ending == "exit":
            owner.stdin.write("\n")
            owner.stdin.flush()
        else:
            owner.send_signal(getattr(signal, ending))
        status = owner.wait(timeout=30)
        assert gone(pids), "the daemon or its grandchild outlived its owner"
        if ending in ("SIGTERM", "SIGHUP"):
            assert status == -getattr(signal, ending)  # the default action still happened
    finally:
        owner.kill()
        for pid in pids:  # a red run leaves nothing behind
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_orphans_of_a_killed_run_are_reaped_but_not_a_live_runs(tmp_path: Path) -> None:
    (tmp_path / "killed").mkdir()
    (tmp_path / "live").mkdir()
    killed, orphans = start_owner(tmp_path / "killed")
    live, kept = start_owner(tmp_path / "live")
    try:
        killed.send_signal(signal.SIGKILL)  # no handler, no atexit: its daemons stay
        killed.wait(timeout=10)
        assert all(running(pid) for pid in orphans)
        reaped = daemons.reap_orphans()
        assert set(orphans) <= set(reaped)
        assert gone(orphans)
        assert all(running(pid) for pid in kept), "a running copy's daemon was killed"
        assert not set(kept) & set(reaped)
    finally:
        for owner in (killed, live):
            owner.terminate()
            owner.wait(timeout=30)
        assert gone(kept)


def test_stopping_a_daemon_stops_what_it_forked(tmp_path: Path) -> None:
    process = daemons.spawn(
        ["sh", "-c", "sleep 300 & echo $! > grandchild; wait"], tmp_path / "daemon.log",
        mark=daemons.owner_mark("hermetic-test"), cwd=tmp_path,
    )  # fmt: skip
    pidfile = tmp_path / "grandchild"
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the daemon never forked"
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    daemons.stop(process, timeout=5)
    assert gone([process.pid, grandchild])
