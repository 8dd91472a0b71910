"""Named leases of a warehouse: one holder across processes and hosts, by conditional commits.

The maintenance lease (`MAINTENANCE`): locally `flock` serialises maintenance; on object storage a
flock is one host's only, and two hosts compacting or vacuuming one table at once can lose data
(delta-rs compaction from a stale snapshot re-adds removed files; vacuum deletes files another
compaction still names). So a maintainer there first takes this lease. The leader lease
(`LEADER`): of several collectors writing one warehouse, the one holding it runs job sync, policy
and detection rounds and maintenance (sing/collector/leader.py), on local disk and object storage
alike. Each lease is a tiny Delta table, `ROOT/<name>`, whose newest commit says who holds it
(holder id, host, pid, expiry) in its commit metadata.

Taking, renewing and releasing the lease are each one commit of the next version with no retry
(`max_commit_retries=0`), which delta-rs writes by conditional put (`If-None-Match: *`, checked
at opening by `store.check_conditional_put`; on local disk by a rename that refuses to replace):
of any processes that read version n, exactly one writes n+1, and the others are refused. A
lease is taken only when the newest entry is released or expired; a dead holder's lease lapses
its time to live (`ttl_s`) after its last renewal. The holder renews every `ttl_s / 3` from a
thread and, before each step that commits or deletes, `check`s that it still holds the lease
with at least `ttl_s / 3` to spare, else the step is not run. Hosts' clocks must agree far
better than that (NTP), since expiry is a wall-clock time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from sing.warehouse import delta, files
from sing.warehouse.files import Location

log = logging.getLogger(__name__)

MAINTENANCE = "_sing_maintenance"
LEADER = "_sing_leader"
# A maintainer that stops renewing (killed, its host gone) blocks others this long at most.
TTL_S = 600.0
# The lease log is checkpointed (and old entries dropped) once this many entries follow the last.
CHECKPOINT_EVERY = 50
_SCHEMA = pa.schema([pa.field("unused", pa.int8())])
# A lease held for months renews thousands of times a day: old entries go after an hour.
_CONFIG = {"delta.logRetentionDuration": "interval 1 hours"}


class LeaseLost(RuntimeError):
    """The lease lapsed or another host took it: the holder must stop before its next step."""


@dataclass(frozen=True)
class Entry:
    """One lease log entry: who holds it and until when (epoch seconds; 0: released)."""

    holder: str
    host: str
    pid: int
    expires_at: float

    def describe(self) -> str:
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires_at))
        return f"{self.host} pid {self.pid} until {until}"


class Lease:
    """A held lease; renewed from a thread until `release`."""

    def __init__(self, dt: DeltaTable, entry: Entry, name: str, ttl_s: float) -> None:
        self._dt = dt
        self.entry = entry
        self.ttl_s = ttl_s
        self.what = f"{name.removeprefix('_sing_')} lease"
        self._lost = False
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_until_released, daemon=True)
        self._renewer.start()

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is held with `ttl_s / 3` to spare (renewing it
        now if need be)."""
        if not self._lost and self.entry.expires_at - time.time() < self.ttl_s / 3:
            self.renew()
        if self._lost or self.entry.expires_at - time.time() < self.ttl_s / 3:
            raise LeaseLost(f"{self.what} of {self.entry.describe()} lost or lapsing")

    def renew(self) -> None:
        """Extend the lease by committing the version after the newest, which must be ours:
        if another host took the lease, or takes it at the same moment, it is lost."""
        with self._mutex:
            if self._lost:
                return
            renewed = _entry(self.entry.holder, time.time() + self.ttl_s)
            try:
                self._lost = _current(self._dt) != self.entry
                if not self._lost:
                    _commit(self._dt, renewed)
                    self.entry = renewed
            except CommitFailedError:
                self._lost = True
            except (DeltaError, OSError) as err:  # the store unreachable: try again later
                log.warning("%s not renewed: %s", self.what, err)
            if self._lost:
                log.warning("%s of %s was taken over", self.what, self.entry.describe())
            elif self.entry is renewed:
                _tidy(self._dt)

    def release(self) -> None:
        """Stop renewing and mark the lease free, unless another host took it meanwhile."""
        self._stop.set()
        self._renewer.join()
        with self._mutex:
            if self._lost:
                return
            self._lost = True
            try:
                if _current(self._dt) == self.entry:
                    _commit(self._dt, _entry(self.entry.holder, 0.0))
            except (CommitFailedError, DeltaError, OSError) as err:
                log.warning("%s not released (it lapses by itself): %s", self.what, err)
                return
        _tidy(self._dt)

    def abandon(self) -> None:
        """Stop renewing and leave the entry to lapse at its expiry, not released: a holder
        that can no longer show it holds the lease gives the steps it has in flight until then."""
        with self._mutex:
            self._lost = True
        self._stop.set()
        self._renewer.join()

    def _renew_until_released(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.renew()


def acquire(root: Location, name: str = MAINTENANCE, ttl_s: float | None = None) -> Lease | str:
    """Take the warehouse's lease `name` for `ttl_s` seconds (default `TTL_S`; renewed while
    held): a `Lease`, or why not (another holds it)."""
    ttl_s = ttl_s or TTL_S
    path = str(files.join(root, name))
    options = files.storage_options() if files.is_uri(root) else None
    try:
        DeltaTable.create(
            path, _SCHEMA, mode="ignore", configuration=_CONFIG, storage_options=options
        )
    except (CommitFailedError, DeltaError):  # another host created it meanwhile
        if not DeltaTable.is_deltatable(path, storage_options=options):
            raise
    dt = DeltaTable(path, storage_options=options)
    current = _current(dt)
    if current is not None and current.expires_at > time.time():
        return f"held by {current.describe()}"
    mine = _entry(uuid.uuid4().hex, time.time() + ttl_s)
    try:
        _commit(dt, mine)
    except CommitFailedError:
        winner = _current(dt)
        return f"taken at the same moment by {winner.describe() if winner else 'another host'}"
    return Lease(dt, mine, name, ttl_s)


def _current(dt: DeltaTable) -> Entry | None:
    """The newest entry of the lease log, `dt` moved to its version (None before the first)."""
    dt.update_incremental()
    newest = dt.history(limit=1)[0]
    if "sing.lease.holder" not in newest:
        return None
    return Entry(
        holder=str(newest["sing.lease.holder"]),
        host=str(newest["sing.lease.host"]),
        pid=int(newest["sing.lease.pid"]),
        expires_at=float(newest["sing.lease.expires_at"]),
    )


def _tidy(dt: DeltaTable) -> None:
    """Checkpoint a long lease log and drop the entries older than the retention; a failure
    only leaves the log longer until the next try."""
    try:
        if delta.versions_since_checkpoint(dt) >= CHECKPOINT_EVERY:
            dt.create_checkpoint()
            dt.cleanup_metadata()
    except (DeltaError, OSError) as err:
        log.warning("lease log not checkpointed: %s", err)


def _entry(holder_id: str, expires_at: float) -> Entry:
    return Entry(holder_id, socket.gethostname(), os.getpid(), expires_at)


def _commit(dt: DeltaTable, entry: Entry) -> None:
    """Write the entry as the version after the one `dt` holds, or raise CommitFailedError if
    that version exists (conditional put; `dt` is not moved on)."""
    dt.create_write_transaction(
        [],
        "append",
        _SCHEMA,
        commit_properties=CommitProperties(
            max_commit_retries=0,
            custom_metadata={
                "sing.lease.holder": entry.holder,
                "sing.lease.host": entry.host,
                "sing.lease.pid": str(entry.pid),
                "sing.lease.expires_at": repr(entry.expires_at),
            },
        ),
        post_commithook_properties=delta.NO_HOOKS,
    )
