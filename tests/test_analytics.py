"""Analytics reports on tiny hand-made warehouses: every expected number is worked out by hand.

Jobs are written through `Warehouse.append` exactly as the collector and executors write them:
job records, the GPUs each job held, GPU samples stamped with the job id, RDMA samples with their
deltas. Samples are every 15 minutes (the reports average samples, so the spacing only changes
row counts) and each job's utilisation is constant, so every figure is a small sum.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sing.collector.counters import CounterDeltas
from sing.collector.rows import HOST_COUNTERS
from sing.schema import table
from sing.warehouse import analytics, delta
from sing.warehouse.store import Warehouse

ROOT = Path(__file__).resolve().parents[1]
SING = ROOT / ".venv" / "bin" / "sing"
GIB = 2**30
STEP = timedelta(minutes=15)
# Monday 2026-01-05, 10:00 UTC: every test's clock starts here.
T0 = datetime(2026, 1, 5, 10, tzinfo=UTC)
DEMO_END = "2026-01-10T00:00:00+00:00"  # end of the 2-day synthetic history


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


# Nodes are in the inventory from a month before every test's clock starts.
SINCE_EVER = T0 - timedelta(days=30)


def add_nodes(
    wh: Warehouse, names: list[str], gpus: int = 4, valid_from: datetime = SINCE_EVER
) -> None:
    """A version of each node, as the collector writes one when it first sees it or it changes."""
    wh.append(
        "nodes",
        pl.DataFrame(
            {
                "node": names,
                "gpus": [gpus] * len(names),
                "gpu_model": ["H100"] * len(names),
                "gpu_memory_bytes": [80 * GIB] * len(names),
                "partition": ["gpu"] * len(names),
                "cluster": ["test"] * len(names),
                "valid_from": [valid_from] * len(names),
                "source": ["exporter"] * len(names),
            }
        ),
    )


def add_job(
    wh: Warehouse,
    job_id: str,
    nodes: list[str],
    gpus_per_node: int,
    start: datetime,
    end: datetime | None,
    *,
    user: str = "alice",
    submit: datetime | None = None,
    partition: str = "gpu",
    state: str | None = None,
    cluster: str = "test",
    account: str | None = None,
) -> None:
    """A job record and the GPUs it held (GPUs 0..gpus_per_node-1 of each node)."""
    wh.append(
        "jobs",
        pl.DataFrame(
            [
                {
                    "job_id": job_id,
                    "cluster": cluster,
                    "user": user,
                    "account": account or f"{user}-lab",
                    "partition": partition,
                    "name": f"job-{job_id}",
                    "submit_time": submit or start,
                    "start_time": start,
                    "end_time": end,
                    "state": state or ("RUNNING" if end is None else "COMPLETED"),
                    "exit_code": None if end is None else 0,
                    "num_nodes": len(nodes),
                    "gpus_per_node": gpus_per_node,
                    "num_gpus": len(nodes) * gpus_per_node,
                    "time_limit_s": 86_400,
                    "nodes": nodes,
                }
            ]
        ),
    )
    wh.append(
        "job_gpus",
        pl.DataFrame(
            [
                {
                    "job_id": job_id,
                    "cluster": cluster,
                    "node": node,
                    "gpu_index": i,
                    "start_time": start,
                    "end_time": end,
                }
                for node in nodes
                for i in range(gpus_per_node)
            ]
        ),
    )


def sample_times(start: datetime, end: datetime) -> list[datetime]:
    """Sample instants in [start, end), every STEP."""
    n = int((end - start) / STEP)
    return [start + k * STEP for k in range(n)]


def add_gpu_samples(
    wh: Warehouse,
    job_id: str | None,
    node: str,
    gpus: list[int],
    start: datetime,
    end: datetime,
    util: float,
    *,
    sm: float | None = None,
    mem_bytes: int = 10 * GIB,
    power_w: float = 100.0,
    energy0_j: float = 1e6,
    cluster: str | None = "test",
) -> None:
    """Constant-utilisation samples; the energy counter integrates `power_w` from `energy0_j`,
    and each sample's delta is the energy of the step before it, as the collector writes them."""
    times = sample_times(start, end)
    rows = [
        {
            "ts": ts,
            "node": node,
            "gpu_index": g,
            "util": util,
            "sm_active": sm,
            "mem_used_bytes": mem_bytes,
            "mem_total_bytes": 80 * GIB,
            "power_w": power_w,
            "energy_j": energy0_j + power_w * k * STEP.total_seconds(),
            "energy_delta_j": power_w * STEP.total_seconds(),
            "temp_c": 40.0,
            "job_id": job_id,
            "cluster": cluster,
        }
        for g in gpus
        for k, ts in enumerate(times)
    ]
    wh.append("gpu_samples", pl.DataFrame(rows, schema_overrides={"sm_active": pl.Float32}))


def add_rdma_samples(
    wh: Warehouse,
    job_id: str,
    node: str,
    start: datetime,
    end: datetime,
    tx_per_sample: int,
    rx_per_sample: int,
    cluster: str = "test",
) -> None:
    """One port's counters, rising by the given deltas each sample."""
    times = sample_times(start, end)
    rows = [
        {
            "ts": ts,
            "node": node,
            "device": "mlx5_0",
            "port": 1,
            "tx_bytes": tx_per_sample * (k + 1),
            "rx_bytes": rx_per_sample * (k + 1),
            "tx_delta_bytes": tx_per_sample,
            "rx_delta_bytes": rx_per_sample,
            "job_id": job_id,
            "cluster": cluster,
        }
        for k, ts in enumerate(times)
    ]
    wh.append("rdma_samples", pl.DataFrame(rows))


def add_host_samples(
    wh: Warehouse,
    job_id: str,
    node: str,
    start: datetime,
    end: datetime,
    cores_busy: float,
    *,
    cpus: int | None,
    mem_peak: int,
    mem_limit: int | None = None,
    io_per_sample: int = 0,
    cluster: str = "test",
) -> None:
    """A job's cgroup on `node`: `cores_busy` cores' CPU seconds by the end of each sample's
    step (the counter at the last sample is cores_busy x (end - start)), memory at `mem_peak`,
    I/O read and written rising by `io_per_sample`; deltas as the collector writes them."""
    deltas = CounterDeltas()
    rows = []
    for k, ts in enumerate(sample_times(start, end)):
        cpu_s = cores_busy * (k + 1) * STEP.total_seconds()
        io = io_per_sample * (k + 1)
        row = {"ts": ts, "cluster": cluster, "node": node, "job_id": job_id, "cpu_s": cpu_s,
               "cpuset_cpus": cpus, "mem_used_bytes": mem_peak, "mem_peak_bytes": mem_peak,
               "mem_limit_bytes": mem_limit, "io_read_bytes": io, "io_write_bytes": io}  # fmt: skip
        for column, delta_column in HOST_COUNTERS.items():
            row[delta_column] = deltas.delta(column, row[column])
        rows.append(row)
    wh.append("job_host_samples", pa.Table.from_pylist(rows, table("job_host_samples").schema))


def add_busy_job(
    wh: Warehouse,
    job_id: str,
    nodes: list[str],
    gpus_per_node: int,
    start: datetime,
    end: datetime | None,
    util: float,
    *,
    now: datetime | None = None,
    rdma_per_sample: int = 0,
    **job: object,
) -> None:
    """A job plus constant-utilisation samples on all its GPUs (and RDMA if asked)."""
    add_job(wh, job_id, nodes, gpus_per_node, start, end, **job)  # type: ignore[arg-type]
    until = end or now
    assert until is not None
    for node in nodes:
        add_gpu_samples(wh, job_id, node, list(range(gpus_per_node)), start, until, util)
        if rdma_per_sample:
            add_rdma_samples(wh, job_id, node, start, until, rdma_per_sample, rdma_per_sample)


def rows_by_id(frame: pl.DataFrame, key: str = "job_id") -> dict:
    return {r[key]: r for r in frame.to_dicts()}


def run_sing(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SING), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SING_CONFIG": "", **(env or {})},
    )


# ---- job_usage ----------------------------------------------------------------------------


@pytest.fixture
def usage_wh(tmp_path: Path) -> Warehouse:
    """Three jobs: a half-idle 1-node job, a 2-node job across midnight, a running job.

    A: n1 GPUs 0-1, 10:00-12:00, queued 1 h. GPU 0: util 0.8, SM 0.6, 40 GiB, 400 W;
       GPU 1: util 0 (never used), SM 0, 1 GiB, 100 W.
    B: n2+n3 x 4 GPUs, 22:00-01:00 (crosses the UTC day), util 0.02 (above the 1% idle-sample
       mark), RDMA tx + rx per sample: n2 1 MB + 2 MB, n3 3 MB + 4 MB.
    C: n4 x 4 GPUs, started 10:00, still running; util 0.5.
    """
    wh = Warehouse(tmp_path / "wh")
    add_nodes(wh, ["n1", "n2", "n3", "n4"])
    add_job(wh, "A", ["n1"], 2, at(0), at(2), submit=at(-1))
    add_gpu_samples(
        wh, "A", "n1", [0], at(0), at(2), 0.8, sm=0.6, mem_bytes=40 * GIB, power_w=400.0
    )
    add_gpu_samples(wh, "A", "n1", [1], at(0), at(2), 0.0, sm=0.0, mem_bytes=GIB, power_w=100.0)
    add_job(wh, "B", ["n2", "n3"], 4, at(12), at(15), user="bob")
    for node, tx, rx in (("n2", 10**6, 2 * 10**6), ("n3", 3 * 10**6, 4 * 10**6)):
        add_gpu_samples(wh, "B", node, [0, 1, 2, 3], at(12), at(15), 0.02)
        add_rdma_samples(wh, "B", node, at(12), at(15), tx, rx)
    add_busy_job(wh, "C", ["n4"], 4, at(0), None, 0.5, now=at(3), user="carol")
    return wh


def test_job_usage_hand_numbers(usage_wh: Warehouse) -> None:
    jobs = rows_by_id(analytics.job_usage(usage_wh.connect(), now=at(3)))
    a, b, c = jobs["A"], jobs["B"], jobs["C"]

    # A: 2 GPUs x 2 h; GPU 1 idle the whole time -> half the samples idle.
    assert a["run_s"] == 7200.0 and a["queue_s"] == 3600.0
    assert a["gpu_hours"] == pytest.approx(4.0)
    assert a["mean_util"] == pytest.approx(0.4)
    assert a["mean_sm_active"] == pytest.approx(0.3)
    assert a["idle_share"] == pytest.approx(0.5)
    assert a["idle_gpu_hours"] == pytest.approx(2.0)
    assert (a["gpus_never_used"], a["gpus_sampled"]) == (1, 2)
    assert a["peak_mem_bytes"] == 40 * GIB and a["gpu_mem_bytes"] == 80 * GIB
    # Energy counter: 8 samples, 7 intervals of 900 s between first and last: (400+100) W x 6300 s.
    assert a["energy_j"] == pytest.approx(500 * 6300)
    assert a["rdma_tx_bytes"] is None and a["rdma_bytes_per_node_hour"] == 0.0  # no RDMA seen

    # B: 8 GPUs x 3 h; 2% is above the 1% idle-sample mark, so no idle GPU-hours.
    assert b["gpu_hours"] == pytest.approx(24.0)
    assert b["mean_util"] == pytest.approx(0.02)
    assert b["mean_sm_active"] is None  # no SM samples: unknown, not zero
    assert b["idle_gpu_hours"] == pytest.approx(0.0) and b["gpus_never_used"] == 0
    # 12 samples per node: tx 12 MB + 36 MB, rx 24 MB + 48 MB; 120 MB over 2 nodes x 3 h.
    assert b["rdma_tx_bytes"] == 48 * 10**6 and b["rdma_rx_bytes"] == 72 * 10**6
    assert b["rdma_bytes_per_node_hour"] == pytest.approx(20e6)

    # C runs on: counted up to `now` (3 h), as RUNNING with no end.
    assert c["end_time"] is None and c["run_s"] == 3 * 3600.0
    assert c["gpu_hours"] == pytest.approx(12.0)
    assert c["mean_util"] == pytest.approx(0.5)


def test_job_usage_same_after_compaction(usage_wh: Warehouse) -> None:
    """Days closed and rolled up give the numbers the live (hot) rollup views gave."""
    before = analytics.job_usage(usage_wh.connect(), now=at(3)).sort("job_id")
    result = usage_wh.compact(now=at(48), settle_s=0)
    assert result.rollup_days > 0
    after = analytics.job_usage(usage_wh.connect(), now=at(3)).sort("job_id")
    assert after.columns == before.columns
    for old, new in zip(before.to_dicts(), after.to_dicts(), strict=True):
        for column, value in old.items():
            if isinstance(value, float):
                assert new[column] == pytest.approx(value), column
            else:
                assert new[column] == value, column


def test_job_usage_window_selects_overlapping_jobs(usage_wh: Warehouse) -> None:
    con = usage_wh.connect()
    # [12:00, 22:30): B starts in it, C still runs in it, A ended as it began (half-open).
    ids = analytics.job_usage(con, since=at(2), until=at(12.5), now=at(20))["job_id"].to_list()
    assert sorted(ids) == ["B", "C"]
    # A job's figures are over its whole life even when the window cuts it.
    b = rows_by_id(analytics.job_usage(con, since=at(13), until=at(14), now=at(20)))["B"]
    assert b["gpu_hours"] == pytest.approx(24.0)
    # A window ending exactly at a job's start excludes it.
    ids = analytics.job_usage(con, since=at(-5), until=at(0), now=at(4))["job_id"].to_list()
    assert ids == []


# ---- utilization by node count ----------------------------------------------------------


def test_utilization_by_node_count_groups_and_weights(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    nodes = [f"n{i}" for i in range(1, 9)]
    # (id, node count, GPUs per node, hours, util, partition)
    for job_id, n, g, hours, util, part in (
        ("J1", 1, 1, 2, 0.6, "gpu"),  # 2 GPU-h
        ("J2", 1, 4, 1, 0.9, "interactive"),  # 4 GPU-h
        ("J3", 2, 4, 1, 0.4, "gpu"),  # 8 GPU-h
        ("J4", 3, 4, 1, 0.2, "gpu"),  # 12 GPU-h -> the 4-node group
        ("J5", 4, 4, 2, 0.3, "gpu"),  # 32 GPU-h
        ("J6", 5, 4, 1, 0.1, "gpu"),  # 20 GPU-h -> the 8-node group
        ("J7", 8, 4, 1, 0.1, "gpu"),  # 32 GPU-h
    ):
        add_busy_job(wh, job_id, nodes[:n], g, at(0), at(hours), util, partition=part)
    add_job(wh, "no-samples", ["n1"], 1, at(0), at(1))  # no telemetry: left out, not util 0
    con = wh.connect()

    table = rows_by_id(analytics.utilization_by_node_count(con, now=at(5)), "nodes")
    assert sorted(table) == [1, 2, 4, 8]
    assert (table[1]["jobs"], table[1]["gpu_hours"]) == (2, pytest.approx(6.0))
    assert table[1]["weighted_util"] == pytest.approx((0.6 * 2 + 0.9 * 4) / 6)  # 0.8
    assert table[1]["mean_job_util"] == pytest.approx(0.75)
    assert table[2]["weighted_util"] == pytest.approx(0.4)
    assert (table[4]["jobs"], table[4]["gpu_hours"]) == (2, pytest.approx(44.0))
    assert table[4]["weighted_util"] == pytest.approx((12 * 0.2 + 32 * 0.3) / 44)
    assert (table[8]["jobs"], table[8]["weighted_util"]) == (2, pytest.approx(0.1))
    assert table[4]["p50_util"] == pytest.approx(0.25)  # median of 0.2 and 0.3

    gpu_only = rows_by_id(
        analytics.utilization_by_node_count(con, partition="gpu", now=at(5)), "nodes"
    )
    assert gpu_only[1]["jobs"] == 1 and gpu_only[1]["weighted_util"] == pytest.approx(0.6)


# ---- fairness -----------------------------------------------------------------------------


def test_jain_index_known_values() -> None:
    assert analytics.jain_index([1, 1]) == 1.0
    assert analytics.jain_index([1, 0]) == 0.5
    assert analytics.jain_index([5, 0, 0, 0]) == 0.25  # one user got everything: 1/n
    assert analytics.jain_index([8, 8, 16]) == pytest.approx(32**2 / (3 * (64 + 64 + 256)))
    assert analytics.jain_index([]) == 1.0


def test_fairness_shares_queueing_and_window(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    # alice: 4 GPUs x 2 h, one job queued 0 h and one 2 h (2 GPUs x 2 h each);
    # bob: 8 GPUs x 1 h queued 1 h; carol: 4 GPUs x 4 h queued 0 h.
    add_job(wh, "a1", ["n1"], 2, at(0), at(2), user="alice", submit=at(0))
    add_job(wh, "a2", ["n1"], 2, at(2), at(4), user="alice", submit=at(0))
    add_job(wh, "b1", ["n2"], 8, at(1), at(2), user="bob", submit=at(0))
    add_job(wh, "c1", ["n3"], 4, at(0), at(4), user="carol", submit=at(0))
    add_job(wh, "p1", ["n3"], 4, at(30), None, user="dave", submit=at(0))  # after the window
    con = wh.connect()

    users, jain = analytics.fairness(con, until=at(24), now=at(24))
    by_user = rows_by_id(users, "user")
    assert users["user"][0] == "carol"  # by GPU-hours, descending
    assert [by_user[u]["gpu_hours"] for u in ("alice", "bob", "carol")] == pytest.approx([8, 8, 16])
    assert by_user["carol"]["share"] == pytest.approx(0.5)
    assert by_user["alice"]["share"] == pytest.approx(0.25)
    assert by_user["alice"]["equal_share"] == pytest.approx(1 / 3)
    assert jain == pytest.approx(1024 / 1152)
    assert by_user["alice"]["mean_queue_h"] == pytest.approx(1.0)
    assert by_user["alice"]["p95_queue_h"] == pytest.approx(1.9)  # 0 + 0.95 x (2 - 0)
    assert by_user["bob"]["mean_queue_h"] == pytest.approx(1.0)

    # [1 h, 3 h): alice 2 GPUs x 1 h (a1) + 2 x 1 h (a2); bob 8 x 1 h; carol 4 x 2 h.
    users, jain = analytics.fairness(con, since=at(1), until=at(3), now=at(24))
    by_user = rows_by_id(users, "user")
    assert [by_user[u]["gpu_hours"] for u in ("alice", "bob", "carol")] == pytest.approx([4, 8, 8])
    assert jain == pytest.approx(20**2 / (3 * (16 + 64 + 64)))

    # Equal use -> Jain 1; a running job counts up to now.
    users, jain = analytics.fairness(con, since=at(2), until=at(40), now=at(31))
    by_user = rows_by_id(users, "user")
    assert by_user["dave"]["gpu_hours"] == pytest.approx(4.0)  # 4 GPUs x 1 h, still running
    assert by_user["alice"]["gpu_hours"] == pytest.approx(4.0)  # a2 only
    assert by_user["carol"]["gpu_hours"] == pytest.approx(8.0)


# ---- idle multi-node jobs ---------------------------------------------------------------


@pytest.fixture
def idle_wh(tmp_path: Path) -> Warehouse:
    wh = Warehouse(tmp_path / "wh")
    two, four = ["n1", "n2"], ["n3", "n4", "n5", "n6"]
    # I1: 8 GPUs x 4 h at 1%, no RDMA           -> wasted 32 x 0.99 = 31.68, low RDMA
    # I2: 16 GPUs x 1 h at 0%, 2 GB per node-hour -> wasted 16, RDMA fine
    # I3: 2 nodes at 30%: not idle; I4: 1 node at 0%: not multi-node
    # I5: running since 23:00 (now 24:00) at 2% -> wasted 8 x 0.98 = 7.84
    # I6: 2 nodes for 15 minutes at 0%           -> wasted 2 (shorter than idle_job_min_hours)
    add_busy_job(wh, "I1", two, 4, at(0), at(4), 0.01)
    add_busy_job(wh, "I2", four, 4, at(5), at(6), 0.0, rdma_per_sample=250_000_000)
    add_busy_job(wh, "I3", two, 4, at(6), at(8), 0.3)
    add_busy_job(wh, "I4", ["n7"], 4, at(0), at(8), 0.0)
    add_busy_job(wh, "I5", two, 4, at(13), None, 0.02, now=at(14), user="bob")
    add_busy_job(wh, "I6", four[:2], 4, at(10), at(10.25), 0.0)
    return wh


def test_idle_multinode_jobs_ranked_by_waste(idle_wh: Warehouse) -> None:
    con = idle_wh.connect()
    idle = analytics.idle_multinode_jobs(con, util_threshold=0.05, now=at(14))
    assert idle["job_id"].to_list() == ["I1", "I2", "I5", "I6"]
    rows = rows_by_id(idle)
    assert rows["I1"]["wasted_gpu_hours"] == pytest.approx(31.68)
    assert rows["I2"]["wasted_gpu_hours"] == pytest.approx(16.0)
    assert rows["I5"]["wasted_gpu_hours"] == pytest.approx(7.84)
    # 4 samples x 250 MB x 2 directions per node-hour, per node = 2 GB.
    assert rows["I2"]["rdma_bytes_per_node_hour"] == pytest.approx(2e9)
    assert [rows[j]["low_rdma"] for j in ("I1", "I2", "I5")] == [True, False, True]

    stricter = analytics.idle_multinode_jobs(con, util_threshold=0.015, now=at(14))
    assert stricter["job_id"].to_list() == ["I1", "I2", "I6"]  # I5 at 2% is above 1.5%
    running = analytics.idle_multinode_jobs(con, running_only=True, now=at(14))
    assert running["job_id"].to_list() == ["I5"]
    wide = analytics.idle_multinode_jobs(con, min_nodes=4, now=at(14))
    assert wide["job_id"].to_list() == ["I2"]
    window = analytics.idle_multinode_jobs(con, since=at(4.5), until=at(12), now=at(14))
    assert window["job_id"].to_list() == ["I2", "I6"]


def test_idle_report_cli_ignores_short_allocations(idle_wh: Warehouse) -> None:
    """[thresholds] idle_job_min_hours (default 1 h): the 15-minute I6 is not listed."""
    out = run_sing(
        "--warehouse", str(idle_wh.root), "report", "idle", "--until", "2026-01-06", "--json"
    )
    assert out.returncode == 0, out.stderr
    ids = [r["job_id"] for r in json.loads(out.stdout)["rows"]]
    assert "I1" in ids and "I2" in ids
    assert "I6" not in ids, "allocations shorter than idle_job_min_hours must be left out"


# ---- cluster usage ------------------------------------------------------------------------


@pytest.fixture
def cluster_wh(tmp_path: Path) -> Warehouse:
    """12 GPUs (3 nodes x 4). K1: n1 x 4, 10:00-12:00 at 0.6; K2: n2+n3 x 8, 11:30-13:00 at 0.3.
    Every GPU is sampled every 15 minutes from 10:00 to 15:00; idle GPUs report 0."""
    wh = Warehouse(tmp_path / "wh")
    add_nodes(wh, ["n1", "n2", "n3"])
    add_job(wh, "K1", ["n1"], 4, at(0), at(2))
    add_job(wh, "K2", ["n2", "n3"], 4, at(1.5), at(3))
    gpus = [0, 1, 2, 3]
    add_gpu_samples(wh, "K1", "n1", gpus, at(0), at(2), 0.6)
    add_gpu_samples(wh, None, "n1", gpus, at(2), at(5), 0.0)
    for node in ("n2", "n3"):
        add_gpu_samples(wh, None, node, gpus, at(0), at(1.5), 0.0)
        add_gpu_samples(wh, "K2", node, gpus, at(1.5), at(3), 0.3)
        add_gpu_samples(wh, None, node, gpus, at(3), at(5), 0.0)
    return wh


def test_cluster_usage_hourly(cluster_wh: Warehouse) -> None:
    frame = analytics.cluster_usage(
        cluster_wh.connect(), since=at(0), until=at(4), bucket="hour", now=at(24)
    )
    hours = {r["bucket"]: r for r in frame.to_dicts()}
    assert sorted(hours) == [at(0), at(1), at(2), at(3)]
    assert all(r["capacity_gpu_hours"] == pytest.approx(12.0) for r in hours.values())
    # 10:00 K1 4 GPU-h; 11:00 K1 4 + K2 8 x 0.5; 12:00 K2 8; 13:00 nothing.
    assert [hours[at(h)]["allocated_gpu_hours"] for h in range(3)] == pytest.approx([4, 8, 8])
    assert [hours[at(h)]["assignment_rate"] for h in range(3)] == pytest.approx(
        [1 / 3, 2 / 3, 2 / 3]
    )
    # 11:00: two quarter-hours with 4 GPUs at 0.6, two with those plus 8 at 0.3, over 12 GPUs.
    assert [hours[at(h)]["util"] for h in range(4)] == pytest.approx([0.2, 0.3, 0.2, 0.0])
    assert [hours[at(h)]["sampled_assignment"] for h in range(4)] == pytest.approx(
        [1 / 3, 2 / 3, 2 / 3, 0.0]
    )


def test_cluster_usage_hour_with_no_job_is_zero(cluster_wh: Warehouse) -> None:
    """14:00, after every job ended: sampled idle GPUs, nothing allocated -> rate 0, not 100%."""
    frame = analytics.cluster_usage(
        cluster_wh.connect(), since=at(0), until=at(5), bucket="hour", now=at(24)
    )
    last = frame.filter(pl.col("bucket") == at(4)).row(0, named=True)
    assert last["util"] == 0.0 and last["sampled_assignment"] == 0.0
    assert last["assignment_rate"] == 0.0
    assert last["allocated_gpu_hours"] == 0.0


def test_cluster_usage_daily(cluster_wh: Warehouse) -> None:
    frame = analytics.cluster_usage(
        cluster_wh.connect(), since=at(0), until=at(4), bucket="day", now=at(24)
    )
    (day,) = frame.to_dicts()
    assert day["bucket"] == datetime(2026, 1, 5, tzinfo=UTC)
    # The window holds 4 h of the day: capacity 12 x 4 = 48 GPU-h, allocated 8 + 12 = 20.
    assert day["capacity_gpu_hours"] == pytest.approx(48.0)
    assert day["allocated_gpu_hours"] == pytest.approx(20.0)
    assert day["assignment_rate"] == pytest.approx(20 / 48)
    # Busy-GPU samples: 8 quarter-hours of 4 x 0.6, 6 of 8 x 0.3, over 16 x 12 samples.
    assert day["util"] == pytest.approx((8 * 2.4 + 6 * 2.4) / 192)


def test_cluster_usage_partial_buckets(cluster_wh: Warehouse) -> None:
    """A window cutting buckets counts capacity and allocation inside the window only."""
    frame = analytics.cluster_usage(
        cluster_wh.connect(), since=at(0.5), until=at(2.5), bucket="hour", now=at(24)
    )
    hours = {r["bucket"]: r for r in frame.to_dicts()}
    # 10:30-11:00: K1 4 GPUs x 0.5 h of 12 x 0.5 h.
    assert hours[at(0)]["capacity_gpu_hours"] == pytest.approx(6.0)
    assert hours[at(0)]["allocated_gpu_hours"] == pytest.approx(2.0)
    assert hours[at(0)]["assignment_rate"] == pytest.approx(1 / 3)
    # 12:00-12:30: K2 8 GPUs x 0.5 h of 12 x 0.5 h.
    assert hours[at(2)]["capacity_gpu_hours"] == pytest.approx(6.0)
    assert hours[at(2)]["allocated_gpu_hours"] == pytest.approx(4.0)
    assert hours[at(2)]["assignment_rate"] == pytest.approx(2 / 3)
    # Utilisation comes from hourly rollups: the hour the window starts in is not dropped.
    assert hours[at(0)]["util"] == pytest.approx(0.2)


def test_cluster_usage_running_job_counts_to_now(cluster_wh: Warehouse) -> None:
    add_job(cluster_wh, "K3", ["n1"], 4, at(3), None)
    frame = analytics.cluster_usage(cluster_wh.connect(), since=at(3), bucket="hour", now=at(4.5))
    hours = {r["bucket"]: r for r in frame.to_dicts()}
    assert sorted(hours) == [at(3), at(4)]
    assert hours[at(4)]["capacity_gpu_hours"] == pytest.approx(6.0)  # up to now: half an hour
    assert hours[at(4)]["allocated_gpu_hours"] == pytest.approx(2.0)
    assert hours[at(3)]["assignment_rate"] == pytest.approx(4 / 12)


def test_cluster_usage_rejects_unknown_bucket(cluster_wh: Warehouse) -> None:
    with pytest.raises(ValueError, match="bucket"):
        analytics.cluster_usage(cluster_wh.connect(), bucket="minute")


# ---- the `sing report` commands on a small synthetic warehouse --------------------------


@pytest.fixture(scope="module")
def demo_wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo") / "wh"
    out = run_sing(
        "--warehouse", str(root), "demo-data", "--days", "2", "--seed", "3", "--end", DEMO_END
    )
    assert out.returncode == 0, out.stderr
    return root


def report_json(root: Path, *args: str) -> dict:
    """A report of the demo history as of its end (`--now`: running jobs count up to there)."""
    out = run_sing("--warehouse", str(root), "report", *args, "--now", DEMO_END, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_report_jobs_cli_matches_function(demo_wh: Path) -> None:
    rows = {r["job_id"]: r for r in report_json(demo_wh, "jobs")["rows"]}
    now = datetime.fromisoformat(DEMO_END)
    expected = analytics.job_usage(Warehouse(demo_wh).connect(), now=now)
    assert len(rows) == expected.height > 300
    assert sum(r["end_time"] is None for r in rows.values()) > 0  # some still run at the end
    for job in expected.to_dicts():
        got = rows[job["job_id"]]
        assert got["gpu_hours"] == pytest.approx(job["gpu_hours"])
        assert got["mean_util"] == pytest.approx(job["mean_util"], nan_ok=True)


def test_stale_warehouse_reports_as_of_its_newest_sample(demo_wh: Path) -> None:
    """Without --now, a history that ended long ago does not count running jobs up to today."""
    out = run_sing("--warehouse", str(demo_wh), "report", "jobs", "--json")
    assert out.returncode == 0, out.stderr
    running = [r for r in json.loads(out.stdout)["rows"] if r["end_time"] is None]
    newest = datetime.fromisoformat(DEMO_END) - timedelta(seconds=15)
    for r in running:
        started = datetime.fromisoformat(r["start_time"])
        assert started + timedelta(seconds=r["run_s"]) == newest


def test_report_by_nodes_cli(demo_wh: Path) -> None:
    rows = report_json(demo_wh, "by-nodes", "--until", DEMO_END)["rows"]
    assert [r["nodes"] for r in rows] == [1, 2, 4, 8]
    assert sum(r["jobs"] for r in rows) > 300
    assert all(0 <= r["weighted_util"] <= 1 for r in rows)
    one = rows[0]
    assert one["p10_util"] <= one["p50_util"] <= one["p90_util"]


def test_report_fairness_cli(demo_wh: Path) -> None:
    report = report_json(demo_wh, "fairness", "--until", DEMO_END)
    shares = [r["share"] for r in report["rows"]]
    assert sum(shares) == pytest.approx(1.0)
    assert all(r["equal_share"] == pytest.approx(1 / len(shares)) for r in report["rows"])
    assert 1 / len(shares) <= report["jain_index"] <= 1
    hours = [r["gpu_hours"] for r in report["rows"]]
    assert report["jain_index"] == pytest.approx(analytics.jain_index(hours))
    # Inside a closed window GPU-hours are clipped to it: at most 128 GPUs x 48 h.
    assert sum(hours) <= 128 * 48 + 1e-6


def test_report_idle_cli(demo_wh: Path) -> None:
    rows = report_json(demo_wh, "idle")["rows"]
    assert rows, "the synthetic workload holds idle multi-node jobs"
    assert all(r["num_nodes"] >= 2 and r["mean_util"] < 0.05 for r in rows)
    wasted = [r["wasted_gpu_hours"] for r in rows]
    assert wasted == sorted(wasted, reverse=True)
    assert all(r["low_rdma"] for r in rows)  # idle synthetic jobs send next to nothing


def test_report_cluster_cli(demo_wh: Path) -> None:
    window = ("--since", "2026-01-08T00:00:00Z", "--until", "2026-01-10T00:00:00Z")
    days = report_json(demo_wh, "cluster", *window)["rows"]
    assert [r["bucket"][:10] for r in days] == ["2026-01-09", "2026-01-08"]  # newest first
    assert all(r["capacity_gpu_hours"] == pytest.approx(128 * 24) for r in days)
    assert all(0.5 < r["assignment_rate"] <= 1 for r in days)
    # Allocation from job records and from sample stamps tell the same story (within 2 points).
    assert all(abs(r["assignment_rate"] - r["sampled_assignment"]) < 0.02 for r in days)
    hours = report_json(demo_wh, "cluster", *window, "--bucket", "hour")["rows"]
    assert len(hours) == 48
    day_gpu_h = sum(r["allocated_gpu_hours"] for r in hours[:24])  # the newest day's hours
    assert day_gpu_h == pytest.approx(days[0]["allocated_gpu_hours"])


def test_report_rejects_bad_time(demo_wh: Path) -> None:
    out = run_sing("--warehouse", str(demo_wh), "report", "jobs", "--since", "yesterday")
    assert out.returncode == 2
    assert "'yesterday' is neither an ISO 8601 time" in out.stderr


# ---- capacity from the node inventory's history -----------------------------------------


def add_node_version(wh: Warehouse, node: str, gpus: int, valid_from: datetime) -> None:
    add_nodes(wh, [node], gpus=gpus, valid_from=valid_from)


def write_as_before(wh: Warehouse, name: str, data: pa.Table, day: str | None = None) -> None:
    """A Parquet file as a warehouse written before this schema holds it: no new columns."""
    spec = table(name)
    partition = [delta.DAY] if spec.is_samples else []
    table_dir = wh.table_dir(name)
    dt = delta.ensure_table(table_dir, delta.table_schema(spec.schema, spec.is_samples), partition)
    tmp = delta.temporary_path(table_dir, date.fromisoformat(day) if day else None)
    pq.write_table(data, tmp)
    added = delta.publish(
        table_dir, date.fromisoformat(day) if day else None, tmp, spec.time_column
    )
    delta.commit(dt, [added], "append")


def test_capacity_follows_node_versions(tmp_path: Path) -> None:
    """n1 (4 GPUs) since long ago and gone (gpus 0) at 13:00; n2 added at 11:30, first said to
    have 2 GPUs, then corrected to 8 by a newer record of the same version."""
    wh = Warehouse(tmp_path / "wh")
    add_node_version(wh, "n1", 4, SINCE_EVER)
    add_node_version(wh, "n1", 0, at(3))
    add_node_version(wh, "n2", 2, at(1.5))
    add_node_version(wh, "n2", 8, at(1.5))  # same key, newer recorded_at: this one counts
    add_job(wh, "K", ["n2"], 4, at(0), at(4))
    frame = analytics.cluster_usage(wh.connect(), since=at(0), until=at(4), bucket="hour")
    # 10:00 n1 4; 11:00 n1 4 + n2 8 x 0.5; 12:00 4 + 8; 13:00 n2 only.
    assert frame["capacity_gpu_hours"].to_list() == pytest.approx([4, 8, 12, 8])
    assert frame["assignment_rate"].to_list() == pytest.approx([1, 0.5, 1 / 3, 0.5])


def test_capacity_partial_history_and_gone_nodes(tmp_path: Path) -> None:
    """Buckets before the inventory starts have no capacity (and no rate); a bucket whose every
    node is gone has capacity 0 and no rate."""
    wh = Warehouse(tmp_path / "wh")
    add_node_version(wh, "n1", 4, at(1))
    add_node_version(wh, "n1", 0, at(3))
    add_job(wh, "K", ["n1"], 4, at(0), at(4))
    frame = analytics.cluster_usage(wh.connect(), since=at(0), until=at(4), bucket="hour")
    rows = {r["bucket"]: r for r in frame.to_dicts()}
    assert rows[at(0)]["capacity_gpu_hours"] is None
    assert rows[at(0)]["assignment_rate"] is None, "no inventory: rate unknown, not 100 %"
    assert rows[at(0)]["allocated_gpu_hours"] == pytest.approx(4.0)
    assert rows[at(1)]["capacity_gpu_hours"] == pytest.approx(4.0)
    assert rows[at(1)]["assignment_rate"] == pytest.approx(1.0)
    assert rows[at(3)]["capacity_gpu_hours"] == 0.0
    assert rows[at(3)]["assignment_rate"] is None


def test_exporter_only_warehouse_reports_unknown_not_full(tmp_path: Path) -> None:
    """Samples only (no node inventory, no job records), as `sing collector --once` against an
    exporter wrote them before the collector recorded nodes: capacity, allocations and rate are
    unknown (the old report said rate 1.0 beside capacity null)."""
    wh = Warehouse(tmp_path / "wh")
    add_gpu_samples(wh, None, "n1", [0, 1], at(0), at(1), 0.4)
    (row,) = analytics.cluster_usage(wh.connect(), since=at(0), until=at(1), now=at(2)).to_dicts()
    assert row["util"] == pytest.approx(0.4)
    assert row["capacity_gpu_hours"] is None and row["allocated_gpu_hours"] is None
    assert row["assignment_rate"] is None

    out = run_sing("--warehouse", str(wh.root), "report", "cluster", "--now", at(2).isoformat())
    assert out.returncode == 0, out.stderr
    assert "capacity unknown for 1 of 1 bucket(s)" in out.stdout
    assert "allocations unknown" in out.stdout
    (row_line,) = [line for line in out.stdout.splitlines() if "2026-01-05 00:00:00" in line]
    assert row_line.count("unknown") == 3  # allocated, capacity, rate


def test_old_inventory_without_valid_from_holds_since_the_beginning(tmp_path: Path) -> None:
    """A nodes file from before the history (no valid_from, no source) still gives capacity."""
    wh = Warehouse(tmp_path / "wh")
    write_as_before(
        wh,
        "nodes",
        pa.table(
            {"node": ["n1", "n2"], "gpus": pa.array([4, 4], pa.int16()), "cluster": ["test"] * 2}
        ),
    )
    add_node_version(wh, "n2", 0, at(1))  # a newer writer records n2 leaving at 11:00
    add_job(wh, "K", ["n1"], 4, at(0), at(2))
    frame = analytics.cluster_usage(wh.connect(), since=at(0), until=at(2), bucket="hour")
    assert frame["capacity_gpu_hours"].to_list() == pytest.approx([8.0, 4.0])
    assert frame["assignment_rate"].to_list() == pytest.approx([0.5, 1.0])


# ---- energy from counter deltas -----------------------------------------------------------


def test_energy_survives_a_counter_reset_and_midnight(tmp_path: Path) -> None:
    """Job E on n1 GPU 0, 23:00-01:00 (crosses the UTC day) at 200 W; the counter restarts from
    ~0 at 23:30 (driver reload). The writer's deltas handle the reset: the job's energy is the
    sum of its samples' deltas except the first one (which reaches back before the job), so 7
    intervals x 900 s x 200 W. The old max - min read the reset as 1.8 MJ of energy."""
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "E", ["n1"], 1, at(13), at(15))
    rows = []
    counter = 5e6
    for ts in sample_times(at(13), at(15)):
        delta = 200.0 * STEP.total_seconds()
        counter = delta if ts == at(13.5) else counter + delta  # the reset: counts from 0
        rows.append(
            {"ts": ts, "node": "n1", "gpu_index": 0, "util": 0.5, "energy_j": counter}
            | {"energy_delta_j": delta, "job_id": "E", "cluster": "test", "power_w": 200.0}
        )
    wh.append("gpu_samples", pl.DataFrame(rows))
    expected = (len(rows) - 1) * 200.0 * STEP.total_seconds()
    job = rows_by_id(analytics.job_usage(wh.connect(), now=at(24)))["E"]
    assert job["energy_j"] == pytest.approx(expected)
    wh.compact(now=at(48), settle_s=0)  # both days rolled up and stored: still exact
    assert wh.live_files("job_gpu_usage"), "both days rolled up"
    job = rows_by_id(analytics.job_usage(wh.connect(), now=at(24)))["E"]
    assert job["energy_j"] == pytest.approx(expected)


def test_energy_of_old_samples_without_deltas_falls_back_to_the_counter(tmp_path: Path) -> None:
    """Samples written before energy_delta_j (and cluster) existed: energy is the day's counter
    max - min, and the samples count for the warehouse's only cluster."""
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "O", ["n1"], 1, at(0), at(1))
    times = sample_times(at(0), at(1))
    write_as_before(
        wh,
        "gpu_samples",
        pa.table(
            {
                "ts": pa.array(times, pa.timestamp("us", tz="UTC")),
                "node": ["n1"] * len(times),
                "gpu_index": pa.array([0] * len(times), pa.int16()),
                "util": pa.array([0.3] * len(times), pa.float32()),
                "energy_j": [1000.0 + 90_000 * k for k in range(len(times))],
                "job_id": ["O"] * len(times),
            }
        ),
        day="2026-01-05",
    )
    job = rows_by_id(analytics.job_usage(wh.connect(), now=at(2)))["O"]
    assert job["mean_util"] == pytest.approx(0.3)
    assert job["energy_j"] == pytest.approx(3 * 90_000)


# ---- RDMA unknown, clusters, numeric job ids ------------------------------------------


def test_rdma_with_an_unknown_counter_is_unknown_not_small(tmp_path: Path) -> None:
    """Two nodes of job R; on n2 the 32-bit transmit counter saturated for two samples (NULL
    counter and delta). Its transmit total is unknown, so is the per-node-hour rate and so the
    job is neither low-RDMA nor fine; received bytes stay known."""
    wh = Warehouse(tmp_path / "wh")
    add_busy_job(wh, "R", ["n1", "n2"], 4, at(0), at(2), 0.0)
    add_rdma_samples(wh, "R", "n1", at(0), at(2), 10**6, 10**6)
    rows = [
        {"ts": ts, "node": "n2", "device": "mlx5_0", "port": 1, "job_id": "R", "cluster": "test"}
        | {"rx_bytes": 10**6 * (k + 1), "rx_delta_bytes": 10**6}
        | ({} if k in (3, 4) else {"tx_bytes": 10**6 * (k + 1), "tx_delta_bytes": 10**6})
        for k, ts in enumerate(sample_times(at(0), at(2)))
    ]
    wh.append("rdma_samples", pl.DataFrame(rows))
    job = rows_by_id(analytics.job_usage(wh.connect(), now=at(3)))["R"]
    assert job["rdma_tx_bytes"] is None and job["rdma_bytes_per_node_hour"] is None
    assert job["rdma_rx_bytes"] == 16 * 10**6
    idle = rows_by_id(analytics.idle_multinode_jobs(wh.connect(), now=at(3)))["R"]
    assert idle["low_rdma"] is None

    out = run_sing("--warehouse", str(wh.root), "job", "R", "--now", at(3).isoformat())
    assert out.returncode == 0, out.stderr
    assert "  n1  sent 8.0 MB  received 8.0 MB" in out.stdout  # 8 deltas of 1 MB
    assert "  n2  sent unknown  received 8.0 MB" in out.stdout
    assert "RDMA traffic" not in out.stdout  # no low-RDMA note on an unknown figure


def test_a_requeued_jobs_report_lists_its_runs(tmp_path: Path) -> None:
    """Job Q's node failed after an hour; Slurm requeued it and it runs on n2. `sing job`
    shows the runs as a table (one run: no table), and `--json` gives them."""
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "Q", ["n2"], 2, at(1.5), None, state="RUNNING")
    add_job(wh, "S", ["n1"], 2, at(0), at(1), state="COMPLETED")
    run = {"job_id": "Q", "cluster": "test", "num_gpus": 2, "recorded_at": at(4)}
    runs = [
        run | {"start_time": at(0), "end_time": at(1), "state": "NODE_FAIL", "nodes": ["n1"]},
        run | {"start_time": at(1.5), "end_time": None, "state": "RUNNING", "nodes": ["n2"]},
        {**run, "job_id": "S", "start_time": at(0), "end_time": at(1), "state": "COMPLETED"},
    ]
    wh.append("job_runs", pa.Table.from_pylist(runs, schema=table("job_runs").schema))
    out = run_sing("--warehouse", str(wh.root), "job", "Q", "--now", at(4).isoformat())
    assert out.returncode == 0, out.stderr
    table_lines = out.stdout.split("Runs (requeued; the figures above are the last run's):\n")[1]
    assert table_lines.splitlines()[:3] == [
        "  run  start (UTC)          end (UTC)            run time h  state      GPUs  node list",
        "    1  2026-01-05 10:00:00  2026-01-05 11:00:00        1.00  NODE_FAIL     2  n1",
        "    2  2026-01-05 11:30:00  running                 running  RUNNING       2  n2",
    ]
    out = run_sing("--warehouse", str(wh.root), "job", "Q", "--json", "--now", at(4).isoformat())
    (job,) = json.loads(out.stdout)["rows"]
    assert [(r["run"], r["state"], r["nodes"]) for r in job["runs"]] == [
        (1, "NODE_FAIL", ["n1"]),
        (2, "RUNNING", ["n2"]),
    ]
    out = run_sing("--warehouse", str(wh.root), "job", "S", "--now", at(4).isoformat())
    assert out.returncode == 0 and "Runs" not in out.stdout


def test_jobs_are_matched_to_samples_by_cluster_too(tmp_path: Path) -> None:
    """Job 7 exists in clusters a and b (ids repeat across clusters) on a node named n1 in
    both: each keeps its own samples."""
    wh = Warehouse(tmp_path / "wh")
    for cluster, util in (("a", 0.8), ("b", 0.2)):
        add_job(wh, "7", ["n1"], 2, at(0), at(1), cluster=cluster)
        add_gpu_samples(wh, "7", "n1", [0, 1], at(0), at(1), util, cluster=cluster)
    jobs = {r["cluster"]: r for r in analytics.job_usage(wh.connect(), now=at(2)).to_dicts()}
    assert jobs["a"]["mean_util"] == pytest.approx(0.8)
    assert jobs["b"]["mean_util"] == pytest.approx(0.2)
    assert jobs["a"]["gpus_sampled"] == jobs["b"]["gpus_sampled"] == 2


def test_old_samples_without_cluster_belong_to_the_only_cluster(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "5", ["n1"], 1, at(0), at(1))
    add_gpu_samples(wh, "5", "n1", [0], at(0), at(1), 0.6, cluster=None)
    job = rows_by_id(analytics.job_usage(wh.connect(), now=at(2)))["5"]
    assert job["cluster"] == "test" and job["mean_util"] == pytest.approx(0.6)


def test_numeric_job_ids_sort_and_break_ties_as_numbers(tmp_path: Path) -> None:
    """Jobs 9 and 10 waste the same GPU-hours: 9 ranks first ("10" < "9" as text)."""
    wh = Warehouse(tmp_path / "wh")
    for job_id in ("10", "9", "100"):
        add_busy_job(wh, job_id, ["n1", "n2"], 4, at(0), at(2), 0.0)
    assert analytics.job_usage(wh.connect(), now=at(3))["job_id"].to_list() == ["9", "10", "100"]
    idle = analytics.idle_multinode_jobs(wh.connect(), now=at(3))
    assert idle["job_id"].to_list() == ["9", "10", "100"]
