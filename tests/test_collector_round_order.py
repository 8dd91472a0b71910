"""A round reads each page as soon as it arrives: a target that hangs until its deadline holds
up no other page (sing/collector/service.py `scrape_round`). Read in target order, a dead node
listed first would leave every other page unread until its timeout, and a round of 10,000
nodes would then need the timeout plus all the parsing, past its interval. And a page read is
a page freed: a round that kept them all held 42 MB at 1,000 nodes (docs/collector.md).

Real HTTP and a real Collector; the slow target answers only when the test lets it, so the test
observes the order, not a duration.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

from sing.collector.scrape import Page
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.collector.targets import target_from
from sing.config import Config
from sing.warehouse.store import Warehouse
from tests.http_stub import serving
from tests.test_collector_scrape import wait_for

PAGE = b'sing_gpu_utilization_ratio{gpu="0",uuid="GPU-a"} 0.5\n'
NODES = 5


def pages_read(collector: Collector) -> float:
    """How many pages the round has read so far (each read observes its duration)."""
    for metric in collector.metrics.scrape_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                return sample.value
    return 0.0


def test_a_hanging_first_target_holds_up_no_other_page(tmp_path: Path) -> None:
    release = threading.Event()

    def body_for(path: str) -> bytes:
        if path == "/slow":
            release.wait(30)
        return PAGE

    with serving(body_for) as address:
        targets = [target_from(address, {"node": "slow", "__metrics_path__": "/slow"})] + [
            target_from(address, {"node": f"n{i}", "__metrics_path__": f"/n{i}"})
            for i in range(NODES)
        ]
        settings = CollectorSettings(metrics_port=0, scrape_timeout_s=30)
        collector = Collector(Config({}), settings, Warehouse(tmp_path / "wh"), lambda: targets)
        try:
            round_ = threading.Thread(target=collector.scrape_round)
            round_.start()
            try:
                wait_for(lambda: pages_read(collector) == NODES, 20, "the other pages read")
                assert round_.is_alive()  # the slow page is still out
            finally:
                release.set()
                round_.join(30)
            assert pages_read(collector) == NODES + 1
        finally:
            collector.close()


def test_each_page_is_freed_once_read(tmp_path: Path) -> None:
    """At each page the round reads, no page read before it is still alive. One fetch thread:
    it lets a page go before it fetches the next, so only the round could still hold one."""
    read: list[weakref.ref[Page]] = []
    alive_at_each_read: list[int] = []

    class Watched(Collector):
        def _read(self, page: Page, *args, **kwargs):
            alive_at_each_read.append(sum(ref() is not None for ref in read))
            read.append(weakref.ref(page))
            return super()._read(page, *args, **kwargs)

    with serving(lambda path: PAGE) as address:
        targets = [
            target_from(address, {"node": f"n{i}", "__metrics_path__": f"/n{i}"})
            for i in range(NODES)
        ]
        settings = CollectorSettings(metrics_port=0, scrape_timeout_s=30, concurrency=1)
        collector = Watched(Config({}), settings, Warehouse(tmp_path / "wh"), lambda: targets)
        try:
            assert collector.scrape_round().up == NODES
        finally:
            collector.close()
    assert alive_at_each_read == [0] * NODES
