"""Which of the collectors writing one warehouse runs the work that must run once.

Scrapes are split by shard (sing/collector/shard.py); job sync, policy rounds, incident
detection and maintenance are not: run by every collector they would send every notice, query
Slurm and compact once per collector. So they run only in the collector holding the warehouse's
leader lease (`sing.warehouse.lease.LEADER`), taken by a conditional commit on local disk and on
object storage alike. Fail closed: a collector that cannot show it holds the lease with a third
of its time to live to spare (the lease held by another, the store unreadable) skips the job
and logs who leads. A killed leader's lease lapses after its time to live and the first
collector to ask then takes it; a leader that lost its lease (its renewals failed, another took
it) stops before its next job, and leaves a lease it can no longer renew to lapse rather than
release it, so that a job it has in flight has the rest of the lease to finish. A collector
stopped by SIGTERM or Ctrl-C releases the lease once its jobs in flight have finished, so
another takes over at its next try. The maintenance the leader runs takes the warehouse's
maintenance lease (object storage) for as long as the leader lease, not the 10 minutes of a
`sing warehouse compact` by hand: a leader killed while holding both leaves both to lapse
together, so that the next leader maintains (and every collector checkpoints) at once rather
than skipping maintenance for minutes.
"""

from __future__ import annotations

import logging
import threading

from deltalake.exceptions import DeltaError

from sing.collector.selfmetrics import SelfMetrics
from sing.warehouse import lease
from sing.warehouse.lease import Lease, LeaseLost
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)


class Leadership:
    """This collector's claim to the leader lease, asked before each leader-only job."""

    def __init__(self, warehouse: Warehouse, ttl_s: float, metrics: SelfMetrics) -> None:
        self.root = warehouse.root
        self.ttl_s = ttl_s
        warehouse.maintenance_lease_s = ttl_s  # lapses with the leader lease (above)
        self.metrics = metrics
        self._lease: Lease | None = None
        self._leader = ""  # who leads, as last logged ("" before the first try)
        self._mutex = threading.Lock()

    def leading(self) -> bool:
        """True when this collector holds the lease with `ttl_s / 3` to spare, taking it when
        it is free or lapsed; False (and who leads, logged when that changes) otherwise."""
        with self._mutex:
            if self._lease is not None:
                try:
                    self._lease.check()
                    return True
                except LeaseLost as err:
                    self._lease.abandon()  # lapses after the jobs in flight, not before
                    self._lease = None
                    self._follow(f"lost ({err})")
            try:
                taken = lease.acquire(self.root, lease.LEADER, self.ttl_s)
            except (DeltaError, OSError) as err:
                self._follow(f"unreadable ({err})")
                return False
            if isinstance(taken, str):
                self._follow(taken)
                return False
            self._lease = taken
            self._leader = "this collector"
            self.metrics.leader.set(1)
            log.info("leader: took the leader lease (%s)", taken.entry.describe())
            return True

    def _follow(self, why: str) -> None:
        """Count and log being a follower; the log line only when the leader changed."""
        self.metrics.leader.set(0)
        who = why.split(" until ")[0]  # the expiry moves with each renewal, the leader not
        if who != self._leader:
            self._leader = who
            log.info("follower: leader-only jobs skipped while the leader lease is %s", why)

    def release(self) -> None:
        """Give the lease up (at a clean stop), so another collector takes over at once."""
        with self._mutex:
            if self._lease is not None:
                self._lease.release()
                self._lease = None
                self.metrics.leader.set(0)
                log.info("leader: released the leader lease")
