"""The collector: rounds of scraping (or pulling), job sync and maintenance on one schedule.

Each round reads every target concurrently, turns the readings into rows (jobs stamped, RDMA
and energy deltas computed, health readings that changed, node versions where the inventory
changed) and hands one batch per table to the buffered writer, so the warehouse sees at most five
appends per round whatever the number of nodes. Each warehouse append is atomic, so a collector
killed at any moment loses at most the round in flight; on restart it takes the counters' last
values and the nodes' last versions from the warehouse and carries on (health readings start
over: each series' first reading is written again).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from queue import SimpleQueue

import pyarrow as pa
from apscheduler.executors.pool import ThreadPoolExecutor as ThreadPoolJobs
from apscheduler.schedulers.blocking import BlockingScheduler

from sing.collector.convert import NodeReading
from sing.collector.counters import CounterDeltas
from sing.collector.health import LastValues
from sing.collector.inventory import Inventory, NodeKey, load_inventory
from sing.collector.jobsync import JobSync, running_allocations
from sing.collector.leader import Leadership
from sing.collector.rows import HOST_COUNTERS, Allocations, RoundRows
from sing.collector.scrape import Page, Scrape, fetch_page, read
from sing.collector.selfmetrics import SelfMetrics
from sing.collector.settings import CollectorSettings
from sing.collector.shard import Shard
from sing.collector.targets import Target
from sing.collector.writer import BufferedWriter
from sing.config import Config
from sing.executors.base import CommandError
from sing.executors.records import NodeRecord
from sing.gcpause import cyclic_gc_paused
from sing.schema import table
from sing.warehouse.store import Warehouse

log = logging.getLogger(__name__)

# On restart, counters stored this recently are the baseline of the next deltas.
SEED_WINDOW = timedelta(hours=1)
# The executor's node list: (config) -> [NodeRecord].
NodeSource = Callable[[Config], list[NodeRecord]]


@dataclass
class RoundSummary:
    targets: int
    up: int
    rows: int
    seconds: float


class Collector:
    def __init__(
        self,
        config: Config,
        settings: CollectorSettings,
        warehouse: Warehouse,
        targets: Callable[[], list[Target]],
        job_sync: JobSync | None = None,
        node_source: NodeSource | None = None,
        metrics: SelfMetrics | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """`leadership`: the leader lease this collector must hold to sync jobs and maintain
        the warehouse (None: it always does, as one `--once` round or a library caller)."""
        self.config = config
        self.settings = settings
        self.warehouse = warehouse
        self.targets = targets
        self.job_sync = job_sync
        self.node_source = node_source
        self.cluster = config.site.cluster
        self.metrics = metrics or SelfMetrics()
        self.leadership = leadership
        self.shard = Shard.parse(settings.shard)
        self.writer = BufferedWriter(warehouse, settings.buffer_max_rows, self.metrics)
        self.deltas = seeded_deltas(warehouse, self.cluster)
        # Only this shard's nodes: another shard's are not listed here, and must not read as gone.
        stored = load_inventory(warehouse, self.cluster).last
        self.inventory = Inventory({k: v for k, v in stored.items() if self.shard.owns(k[1])})
        self.last_health = LastValues()  # a restart writes each health series' first reading again
        # (target URL, cluster, node) -> the digest of its last page's health lines (`read_page`)
        self._health_digests: dict[tuple[str, str, str], bytes] = {}
        self.allocations: Allocations = {}
        # The executor's last node list; None until one was read (or without a node source).
        self.listed: dict[NodeKey, NodeRecord] | None = None
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="scrape")

    def new_rows(self) -> RoundRows:
        return RoundRows(self.deltas, self.allocations, self.inventory, self.last_health)

    def scrape_round(self) -> RoundSummary:
        """Scrape every target once and write the round. The pool fetches the pages; this
        thread reads each as soon as it arrives (a target that times out holds up no other)
        and turns a node into rows once all its targets are read (dcgm-exporter and
        node_exporter may both describe it), so only the pages and readings in flight are
        held, not the whole round's."""
        started = time.monotonic()
        ts = datetime.now(UTC)
        targets = self.targets()
        s = self.settings
        rows = self.new_rows()
        pages_of = Counter(self._node_key(t) for t in targets)
        unread = pages_of.copy()
        digests: dict[tuple[str, str, str], bytes] = {}
        readings: dict[NodeKey, NodeReading] = {}
        up = 0
        with cyclic_gc_paused():
            # Each fetch lands here as it completes; nothing else holds it, so a page is freed
            # once read (a list of the futures kept every page to the round's end: 42 MB at
            # 1,000 nodes, docs/collector.md "Measured").
            arrived: SimpleQueue[Future[Page]] = SimpleQueue()
            for t in targets:
                self._pool.submit(
                    fetch_page, t, s.scrape_timeout_s, s.max_payload_bytes
                ).add_done_callback(arrived.put)
            for page in (arrived.get().result() for _ in targets):
                key = self._node_key(page.target)
                result = self._read(page, pages_of[key] == 1, digests)
                self._record(ts, result, rows)
                up += result.error is None
                if result.reading is not None:
                    if key in readings:
                        readings[key].merge(result.reading)
                    else:
                        readings[key] = result.reading
                unread[key] -= 1
                if not unread[key] and key in readings:
                    rows.add_node(ts, *key, readings.pop(key))
            rows.add_inventory(ts, self.listed)
            batches = rows.tables()
        self._health_digests = digests  # a target that failed or left is read whole next time
        self.count_drops(rows)
        self.writer.write(batches)
        # keeps each commit's cost flat between compactions; only the tables a round writes
        # (on object storage each table checked is a few reads: all of them took 0.2-0.4 s)
        self.warehouse.checkpoint_due(batches.keys())
        written = sum(b.num_rows for b in batches.values())
        return self.finish_round(written, len(targets), up, started)

    def _record(self, ts: datetime, result: Scrape, rows: RoundRows) -> None:
        """A target's `scrapes` row, self-metrics and, for a failure, a log line."""
        t = result.target
        rows.add_scrape(
            ts, t.url, t.node, result.duration_s, result.samples, result.error, result.dropped
        )
        self.metrics.scrape_seconds.observe(result.duration_s)
        if result.error is not None:
            self.metrics.scrape_errors.labels(result.error.split(":")[0]).inc()
            log.warning("scrape of %s (%s) failed: %s", t.url, t.node, result.error)

    def _node_key(self, target: Target) -> NodeKey:
        return (target.cluster or self.cluster, target.node)

    def _read(self, page: Page, single: bool, digests: dict[tuple[str, str, str], bytes]) -> Scrape:
        """Read a page, its health lines skipped when they are as on the target's last page;
        the page's digest goes into `digests`. Only for a node read from this one target
        (`single`): a node merged from several pages needs all their health values to compare
        with its last ones."""
        key = (page.target.url, *self._node_key(page.target))
        result = read(page, self._health_digests.get(key) if single else None)
        if result.health_digest is not None:
            digests[key] = result.health_digest
        return result

    def count_drops(self, rows: RoundRows) -> None:
        """Count and log the values each target's page had that fit no column."""
        for target, drops in rows.drops.items():
            for reason, count in drops.items():
                self.metrics.samples_dropped.labels(target, reason).inc(count)
            log.warning("%s: dropped values that fit no column: %s", target, dict(drops))

    def finish_round(self, rows: int, targets: int, up: int, started: float) -> RoundSummary:
        """Count and log a round whose rows were handed to the writer."""
        seconds = time.monotonic() - started
        self.metrics.rounds.inc()
        self.metrics.round_seconds.observe(seconds)
        self.metrics.targets.set(targets)
        self.metrics.last_round.set(time.time())
        summary = RoundSummary(targets, up, rows, seconds)
        log.debug("round: %s", summary)
        if seconds > self.settings.interval_s:
            interval = self.settings.interval_s
            log.warning("round took %.1f s, longer than the %g s interval", seconds, interval)
        return summary

    def sync_jobs(self) -> None:
        """Pull job records through the executor adapter, then refresh running allocations
        and the executor's node list (a failed listing keeps the previous one: a broken sinfo
        must not read as every node gone). A scheduler command that failed is counted and
        recorded (`_command_failed`). Job records are synced by the leader only; every
        collector reads the allocations and lists its shard's nodes."""
        if self.job_sync is not None and self.leads("job sync"):
            try:
                self.job_sync(self.config, self.warehouse)
                self.metrics.job_syncs.labels("ok").inc()
            except Exception as err:
                self.metrics.job_syncs.labels("error").inc()
                self._command_failed(err)
                log.exception("job sync failed; retrying at the next sync")
        # Replaced whole, never mutated: a round running meanwhile keeps a consistent map.
        self.allocations = running_allocations(self.warehouse)
        if self.node_source is not None:
            try:
                nodes = self.node_source(self.config)
            except Exception as err:
                self._command_failed(err)
                log.exception("node inventory from the executor failed; keeping the last one")
            else:
                owned = (n for n in nodes if self.shard.owns(n.node))
                self.listed = {(self.cluster, n.node): n for n in owned}

    def _command_failed(self, err: Exception) -> None:
        """Count a scheduler command's failure by command and reason, and record it in
        `command_failures` for `sing doctor head`; other errors are only logged."""
        if isinstance(err, CommandError):
            self.metrics.command_failures.labels(err.command, err.reason).inc()
            from sing.warehouse.audit import actor

            record_command_failure(self.warehouse, self.cluster, err, actor("sing collector"))

    def leads(self, what: str) -> bool:
        """Whether to run `what`, which must run in one collector of those writing the
        warehouse: the leader (`sing.collector.leader`)."""
        if self.leadership is None or self.leadership.leading():
            return True
        log.debug("%s skipped: this collector is not the leader", what)
        return False

    def leader_only(self, what: str, job: Callable[[], object]) -> Callable[[], None]:
        """`job` as a scheduled job that runs only while this collector leads."""

        def run() -> None:
            if self.leads(what):
                job()

        return run

    def maintain(self) -> None:
        """Compact the warehouse, and age out raw samples when retention is set (leader only)."""
        if not self.leads("maintenance"):
            return
        try:
            result = self.warehouse.compact()
            log.info("compaction: %s", result)
            if self.settings.raw_retention_days > 0:
                removed = self.warehouse.apply_retention(self.settings.raw_retention_days)
                if removed:
                    log.info("retention removed %d day directories", len(removed))
        except OSError as err:
            log.error("maintenance failed: %s", err)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.leadership is not None:
            self.leadership.release()


def seeded_deltas(warehouse: Warehouse, default_cluster: str) -> CounterDeltas:
    """Counter state from the newest stored samples (RDMA bytes, GPU energy, jobs' CPU and I/O
    on each node), so a restart loses no delta. A counter whose newest stored value is unknown
    (NULL) gets no seed, as it would have none had the collector kept running. Rows from before
    samples carried a cluster belong to the site's."""
    since = datetime.now(UTC) - SEED_WINDOW
    deltas = CounterDeltas()
    con = warehouse.connect()
    try:
        ports = con.execute(
            """
            SELECT coalesce(cluster, ?) AS c, node, device, port,
                   arg_max_null(tx_bytes, ts), arg_max_null(rx_bytes, ts)
            FROM rdma_samples WHERE ts > ? GROUP BY ALL
            """,
            [default_cluster, since],
        ).fetchall()
        jobs = con.execute(
            """
            SELECT coalesce(cluster, ?) AS c, node, job_id, arg_max_null(cpu_s, ts),
                   arg_max_null(io_read_bytes, ts), arg_max_null(io_write_bytes, ts)
            FROM job_host_samples WHERE ts > ? GROUP BY ALL
            """,
            [default_cluster, since],
        ).fetchall()
        gpus = con.execute(
            """
            SELECT coalesce(cluster, ?) AS c, node, coalesce(gpu_uuid, gpu_index::VARCHAR),
                   any_value(gpu_uuid IS NULL), arg_max_null(energy_j, ts)
            FROM gpu_samples WHERE ts > ? GROUP BY ALL
            """,
            [default_cluster, since],
        ).fetchall()
    finally:
        con.close()
    for cluster, node, device, port, tx, rx in ports:
        for direction, value in (("tx", tx), ("rx", rx)):
            if value is not None:
                deltas.seed((cluster, node, device, port, direction), value)
    for cluster, node, job, *values in jobs:
        for column, value in zip(HOST_COUNTERS, values, strict=True):
            if value is not None:
                deltas.seed((cluster, node, job, column), value, (cluster, node))
    for cluster, node, gpu, by_index, energy in gpus:
        if energy is not None:
            deltas.seed((cluster, node, int(gpu) if by_index else gpu, "energy"), energy)
    return deltas


def run_forever(
    collector: Collector,
    round_job: Callable[[], object],
    *jobs: tuple[Callable[[], object], float] | None,
) -> None:
    """Run rounds, job sync and maintenance on their intervals until SIGTERM or Ctrl-C; and
    each of `jobs` = (a round, its interval in seconds; None: none) as a job of its own (the
    policy round, incident detection), which runs in its own thread beside the scrapes and
    never delays them, and only while this collector leads (see `leads`). The leader lease is
    also asked for every third of its time to live, so a follower takes over a lapsed one
    promptly and the `sing_collector_leader` gauge stays current. On SIGTERM the jobs in
    flight finish, then the lease is released."""
    s = collector.settings
    pool = ThreadPoolJobs()
    scheduler = BlockingScheduler(timezone=UTC, executors={"default": pool})
    now = datetime.now(UTC)
    common = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
    scheduler.add_job(round_job, "interval", seconds=s.interval_s, next_run_time=now, **common)
    scheduler.add_job(
        collector.sync_jobs, "interval", seconds=s.job_sync_interval_s, next_run_time=now, **common
    )
    scheduler.add_job(collector.maintain, "interval", seconds=s.maintenance_interval_s, **common)
    for job in filter(None, jobs):
        job_round, interval_s = job
        what = job_round.__qualname__.split(".")[0]  # policy_job, detection_job
        scheduler.add_job(
            collector.leader_only(what, job_round), "interval", seconds=interval_s, **common
        )
    if collector.leadership is not None:
        poll_s = collector.leadership.ttl_s / 3
        leading = collector.leadership.leading
        scheduler.add_job(leading, "interval", seconds=poll_s, next_run_time=now, **common)

    # Stopped from a thread of its own: the handler runs in the main thread, which may hold the
    # lock of the scheduler's wake-up Event right then, and `shutdown` sets that Event (a
    # deadlock: the collector would never stop).
    def stop(*_: object) -> None:
        threading.Thread(target=scheduler.shutdown, kwargs={"wait": False}).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        scheduler.start()
    except KeyboardInterrupt:
        pass
    finally:
        # The jobs in flight finish first: a leader-only job must not outlive the lease.
        pool.shutdown(wait=True)
        collector.close()


def record_command_failure(warehouse: Warehouse, cluster: str, err: Exception, who: str) -> None:
    """A scheduler command's failure as a `command_failures` row by `who` (an audit actor),
    what `sing doctor head` shows; never raises: the failure is logged all the same."""
    if not isinstance(err, CommandError):
        return
    row = {
        "ts": datetime.now(UTC),
        "cluster": cluster,
        "command": err.command,
        "reason": err.reason,
        "error": str(err),
        "actor": who,
    }
    try:
        warehouse.append(
            "command_failures", pa.Table.from_pylist([row], table("command_failures").schema)
        )
    except Exception:  # noqa: BLE001 - the failure is logged all the same
        log.exception("could not record the failure of %s", err.command)
