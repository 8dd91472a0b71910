"""The exporter's HTTP(S) server: prometheus_client's WSGI app behind the web config's checks.

prometheus_client's own server does TLS by wrapping the listening socket, so each handshake
runs in the accepting thread and one client that never finishes its handshake stops every
scrape; and it has no basic authentication. Here each connection's handshake runs in that
connection's own thread under a timeout, client certificate SANs are checked right after it,
and a small WSGI layer refuses requests without valid credentials (401) and adds the configured
response headers. Rendering the page is prometheus_client's `make_wsgi_app`, unchanged.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from sing.exporters.basicauth import BasicAuth, Busy
from sing.exporters.webconfig import WebConfig

log = logging.getLogger(__name__)

# A client gets this long to finish its TLS handshake, then this long for its whole request.
TIMEOUT_S = 10.0
# Connections served at once (one thread each), in all and from one IP address; beyond them a
# new connection is closed at once, so slow clients cannot take every thread or all memory.
MAX_CONNECTIONS = 64
MAX_PER_CLIENT = 8

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Deadline(io.RawIOBase):
    """A socket's reading side that fails once `deadline` (time.monotonic) has passed, however
    the bytes trickle in: a timeout per recv alone lets one byte every few seconds hold on."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request not complete in time")
        self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape; a client must send its request within the server's
    request_deadline_s (wsgiref serves one request per connection)."""

    timeout = TIMEOUT_S
    server: MetricsServer

    def setup(self) -> None:
        super().setup()
        deadline = time.monotonic() + self.server.request_deadline_s
        self.rfile = io.BufferedReader(_Deadline(self.connection, deadline))

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer(ThreadingWSGIServer):
    """One thread per connection, up to max_connections (max_per_client from one address);
    with a TLS context, the handshake runs in that thread."""

    tls: ssl.SSLContext | None = None
    allowed_sans: frozenset[str] = frozenset()
    max_connections = MAX_CONNECTIONS
    max_per_client = MAX_PER_CLIENT
    request_deadline_s = TIMEOUT_S
    request_queue_size = MAX_CONNECTIONS  # listen backlog: socketserver's 5 drops bursts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: Counter[str] = Counter()  # connections being served, per client address
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        client = client_address[0]
        with self._open_lock:
            full = self._open.total() >= self.max_connections
            if not full and self._open[client] < self.max_per_client:
                self._open[client] += 1
                return super().process_request(request, client_address)  # starts its thread
        log.debug("refused %s: too many connections (%s)", client, "all" if full else "its own")
        self.shutdown_request(request)
        return None

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open[client_address[0]] -= 1
                if not self._open[client_address[0]]:
                    del self._open[client_address[0]]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up or misbehaves is its own problem: no traceback on stderr."""
        log.debug("error serving %s", client_address[0], exc_info=True)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            return super().finish_request(request, client_address)
        request.settimeout(TIMEOUT_S)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)  # the handshake, here
        except (OSError, ssl.SSLError) as err:
            log.debug("TLS handshake with %s failed: %s", client_address[0], err)
            return None
        try:
            if self.allowed_sans and not self._san_allowed(conn):
                log.warning("refused %s: no allowed SAN in its certificate", client_address[0])
                return None
            return super().finish_request(conn, client_address)
        finally:
            conn.close()

    def _san_allowed(self, conn: ssl.SSLSocket) -> bool:
        """Whether a SAN of the peer's certificate is allowed, compared by type: IP SANs as
        addresses (ssl writes 2001:DB8:0:0:0:0:0:1 for 2001:db8::1), the others as text."""
        ips = {_ip(name) for name in self.allowed_sans} - {None}
        names = {name for name in self.allowed_sans if _ip(name) is None}
        for kind, value in (conn.getpeercert() or {}).get("subjectAltName", ()):
            if (_ip(value) in ips) if kind == "IP Address" else (value in names):
                return True
        return False


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def protect(app: WsgiApp, web: WebConfig) -> WsgiApp:
    """`app` behind basic authentication (when users are set) and the configured headers."""
    auth = BasicAuth(web.users) if web.users else None
    extra = list(web.headers)

    def protected(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, headers + extra, exc_info)

        try:
            allowed = auth is None or auth.allows(
                environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR", "")
            )
        except Busy:
            start(
                "429 Too Many Requests",
                [("Retry-After", "1"), ("Content-Type", "text/plain; charset=utf-8")],
            )
            return [b"Busy checking other passwords; retry\n"]
        if not allowed:
            start(
                "401 Unauthorized",
                [("WWW-Authenticate", 'Basic realm="sing exporter", charset="UTF-8"'),
                 ("Content-Type", "text/plain; charset=utf-8")],
            )  # fmt: skip
            return [b"Unauthorized\n"]
        return app(environ, start)

    return protected


def serve(registry: CollectorRegistry, address: str, port: int, web: WebConfig) -> MetricsServer:
    """Serve `registry` on address:port in a daemon thread; OSError if it cannot listen."""
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class Server(MetricsServer):
        address_family = family

    app = protect(make_wsgi_app(registry), web)
    server = make_server(sockaddr[0], port, app, Server, handler_class=_QuietHandler)
    server.tls, server.allowed_sans = web.tls, web.allowed_sans
    threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True).start()
    return server
