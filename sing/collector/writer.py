"""Write each round's batches, riding out a warehouse that cannot be written for a while.

Scrape rounds (`write`): when an append fails with an OS error (disk full, permission, a lost
mount), the batch stays in a bounded in-memory buffer and the next round retries, merged with
the new batch, so a table still gets one append per round. When the buffer would exceed its
bound the oldest sample batches are dropped, counted in `sing_collector_rows_dropped_total` and
logged: a long outage loses the oldest data, never the newest, and memory stays bounded. Node
inventory versions are never dropped (a handful of rows, each needed until the node changes).

Each buffered batch has an id that its commit records: before a retry, a batch whose append
raised after all (an fsync of the log failing after the entry was written) is found landed and
not written again, so no sample is stored twice.

Pull rounds (`write_each`) need no buffer: Prometheus keeps the data, so a table that could not
be written is simply read again next round (sing/collector/pull.py).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import pyarrow as pa

from sing.collector.selfmetrics import SelfMetrics
from sing.errors import UserError
from sing.schema import TABLES
from sing.warehouse.files import uninterrupted
from sing.warehouse.store import Warehouse, batch_id

log = logging.getLogger(__name__)


class BufferedWriter:
    def __init__(self, warehouse: Warehouse, max_rows: int, metrics: SelfMetrics) -> None:
        self.warehouse = warehouse
        self.max_rows = max_rows
        self.metrics = metrics
        self._pending: deque[tuple[str, pa.Table, str]] = deque()  # (table, batch, batch id)
        self._lock = threading.Lock()
        self._failing = False

    @property
    def buffered_rows(self) -> int:
        return sum(t.num_rows for _, t, _ in self._pending)

    def write(self, batches: dict[str, pa.Table]) -> None:
        """Queue this round's batches and write everything queued, oldest first."""
        with self._lock:
            self._pending.extend((n, t, batch_id()) for n, t in batches.items())
            self._drop_overflow()
            with uninterrupted():  # Ctrl-C comes after the round's tables, never between two
                self._flush()
            self.metrics.rows_buffered.set(self.buffered_rows)

    def write_each(self, batches: dict[str, pa.Table]) -> set[str]:
        """Write each batch now, nothing buffered; returns the tables that could not be written
        (an OS error) so that the caller reads them again."""
        with self._lock, uninterrupted():
            failed = {
                name
                for name, batch in batches.items()
                if not self._append(name, batch, [batch_id()])
            }
            self._failing = bool(failed)
            return failed

    def _flush(self) -> None:
        if self._failing:
            self._forget_landed()
        for name in dict.fromkeys(name for name, _, _ in self._pending):
            parts = [(t, i) for n, t, i in self._pending if n == name]
            batch = pa.concat_tables([t for t, _ in parts]) if len(parts) > 1 else parts[0][0]
            if self._append(name, batch, [i for _, i in parts]):
                self._pending = deque(p for p in self._pending if p[0] != name)
        self._failing = bool(self._pending)

    def _forget_landed(self) -> None:
        """Drop the buffered batches that a failed append did commit."""
        landed: set[str] = set()
        for name in dict.fromkeys(name for name, _, _ in self._pending):
            if TABLES[name].is_samples:
                try:
                    ids = [i for n, _, i in self._pending if n == name]
                    landed |= self.warehouse.landed(name, ids)
                except OSError:
                    return  # still unreadable: the append fails again and keeps them
        if landed:
            log.warning("%d buffered batches had been written after all: not again", len(landed))
            self._pending = deque(p for p in self._pending if p[2] not in landed)

    def _append(self, name: str, batch: pa.Table, batch_ids: list[str]) -> bool:
        """Append one batch; False when the warehouse could not take it (retrying may help)."""
        try:
            written = self.warehouse.append(name, batch, batch_ids)
        except OSError as err:
            if self._landed_after_all(name, batch_ids):
                log.warning("%s: the append raised (%s) after its commit landed; kept", name, err)
                self.metrics.rows_written.labels(name).inc(batch.num_rows)
                return True
            self.metrics.write_errors.labels(name).inc()
            log.error(
                "WAREHOUSE NOT WRITABLE (%s): %s; holding %d rows in memory (limit %d)",
                name,
                err,
                self.buffered_rows or batch.num_rows,
                self.max_rows,
            )
            return False
        except UserError as err:  # rows the schema refuses: retrying cannot help
            self.metrics.rows_dropped.labels(name).inc(batch.num_rows)
            log.error("dropped %d %s rows the warehouse refused: %s", batch.num_rows, name, err)
            written = 0
        self.metrics.rows_written.labels(name).inc(written)
        if self._failing:  # the previous write failed
            log.warning("warehouse writable again: wrote %d %s rows", written, name)
        return True

    def _landed_after_all(self, name: str, batch_ids: list[str]) -> bool:
        if not TABLES[name].is_samples:
            return False  # records are merged on their key: sending one again changes nothing
        try:
            return bool(self.warehouse.landed(name, batch_ids))
        except OSError:
            return False  # the next round's retry asks again (`_forget_landed`)

    def _drop_overflow(self) -> None:
        total = self.buffered_rows
        droppable = [
            i
            for i, (name, _, _) in enumerate(self._pending)
            if TABLES[name].is_samples and TABLES[name].raw  # a health change is never dropped
        ]
        dropped: set[int] = set()
        for i in droppable[:-1]:  # the newest sample batch always stays
            if total <= self.max_rows:
                break
            name, batch, _ = self._pending[i]
            total -= batch.num_rows
            dropped.add(i)
            self.metrics.rows_dropped.labels(name).inc(batch.num_rows)
            log.error(
                "buffer full (%d rows): dropped the oldest %d %s rows",
                self.max_rows,
                batch.num_rows,
                name,
            )
        if dropped:
            self._pending = deque(p for i, p in enumerate(self._pending) if i not in dropped)
