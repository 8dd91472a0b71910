"""HTTP basic authentication against bcrypt hashes, cheap enough to check on every scrape.

bcrypt is slow on purpose (about 50 ms at cost 10), so, as exporter-toolkit does, each verdict
is cached: a scraper presenting the same credentials every 15 s pays for bcrypt once. The cache
is keyed by an HMAC of (user, hash, password) under a per-process random key, so no password is
kept in memory and no secret is compared byte by byte in Python (bcrypt.checkpw compares in
constant time). Accepted and refused credentials live in separate bounded caches, so a flood of
wrong passwords cannot evict the scrapers' good ones. An unknown user is checked against a
decoy hash, so the time taken does not tell which user names exist. One bcrypt runs at a time:
a burst of new credentials costs one core, not all of them. And no queue of bcrypt runs builds
up behind it: each client (IP address) has at most one check pending, and a check that cannot
start within BCRYPT_WAIT_S is answered Busy (429) at once, so a flood of wrong passwords after a
restart cannot push a scraper's first check past its timeout.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping

import bcrypt

CACHE_SIZE = 100
BCRYPT_WAIT_S = 1.0  # how long a new check waits for the running one before Busy


class Busy(Exception):
    """The credentials are not cached and no bcrypt can run for this client now; retry later."""


class _Verdicts:
    """A bounded least-recently-used set of cache keys."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def add(self, key: bytes) -> None:
        self._keys[key] = None
        if len(self._keys) > self.size:
            self._keys.popitem(last=False)


class BasicAuth:
    """Checks `Authorization: Basic ...` headers against {user: bcrypt hash}."""

    def __init__(self, users: Mapping[str, bytes], cache_size: int = CACHE_SIZE) -> None:
        self.users = {user.encode(): hashed for user, hashed in users.items()}
        # bcrypt of a random password nobody knows, at the highest cost configured: an unknown
        # user must never answer faster than the slowest known one.
        self._decoy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(max_cost(users)))
        self.bcrypt_runs = 0  # for tests and the bench: how often the cache missed
        self._secret = os.urandom(32)
        self._lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()
        self._accepted = _Verdicts(cache_size)
        self._refused = _Verdicts(cache_size)
        self._pending: set[str] = set()  # clients with a bcrypt running or waiting

    def allows(self, header: str | None, client: str = "") -> bool:
        """Whether the Authorization header names a user and that user's password; Busy when
        that takes a bcrypt and `client` already waits for one, or the wait is too long."""
        credentials = _parse(header)
        if credentials is None:
            return False
        user, password = credentials
        known = user in self.users
        hashed = self.users.get(user, self._decoy)
        key = hmac.digest(self._secret, b"\0".join((user, hashed, password)), "sha256")
        with self._lock:
            if key in self._accepted:
                return True
            if key in self._refused:
                return False
            if client in self._pending:
                raise Busy(client)
            self._pending.add(client)
        try:
            if not self._bcrypt_lock.acquire(timeout=BCRYPT_WAIT_S):
                raise Busy(client)
            try:
                self.bcrypt_runs += 1
                ok = _checkpw(password, hashed) and known
            finally:
                self._bcrypt_lock.release()
        finally:
            with self._lock:
                self._pending.discard(client)
        with self._lock:
            (self._accepted if ok else self._refused).add(key)
        return ok


def cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash (`$2y$NN$...`)."""
    return int(hashed[4:6])


def max_cost(users: Mapping[str, bytes]) -> int:
    """The highest bcrypt cost among the hashes, 10 when there are none."""
    return max((cost(hashed) for hashed in users.values()), default=10)


def _parse(header: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) from a Basic Authorization header, or None."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    return (user, password) if colon else None


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt 5 refuses passwords over 72 bytes rather than truncating
        return False
