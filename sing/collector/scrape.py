"""Fetch and parse one target's /metrics with a deadline and a size limit.

http.client and a thread pool, not a framework: a fetch is one GET, and the pool's threads spend
their time waiting on sockets; the round's own thread parses each page as it arrives (`read`).
Every failure ends as a `Scrape` with `error` set: a dead, slow or garbage-serving target never
raises. Values of a page that fit no warehouse column are dropped from its reading here, per
target, and counted (`Scrape.dropped`, sing/collector/rows.py says why).
"""

from __future__ import annotations

import hashlib
import http.client
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from sing.collector.client import PayloadError, fetch
from sing.collector.convert import WANTED, WANTED_BESIDE_HEALTH, NodeReading, read_node
from sing.collector.health import HEALTH_METRICS
from sing.collector.promtext import ParseError, parse, wanted_lines
from sing.collector.rows import Drops, fit_reading
from sing.collector.targets import Target


@dataclass
class Page:
    """One target's answer: its text, or why there is none."""

    target: Target
    duration_s: float
    text: str | None = None
    error: str | None = None


@dataclass
class Scrape:
    target: Target
    duration_s: float
    reading: NodeReading | None = None
    samples: int = 0
    error: str | None = None
    dropped: Drops = field(default_factory=Counter)
    health_digest: bytes | None = None  # of the page's health lines (`read_page`)


def fetch_page(target: Target, timeout_s: float, max_bytes: int) -> Page:
    """GET the target's page. A round runs these in its thread pool: they wait on sockets."""
    start = time.monotonic()
    try:
        text = fetch(target.url, timeout_s, max_bytes, target.client)
    except (OSError, http.client.HTTPException, PayloadError) as err:
        return Page(target, time.monotonic() - start, error=_describe(err))
    return Page(target, time.monotonic() - start, text)


def read(page: Page, health_digest: bytes | None = None) -> Scrape:
    """The page's reading; its duration is the fetch's plus the parse's. A round reads its
    pages in one thread as they arrive: the parse is CPU work, and threads taking turns at it
    only add switches. `health_digest`: see `read_page`."""
    if page.text is None:
        return Scrape(page.target, page.duration_s, error=page.error)
    start = time.monotonic()
    try:
        reading, samples, dropped, digest = read_page(page.text, health_digest)
    except ParseError as err:
        return Scrape(page.target, page.duration_s + time.monotonic() - start, error=_describe(err))
    duration_s = page.duration_s + time.monotonic() - start
    return Scrape(page.target, duration_s, reading, samples, dropped=dropped, health_digest=digest)


class PageReading(NamedTuple):
    reading: NodeReading
    samples: int  # wanted samples on the page
    dropped: Drops  # values that fit no column (sing/collector/rows.py `fit_reading`)
    health_digest: bytes | None  # of its health lines; None where they may be spelled otherwise


def read_page(text: str, health_digest: bytes | None = None) -> PageReading:
    """One page's reading; a malformed wanted line raises ParseError.

    A node's health series (error counters, flags) stay the same for months and are most of a
    page's wanted lines. Where their lines hash to `health_digest` (the target's last page
    read), they are not parsed, and the reading's health is None: as on that page."""
    lines = wanted_lines(text, HEALTH_METRICS)
    digest = None if lines is None else hashlib.blake2b("".join(lines).encode()).digest()
    if digest is not None and digest == health_digest:
        samples = parse(text, WANTED_BESIDE_HEALTH)
        reading = read_node(samples)
        reading.health = None
        return PageReading(reading, len(samples) + len(lines), fit_reading(reading), digest)
    samples = parse(text, WANTED)
    reading = read_node(samples)
    return PageReading(reading, len(samples), fit_reading(reading), digest)


def _describe(err: Exception) -> str:
    if isinstance(err, (TimeoutError, socket.timeout)):
        return f"timeout: {err or 'no answer in time'}"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    kind = "malformed payload" if isinstance(err, ParseError) else type(err).__name__
    return f"{kind}: {err}"
