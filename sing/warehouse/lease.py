"""The maintenance lease of a warehouse on object storage: one maintainer across hosts.

Locally `flock` serialises maintenance; on object storage a flock is one host's only, and two
hosts compacting or vacuuming one table at once can lose data (delta-rs compaction from a stale
snapshot re-adds removed files; vacuum deletes files another compaction still names). So a
maintainer there first takes this lease: a tiny Delta table, `ROOT/_sing_maintenance`, whose
newest commit says who holds it (holder id, host, pid, expiry) in its commit metadata.

Taking, renewing and releasing the lease are each one commit of the next version with no retry
(`max_commit_retries=0`), which delta-rs writes by conditional put (`If-None-Match: *`, checked
at opening by `store.check_conditional_put`): of any hosts that read version n, exactly one
writes n+1, and the others are refused. A lease is taken only when the newest entry is released
or expired; a dead holder's lease lapses `TTL_S` after its last renewal. The holder renews
every `TTL_S / 3` from a thread and, before each step that commits or deletes, `check`s that it
still holds the lease with at least `TTL_S / 3` to spare, else the step is not run. Hosts'
clocks must agree far better than that (NTP), since expiry is a wall-clock time.
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

log = logging.getLogger(__name__)

NAME = "_sing_maintenance"
# A holder that stops renewing (killed, its host gone) blocks others this long at most.
TTL_S = 600.0
# The lease log is checkpointed (and old entries dropped) once this many entries follow the last.
CHECKPOINT_EVERY = 50
_SCHEMA = pa.schema([pa.field("unused", pa.int8())])
_CONFIG = {"delta.logRetentionDuration": "interval 1 days"}


class LeaseLost(RuntimeError):
    """The lease lapsed or another host took it: the maintainer must stop before its next step."""


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
    """A held maintenance lease; renewed from a thread until `release`."""

    def __init__(self, dt: DeltaTable, entry: Entry) -> None:
        self._dt = dt
        self.entry = entry
        self._lost = False
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_until_released, daemon=True)
        self._renewer.start()

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is held with `TTL_S / 3` to spare (renewing it
        now if need be)."""
        if not self._lost and self.entry.expires_at - time.time() < TTL_S / 3:
            self.renew()
        if self._lost or self.entry.expires_at - time.time() < TTL_S / 3:
            raise LeaseLost(f"maintenance lease of {self.entry.describe()} lost or lapsing")

    def renew(self) -> None:
        """Extend the lease by committing the version after the newest, which must be ours:
        if another host took the lease, or takes it at the same moment, it is lost."""
        with self._mutex:
            if self._lost:
                return
            renewed = _entry(self.entry.holder, time.time() + TTL_S)
            try:
                self._lost = _current(self._dt) != self.entry
                if not self._lost:
                    _commit(self._dt, renewed)
                    self.entry = renewed
            except CommitFailedError:
                self._lost = True
            except (DeltaError, OSError) as err:  # the store unreachable: try again later
                log.warning("maintenance lease not renewed: %s", err)
            if self._lost:
                log.warning("maintenance lease of %s was taken over", self.entry.describe())

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
                log.warning("maintenance lease not released (it lapses by itself): %s", err)
                return
        if delta.versions_since_checkpoint(self._dt) >= CHECKPOINT_EVERY:
            self._dt.create_checkpoint()
            self._dt.cleanup_metadata()

    def _renew_until_released(self) -> None:
        while not self._stop.wait(TTL_S / 3):
            self.renew()


def acquire(root: str) -> Lease | str:
    """Take the warehouse's maintenance lease: a `Lease`, or why not (another holds it)."""
    path, options = str(files.join(root, NAME)), files.storage_options()
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
    mine = _entry(uuid.uuid4().hex, time.time() + TTL_S)
    try:
        _commit(dt, mine)
    except CommitFailedError:
        winner = _current(dt)
        return f"taken at the same moment by {winner.describe() if winner else 'another host'}"
    return Lease(dt, mine)


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
