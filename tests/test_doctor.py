"""`sing doctor`: each check says OK for a good setup and names the problem for a bad one.

Runs the real command against real processes and files: a `sing exporter --fake` process as the
node's exporter and scrape target, the exporter tests' sysfs tree for RDMA counters.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "exporter"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def doctor(config: Path, role: str) -> tuple[int, dict[str, str]]:
    result = subprocess.run(
        [sys.executable, "-m", "sing.cli", "--config", str(config), "doctor", role],
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = {}
    for line in result.stdout.splitlines():
        status, check = line[:4].strip(), line[6:28].strip()
        findings[check] = f"{status} {line[28:].strip()}"
    return result.returncode, findings


@pytest.fixture(scope="module")
def exporter_port():
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sing.cli",
            "exporter",
            "--fake",
            "--port",
            str(port),
            "--listen-address",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            break
        except OSError:
            time.sleep(0.3)
    yield port
    process.terminate()
    process.wait(timeout=30)


def test_head_node_all_good(tmp_path: Path, exporter_port: int) -> None:
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[site]\nwarehouse = "wh"\n[collector]\ntargets = ["127.0.0.1:{exporter_port}"]\n'
    )
    code, found = doctor(config, "head")
    assert code == 0, found
    assert found["warehouse"].startswith("OK") and "schema v" in found["warehouse"]
    assert found["job records"].startswith("OK")
    assert found["scrape targets"] == "OK all 1 target(s) answer"


def test_head_node_names_dead_targets_and_unwritable_warehouse(tmp_path: Path) -> None:
    dead = free_port()
    config = tmp_path / "sing.toml"
    config.write_text(f'[site]\nwarehouse = "wh"\n[collector]\ntargets = ["127.0.0.1:{dead}"]\n')
    code, found = doctor(config, "head")
    assert code == 1
    assert found["scrape targets"] == "FAIL none of 1 target(s) answers"

    (tmp_path / "blocker").write_text("a file where the warehouse directory should be")
    config.write_text('[site]\nwarehouse = "blocker/wh"\n[executor]\nkind = "slurm"\n')
    code, found = doctor(config, "head")
    assert code == 1
    assert found["warehouse"].startswith("FAIL") and "not writable" in found["warehouse"]


def test_gpu_node_checks(tmp_path: Path, exporter_port: int) -> None:
    mapping = tmp_path / "gpu-jobs"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")
    config = tmp_path / "sing.toml"
    config.write_text(
        f'[exporter]\nport = {exporter_port}\nsysfs_root = "{FIXTURES / "sys"}"\n'
        f'job_mapping_dir = "{mapping}"\n'
    )
    code, found = doctor(config, "node")
    assert found["rdma counters"].startswith("OK") and "port(s) readable" in found["rdma counters"]
    assert found["exporter"] == f"OK http://127.0.0.1:{exporter_port}/metrics serves GPU metrics"
    assert found["gpu-job mapping"].startswith("OK")
    # No NVML on a machine without a GPU driver: a failure that says what to install.
    assert found["nvml"].startswith("FAIL") and "driver" in found["nvml"]
    assert code == 1

    (mapping / "notes.txt").write_text("hello")
    config.write_text(
        f'[exporter]\nport = {free_port()}\nsysfs_root = "{tmp_path}"\n'
        f'job_mapping_dir = "{mapping}"\n'
    )
    code, found = doctor(config, "node")
    assert found["gpu-job mapping"].startswith("FAIL") and "notes.txt" in found["gpu-job mapping"]
    assert found["rdma counters"].startswith("WARN")
    assert found["exporter"].startswith("FAIL") and "systemctl" in found["exporter"]


def test_bad_config_is_reported_not_crashed(tmp_path: Path) -> None:
    config = tmp_path / "sing.toml"
    config.write_text("[collector]\nintervall_s = 5\n")
    code, found = doctor(config, "head")
    assert code == 1
    assert found["config"].startswith("FAIL") and "did you mean 'interval_s'" in found["config"]
