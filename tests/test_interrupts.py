"""Ctrl-C loses nothing, leaves nothing half done, and nothing counts twice (issue 29 item 3).

Each test sends SIGINT to the real command at several points and then finds the warehouse
either as it was before or as a complete run leaves it; a second run of the same work is
refused with why, and `sing report usage` energy does not move."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from sing.warehouse.files import uninterrupted

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SING_")}
END = "2026-03-04T00:00:00+00:00"
DEMO = ["demo-data", "--nodes", "2", "--days", "3", "--end", END]


def sing(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sing.cli", *args], capture_output=True, text=True, env=ENV
    )


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sing.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def interrupt_when(proc: subprocess.Popen, ready: Callable[[], bool]) -> tuple[int, str]:
    """SIGINT once `ready()` holds (or at once if the command already ended); rc and stderr."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    return proc.returncode, err


def contents(root: Path) -> dict[str, int]:
    """Rows per table, and the GPU energy, as sing reads them (empty: no tables)."""
    tables = sorted(p.name for p in root.glob("*/_delta_log")) if root.is_dir() else []
    if not tables:
        return {}
    done = sing(
        "warehouse",
        "sql",
        "SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM gpu_samples) AS gpu,"
        " (SELECT count(*) FROM rdma_samples) AS rdma, (SELECT count(*) FROM nodes) AS nodes,"
        " (SELECT round(sum(energy_delta_j)) FROM gpu_samples) AS joules",
        "--json",
        "--warehouse",
        str(root),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["rows"][0]


def usage_kwh(root: Path) -> float:
    done = sing(
        "report",
        "usage",
        "--since",
        "2026-02-01",
        "--until",
        END,
        "--json",
        "--warehouse",
        str(root),
    )
    assert done.returncode == 0, done.stderr
    return round(sum(r["energy_kwh"] for r in json.loads(done.stdout)["rows"]), 6)


@pytest.fixture(scope="module")
def complete(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("complete") / "wh"
    done = sing(*DEMO, "--warehouse", str(root))
    assert done.returncode == 0, done.stderr
    return root


# Points of a demo-data run: at once, once staging began, once samples are staged, once the
# staged history is being compacted (its rollups appear), near the end.
DEMO_POINTS: dict[str, Callable[[Path], bool]] = {
    "at-start": lambda root: True,
    "staging": lambda root: any(root.glob(".demo-data-*")),
    "samples": lambda root: any(root.glob(".demo-data-*/gpu_samples/_delta_log")),
    "rollups": lambda root: any(root.glob(".demo-data-*/gpu_hourly/_delta_log")),
}


@pytest.mark.parametrize("point", DEMO_POINTS)
def test_interrupted_demo_data_is_all_or_nothing(
    complete: Path, tmp_path: Path, point: str
) -> None:
    root = tmp_path / "wh"
    rc, err = interrupt_when(
        start(*DEMO, "--warehouse", str(root)), lambda: DEMO_POINTS[point](root)
    )
    found = contents(root)
    assert found in ({}, contents(complete)), (point, rc, err)
    assert not list(root.glob(".demo-data-*")) if root.exists() else True, "staging left behind"
    if rc == 130:
        assert err.strip().splitlines()[-1].startswith("sing: interrupted;")
    if not found:  # nothing was written, so running it again finishes the work
        assert sing(*DEMO, "--warehouse", str(root)).returncode == 0
    assert contents(root) == contents(complete)


def test_demo_data_twice_is_refused_and_energy_does_not_double(complete: Path) -> None:
    before, kwh = contents(complete), usage_kwh(complete)
    done = sing(*DEMO, "--warehouse", str(complete))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"sing: warehouse {complete} already has data (")
    assert "demo data would count twice" in done.stderr
    assert (contents(complete), usage_kwh(complete)) == (before, kwh)
    assert kwh > 0


@pytest.fixture(scope="module")
def samples_file(complete: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The complete warehouse's GPU samples as one Parquet file to import elsewhere."""
    path = tmp_path_factory.mktemp("import") / "gpu.parquet"
    files = [str(p) for p in complete.glob("gpu_samples/day=*/*.parquet")]
    duckdb.sql(
        f"COPY (SELECT * EXCLUDE (day) FROM read_parquet({files}, hive_partitioning = true)) "
        f"TO '{path}' (FORMAT parquet)"
    )
    return path


def with_jobs(complete: Path, root: Path) -> None:
    """A warehouse with the complete one's jobs, nodes and allocations, and no samples."""
    for name in ("jobs", "nodes", "job_gpus"):
        files = [str(p) for p in complete.glob(f"{name}/*.parquet")]
        path = root.parent / f"{name}.parquet"
        duckdb.sql(f"COPY (SELECT * FROM read_parquet({files})) TO '{path}' (FORMAT parquet)")
        done = sing("warehouse", "import", name, str(path), "--warehouse", str(root))
        assert done.returncode == 0, done.stderr


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for a test that interrupts this very process: the suite's
    (tests/daemons.py) would stop every test daemon first."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_sigint")
def test_an_interrupt_that_another_thread_receives_comes_after_the_steps() -> None:
    """A Ctrl-C reaches whichever thread does not mask it (delta-rs and Arrow run their own);
    the steps inside still all run before it is raised (the CI failure of stop 35)."""
    steps: list[str] = []
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        with pytest.raises(KeyboardInterrupt), uninterrupted():
            signal.pthread_kill(worker.ident, signal.SIGINT)
            time.sleep(0.2)  # the main thread runs Python's handler after this, if not held
            steps.append("commit")
            steps.append("record")
    finally:
        stop.set()
        worker.join()
    assert steps == ["commit", "record"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_while_the_command_loads_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C before the command runs, while its modules (polars, DuckDB) load: the import
    test's 0.8 s interrupt landed there on a loaded machine and printed a traceback."""
    from sing import cli

    def interrupted(name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert cli.main(["warehouse", "sql", "SELECT 1"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err.startswith("sing: interrupted; ")


@pytest.mark.usefixtures("python_sigint")
def test_an_interrupt_during_a_query_is_one_line(
    complete: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DuckDB turns Ctrl-C into RuntimeError("Query interrupted"); it is an interrupt all the
    same (a demo-data run cut in its rollups printed that traceback)."""
    from sing import cli

    query = "SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3"
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        rc = cli.main(["warehouse", "sql", query, "--warehouse", str(complete)])
    finally:
        timer.cancel()
    assert rc == 128 + signal.SIGINT
    assert capsys.readouterr().err.startswith("sing: interrupted; ")


# What DuckDB raised for a Ctrl-C that came while it read a registered Arrow table (an import
# cut at 0.8 s, on a fresh Debian 12 machine).
ARROW_READ_INTERRUPTED = (
    "Invalid Input Error: reading the schema of the object registered as "
    "'_empty_health_samples' failed: KeyboardInterrupt: "
)


class _Command:
    """A command module whose one command raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def register(self, subparsers) -> None:
        def fail(args, config) -> int:
            raise self.error

        subparsers.add_parser("warehouse").set_defaults(func=fail)


def test_an_interrupt_while_duckdb_reads_an_arrow_table_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB names the KeyboardInterrupt in its own error there; another of its errors is no
    interrupt and goes on being raised."""
    from sing import cli

    interrupted = duckdb.InvalidInputException(ARROW_READ_INTERRUPTED)
    monkeypatch.setattr(cli, "_command_module", lambda command: _Command(interrupted))
    assert cli.main(["warehouse"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err.startswith("sing: interrupted; ")
    other = duckdb.InvalidInputException("Invalid Input Error: no such column")
    monkeypatch.setattr(cli, "_command_module", lambda command: _Command(other))
    with pytest.raises(duckdb.InvalidInputException, match="no such column"):
        cli.main(["warehouse"])


@pytest.mark.parametrize("delay_s", [0.0, 0.8, 1.6, 2.4])
def test_interrupted_import_is_all_or_nothing_and_a_second_import_is_refused(
    complete: Path, samples_file: Path, tmp_path: Path, delay_s: float
) -> None:
    root = tmp_path / "wh"
    with_jobs(complete, root)
    before = contents(root)
    began = time.monotonic()
    proc = start("warehouse", "import", "gpu_samples", str(samples_file), "--warehouse", str(root))
    rc, err = interrupt_when(proc, lambda: time.monotonic() - began >= delay_s)
    after = contents(root)
    whole = contents(complete)
    assert after in (before, {**before, "gpu": whole["gpu"], "joules": whole["joules"]}), (rc, err)
    if after == before:  # the interrupted import left no trace, so it runs again whole
        done = sing(
            "warehouse", "import", "gpu_samples", str(samples_file), "--warehouse", str(root)
        )
        assert done.returncode == 0, done.stderr
    kwh = usage_kwh(root)
    assert kwh == pytest.approx(usage_kwh(complete), rel=1e-3)
    again = sing("warehouse", "import", "gpu_samples", str(samples_file), "--warehouse", str(root))
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "this content was already imported into gpu_samples" in again.stderr
    assert (contents(root)["gpu"], usage_kwh(root)) == (whole["gpu"], kwh)
