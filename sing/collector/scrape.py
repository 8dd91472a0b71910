"""Fetch and parse one target's /metrics with a deadline and a size limit.

http.client and a thread pool, not a framework: a scrape is one GET; the threads spend their time
waiting on sockets, and the CPU work (parsing) is small next to the deadline. Every failure ends
as a `Scrape` with `error` set: a dead, slow or garbage-serving target never raises. Values of
a page that fit no warehouse column are dropped from its reading here, per target, and counted
(`Scrape.dropped`, sing/collector/rows.py says why).
"""

from __future__ import annotations

import http.client
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sing.collector.client import PLAIN, ScrapeClient
from sing.collector.convert import WANTED, NodeReading, read_node
from sing.collector.promtext import ParseError, parse
from sing.collector.rows import Drops, fit_reading
from sing.collector.targets import Target

CHUNK = 256 * 1024


@dataclass
class Scrape:
    target: Target
    duration_s: float
    reading: NodeReading | None = None
    samples: int = 0
    error: str | None = None
    dropped: Drops = field(default_factory=Counter)


class PayloadError(Exception):
    """The target answered, but not with something we accept (status, size, encoding)."""


def scrape(target: Target, timeout_s: float, max_bytes: int) -> Scrape:
    start = time.monotonic()
    try:
        text = fetch(target.url, timeout_s, max_bytes, target.client)
        samples = parse(text, WANTED)
        reading = read_node(samples)
    except (OSError, http.client.HTTPException, PayloadError, ParseError) as err:
        return Scrape(target, time.monotonic() - start, error=_describe(err))
    dropped = fit_reading(reading)
    return Scrape(target, time.monotonic() - start, reading, len(samples), dropped=dropped)


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
        while chunk := response.read1(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise PayloadError(f"payload exceeds the {max_bytes} byte limit")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete payload within {timeout_s:g} s")
            sock.settimeout(remaining)
            chunks.append(chunk)
    finally:
        conn.close()
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as err:
        raise PayloadError(f"payload is not UTF-8 text: {err}") from None


def _describe(err: Exception) -> str:
    if isinstance(err, (TimeoutError, socket.timeout)):
        return f"timeout: {err or 'no answer in time'}"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    kind = "malformed payload" if isinstance(err, ParseError) else type(err).__name__
    return f"{kind}: {err}"
