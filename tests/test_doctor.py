"""`sing doctor`: each check says OK for a good setup and names the problem for a bad one.

Runs the real command against real processes and files: `sing exporter --fake` processes (one
plain, one behind TLS and basic auth, with certificates made at test time) as the node's
exporter and scrape target, the exporter tests' sysfs tree for RDMA counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pki import Pki, make_pki
from tests.ports import free_port
from tests.test_collector_scrape import running, sing, wait_for
from tests.test_exporter_web import PASSWORD, tls_auth_config, write_web_config

FIXTURES = Path(__file__).parent / "fixtures" / "exporter"


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
    assert found["scrape targets"].startswith(
        "FAIL none of 1 target(s) answers: 127.0.0.1: connection refused; start it"
    )

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
    assert found["exporter access"] == "OK listens on 127.0.0.1: plain HTTP, no basic auth"
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

    # Every address, in clear: the page still answers (through loopback), with a warning.
    config.write_text(f'[exporter]\nport = {exporter_port}\nlisten_address = "0.0.0.0"\n')
    code, found = doctor(config, "node")
    assert found["exporter"] == f"OK http://127.0.0.1:{exporter_port}/metrics serves GPU metrics"
    assert found["exporter access"].startswith("WARN serving user names and job ids on 0.0.0.0")
    assert "with neither TLS nor authentication" in found["exporter access"]


def test_bad_config_is_reported_not_crashed(tmp_path: Path) -> None:
    config = tmp_path / "sing.toml"
    config.write_text("[collector]\nintervall_s = 5\n")
    code, found = doctor(config, "head")
    assert code == 1
    assert found["config"].startswith("FAIL") and "did you mean 'interval_s'" in found["config"]


@dataclass(frozen=True)
class Protected:
    """A `sing exporter --fake` behind TLS and basic auth (user "prometheus", PASSWORD)."""

    port: int
    pki: Pki
    web_config: Path
    password_file: Path


@pytest.fixture(scope="module")
def protected(tmp_path_factory) -> Iterator[Protected]:
    base = tmp_path_factory.mktemp("protected")
    pki = make_pki(base / "pki")
    web = write_web_config(base / "web.yml", tls_auth_config(pki))
    (base / "password").write_text(PASSWORD + "\n")
    port = free_port()
    argv = sing("exporter", "--fake", "--web.listen-address", f"127.0.0.1:{port}",
                "--web.config.file", str(web))  # fmt: skip
    with running(argv, base / "exporter.log"):
        wait_for(lambda: "TLS" in (base / "exporter.log").read_text(), what="protected exporter")
        yield Protected(port, pki, web, base / "password")


def collector_section(protected: Protected, **overrides: object) -> str:
    """[collector] settings that reach the protected exporter; `overrides` break one of them."""
    settings = {
        "targets": [f"127.0.0.1:{protected.port}"],
        "scheme": "https",
        "tls_ca_file": str(protected.pki.ca),
        "basic_auth_username": "prometheus",
        "basic_auth_password_file": str(protected.password_file),
        **overrides,
    }
    return "[collector]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


def test_head_node_scrapes_a_protected_exporter_as_the_collector_does(
    tmp_path: Path, protected: Protected, exporter_port: int
) -> None:
    (tmp_path / "wrong-password").write_text("not the password\n")
    other_ca = make_pki(tmp_path / "other-pki").ca
    config = tmp_path / "sing.toml"

    def targets(**overrides: object) -> tuple[int, str]:
        config.write_text('[site]\nwarehouse = "wh"\n' + collector_section(protected, **overrides))
        code, found = doctor(config, "head")
        return code, found["scrape targets"]

    assert targets() == (0, "OK all 1 target(s) answer")
    dead = f"127.0.0.1:{free_port()}"
    code, line = targets(targets=[f"127.0.0.1:{protected.port}", dead])
    assert code == 0 and line.startswith("WARN 1 of 2 down: 127.0.0.1: connection refused; ")

    code, line = targets(basic_auth_password_file=str(tmp_path / "wrong-password"))
    assert code == 1
    assert line.startswith("FAIL none of 1 target(s) answers: 127.0.0.1: HTTP 401, wrong ")
    assert f"basic_auth_password_file ({tmp_path / 'wrong-password'})" in line

    code, line = targets(tls_ca_file=str(other_ca))
    assert code == 1
    assert "TLS verify failed" in line and "wrong CA" in line
    assert f"tls_ca_file ({other_ca}) must be the CA that signed the exporter's cert_file" in line

    code, line = targets(tls_ca_file="")  # the system store does not know the test CA
    assert code == 1 and "the system store does not trust the certificate" in line
    assert "tls_ca_file = the CA that signed the exporter's cert_file" in line

    # Basic auth over plain http would send the password in clear: the config is refused.
    config.write_text(collector_section(protected, scheme="http"))
    refused = subprocess.run(
        [sys.executable, "-m", "sing.cli", "--config", str(config), "doctor", "head"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and 'need scheme = "https"' in refused.stderr

    code, line = targets(targets=[f"127.0.0.1:{exporter_port}"])  # the plain exporter
    assert code == 1 and 'speaks plain HTTP, not TLS; set scheme = "http"' in line

    code, line = targets(basic_auth_password_file=str(tmp_path / "absent"))
    assert code == 1 and line.startswith("FAIL [collector] basic_auth_password_file")


def test_gpu_node_checks_its_protected_exporter_over_tls(
    tmp_path: Path, protected: Protected
) -> None:
    config = tmp_path / "sing.toml"
    exporter = (
        f'[exporter]\nport = {protected.port}\nlisten_address = "0.0.0.0"\n'
        f'web_config_file = "{protected.web_config}"\n'
    )
    url = f"https://127.0.0.1:{protected.port}/metrics"

    def node(collector: str) -> dict[str, str]:
        config.write_text(exporter + collector)
        return doctor(config, "node")[1]

    found = node(collector_section(protected))
    assert found["exporter"] == f"OK {url} serves GPU metrics (TLS, basic auth (1 users))"
    assert found["exporter access"] == "OK listens on 0.0.0.0: TLS, basic auth (1 users)"

    # No [collector] here: TLS is on, and the line says what the collector needs.
    found = node("")
    assert found["exporter"].startswith(f"WARN {url}: TLS is on")
    assert 'the collector needs [collector] scheme = "https" and tls_ca_file' in found["exporter"]

    found = node(collector_section(protected, basic_auth_username="", basic_auth_password_file=""))
    assert found["exporter"] == (
        f"WARN {url}: HTTP 401, basic auth is on; the collector needs [collector] "
        "basic_auth_username and basic_auth_password_file"
    )

    other_ca = make_pki(tmp_path / "other-pki").ca
    found = node(collector_section(protected, tls_ca_file=str(other_ca)))
    assert found["exporter"].startswith(f"FAIL {url}: TLS verify failed")

    # Basic auth without TLS on every address: passwords cross the network in clear.
    auth_only = write_web_config(
        tmp_path / "auth.yml",
        {"basic_auth_users": tls_auth_config(protected.pki)["basic_auth_users"]},
    )
    config.write_text(
        f'[exporter]\nport = {free_port()}\nlisten_address = "0.0.0.0"\n'
        f'web_config_file = "{auth_only}"\n'
    )
    found = doctor(config, "node")[1]
    assert found["exporter access"].startswith("WARN basic auth without TLS on 0.0.0.0")
    assert found["exporter"].startswith("FAIL http://127.0.0.1:")  # nothing listens there


def test_a_certificate_without_the_collectors_name_fails_the_head_not_the_node(
    tmp_path: Path, protected: Protected
) -> None:
    """The test certificate names 127.0.0.1 and localhost, not 127.0.0.2 (loopback too). The
    node checks its page whatever address it is reached by; the head checks the name it uses."""
    port = free_port()
    argv = sing("exporter", "--fake", "--web.listen-address", f"127.0.0.2:{port}",
                "--web.config.file", str(protected.web_config))  # fmt: skip
    config = tmp_path / "sing.toml"
    with running(argv, tmp_path / "exporter.log"):
        wait_for(lambda: "TLS" in (tmp_path / "exporter.log").read_text(), what="exporter")
        config.write_text(
            f'[site]\nwarehouse = "wh"\n[exporter]\nport = {port}\nlisten_address = "127.0.0.2"\n'
            f'web_config_file = "{protected.web_config}"\n'
            + collector_section(protected, targets=[f"127.0.0.2:{port}"])
        )
        node = doctor(config, "node")[1]
        code, head = doctor(config, "head")
    assert node["exporter"].startswith(f"OK https://127.0.0.2:{port}/metrics serves GPU metrics")
    assert code == 1
    assert head["scrape targets"] == (
        "FAIL none of 1 target(s) answers: 127.0.0.2: TLS: IP address mismatch, certificate is "
        "not valid for '127.0.0.2'; reach the exporter by a name its certificate holds, "
        "or add this one to it"
    )
