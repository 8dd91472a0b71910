"""A page's health lines, when they are as on the target's last page, are not parsed again
(sing/collector/scrape.py `read_page`), and that must never hide a change.

The pages are hand-written in the exporter's format, served over real HTTP to a real Collector
writing a real warehouse; the rows each round writes are the known answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sing.collector.scrape import read_page
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import target_from
from sing.config import Config
from sing.warehouse.store import Warehouse
from tests.http_stub import serving

UUID = "GPU-5b0c1d2e-0000-4000-8000-000000000001"


def page(util: float = 0.5, ecc: int = 0, link_state: int = 4) -> str:
    return (
        "# TYPE sing_gpu_utilization_ratio gauge\n"
        f'sing_gpu_utilization_ratio{{gpu="0",uuid="{UUID}"}} {util}\n'
        "# TYPE sing_gpu_ecc_errors_total counter\n"
        f'sing_gpu_ecc_errors_total{{gpu="0",uuid="{UUID}",type="corrected",counter="volatile"}} '
        f"{ecc}\n"
        f'sing_gpu_row_remap_pending{{gpu="0",uuid="{UUID}"}} 0\n'
        f'sing_rdma_link_state{{device="mlx5_0",port="1"}} {link_state}\n'
    )


def test_unchanged_health_lines_are_skipped_and_the_rest_is_read() -> None:
    reading, samples, _, digest = read_page(page())
    assert digest is not None and samples == 4 and len(reading.health) == 3
    again, again_samples, _, same = read_page(page(util=0.75), digest)
    assert same == digest and again.health is None and again_samples == 4
    assert again.gpus[0]["util"] == 0.75  # the other lines are read as always
    changed, _, _, other = read_page(page(ecc=3), digest)
    assert other != digest
    assert changed.health[("gpu", "0", UUID, "ecc_corrected_volatile")] == 3.0


def test_a_reading_whose_health_lines_were_skipped_is_never_merged() -> None:
    """A node read from two targets never takes the shortcut; were it to, its skipped health
    lines would be merged as none (every series gone), so `merge` refuses them."""
    whole, _, _, digest = read_page(page())
    skipped = read_page(page(), digest).reading
    for first, second in ((whole, skipped), (skipped, whole)):
        with pytest.raises(ValueError, match="health lines were not read"):
            first.merge(second)


@pytest.mark.parametrize(
    "moved",
    [
        # a blank more before the value: the same value, but not the same line
        page().replace("} 4\n", "}  4\n"),
        # the same series under its name quoted in the braces (prometheus/common 0.62+)
        page().replace("sing_rdma_link_state{", '{"sing_rdma_link_state",'),
    ],
)
def test_any_other_spelling_of_the_health_lines_is_parsed_whole(moved: str) -> None:
    _, _, _, digest = read_page(page())
    reading, _, _, _ = read_page(moved, digest)
    assert reading.health is not None
    assert reading.health[("rdma", "mlx5_0/1", None, "link_state")] == 4.0


@pytest.fixture
def served(tmp_path: Path):
    """Two nodes' pages, changed between rounds by the test: gpu01 alone on its target, gpu02
    read from two targets (its GPU page and its InfiniBand page), as dcgm-exporter and
    node_exporter both describe one node."""
    pages = {"/gpu01": page(), "/gpu02-gpu": page(), "/gpu02-ib": ""}
    with serving(lambda path: pages[path].encode()) as address:
        targets = [
            target_from(address, {"node": "gpu01", "__metrics_path__": "/gpu01"}),
            target_from(address, {"node": "gpu02", "__metrics_path__": "/gpu02-gpu"}),
            target_from(address, {"node": "gpu02", "__metrics_path__": "/gpu02-ib"}),
        ]
        wh = Warehouse(tmp_path / "wh")
        collector = Collector(Config({}), CollectorSettings(metrics_port=0), wh, lambda: targets)
        try:
            yield pages, collector, targets
        finally:
            collector.close()


def health_rows_of(collector: Collector) -> list[tuple]:
    con = collector.warehouse.connect()
    try:
        return con.execute(
            "SELECT node, signal, value FROM health_samples ORDER BY ts, node, signal"
        ).fetchall()
    finally:
        con.close()


def test_every_change_is_a_row_whether_a_node_has_one_target_or_two(served) -> None:
    pages, collector, _ = served
    collector.scrape_round()
    first = health_rows_of(collector)
    assert len(first) == 6  # three series on each node
    collector.scrape_round()  # nothing changed
    assert health_rows_of(collector) == first
    pages["/gpu01"] = page(util=0.9, ecc=1)
    pages["/gpu02-gpu"], pages["/gpu02-ib"] = page(link_state=1).split("sing_rdma_link_state")
    pages["/gpu02-ib"] = "sing_rdma_link_state" + pages["/gpu02-ib"]  # moved to the other page
    collector.scrape_round()
    assert health_rows_of(collector)[6:] == [
        ("gpu01", "ecc_corrected_volatile", 1.0),
        ("gpu02", "link_state", 1.0),
    ]


def test_a_target_that_now_names_another_node_writes_that_nodes_first_readings(
    served, tmp_path: Path
) -> None:
    pages, collector, targets = served
    collector.scrape_round()
    assert len(health_rows_of(collector)) == 6
    # The same URL, relabelled to a node the collector has never seen: the same page's health
    # lines are that node's first readings, not "as last time".
    targets[0] = target_from(
        targets[0].url.split("/")[2], {"node": "gpu03", "__metrics_path__": "/gpu01"}
    )
    collector.scrape_round()
    rows = health_rows_of(collector)[6:]
    assert sorted(rows) == [
        ("gpu03", "ecc_corrected_volatile", 0.0),
        ("gpu03", "link_state", 4.0),
        ("gpu03", "row_remap_pending", 0.0),
    ]
