"""Job sync on the collector's schedule: the pluggable source, idempotent upserts, and stamping
samples from synced allocations when the exporter (here dcgm-exporter without `hpc_job`) does
not say which job holds a GPU: keyed by (cluster, node, GPU), lowest numeric id first."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from sing.collector.jobsync import DEFAULT, executor_sync, load_job_sync
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import target_from
from sing.config import Config
from sing.errors import UserError
from sing.warehouse.store import Warehouse
from tests.http_stub import serving

# What the fake executor reports; the tests change it between syncs.
JOB_STATE = {"state": "RUNNING", "end_time": None}
START = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def fake_executor_sync(config: Config, warehouse: Warehouse) -> None:
    """A job source as a site might plug in, for two clusters that both have a node n1: job 5
    holds GPUs 0 and 1 of the site's n1, jobs 9 and 10 share its GPU 3; job 7 holds GPU 2 of
    cluster "other"'s n1."""
    end = JOB_STATE["end_time"]
    site = config.site.cluster
    allocations = [(site, "5", (0, 1), end), (site, "10", (3,), None), (site, "9", (3,), None)]
    allocations.append(("other", "7", (2,), None))
    jobs = [
        {"job_id": job, "cluster": cluster, "user": "ann", "start_time": START, "end_time": ends}
        | {"state": JOB_STATE["state"] if job == "5" else "RUNNING", "num_gpus": len(gpus)}
        for cluster, job, gpus, ends in allocations
    ]
    warehouse.append("jobs", pa.Table.from_pylist(jobs))
    rows = [
        {"job_id": job, "cluster": cluster, "node": "n1", "gpu_index": i}
        | {"start_time": START, "end_time": ends}
        for cluster, job, gpus, ends in allocations
        for i in gpus
    ]
    warehouse.append("job_gpus", pa.Table.from_pylist(rows))


DCGM_PAYLOAD = (
    "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",Hostname="n1"}} {10 * i}\n'
        for i in range(4)
    )
    + 'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"} 100\n'
)


@pytest.fixture
def dcgm_target() -> Iterator[str]:
    with serving(lambda _path: DCGM_PAYLOAD.encode()) as address:
        yield address


def jobs_of_gpus(wh: Warehouse, ts: datetime, cluster: str = "campus") -> dict[int, str | None]:
    rows = wh.connect().execute(
        "SELECT gpu_index, job_id FROM gpu_samples WHERE ts = ? AND cluster = ? ORDER BY 1",
        [ts, cluster],
    )
    return dict(rows.fetchall())


def test_synced_allocations_stamp_samples_and_resync_adds_no_duplicates(
    tmp_path: Path, dcgm_target: str, install_source
) -> None:
    install_source(f"{__name__}:fake_executor_sync")
    config = Config({"collector": {"job_sync": f"{__name__}:fake_executor_sync"}})
    settings = config.section("collector", CollectorSettings)
    wh = Warehouse(tmp_path / "wh")
    targets = [
        target_from(dcgm_target, {"node": "n1"}),
        target_from(dcgm_target, {"node": "n1", "cluster": "other"}),
    ]
    sync = load_job_sync(settings.job_sync, config)
    assert sync is fake_executor_sync
    collector = Collector(config, settings, wh, lambda: targets, job_sync=sync)
    JOB_STATE.update(state="RUNNING", end_time=None)
    collector.sync_jobs()
    collector.sync_jobs()  # a re-run changes nothing
    collector.scrape_round()
    con = wh.connect()
    (ts,) = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()
    assert jobs_of_gpus(wh, ts) == {0: "5", 1: "5", 2: None, 3: "9"}
    assert jobs_of_gpus(wh, ts, "other") == {0: None, 1: None, 2: "7", 3: None}
    rdma = con.execute("SELECT cluster, job_id FROM rdma_samples ORDER BY 1").fetchall()
    assert rdma == [("campus", "5"), ("other", "7")]
    assert con.execute("SELECT util FROM gpu_samples WHERE gpu_index = 3").fetchone()[0] == (
        pytest.approx(0.30)
    )

    # The job ends: one row with the final state, and new samples are no longer stamped.
    JOB_STATE.update(state="COMPLETED", end_time=datetime(2026, 1, 5, 9, 0, tzinfo=UTC))
    collector.sync_jobs()
    collector.scrape_round()
    collector.close()
    con = wh.connect()
    assert con.execute("SELECT state FROM jobs WHERE job_id = '5'").fetchall() == [("COMPLETED",)]
    assert con.execute("SELECT count(*) FROM job_gpus").fetchone()[0] == 5
    (ts,) = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()
    assert jobs_of_gpus(wh, ts) == {0: None, 1: None, 2: None, 3: "9"}


def test_default_job_sync_needs_an_executor_section(tmp_path: Path) -> None:
    assert load_job_sync(DEFAULT, Config({})) is None
    config = Config({"executor": {"kind": "local", "local_state_dir": str(tmp_path / "jobs")}})
    assert load_job_sync(DEFAULT, config) is executor_sync
    # The local executor with no jobs: a sync that writes nothing and raises nothing.
    executor_sync(config, Warehouse(tmp_path / "wh"))
    assert load_job_sync("", config) is None


def test_a_source_not_installed_is_refused_unimported(install_source) -> None:
    """A config names only installed sources: other module paths are never imported."""
    refused = (
        r"job_sync = 'tests.sentinel_source:run' is not an installed source "
        r"\(entry point group 'sing.sources'\); installed: .*collector.jobsync:executor_sync"
    )
    with pytest.raises(UserError, match=refused):
        load_job_sync("tests.sentinel_source:run", Config({}))
    assert "tests.sentinel_source" not in sys.modules
    # Installed but gone (the package was removed): the source is off, scraping goes on.
    install_source("no_such_module_xyz:f")
    assert load_job_sync("no_such_module_xyz:f", Config({})) is None
