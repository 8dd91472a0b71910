"""The collector killed with SIGKILL mid-round, and a warehouse that cannot be written for a
while: real `sing collector` processes against real fake-exporter processes."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import time
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from sing.collector.selfmetrics import SelfMetrics
from sing.collector.writer import BufferedWriter
from sing.warehouse import delta, store
from sing.warehouse.store import Warehouse, batch_id
from tests.ports import free_port
from tests.test_collector_scrape import (  # noqa: F401 - `exporter` is a fixture
    exporter,
    file_sd_entry,
    http_get,
    running,
    sing,
    wait_for,
    write_config,
)


def rounds(wh: Warehouse) -> int:
    return wh.connect().execute("SELECT count(DISTINCT ts) FROM scrapes").fetchone()[0]


def test_sigkill_mid_round_loses_no_committed_round_and_restart_continues(
    tmp_path: Path,
    exporter: dict[str, int],  # noqa: F811 - the imported fixture
) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([file_sd_entry(n, p) for n, p in exporter.items()]))
    config = write_config(tmp_path / "sing.toml", targets, interval_s=0.2, metrics_port=0)
    wh = Warehouse(tmp_path / "wh")
    argv = sing("--config", str(config), "--warehouse", str(wh.root), "collector")
    rng = random.Random(7)
    for attempt in range(3):
        before = rounds(wh)
        with running(argv, tmp_path / f"collector-{attempt}.log") as proc:
            wait_for(lambda b=before: rounds(wh) >= b + 3, what="rounds after a (re)start")
            time.sleep(rng.uniform(0.0, 0.2))  # land somewhere inside a round
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    # Every round whose scrapes rows (written last) are stored has all its samples.
    con = wh.connect()
    incomplete = con.execute(
        """
        SELECT s.ts, count(DISTINCT g.node || g.gpu_index), count(DISTINCT r.node)
        FROM (SELECT DISTINCT ts FROM scrapes) s
        LEFT JOIN gpu_samples g USING (ts) LEFT JOIN rdma_samples r USING (ts)
        GROUP BY s.ts HAVING count(DISTINCT g.node || g.gpu_index) <> 8
            OR count(DISTINCT r.node) <> 2
        """
    ).fetchall()
    assert incomplete == []
    assert rounds(wh) >= 9
    # After each restart the RDMA deltas continue from the stored counters: only the very
    # first round of the very first run has no previous value.
    (first_ts,) = con.execute("SELECT min(ts) FROM rdma_samples").fetchone()
    missing = con.execute(
        "SELECT count(*) FROM rdma_samples WHERE tx_delta_bytes IS NULL AND ts > ?", [first_ts]
    ).fetchone()[0]
    assert missing == 0


def test_unwritable_warehouse_buffers_drops_oldest_and_recovers(
    tmp_path: Path,
    exporter: dict[str, int],  # noqa: F811 - the imported fixture
) -> None:
    """Permissions are taken away from the warehouse while the collector runs, then given
    back. Root ignores permissions, so as root the collector runs without the capabilities
    that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([file_sd_entry("a", exporter["a"])]))
    metrics_port = free_port()
    # One node: 4 GPU + 1 RDMA + 1 scrape rows per round; the buffer holds 5 rounds' worth.
    config = write_config(
        tmp_path / "sing.toml",
        targets,
        interval_s=0.25,
        metrics_port=metrics_port,
        buffer_max_rows=30,
        maintenance_interval_s=3600,
    )
    wh = Warehouse(tmp_path / "wh")
    argv = sing("--config", str(config), "--warehouse", str(wh.root), "collector")
    if os.geteuid() == 0:
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]
    log = tmp_path / "collector.log"

    def metric(name: str) -> float:
        text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)
        )

    def set_writable(writable: bool) -> None:
        for path in [wh.root, *wh.root.rglob("*")]:
            if path.is_dir():
                mode = path.stat().st_mode
                path.chmod(mode | stat.S_IWUSR if writable else mode & ~0o222)

    with running(argv, log):
        wait_for(lambda: rounds(wh) >= 2, what="first rounds")
        set_writable(False)
        frozen = rounds(wh)
        wait_for(lambda: metric("sing_collector_rows_dropped_total") >= 24, what="drops")
        assert rounds(wh) == frozen  # nothing could be written meanwhile
        set_writable(True)
        wait_for(lambda: metric("sing_collector_rows_buffered") == 0, what="buffer flushed")
        dropped = metric("sing_collector_rows_dropped_total")
        finished_rounds = metric("sing_collector_rounds_total")
    text = log.read_text()
    assert "WAREHOUSE NOT WRITABLE" in text
    assert "buffer full (30 rows): dropped the oldest" in text
    assert "warehouse writable again" in text
    con = wh.connect()
    stored = con.execute("SELECT count(*) FROM scrapes").fetchone()[0]
    stored += con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    stored += con.execute("SELECT count(*) FROM rdma_samples").fetchone()[0]
    # Every row of every round is either stored or counted as dropped; the buffered rounds
    # written on recovery are the newest ones (the oldest went first).
    assert stored + dropped >= 6 * (finished_rounds - 1)
    ts = [t for (t,) in con.execute("SELECT DISTINCT ts FROM scrapes ORDER BY ts").fetchall()]
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert max(gaps).total_seconds() > 0.9  # 4+ dropped rounds leave a hole in the middle


class ReadOnlyWarehouse:
    """A warehouse whose disk refuses every write, as `append` meets a full or read-only disk."""

    def append(self, name: str, batch: pa.Table, batch_ids: Collection[str] = ()) -> int:
        raise OSError(30, "Read-only file system")

    def landed(self, name: str, batch_ids: Collection[str]) -> set[str]:
        return set()  # nothing was ever written


def test_a_full_buffer_drops_old_telemetry_but_never_a_health_change() -> None:
    """Health rows are written once per change: a dropped one would never come again."""
    writer = BufferedWriter(ReadOnlyWarehouse(), max_rows=4, metrics=SelfMetrics())
    health = pa.table({"signal": ["row_remap_failed"], "value": [1.0]})
    writer.write({"health_samples": health, "gpu_samples": pa.table({"util": [0.5] * 3})})
    for _ in range(3):  # three more rounds of telemetry while the disk stays read-only
        writer.write({"gpu_samples": pa.table({"util": [0.5] * 3})})
    kept = [name for name, _, _ in writer._pending]
    assert kept == ["health_samples", "gpu_samples"]  # the newest telemetry batch, the health row


def gpu_batch(second: int) -> pa.Table:
    ts = datetime(2026, 3, 1, 12, 0, second, tzinfo=UTC)
    return pa.table({"ts": [ts] * 4, "node": ["n1"] * 4, "gpu_index": [0, 1, 2, 3]})


@pytest.mark.parametrize("failing", ["log-fsync", "file-write"])
def test_a_retried_round_stores_each_sample_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """An append that raised after its log entry was written (the fsync of the log failed) did
    land: the retry must not store it again. One that failed before its commit did not: the
    retry must store it."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("gpu_samples", gpu_batch(0))  # the table exists, as on a running site
    real = delta.sync_log if failing == "log-fsync" else delta.write_files
    calls = {"n": 0}

    def once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(delta, real.__name__, once)
    writer = BufferedWriter(wh, max_rows=1000, metrics=SelfMetrics())
    writer.write({"gpu_samples": gpu_batch(1)})
    writer.write({"gpu_samples": gpu_batch(2)})  # the next round retries what is buffered
    con = wh.connect({"gpu_samples": None})
    rows = con.execute("SELECT second(ts), count(*) FROM gpu_samples GROUP BY 1 ORDER BY 1")
    assert rows.fetchall() == [(0, 4), (1, 4), (2, 4)]
    assert writer.buffered_rows == 0


def test_a_landed_batch_is_found_however_many_commits_followed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other collectors' commits can bury a landed batch below the newest RETRY_HISTORY (with
    30 collectors on 15 s rounds, 256 commits are two minutes of an outage): `landed` reads back
    to before the batch was made, so its retry is not stored twice."""
    monkeypatch.setattr(store, "RETRY_HISTORY", 4)
    wh = Warehouse(tmp_path / "wh")
    wh.append("gpu_samples", gpu_batch(0))
    ours = batch_id()
    wh.append("gpu_samples", gpu_batch(1), [ours])
    for second in range(2, 20):  # 18 other rounds committed meanwhile
        wh.append("gpu_samples", gpu_batch(second), [batch_id()])
    assert wh.landed("gpu_samples", [ours, batch_id()]) == {ours}
