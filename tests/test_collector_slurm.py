"""The node inventory from a real Slurm 22.05 on loopback (tests/slurm_harness.py: gpu-1 and
gpu-2, Gres=gpu:a100:8, partition debug) merged with what an exporter says: `sinfo` through the
Slurm executor gives the node list and partition, the exporter the GPUs of the node it serves.
The exporter here is a plain HTTP server with a dcgm-exporter payload for gpu-1 (no GPU on this
machine); gpu-2 has none, so its Gres count stands in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sing.collector.inventory import DEFAULT, executor_inventory
from sing.collector.plugins import load_source
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import target_from
from sing.config import Config
from sing.warehouse.store import Warehouse
from tests.http_stub import serving
from tests.slurm_harness import SlurmCluster, running, scratch

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

MODEL = "NVIDIA A100-SXM4-80GB"
PAYLOAD = "".join(
    f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="GPU-{i}",modelName="{MODEL}"}} 1024\n'
    f'DCGM_FI_DEV_FB_FREE{{gpu="{i}",UUID="GPU-{i}",modelName="{MODEL}"}} 80896\n'
    for i in range(8)
)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with running(SlurmCluster(scratch("sing-slurm-"))) as cluster:
        yield cluster


@pytest.fixture
def gpu1_exporter() -> Iterator[str]:
    with serving(lambda _path: PAYLOAD.encode()) as address:
        yield address


def test_inventory_merges_sinfo_and_the_exporter(
    slurm: SlurmCluster, gpu1_exporter: str, tmp_path: Path
) -> None:
    config = Config({"executor": {"kind": "slurm"}, "collector": {"job_sync": ""}})
    settings = config.section("collector", CollectorSettings)
    source = load_source(settings.node_inventory, config, DEFAULT, "node_inventory")
    assert source is executor_inventory
    wh = Warehouse(tmp_path / "wh")
    target = target_from(gpu1_exporter, {"node": "gpu-1"})
    collector = Collector(config, settings, wh, lambda: [target], node_source=source)
    collector.sync_jobs()
    collector.scrape_round()
    collector.scrape_round()  # nothing changed: no new versions
    collector.close()
    rows = (
        wh.connect()
        .execute(
            "SELECT node, gpus, gpu_model, gpu_memory_bytes, partition, cluster, source "
            "FROM nodes ORDER BY node"
        )
        .fetchall()
    )
    assert rows == [
        ("gpu-1", 8, MODEL, (1024 + 80896) * 1024 * 1024, "debug", "campus", "exporter+sinfo"),
        ("gpu-2", 8, "a100", None, "debug", "campus", "sinfo"),
    ]
