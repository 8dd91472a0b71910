"""Pull mode's watermark against a scripted Prometheus HTTP API: a step is read only once every
target's scrape after it is ingested, and a table whose write fails is read again, with the
same deltas and without duplicating the tables that were written.

The API is scripted (not the real Prometheus, tests/test_collector_prometheus.py runs that)
because the cases need control of when each node's newest sample becomes visible. It answers
as Prometheus does: at a step, a series has the value of its newest sample at or before it,
so a node whose newest scrape is not ingested yet shows its previous value (a stale step).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from sing.collector.pull import PrometheusPull
from sing.collector.service import Collector
from sing.collector.settings import CollectorSettings
from sing.config import Config
from sing.warehouse.store import Warehouse
from tests.http_stub import serving

TX_PER_S = 1000  # bytes per second every node's port sends
JOULES_PER_S = 250.0


class ScriptedPrometheus:
    """Nodes a and b scraped every second; `ingested[node]` is the newest visible scrape."""

    def __init__(self) -> None:
        now = math.floor(time.time())
        self.ingested = {"a": now, "b": now}

    def newest_sample(self, node: str, t: float) -> float:
        return min(math.floor(t), self.ingested[node])

    def query(self, params: dict[str, str]) -> dict:
        assert params["query"].startswith("timestamp(up)")
        return {
            "resultType": "vector",
            "result": [
                {"metric": {"instance": f"{n}:9410", "job": "sing"}, "value": [time.time(), str(t)]}
                for n, t in self.ingested.items()
            ],
        }

    def query_range(self, params: dict[str, str]) -> dict:
        start, end, step = (float(params[k]) for k in ("start", "end", "step"))
        steps = [start + i * step for i in range(int((end - start) / step) + 1)]
        result = []
        for node in self.ingested:
            labels = {"instance": f"{node}:9410", "job": "sing", "node": node}
            series = {
                ("up", ()): lambda s: 1,
                ("sing_gpu_energy_joules_total", (("gpu", "0"), ("uuid", f"GPU-{node}"))): (
                    lambda s: JOULES_PER_S * s
                ),
                ("sing_rdma_transmit_bytes_total", (("device", "mlx5_0"), ("port", "1"))): (
                    lambda s: TX_PER_S * s
                ),
            }
            for (name, extra), value in series.items():
                values = [[t, str(value(self.newest_sample(node, t)))] for t in steps]
                metric = {"__name__": name, **labels, **dict(extra)}
                result.append({"metric": metric, "values": values})
        return {"resultType": "matrix", "result": result}


@pytest.fixture
def prometheus() -> Iterator[tuple[str, ScriptedPrometheus]]:
    script = ScriptedPrometheus()

    def answer(path: str) -> bytes:
        parts = urlsplit(path)
        params = {k: v[0] for k, v in parse_qs(parts.query).items()}
        data = getattr(script, parts.path.rsplit("/", 1)[1])(params)
        return json.dumps({"status": "success", "data": data}).encode()

    with serving(answer) as address:
        yield f"http://{address}", script


def pull_collector(wh: Warehouse, url: str) -> PrometheusPull:
    config = Config({"collector": {"interval_s": 1.0, "pull_lookback_s": 30.0}})
    settings = config.section("collector", CollectorSettings)
    return PrometheusPull(Collector(config, settings, wh, lambda: []), url)


def stored(wh: Warehouse, table: str, column: str) -> list[tuple]:
    return (
        wh.connect()
        .execute(f"SELECT node, epoch(ts)::BIGINT, {column} FROM {table} ORDER BY ALL")
        .fetchall()
    )


def assert_every_step_once_with_true_deltas(wh: Warehouse) -> None:
    for table, column, rate in (
        ("rdma_samples", "tx_delta_bytes", TX_PER_S),
        ("gpu_samples", "energy_delta_j", JOULES_PER_S),
    ):
        rows = stored(wh, table, column)
        for node in "ab":
            steps = [(ts, delta) for n, ts, delta in rows if n == node]
            times = [ts for ts, _ in steps]
            assert times == list(range(times[0], times[-1] + 1)), f"{table} {node}: gap or dup"
            # Every delta after the first is one second's worth: no stale step read as 0
            # followed by a double step.
            assert [d for _, d in steps[1:]] == [rate] * (len(steps) - 1), (table, node)


def test_pull_never_reads_a_step_before_every_node_has_a_later_scrape(
    tmp_path: Path, prometheus: tuple[str, ScriptedPrometheus]
) -> None:
    url, script = prometheus
    wh = Warehouse(tmp_path / "wh")
    script.ingested["b"] -= 6  # b's last 6 scrapes are still on their way
    pull = pull_collector(wh, url)
    pull.pull_round()
    newest = max(ts for _, ts, _ in stored(wh, "gpu_samples", "energy_delta_j"))
    assert newest == script.ingested["b"]
    script.ingested["b"] += 6
    time.sleep(1.1)
    pull.pull_round()
    assert max(ts for _, ts, _ in stored(wh, "gpu_samples", "energy_delta_j")) > newest + 5
    assert_every_step_once_with_true_deltas(wh)


def test_a_table_that_cannot_be_written_is_read_again_without_duplicating_others(
    tmp_path: Path, prometheus: tuple[str, ScriptedPrometheus]
) -> None:
    url, script = prometheus
    wh = Warehouse(tmp_path / "wh")
    pull = pull_collector(wh, url)
    pull.pull_round()
    # A real filesystem fault for one table: its directory is a file for one round.
    table_dir = wh.root / "rdma_samples"
    table_dir.rename(tmp_path / "rdma-away")
    table_dir.write_text("not a directory")
    time.sleep(2.1)
    script.ingested = dict.fromkeys(script.ingested, math.floor(time.time()))
    pull.pull_round()
    table_dir.unlink()
    (tmp_path / "rdma-away").rename(table_dir)
    failed_through = max(ts for _, ts, _ in stored(wh, "gpu_samples", "energy_delta_j"))
    assert max(ts for _, ts, _ in stored(wh, "rdma_samples", "tx_delta_bytes")) < failed_through
    time.sleep(1.1)
    script.ingested = dict.fromkeys(script.ingested, math.floor(time.time()))
    pull.pull_round()
    assert max(ts for _, ts, _ in stored(wh, "rdma_samples", "tx_delta_bytes")) > failed_through
    assert_every_step_once_with_true_deltas(wh)

    # A restart goes on from each table's newest row: nothing twice, nothing lost.
    time.sleep(1.1)
    script.ingested = dict.fromkeys(script.ingested, math.floor(time.time()))
    pull_collector(wh, url).pull_round()
    assert_every_step_once_with_true_deltas(wh)
