"""The exporter's `--web.config.file`: parsing, TLS, client certificates and basic auth, through
real sockets and real clients (urllib with `ssl`), with certificates made at test time."""

from __future__ import annotations

import argparse
import base64
import contextlib
import ipaddress
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry, Gauge

from sing.config import Config
from sing.errors import UserError
from sing.exporters.basicauth import BasicAuth, Busy
from sing.exporters.cli import _settings, add_arguments
from sing.exporters.web import MAX_PER_CLIENT, MetricsServer, serve
from sing.exporters.webconfig import WebConfig, WebConfigError, load_web_config
from tests.pki import Pki, _cert, _key, _write, make_pki
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "correct horse battery staple"


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def write_web_config(path: Path, config: dict) -> Path:
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def tls_auth_config(pki: Pki, **tls: object) -> dict:
    """TLS with the test server certificate, and user `prometheus` with PASSWORD."""
    return {
        "tls_server_config": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            **tls,
        },
        "basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)},
    }


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(url: str, context: ssl.SSLContext | None = None, auth: str | None = None):
    """(status, headers, body) of a GET; HTTP errors are answers, not exceptions."""
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator:
    """Start servers of a registry holding `known_value 42` under a web config dict."""
    servers: list[MetricsServer] = []
    registry = CollectorRegistry()
    Gauge("known_value", "A value the test checks.", registry=registry).set(42)

    def start(config: dict) -> int:
        port = free_port()
        web = load_web_config(write_web_config(tmp_path / f"web-{port}.yml", config))
        servers.append(serve(registry, "127.0.0.1", port, web))
        return port

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tls_server_config": {}, "basic_auth_user": {}}, "unknown key 'basic_auth_user'"),
        ({"tls_server_config": {"certfile": "x"}}, "unknown key 'certfile'"),
        ({"http_server_config": {"headers": {"X-Powered-By": "sing"}}}, "can not be configured"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "deny, sameorigin"),
        ({"basic_auth_users": {"alice": "secret"}}, "not a bcrypt hash"),
        ({"basic_auth_users": {"alice": "$2y$10$tooshort"}}, "not a bcrypt hash"),
        ({"basic_auth_users": ["alice"]}, "expected a mapping"),
        ({"rate_limit": {"interval": "1s", "burst": 20}}, "rate_limit is not supported"),
        ({"tls_server_config": {"cert_file": "server.pem"}}, "both cert_file and key_file"),
        ({"tls_server_config": {"cert_file": "nope.pem", "key_file": "nope.key"}}, "nope.pem"),
        ({"tls_server_config": {"cert_file": 5, "key_file": "k"}}, "cert_file must be a str"),
    ],
)
def test_bad_web_configs_are_refused_with_the_reason(
    tmp_path: Path, config: dict, message: str
) -> None:
    with pytest.raises(WebConfigError, match=message):
        load_web_config(write_web_config(tmp_path / "web.yml", config))


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"client_auth_type": "RequireAnyClientCert"}, "accepts unverified certificates"),
        ({"client_auth_type": "RequireAndVerifyClientCert"}, "needs client_ca_file"),
        ({"client_auth_type": "Sometimes"}, "not one of"),
        ({"client_ca_file": "ca.pem"}, "client_auth_type is NoClientCert"),
        ({"min_version": "TLS14"}, "min_version 'TLS14'"),
        ({"cipher_suites": ["TLS_AES_128_GCM_SHA256"]}, "cipher_suites is not supported"),
        ({"client_allowed_sans": ["a"]}, "client_allowed_sans needs RequireAndVerifyClientCert"),
        ({"cert": "-----BEGIN CERTIFICATE-----"}, "inline cert is not supported"),
    ],
)
def test_tls_settings_that_cannot_be_enforced_are_refused(
    tmp_path: Path, pki: Pki, tls: dict, message: str
) -> None:
    config = tls_auth_config(pki, **tls)
    with pytest.raises(WebConfigError, match=message):
        load_web_config(write_web_config(tmp_path / "web.yml", config))


def test_missing_and_malformed_files_are_refused(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(WebConfigError, match="cannot read it"):
        load_web_config(tmp_path / "absent.yml")
    (tmp_path / "bad.yml").write_text("tls_server_config: [unclosed\n")
    with pytest.raises(WebConfigError, match="not valid YAML"):
        load_web_config(tmp_path / "bad.yml")
    config = tls_auth_config(pki)
    config["tls_server_config"]["key_file"] = str(pki.client_key)  # not the cert's key
    with pytest.raises(WebConfigError, match="cannot load cert_file"):
        load_web_config(write_web_config(tmp_path / "web.yml", config))


def test_relative_paths_are_relative_to_the_web_config_file(pki: Pki) -> None:
    config = {"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key"}}
    web = load_web_config(write_web_config(pki.dir / "web.yml", config))
    assert web.tls is not None and web.describe().startswith("TLS")


# --- serving ---------------------------------------------------------------------------------


def test_basic_auth_refuses_wrong_and_missing_passwords(served) -> None:
    headers = {"X-Content-Type-Options": "nosniff"}
    port = served(
        {
            "basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)},
            "http_server_config": {"headers": headers},
        }
    )
    url = f"http://127.0.0.1:{port}/metrics"
    status, headers, _ = get(url)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert get(url, auth=basic("prometheus", "wrong"))[0] == 401
    assert get(url, auth=basic("nobody", PASSWORD))[0] == 401
    assert get(url, auth="Basic !!!notbase64")[0] == 401
    status, headers, body = get(url, auth=basic("prometheus", PASSWORD))
    assert status == 200 and "known_value 42.0" in body
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_bcrypt_runs_once_per_credentials_and_floods_do_not_evict_them() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash(PASSWORD).encode()}, cache_size=4)
    good = basic("prometheus", PASSWORD)
    assert all(auth.allows(good) for _ in range(20))
    assert auth.bcrypt_runs == 1
    for i in range(10):  # more wrong passwords than the cache holds
        assert not auth.allows(basic("prometheus", f"guess{i}"))
    assert auth.allows(good) and auth.bcrypt_runs == 11
    assert not auth.allows(basic("prometheus", "x" * 100))  # over bcrypt's 72 bytes: refused
    assert not auth.allows(None) and not auth.allows("Bearer abc")


def test_the_decoy_for_unknown_users_costs_as_much_as_the_dearest_known_hash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Else a wrong password for a known user at cost 12 takes longer than one for a user that
    does not exist, and the timing tells which names exist."""
    users = {"collector": bcrypt_hash(PASSWORD, cost=7), "prometheus": bcrypt_hash("x", cost=5)}
    web = load_web_config(write_web_config(tmp_path / "web.yml", {"basic_auth_users": users}))
    assert "bcrypt costs differ (collector 7, prometheus 5)" in caplog.text
    auth = BasicAuth(web.users)
    assert auth._decoy.startswith(b"$2b$07$")
    assert not auth.allows(basic("nobody", PASSWORD))
    caplog.clear()
    same = {"collector": bcrypt_hash(PASSWORD, cost=5), "prometheus": bcrypt_hash("x", cost=5)}
    assert BasicAuth(load_web_config(write_web_config(
        tmp_path / "same.yml", {"basic_auth_users": same}
    )).users)._decoy.startswith(b"$2b$05$")  # fmt: skip
    assert "costs differ" not in caplog.text


def test_a_client_waits_for_at_most_one_bcrypt_and_never_queues_a_second() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash(PASSWORD, cost=12).encode()})
    slow = threading.Thread(target=auth.allows, args=(basic("prometheus", "guess"), "10.0.0.9"))
    slow.start()
    deadline = time.monotonic() + 10
    while auth.bcrypt_runs == 0 and time.monotonic() < deadline:  # its bcrypt has begun
        time.sleep(0.005)
    with pytest.raises(Busy):  # the same client again: refused at once, not queued
        auth.allows(basic("prometheus", "another guess"), "10.0.0.9")
    slow.join()
    assert auth.bcrypt_runs == 1


def connect_from(source: str, port: int) -> socket.socket:
    """A connection to 127.0.0.1:port from `source`, another loopback address (all of 127/8
    is loopback on Linux), standing for another client machine."""
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def raw_get(port: int, auth: str, source: str = "127.0.0.1") -> int:
    """The status of a GET /metrics from `source`; 0 when closed without an answer."""
    with connect_from(source, port) as sock:
        sock.sendall(f"GET /metrics HTTP/1.0\r\nAuthorization: {auth}\r\n\r\n".encode())
        try:
            status = sock.makefile("rb").readline().split()[1:2]
        except ConnectionResetError:
            return 0
        return int(status[0]) if status else 0


def test_a_flood_of_wrong_passwords_does_not_starve_the_scraper(served) -> None:
    """After a restart nothing is cached: the scraper's first check must not wait behind a
    queue of bcrypt runs for other clients' guesses; those get 429 instead."""
    port = served({"basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD, cost=8)}})
    statuses: list[int] = []
    done = threading.Event()

    def attack(source: str) -> None:
        while not done.is_set():
            statuses.append(raw_get(port, basic("prometheus", os.urandom(8).hex()), source))

    attackers = [threading.Thread(target=attack, args=(f"127.0.0.{2 + i % 3}",)) for i in range(9)]
    for thread in attackers:
        thread.start()
    time.sleep(1)
    started, status = time.monotonic(), 429
    while status == 429 and time.monotonic() - started < 5:
        status = raw_get(port, basic("prometheus", PASSWORD))
    waited = time.monotonic() - started
    done.set()
    for thread in attackers:
        thread.join()
    assert status == 200 and waited < 3, (status, waited)
    assert 429 in statuses and 401 in statuses, Counter(statuses)


def server_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def closed(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closes `sock` within wait_s."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_trickling_clients_hold_few_threads_and_are_cut_at_the_deadline(tmp_path: Path) -> None:
    """Slowloris: connections sending a byte now and then, each under the per-recv timeout."""
    port, users = free_port(), {"prometheus": bcrypt_hash(PASSWORD).encode()}
    server = serve(CollectorRegistry(), "127.0.0.1", port, WebConfig(users=users))
    server.request_deadline_s = 3.0
    try:
        slow = [connect_from("127.0.0.2", port) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"G")
        time.sleep(0.3)
        assert server_threads() <= MAX_PER_CLIENT
        waited = time.monotonic() + 2
        while len(closing := select.select(slow, [], [], 0.1)[0]) < 20 - MAX_PER_CLIENT:
            assert time.monotonic() < waited, f"only {len(closing)} refused"  # EOF/reset: readable
        held = [sock for sock in slow if sock not in closing]
        assert len(held) == MAX_PER_CLIENT  # the others were closed at once
        assert raw_get(port, basic("prometheus", PASSWORD)) == 200  # other clients get in
        for _ in range(10):  # a byte every 0.5 s for 5 s: under the 10 s per-recv timeout
            time.sleep(0.5)
            for sock in held:
                with contextlib.suppress(OSError):  # cut already
                    sock.sendall(b"E")
        assert all(closed(sock, 0.5) for sock in held)  # the 3 s deadline cut them
        server.max_connections = 12
        many = [connect_from(f"127.0.0.{2 + i % 3}", port) for i in range(24)]
        time.sleep(0.3)
        assert server_threads() <= 12
        assert sum(closed(sock, 0.1) for sock in many) >= 12
    finally:
        server.shutdown()
        server.server_close()


def test_tls_is_required_when_configured(served, pki: Pki) -> None:
    port = served(tls_auth_config(pki))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(f"http://127.0.0.1:{port}/metrics", auth=basic("prometheus", PASSWORD))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(f"https://127.0.0.1:{port}/metrics", context=ssl.create_default_context())
    https = f"https://127.0.0.1:{port}/metrics"
    assert get(https, client_context(pki))[0] == 401
    status, _, body = get(https, client_context(pki), basic("prometheus", PASSWORD))
    assert status == 200 and "known_value 42.0" in body


def test_a_client_certificate_is_required_when_client_auth_type_says_so(served, pki: Pki) -> None:
    port = served(
        tls_auth_config(
            pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)
        )
    )
    url, auth = f"https://127.0.0.1:{port}/metrics", basic("prometheus", PASSWORD)
    for context in (client_context(pki), client_context(pki, pki.stranger_cert, pki.stranger_key)):
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            get(url, context, auth)
    status, _, body = get(url, client_context(pki, pki.client_cert, pki.client_key), auth)
    assert status == 200 and "known_value 42.0" in body


def test_client_allowed_sans_refuse_other_certificates(served, pki: Pki) -> None:
    tls = {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    allowed = served(tls_auth_config(pki, **tls, client_allowed_sans=["collector.test"]))
    other = served(tls_auth_config(pki, **tls, client_allowed_sans=["prometheus.test"]))
    context = client_context(pki, pki.client_cert, pki.client_key)
    auth = basic("prometheus", PASSWORD)
    assert get(f"https://127.0.0.1:{allowed}/metrics", context, auth)[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(f"https://127.0.0.1:{other}/metrics", context, auth)


@pytest.mark.parametrize(
    ("san", "allowed", "accepted"),
    [
        (x509.IPAddress(ipaddress.ip_address("2001:db8::1")), "2001:db8::1", True),
        (x509.IPAddress(ipaddress.ip_address("2001:db8::1")), "2001:DB8:0:0:0:0:0:1", True),
        (x509.IPAddress(ipaddress.ip_address("10.0.0.1")), "10.0.0.1", True),
        (x509.IPAddress(ipaddress.ip_address("2001:db8::2")), "2001:db8::1", False),
        (x509.DNSName("10.0.0.1"), "10.0.0.1", False),  # a DNS name is not an IP address
        (x509.IPAddress(ipaddress.ip_address("10.0.0.1")), "collector.test", False),
        (x509.DNSName("collector.test"), "collector.test", True),
    ],
)
def test_client_allowed_sans_compare_ip_addresses_as_addresses_and_by_type(
    served, pki: Pki, tmp_path: Path, san: x509.GeneralName, allowed: str, accepted: bool
) -> None:
    ca = (
        x509.load_pem_x509_certificate(pki.ca.read_bytes()).subject,
        serialization.load_pem_private_key(pki.ca.with_suffix(".key").read_bytes(), None),
    )
    key = _key()
    _write(tmp_path / "peer", _cert("peer", key, ca, [san]), key)  # fmt: skip
    tls = {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    port = served(tls_auth_config(pki, **tls, client_allowed_sans=[allowed]))
    context = client_context(pki, tmp_path / "peer.pem", tmp_path / "peer.key")
    url, auth = f"https://127.0.0.1:{port}/metrics", basic("prometheus", PASSWORD)
    if accepted:
        assert get(url, context, auth)[0] == 200
    else:
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(url, context, auth)


def test_a_client_stuck_in_its_handshake_does_not_block_scrapes(served, pki: Pki) -> None:
    port = served(tls_auth_config(pki))
    with socket.create_connection(("127.0.0.1", port)):  # connects, never says hello
        started = time.monotonic()
        status, _, _ = get(
            f"https://127.0.0.1:{port}/metrics", client_context(pki), basic("prometheus", PASSWORD)
        )
        assert status == 200 and time.monotonic() - started < 2


def test_the_exporter_refuses_to_start_on_a_bad_web_config(tmp_path: Path) -> None:
    web = write_web_config(tmp_path / "web.yml", {"basic_auth_users": {"alice": "plaintext"}})
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "sing.exporters", "--fake", "--duration", "5",
         "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "not a bcrypt hash" in result.stderr and "'alice'" in result.stderr


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["--web.listen-address", ":9500"], ("0.0.0.0", 9500)),
        (["--web.listen-address", "10.1.2.3:9500"], ("10.1.2.3", 9500)),
        (["--web.listen-address", "[::1]:9500"], ("::1", 9500)),
        ([], ("127.0.0.1", 9410)),  # the safe default: nothing leaves the node
        (["--web.listen-address", "9500"], "expected HOST:PORT"),
        (["--web.listen-address", ":\u00b2"], "expected HOST:PORT"),  # a digit to isdigit()
        (["--web.listen-address", ":9500", "--port", "1"], "give one"),
    ],
)
def test_listen_address_options(argv: list[str], where: tuple | str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    if isinstance(where, str):
        with pytest.raises(UserError, match=where):
            _settings(args, Config({}))
    else:
        settings = _settings(args, Config({}))
        assert (settings.listen_address, settings.port) == where


def test_web_config_file_in_the_site_config_is_relative_to_it(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = Config({"exporter": {"web_config_file": "web.yml"}}, tmp_path / "sing.toml")
    settings = _settings(parser.parse_args([]), config)
    assert settings.web_config_file == str(tmp_path / "web.yml")
    settings = _settings(parser.parse_args(["--web.config.file", "other.yml"]), config)
    assert settings.web_config_file == "other.yml"  # the command line's, relative to the CWD


def test_serving_the_network_in_clear_is_warned_about(tmp_path: Path) -> None:
    def stderr(address: str, *extra: str) -> str:
        argv = [sys.executable, "-m", "sing.exporters", "--fake", "--duration", "1",
                "--web.listen-address", f"{address}:{free_port()}", *extra]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stderr

    auth_only = write_web_config(
        tmp_path / "web.yml", {"basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)}}
    )
    assert "with neither TLS nor authentication" in stderr("0.0.0.0")
    assert "passwords cross the network in clear" in stderr(
        "0.0.0.0", "--web.config.file", str(auth_only)
    )
    assert "WARNING" not in stderr("127.0.0.1")
