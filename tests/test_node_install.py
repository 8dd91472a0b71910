"""The GPU node's install: sing's wheel with only what `sing exporter` needs (`pip install sing`,
or 'sing[node]'), in a fresh virtualenv of this machine's Python, serving a fake node that
`sing doctor node` checks there and the head node's `sing collector --once` (this checkout's
full install) scrapes into a warehouse.

It builds the wheel from this checkout and installs its four dependencies from the package
index, as a site would; docs/deploy.md ("A GPU node's install") gives the figures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from sing.warehouse.store import Warehouse
from tests.ports import free_port
from tests.test_collector_scrape import REPO, http_get, running, sing, wait_for

pytestmark = pytest.mark.timeout(600)

HEAD_ENGINES = ("duckdb", "polars", "deltalake", "pyarrow", "streamlit", "numpy")


# The node's virtualenv sees nothing of this checkout's: no PYTHONPATH, no active virtualenv.
NODE_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=NODE_ENV, **kw)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding sing's wheel installed as a GPU node installs it."""
    base = tmp_path_factory.mktemp("node")
    # setuptools stages a wheel's files in build/lib and keeps them: a module moved away since
    # the last build would ship in this one (build/native, the compiled replay, stays).
    for staged in (REPO / "build").glob("lib*"):
        shutil.rmtree(staged)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                 "--wheel-dir", str(base / "wheel"), str(REPO)])  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (base / "wheel").glob("sing-*.whl")
    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    installed = run([str(python), "-m", "pip", "install", "--quiet", f"{wheel}[node]"])
    assert installed.returncode == 0, installed.stderr
    return base / "venv"


def test_the_node_install_holds_none_of_the_head_nodes_engines(node: Path) -> None:
    probe = "import importlib.util as u; print([m for m in {!r} if u.find_spec(m)])"
    found = run([str(node / "bin" / "python"), "-c", probe.format(HEAD_ENGINES)])
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def test_a_head_node_command_there_names_the_install_it_needs(node: Path) -> None:
    listed = run([str(node / "bin" / "sing"), "--help"])
    assert listed.returncode == 0 and "report" in listed.stdout, listed.stderr
    report = run([str(node / "bin" / "sing"), "report", "idle"])
    assert report.returncode == 1
    assert "pip install 'sing[head]'" in report.stderr and "Traceback" not in report.stderr


def test_the_node_serves_a_fake_gpu_node_that_the_head_node_collects(
    node: Path, tmp_path: Path
) -> None:
    port = free_port()
    exporter = [str(node / "bin" / "sing"), "exporter", "--fake", "--port", str(port),
                "--listen-address", "127.0.0.1"]  # fmt: skip
    with running(exporter, tmp_path / "exporter.log", env=NODE_ENV):
        page = wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), 60, "the exporter")
        assert "sing_gpu_utilization_ratio" in page
        config = tmp_path / "sing.toml"
        config.write_text(f'[exporter]\nport = {port}\nlisten_address = "127.0.0.1"\n')
        doctor = run([str(node / "bin" / "sing"), "--config", str(config), "doctor", "node"])
        assert "raised" not in doctor.stdout and not doctor.stderr, doctor.stdout + doctor.stderr
        assert any(
            line.startswith("OK") and "exporter" in line for line in doctor.stdout.splitlines()
        ), doctor.stdout
        wh = tmp_path / "wh"
        collected = subprocess.run(
            sing("--warehouse", str(wh), "collector", "--once", "--target", f"127.0.0.1:{port}"),
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
    assert collected.returncode == 0, collected.stderr
    assert "1/1 targets up" in collected.stdout
    con = Warehouse(wh).connect()
    (gpus,) = con.execute("SELECT count(DISTINCT gpu_index) FROM gpu_samples").fetchone()
    assert gpus == 8  # the fake node's eight GPUs
