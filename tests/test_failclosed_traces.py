"""A trace release's per-minute timeseries holds only the released jobs' own samples, matched by
(cluster, job_id): another cluster's job with the same id, not released, must not be published
under the released job's pseudonym (issue 27, item 7.2: its 60 minutes doubled to 120 rows)."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from sing.traces.export import build_release
from sing.traces.settings import TraceSettings
from sing.warehouse.store import Warehouse
from tests.test_traces_export import HOSTS, KEY, T0, UNTIL, inventory, job

MINUTES = 60


def minute_samples(job_id: str, cluster: str, start, util: float) -> dict:
    """One GPU sample a minute for an hour on node01's GPU 0, and one RDMA sample a minute."""
    ts = [start + timedelta(minutes=i) for i in range(MINUTES)]
    gpu = {
        "ts": ts,
        "node": [HOSTS[0]] * MINUTES,
        "gpu_index": [0] * MINUTES,
        "util": [util] * MINUTES,
        "sm_active": [util] * MINUTES,
        "mem_used_bytes": [10**9] * MINUTES,
        "power_w": [100.0] * MINUTES,
        "energy_j": [100.0 * 60 * i for i in range(MINUTES)],
        "job_id": [job_id] * MINUTES,
        "cluster": [cluster] * MINUTES,
    }
    rdma = {
        "ts": ts,
        "node": [HOSTS[0]] * MINUTES,
        "device": ["mlx5_0"] * MINUTES,
        "port": [1] * MINUTES,
        "tx_bytes": [1000 * i for i in range(MINUTES)],
        "tx_delta_bytes": [1000] * MINUTES,
        "rx_bytes": [10 * i for i in range(MINUTES)],
        "rx_delta_bytes": [10] * MINUTES,
        "job_id": [job_id] * MINUTES,
        "cluster": [cluster] * MINUTES,
    }
    return {"gpu": gpu, "rdma": rdma}


@pytest.mark.parametrize("node_aliases", ["name_order", "per_job"])
def test_timeseries_keeps_another_clusters_job_of_the_same_id_out(tmp_path, node_aliases):
    """Campus job 1000 runs 60 minutes in the window at util 0.25; the other cluster's job 1000,
    submitted before the window (so not released), runs the same hour on a node of the same
    name at util 0.75. The release's series: 60 rows, all the campus job's, under its
    pseudonym; none of the other job's utilisation or traffic."""
    wh = Warehouse(tmp_path / "wh")
    wh.append("nodes", inventory())
    mine = job(0, "alice.liddell", 1, 0, 1, [HOSTS[0]], 1)
    theirs = job(0, "bob.marley", -2, 0, 4, [HOSTS[0]], 1) | {"cluster": "other"}
    wh.append("jobs", pa.Table.from_pylist([mine, theirs]))
    start = T0 + timedelta(hours=1)
    for cluster, util in (("campus", 0.25), ("other", 0.75)):
        samples = minute_samples("1000", cluster, start, util)
        wh.append("gpu_samples", pa.table(samples["gpu"]))
        wh.append("rdma_samples", pa.table(samples["rdma"]))

    settings = TraceSettings.precise(rare_shapes="keep", node_aliases=node_aliases)
    release = build_release(wh, T0, UNTIL, KEY, settings, timeseries=True)
    (released,) = release.jobs.to_pylist()
    series = release.timeseries.to_pylist()
    assert len(series) == MINUTES
    assert {row["job_id"] for row in series} == {released["job_id"]}
    assert {row["gpus"] for row in series} == {1}
    assert [row["gpu_util"] for row in series] == [pytest.approx(0.25)] * MINUTES
    assert {row["rdma_tx_bytes"] for row in series} == {1000}
