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

from sing.collector.client import PayloadError, fetch
from sing.collector.convert import WANTED, NodeReading, read_node
from sing.collector.promtext import ParseError, parse
from sing.collector.rows import Drops, fit_reading
from sing.collector.targets import Target


@dataclass
class Scrape:
    target: Target
    duration_s: float
    reading: NodeReading | None = None
    samples: int = 0
    error: str | None = None
    dropped: Drops = field(default_factory=Counter)


def scrape(target: Target, timeout_s: float, max_bytes: int) -> Scrape:
    start = time.monotonic()
    try:
        text = fetch(target.url, timeout_s, max_bytes, target.client)
        reading, samples, dropped = read_page(text)
    except (OSError, http.client.HTTPException, PayloadError, ParseError) as err:
        return Scrape(target, time.monotonic() - start, error=_describe(err))
    return Scrape(target, time.monotonic() - start, reading, samples, dropped=dropped)


def read_page(text: str) -> tuple[NodeReading, int, Drops]:
    """One page's reading, its number of wanted samples and the values dropped from it (they
    fit no column); a malformed wanted line raises ParseError."""
    samples = parse(text, WANTED)
    reading = read_node(samples)
    return reading, len(samples), fit_reading(reading)


def _describe(err: Exception) -> str:
    if isinstance(err, (TimeoutError, socket.timeout)):
        return f"timeout: {err or 'no answer in time'}"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    kind = "malformed payload" if isinstance(err, ParseError) else type(err).__name__
    return f"{kind}: {err}"
