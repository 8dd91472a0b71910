"""Time of one incident detection round on a day of health readings of a 16 x 8-GPU cluster,
beside the collector's round budget (issue 18: detection runs inside it).

The warehouse (made in a temporary directory, about a minute):
- `health_samples` as the collector writes them (a row per series when its value changes): each
  GPU's 16 signals and each node's InfiniBand port's 6 at the day's start, then a day of
  changes: thermal throttling toggling every few minutes on half the GPUs, corrected ECC and
  PCIe replays creeping up, symbol errors on the ports; a handful of serious XIDs, a failed row
  remap and one flapping link for the detector to find (~50,000 rows).
- `scrapes`: two targets per node (sing exporter, node_exporter) every 15 s (~184,000 rows).
- `jobs`: each node running a job at a time, an hour each.
The day lands in hourly batches, compacted as the collector's maintenance does every 5 minutes,
then its last 10 minutes one collector round (15 s) per commit: two maintenance intervals of
small files (a day's files are merged once there are 16).

Then the figures: the first round (no earlier round: it looks back an hour) and steady rounds,
each after one more collector round was written, reading what arrived since the round before.
Each figure is beside the collector's scrape interval (its round budget) and `[health]
interval_s`.

    .venv/bin/python bench/bench_health.py
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from sing.collector.settings import CollectorSettings
from sing.health.detect import detect_round
from sing.health.settings import HealthSettings
from sing.schema import table
from sing.warehouse.store import Warehouse

NODES, GPUS = 16, 8
SCRAPE_S = CollectorSettings().interval_s
DAY = timedelta(days=1)
END = datetime(2026, 11, 3, tzinfo=UTC)
START = END - DAY
GPU_SIGNALS = [
    "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate", "retired_pages_sbe", "retired_pages_dbe",
    "row_remap_correctable", "row_remap_uncorrectable", "row_remap_pending",
    "row_remap_failed", "throttle_hw_slowdown", "throttle_hw_thermal", "throttle_sw_thermal",
    "pcie_replays", "nvlink_crc_errors", "nvlink_replay_errors",
]  # fmt: skip
PORT_SIGNALS = {"link_state": 4, "physical_state": 5, "link_downed": 0, "link_error_recovery": 0,
                "symbol_error": 0, "port_rcv_errors": 0}  # fmt: skip
STEADY_ROUNDS = 5


def node(i: int) -> str:
    return f"gpu{i:02d}"


def health_rows(rng: random.Random) -> list[dict]:
    """A day of change-only readings, with the faults the detector should find."""
    rows: list[dict] = []

    def add(ts: datetime, n: int, component: str, device: str, signal: str, value: float) -> None:
        uuid = f"GPU-{n:02d}-{device}" if component == "gpu" else None
        where = {"cluster": "campus", "node": node(n), "component": component, "device": device}
        rows.append({"ts": ts, **where, "gpu_uuid": uuid, "signal": signal, "value": float(value)})

    for n in range(NODES):
        for g in range(GPUS):
            for signal in GPU_SIGNALS:
                add(START, n, "gpu", str(g), signal, 0)
            if (n + g) % 2:  # thermal throttling on and off every few minutes
                ts, on = START, 0
                while ts < END:
                    ts += timedelta(minutes=rng.uniform(2, 8))
                    on = 1 - on
                    add(ts, n, "gpu", str(g), "throttle_sw_thermal", on)
            for signal, every_min in (("ecc_corrected_volatile", 30), ("pcie_replays", 60)):
                ts, count = START, 0
                while ts < END:
                    ts += timedelta(minutes=rng.expovariate(1 / every_min))
                    count += 1
                    add(ts, n, "gpu", str(g), signal, count)
        for signal, value in PORT_SIGNALS.items():
            add(START, n, "rdma", "mlx5_0/1", signal, value)
        ts, count = START, 0
        while ts < END:
            ts += timedelta(minutes=rng.expovariate(1 / 5))
            count += 1
            add(ts, n, "rdma", "mlx5_0/1", "symbol_error", count)
    late = END - timedelta(minutes=50)  # the faults: in the first round's look-back (an hour)
    for n in (3, 7):
        add(late - timedelta(hours=n), n, "gpu", "2", "xid_79", 1)  # older: found before
        add(late + timedelta(minutes=n), n, "gpu", "2", "xid_79", 2)
    add(late + timedelta(minutes=15), 5, "gpu", "6", "row_remap_failed", 1)
    for k in range(4):
        add(late + timedelta(minutes=20 + k), 9, "rdma", "mlx5_0/1", "link_downed", k + 1)
    return [r for r in rows if r["ts"] < END]


def scrape_rows(ts: datetime) -> list[dict]:
    return [
        {"ts": ts, "target": f"http://{node(n)}:{port}/metrics", "node": node(n),
         "up": not (n == 12 and ts > END - timedelta(minutes=40)),  # gpu12 dies
         "duration_s": 0.02, "samples": 900, "error": None}
        for n in range(NODES)
        for port in (9410, 9100)
    ]  # fmt: skip


def job_rows() -> list[dict]:
    hour = timedelta(hours=1)
    return [
        {"job_id": f"{n}{h:02d}", "cluster": "campus", "user": "alice", "state": "COMPLETED",
         "submit_time": START + h * hour, "start_time": START + h * hour,
         "end_time": START + (h + 1) * hour, "nodes": [node(n)], "num_nodes": 1,
         "num_gpus": GPUS}
        for n in range(NODES)
        for h in range(24)
    ]  # fmt: skip


def append(wh: Warehouse, name: str, rows: list[dict]) -> None:
    if rows:
        wh.append(name, pa.Table.from_pylist(rows, table(name).schema))


def build(wh: Warehouse) -> dict[str, int]:
    """The day's readings: hourly batches compacted, then a commit per round for 10 minutes."""
    health = sorted(health_rows(random.Random(18)), key=lambda r: r["ts"])
    append(wh, "jobs", job_rows())
    step = timedelta(seconds=SCRAPE_S)
    rounds = [START + k * step for k in range(int(DAY / step) - 1)]  # the last: steady rounds
    small = END - timedelta(minutes=10)
    counts = {"health_samples": len(health), "scrapes": len(rounds) * NODES * 2}
    hours = [START + timedelta(hours=h) for h in range(25)]
    for lo, hi in zip(hours, hours[1:], strict=False):
        hi = min(hi, small)
        append(wh, "health_samples", [r for r in health if lo <= r["ts"] < hi])
        append(wh, "scrapes", [row for ts in rounds if lo <= ts < hi for row in scrape_rows(ts)])
    wh.compact(now=small)
    for ts in (t for t in rounds if t >= small):
        append(wh, "health_samples", [r for r in health if ts <= r["ts"] < ts + step])
        append(wh, "scrapes", scrape_rows(ts))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    settings = HealthSettings()
    with tempfile.TemporaryDirectory(prefix="sing-bench-health-") as tmp:
        wh = Warehouse(Path(tmp) / "wh")
        began = time.monotonic()
        counts = build(wh)
        print(f"warehouse: {NODES} nodes x {GPUS} GPUs, one day: {counts['health_samples']:,} "
              f"health_samples rows, {counts['scrapes']:,} scrapes rows "
              f"(built in {time.monotonic() - began:.0f} s)\n")  # fmt: skip
        first = detect_round(wh, settings, "campus", now=END)
        found = sorted({f"{f.klass} {f.node}" for f in first.findings})
        steady = []
        ts = END - timedelta(seconds=SCRAPE_S)
        for _ in range(STEADY_ROUNDS):
            append(wh, "scrapes", scrape_rows(ts))
            ts += timedelta(seconds=SCRAPE_S)
            steady.append(detect_round(wh, settings, "campus", now=ts).seconds)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"first round: {len(first.opened)} incidents opened ({', '.join(found)}), "
          f"{len(first.noted)} notes")  # fmt: skip
    print(f"\n{'measure':<40} {'figure':>8} {'budget':>8}  share of the budget")
    for name, seconds in (
        ("first round, 1 h look-back (s)", first.seconds),
        (f"steady round (s, median of {STEADY_ROUNDS})", statistics.median(steady)),
        ("steady round, slowest (s)", max(steady)),
    ):
        print(f"{name:<40} {seconds:8.2f} {SCRAPE_S:8.0f}  {seconds / SCRAPE_S:.0%} of a scrape "
              f"interval; {seconds / settings.interval_s:.1%} of [health] interval_s")  # fmt: skip
    print(f"{'peak RSS of the process (MiB)':<40} {rss_mib:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
