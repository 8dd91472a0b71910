"""The collector against real processes: `sing exporter --fake` nodes, and HTTP servers that are
dead, slow, broken or huge. Each test runs `sing collector` as a user would, as a subprocess,
and reads the warehouse back."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from sing.cli.collector import target_source
from sing.collector.client import ScrapeClient
from sing.collector.scrape import fetch_page
from sing.collector.settings import CollectorSettings
from sing.config import Config
from sing.errors import UserError
from sing.warehouse.store import Warehouse
from tests.pki import Pki, make_pki
from tests.ports import free_port
from tests.test_exporter_web import PASSWORD, bcrypt_hash, write_web_config

REPO = Path(__file__).resolve().parents[1]

# Two fake nodes with 4 GPUs: GPUs 0-1 run job 101, GPU 2 job 102, GPU 3 is free; one IB port
# sending 1 GB/s and receiving 2 GB/s.
NODE_YAML = """\
model: NVIDIA H200
count: 4
memory_total: 150754820096
defaults:
  util: {pattern: sine, min: 0.5, max: 0.5, period_s: 60}
  memory_used: 1.0e+9
  power_w: 300
  energy_j: 0
  temperature_c: 50
gpus:
  0: {job_id: "101", util: {pattern: sine, min: 0.25, max: 0.25, period_s: 60}}
  1: {job_id: "101"}
  2: {job_id: "102"}
rdma:
  mlx5_0/1:
    rate: 400 Gb/sec (4X NDR)
    link_layer: InfiniBand
    tx_bytes_per_s: 1.0e+9
    rx_bytes_per_s: 2.0e+9
"""


def wait_for(check, timeout_s: float = 20.0, what: str = "condition"):
    """Poll `check` until it returns something truthy (returned) or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if result:
                return result
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@contextmanager
def running(argv: list[str], log: Path, env: dict[str, str] | None = None, **kw) -> Iterator:
    """A subprocess in its own session, logging to `log`, stopped by its PID afterwards."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            **kw,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def sing(*args: str) -> list[str]:
    return [sys.executable, "-m", "sing.cli", *args]


def collector_once(config: Path, wh: Path) -> subprocess.CompletedProcess:
    """One `sing collector --once` round of the site `config` into the warehouse `wh`."""
    return subprocess.run(
        sing("--config", str(config), "--warehouse", str(wh), "collector", "--once"),
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def exporter(tmp_path_factory) -> Iterator[dict[str, int]]:
    """One `sing exporter --fake` process serving nodes a and b; {node: port}."""
    with fake_exporter(tmp_path_factory.mktemp("exporter"), ["a", "b"]) as ports:
        yield ports


@contextmanager
def fake_exporter(base: Path, names: list[str]) -> Iterator[dict[str, int]]:
    """One `sing exporter --fake` process serving `names`, each a NODE_YAML node on a port of
    its own, up and answering; {node: port}."""
    (base / "node.yaml").write_text(NODE_YAML)
    ports = {name: free_port() for name in names}
    nodes = [f"--node={name}:{port}" for name, port in ports.items()]
    argv = sing(
        "exporter",
        "--fake",
        str(base / "node.yaml"),
        "--listen-address=127.0.0.1",
        "--cache-seconds=0.05",
    )
    with running([*argv, *nodes], base / "exporter.log"):
        for port in ports.values():
            wait_for(lambda p=port: http_get(f"http://127.0.0.1:{p}/metrics"), what="exporter")
        yield ports


@dataclass(frozen=True)
class SecureExporter:
    """A `sing exporter --fake` node "s" requiring TLS, a client certificate and basic auth."""

    port: int
    pki: Pki
    password_file: Path  # holds PASSWORD, user "prometheus"


@pytest.fixture(scope="module")
def secure_exporter(tmp_path_factory) -> Iterator[SecureExporter]:
    base = tmp_path_factory.mktemp("secure")
    pki = make_pki(base / "pki")
    (base / "node.yaml").write_text(NODE_YAML)
    (base / "password").write_text(PASSWORD + "\n")
    web = {
        "tls_server_config": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki.ca),
        },
        "basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD, cost=10)},
    }
    port = free_port()
    argv = sing(
        "exporter", "--fake", str(base / "node.yaml"), "--cache-seconds=0.05",
        "--web.listen-address", f"127.0.0.1:{port}",
        "--web.config.file", str(write_web_config(base / "web.yml", web)),
    )  # fmt: skip
    with running(argv, base / "exporter.log"):
        wait_for(lambda: "TLS" in (base / "exporter.log").read_text(), what="secure exporter")
        wait_for(lambda: socket.create_connection(("127.0.0.1", port)).close() or True)
        yield SecureExporter(port, pki, base / "password")


class FaultHandler(BaseHTTPRequestHandler):
    """Serves one kind of bad target, chosen by the server's `mode`."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "error":
            self.send_error(500, "exporter crashed")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        if mode == "slow":  # answers at once, then trickles forever
            for _ in range(300):
                self.wfile.write(b"# still here\n")
                self.wfile.flush()
                time.sleep(0.2)
        elif mode == "garbage":
            self.wfile.write(b'# HELP x\nsing_gpu_power_watts{gpu="0",uuid="u" 301\n')
        elif mode == "binary":
            self.wfile.write(bytes(range(128, 256)) * 10)
        elif mode == "huge":  # valid text, no Content-Length, 40 MB
            line = b"# padding " + b"x" * 1000 + b"\n"
            for _ in range(40_000):
                self.wfile.write(line)

    def log_message(self, *args) -> None:
        pass


def serve_faults(modes: dict[str, int]) -> None:
    """Run one server per fault mode (in this process) until killed."""
    for mode, port in modes.items():
        server = ThreadingHTTPServer(("127.0.0.1", port), FaultHandler)
        server.daemon_threads = True
        server.mode = mode  # type: ignore[attr-defined]
        Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(60)


@pytest.fixture(scope="module")
def fault_servers(tmp_path_factory) -> Iterator[dict[str, int]]:
    base = tmp_path_factory.mktemp("faults")
    modes = {m: free_port() for m in ("slow", "garbage", "binary", "huge", "error")}
    code = f"from tests.test_collector_scrape import serve_faults; serve_faults({modes!r})"
    with running([sys.executable, "-c", code], base / "faults.log"):
        wait_for(lambda: "ready" in (base / "faults.log").read_text(), what="fault servers")
        yield modes


def write_config(path: Path, file_sd: Path, **collector: object) -> Path:
    lines = ["[collector]", f'file_sd = "{file_sd}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in collector.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def file_sd_entry(node: str, port: int) -> dict:
    return {"targets": [f"127.0.0.1:{port}"], "labels": {"node": node}}


def test_one_round_records_bad_targets_and_keeps_the_good(
    tmp_path: Path, exporter: dict[str, int], fault_servers: dict[str, int]
) -> None:
    groups = [file_sd_entry(n, p) for n, p in exporter.items()]
    groups += [file_sd_entry(mode, port) for mode, port in fault_servers.items()]
    groups.append(file_sd_entry("dead", free_port()))
    (tmp_path / "targets.json").write_text(json.dumps(groups))
    config = write_config(
        tmp_path / "sing.toml",
        tmp_path / "targets.json",
        scrape_timeout_s=1.5,
        max_payload_bytes=1_000_000,
    )
    result = collector_once(config, tmp_path / "wh")
    assert result.returncode == 0, result.stderr
    assert "2/8 targets up" in result.stdout

    con = Warehouse(tmp_path / "wh").connect()
    scrapes = dict(con.execute("SELECT node, error FROM scrapes").fetchall())
    assert scrapes["a"] is None and scrapes["b"] is None
    assert scrapes["dead"] == "connection refused"
    assert scrapes["slow"].startswith("timeout")
    # the trickling target was cut at its timeout (it would trickle forever), not at the round's
    (slow_s,) = con.execute("SELECT duration_s FROM scrapes WHERE node = 'slow'").fetchone()
    assert 1.5 <= slow_s < 10
    assert scrapes["garbage"].startswith("malformed payload: line 2: unterminated label set")
    assert "not UTF-8" in scrapes["binary"]
    assert "exceeds the 1000000 byte limit" in scrapes["huge"]
    assert scrapes["error"] == "PayloadError: HTTP 500 exporter crashed"
    huge_url = f"http://127.0.0.1:{fault_servers['huge']}/metrics"
    assert f"scrape of {huge_url} (huge) failed: PayloadError: payload exceeds" in result.stderr

    gpus = con.execute(
        "SELECT node, gpu_index, util, mem_used_bytes, power_w, job_id FROM gpu_samples "
        "ORDER BY node, gpu_index"
    ).fetchall()
    assert [(n, i, j) for n, i, _, _, _, j in gpus] == [
        (node, i, job) for node in "ab" for i, job in enumerate(["101", "101", "102", None])
    ]
    assert [round(u, 3) for _, _, u, _, _, _ in gpus[:4]] == [0.25, 0.5, 0.5, 0.5]
    assert {(m, p) for _, _, _, m, p, _ in gpus} == {(1_000_000_000, 300.0)}
    rdma = con.execute(
        "SELECT node, device, port, job_id FROM rdma_samples ORDER BY node"
    ).fetchall()
    assert rdma == [("a", "mlx5_0", 1, "101"), ("b", "mlx5_0", 1, "101")]  # majority job


def test_daemon_follows_file_sd_serves_metrics_and_computes_rates(
    tmp_path: Path, exporter: dict[str, int]
) -> None:
    targets = tmp_path / "targets.yaml"
    targets.write_text(json.dumps([file_sd_entry("a", exporter["a"])]))
    metrics_port = free_port()
    config = write_config(
        tmp_path / "sing.toml", targets, interval_s=0.5, metrics_port=metrics_port
    )
    wh = Warehouse(tmp_path / "wh")
    argv = sing("--config", str(config), "--warehouse", str(wh.root), "collector")

    def nodes_seen() -> set[str]:
        return {n for (n,) in wh.connect().execute("SELECT DISTINCT node FROM scrapes").fetchall()}

    with running(argv, tmp_path / "collector.log"):
        wait_for(lambda: nodes_seen() == {"a"}, what="node a")
        # YAML this time (file_sd may be either); the collector notices the change.
        targets.write_text(
            f"- targets: ['127.0.0.1:{exporter['b']}']\n  labels: {{node: b}}\n"
            f"- targets: ['127.0.0.1:{exporter['a']}']\n  labels: {{node: a}}\n"
        )
        wait_for(lambda: nodes_seen() == {"a", "b"}, what="node b")
        wait_for(
            lambda: wh.connect().execute("SELECT count(*) FROM rdma_samples").fetchone()[0] >= 12,
            what="several rounds",
        )
        metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")

    assert "sing_collector_rounds_total" in metrics
    rounds = float(metrics.split("\nsing_collector_rounds_total ")[1].split()[0])
    assert rounds >= 4
    assert 'sing_collector_rows_written_total{table="gpu_samples"}' in metrics
    assert "sing_collector_scrape_duration_seconds_bucket" in metrics
    # The RDMA deltas add up to the fake port's 1 GB/s out and 2 GB/s in.
    rates = (
        wh.connect()
        .execute(
            """
        SELECT node, sum(tx_delta_bytes) / epoch(max(ts) - min(ts)),
               sum(rx_delta_bytes) / epoch(max(ts) - min(ts)), count(tx_delta_bytes)
        FROM rdma_samples GROUP BY node
        """
        )
        .fetchall()
    )
    for node, tx, rx, deltas in rates:
        assert deltas >= 3, node
        assert tx == pytest.approx(1e9, rel=0.25) and rx == pytest.approx(2e9, rel=0.25)
    (negative,) = (
        wh.connect()
        .execute("SELECT count(*) FROM rdma_samples WHERE tx_delta_bytes < 0 OR rx_delta_bytes < 0")
        .fetchone()
    )
    assert negative == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not: [valid", "cannot read it"),
        ('{"targets": ["h:1"]}', "expected a list of target groups"),
        ('[{"labels": {}}]', "group 1 needs a 'targets' list"),
    ],
)
def test_bad_file_sd_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "targets.json").write_text(content)
    result = subprocess.run(
        sing("--warehouse", str(tmp_path / "wh"), "collector", "--once", "--file-sd",
             str(tmp_path / "targets.json")),
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"sing: file_sd file {tmp_path / 'targets.json'}: {message}" in result.stderr


def secure_config(path: Path, secure: SecureExporter, **overrides: object) -> Path:
    """A collector config scraping the secure exporter by host:port over https."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "targets.json").write_text(json.dumps([file_sd_entry("s", secure.port)]))
    settings = {
        "scheme": "https",
        "tls_ca_file": str(secure.pki.ca),
        "tls_cert_file": str(secure.pki.client_cert),
        "tls_key_file": str(secure.pki.client_key),
        "basic_auth_username": "prometheus",
        "basic_auth_password_file": str(secure.password_file),
        **overrides,
    }
    return write_config(path, path.parent / "targets.json", **settings)


def test_collector_scrapes_an_exporter_over_tls_with_client_cert_and_basic_auth(
    tmp_path: Path, secure_exporter: SecureExporter
) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not the password\n")
    runs = {
        "good": secure_config(tmp_path / "good" / "sing.toml", secure_exporter),
        "wrong_password": secure_config(
            tmp_path / "wrong_password" / "sing.toml",
            secure_exporter,
            basic_auth_password_file=str(wrong),
        ),
        "no_client_cert": secure_config(
            tmp_path / "no_client_cert" / "sing.toml",
            secure_exporter,
            tls_cert_file="",
            tls_key_file="",
        ),
        "untrusted": secure_config(
            tmp_path / "untrusted" / "sing.toml", secure_exporter, tls_ca_file=""
        ),
    }
    errors = {}
    for name, config in runs.items():
        wh = config.parent / "wh"
        result = collector_once(config, wh)
        assert ("1/1 targets up" if name == "good" else "0/1 targets up") in result.stdout, name
        con = Warehouse(wh).connect()
        ((url, errors[name]),) = con.execute("SELECT target, error FROM scrapes").fetchall()
        assert url == f"https://127.0.0.1:{secure_exporter.port}/metrics"
    assert errors["good"] is None
    assert errors["wrong_password"] == "PayloadError: HTTP 401 Unauthorized"
    assert "SSL" in errors["no_client_cert"] or "reset" in errors["no_client_cert"]
    assert "CERTIFICATE_VERIFY_FAILED" in errors["untrusted"]
    con = Warehouse(tmp_path / "good" / "wh").connect()
    gpus = con.execute("SELECT gpu_index, round(util, 3), job_id FROM gpu_samples ORDER BY 1")
    assert gpus.fetchall() == [(0, 0.25, "101"), (1, 0.5, "101"), (2, 0.5, "102"), (3, 0.5, None)]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"scheme": "ftp"}, "scheme must be http or https"),
        (
            {"scheme": "https", "tls_cert_file": "c.pem"},
            "tls_cert_file and tls_key_file go together",
        ),
        ({"scheme": "https", "tls_ca_file": "absent.pem"}, "tls_ca_file"),
        ({"scheme": "https", "basic_auth_username": "u"}, "basic_auth_password_file go together"),
        (
            {"scheme": "https", "basic_auth_username": "u", "basic_auth_password_file": "absent"},
            "No such file",
        ),
        ({"basic_auth_username": "u", "basic_auth_password_file": "pw"}, 'need scheme = "https"'),
        ({"scheme": "http", "tls_ca_file": "ca.pem"}, 'need scheme = "https"'),
    ],
)
def test_bad_scrape_client_settings_are_clear_errors(
    tmp_path: Path, settings: dict, message: str
) -> None:
    config = Config({}, tmp_path / "sing.toml")
    with pytest.raises(UserError, match=message):
        ScrapeClient.from_settings(CollectorSettings(**settings), config)


def test_a_file_sd_http_target_is_refused_not_sent_the_password(tmp_path: Path) -> None:
    """[collector] says https with basic auth; a file_sd group's `__scheme__: http` must not
    downgrade it: that target is a failed scrape and no connection is even made."""
    listener = socket.create_server(("127.0.0.1", 0))  # where the password would have gone
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    (tmp_path / "pw").write_text("secret\n")
    sd = tmp_path / "targets.json"
    sd.write_text(
        json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"__scheme__": "http"}}])
    )
    settings = CollectorSettings(
        file_sd=str(sd), scheme="https", basic_auth_username="u", basic_auth_password_file="pw"
    )
    (target,) = target_source(settings, Config({}, tmp_path / "sing.toml"))()
    assert target.url == f"http://127.0.0.1:{port}/metrics"
    result = fetch_page(target, timeout_s=2, max_bytes=10**6)
    assert result.error is not None and "refused plain http" in result.error
    with pytest.raises(TimeoutError), listener:
        listener.accept()
