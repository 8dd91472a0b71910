"""How the collector connects to its targets: TLS trust, client certificate and basic auth, and
one GET of a page with a deadline and a size limit (`fetch`).

The settings mirror a Prometheus scrape config's `tls_config` and `basic_auth`, so an exporter
protected with `--web.config.file` is scraped by sing's collector and by Prometheus alike. One
client serves every target (as one Prometheus job does); `https` targets are verified against
`tls_ca_file`, else the system's trust store, and the certificate must name the host the
target is reached by. The password is read from a file once, at start, so it never sits in the
site config. TLS and basic auth settings need `scheme = "https"`: a password sent over plain
HTTP is a password given away, so such a config is refused, and so is (per target) a file_sd
group whose `__scheme__: http` would downgrade a secured site.
"""

from __future__ import annotations

import base64
import functools
import http.client
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from sing.collector.settings import CollectorSettings
from sing.config import Config
from sing.errors import UserError


@dataclass(frozen=True)
class ScrapeClient:
    """The TLS context for https targets and the Authorization header, if any."""

    tls: ssl.SSLContext | None = None  # None: the system's trust store, no client certificate
    authorization: str | None = None

    def context(self) -> ssl.SSLContext:
        return self.tls or system_context()

    @property
    def secured(self) -> bool:
        """Whether TLS or basic auth is configured, so plain http targets are refused."""
        return self.tls is not None or self.authorization is not None

    @classmethod
    def from_settings(cls, s: CollectorSettings, config: Config) -> ScrapeClient:
        """The client the [collector] section describes (checked by `CollectorSettings`); a
        file that cannot be read is a UserError."""
        where = "[collector]"
        tls = None
        if s.tls_ca_file or s.tls_cert_file:
            ca = config.resolve_path(s.tls_ca_file) if s.tls_ca_file else None
            try:
                tls = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as err:
                raise UserError(f"{where} tls_ca_file {ca}: {err}") from err
        if tls is not None and s.tls_cert_file:
            cert, key = config.resolve_path(s.tls_cert_file), config.resolve_path(s.tls_key_file)
            try:
                tls.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as err:
                raise UserError(f"{where} cannot load tls_cert_file {cert}: {err}") from err
        authorization = None
        if s.basic_auth_username:
            path = config.resolve_path(s.basic_auth_password_file)
            try:
                password = path.read_text().rstrip("\r\n")
            except OSError as err:
                raise UserError(f"{where} basic_auth_password_file {path}: {err.strerror}") from err
            pair = f"{s.basic_auth_username}:{password}".encode()
            authorization = "Basic " + base64.b64encode(pair).decode()
        return cls(tls, authorization)


@functools.cache
def system_context() -> ssl.SSLContext:
    """One verifying context for every target without settings of its own (loading the
    system's certificates takes milliseconds, too long to repeat per target)."""
    return ssl.create_default_context()


PLAIN = ScrapeClient()


CHUNK = 256 * 1024


class PayloadError(Exception):
    """The target answered, but not with something we accept (status, size, encoding)."""


def fetch(url: str, timeout_s: float, max_bytes: int, client: ScrapeClient = PLAIN) -> str:
    """GET `url`; the whole exchange must finish within `timeout_s` and `max_bytes`."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "http" and client.secured:
        raise PayloadError(
            "refused plain http: [collector] sets TLS or basic auth (a file_sd __scheme__: http?)"
        )
    if parts.scheme == "http":
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    elif parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            parts.hostname, parts.port or 443, timeout=timeout_s, context=client.context()
        )
    else:
        raise PayloadError(f"unsupported scheme {parts.scheme!r} (http or https)")
    headers = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}
    if client.authorization:
        headers["Authorization"] = client.authorization
    try:
        conn.request(
            "GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers
        )
        sock = conn.sock  # the response closes conn.sock early; the deadline needs the socket
        response = conn.getresponse()
        if response.status != 200:
            raise PayloadError(f"HTTP {response.status} {response.reason}")
        length = response.getheader("Content-Length")
        if length and int(length) > max_bytes:
            raise PayloadError(f"payload of {int(length)} bytes exceeds the {max_bytes} limit")
        chunks, size = [], 0
        # Each read may wait only what is left of the deadline. The timeout is set before a
        # read, never after one: the read that completes the body closes the socket (Python
        # 3.13 does so at once, and a settimeout then fails with EBADF).
        while not response.isclosed():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete payload within {timeout_s:g} s")
            sock.settimeout(remaining)
            chunk = response.read1(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise PayloadError(f"payload exceeds the {max_bytes} byte limit")
            chunks.append(chunk)
    finally:
        conn.close()
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as err:
        raise PayloadError(f"payload is not UTF-8 text: {err}") from None
