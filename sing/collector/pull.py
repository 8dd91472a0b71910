"""Pull mode: read the series from a Prometheus server's HTTP API instead of scraping nodes.

For sites that already run Prometheus next to their exporters (or outgrow one scraper): each
round asks `query_range` for every wanted series since the last stored step, at the collector's
interval as the step, and feeds the values through the same conversion as a scrape (the
Prometheus samples become the same `Sample`s the text parser yields), so units, job stamping,
deltas and node inventory are identical. `up` and `scrape_duration_seconds` become `scrapes`
rows. Nodes are named by the `node` label, else the host part of `instance`; the cluster is the
`cluster` label, else the site's.

The watermark never passes data that is not stored:
- Only final steps are read: a step is read once every target that has sing's series has been
  scraped after it (`timestamp(up)`), so a value Prometheus has not ingested yet cannot change
  a step already written, and no node is missing from a step because its scrape is in flight.
- Each samples table keeps its own watermark, started from its newest stored row. A table
  whose append fails is read again next round, from its own watermark, while the tables that
  were written are not written twice; the counter, health and inventory state goes back to where
  the round started, so the re-read gives the same deltas and versions (node versions upsert).
- A failed query writes and advances nothing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from datetime import UTC, datetime
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.compute as pc

from sing.collector.client import PayloadError, fetch
from sing.collector.convert import WANTED, read_node
from sing.collector.promtext import ParseError, Sample
from sing.collector.service import Collector, RoundSummary
from sing.errors import UserError
from sing.schema import UTC_TS

log = logging.getLogger(__name__)

# Prometheus refuses more than 11,000 points per series in one query_range.
MAX_STEPS = 10_000
HEALTH = ("up", "scrape_duration_seconds", "scrape_samples_scraped")
QUERY = '{__name__=~"' + "|".join(sorted(WANTED | set(HEALTH))) + '"}'
# When each target that exports any wanted series was last scraped.
FRESHNESS = 'timestamp(up) and on (instance, job) {__name__=~"' + "|".join(sorted(WANTED)) + '"}'
MAX_RESPONSE_BYTES = 512_000_000
# Samples tables with their own watermark (the `nodes` records upsert, so a re-read is harmless).
SAMPLE_TABLES = ("gpu_samples", "rdma_samples", "job_host_samples", "health_samples", "scrapes")

# {step time: {(cluster, node): (instance, samples)}}
Steps = dict[float, dict[tuple[str, str], tuple[str, list[Sample]]]]


class PrometheusPull:
    """Pull rounds for one collector from the Prometheus server at `url`."""

    def __init__(self, collector: Collector, url: str) -> None:
        self.collector = collector
        self.url = url.rstrip("/")
        self.step = collector.settings.interval_s
        # Per table, the time through which every step is stored (or was before the lookback).
        floor = time.time() - collector.settings.pull_lookback_s - self.step
        self.stored_through: dict[str, float] = {}
        for name in SAMPLE_TABLES:
            newest = collector.warehouse.newest_time(name)
            self.stored_through[name] = max(floor, newest.timestamp() if newest else floor)

    def pull_round(self) -> RoundSummary:
        """Read the final steps after the oldest table watermark and write them."""
        started = time.monotonic()
        start = (math.floor(min(self.stored_through.values()) / self.step) + 1) * self.step
        try:
            end = min(self.final_step(), start + (MAX_STEPS - 1) * self.step)
            by_step = group_by_step(self.query_range(start, end), self.collector.cluster)
        except (OSError, ValueError, PayloadError, UserError) as err:
            log.error("pull from %s failed, retrying next round: %s", self.url, err)
            return self.collector.finish_round(0, 0, 0, started)
        if start > end:
            return self.collector.finish_round(0, 0, 0, started)
        deltas, inventory = self.collector.deltas.copy(), self.collector.inventory.copy()
        last_health = self.collector.last_health.copy()
        rows = self.collector.new_rows()
        targets, up = 0, 0
        for ts in sorted(by_step):
            when = datetime.fromtimestamp(ts, UTC)
            for (cluster, node), (instance, samples) in sorted(by_step[ts].items()):
                health = {s.name: s.value for s in samples if s.name in HEALTH}
                if "up" in health:
                    targets += 1
                    up += health["up"] == 1
                    rows.add_scrape(
                        when,
                        instance,
                        node,
                        health.get("scrape_duration_seconds"),
                        int(health.get("scrape_samples_scraped", 0)),
                        None if health["up"] == 1 else "down in Prometheus",
                    )
                try:
                    reading = read_node(s for s in samples if s.name not in HEALTH)
                except ParseError as err:
                    log.warning("prometheus series of %s at %s: %s", node, when, err)
                    continue
                rows.add_node(when, cluster, node, reading)
            rows.add_inventory(when, self.collector.listed)
        batches = {name: self._unstored(name, batch) for name, batch in rows.tables().items()}
        failed = self.collector.writer.write_each(batches)
        for name in SAMPLE_TABLES:
            if name not in failed:
                self.stored_through[name] = max(self.stored_through[name], end)
        if failed:  # those steps are read again: compute them again from the same state
            self.collector.deltas, self.collector.inventory = deltas, inventory
            self.collector.last_health = last_health
        written = sum(b.num_rows for name, b in batches.items() if name not in failed)
        return self.collector.finish_round(written, targets, up, started)

    def _unstored(self, name: str, batch: pa.Table) -> pa.Table:
        """The rows of `batch` after its table's watermark (a re-read step is stored once)."""
        if name not in self.stored_through:
            return batch
        through = pa.scalar(datetime.fromtimestamp(self.stored_through[name], UTC), UTC_TS)
        return batch.filter(pc.greater(batch["ts"], through))

    def final_step(self) -> float:
        """The newest step no later scrape can change: every target with sing's series has been
        scraped after it (the oldest of their newest `up` timestamps), never past now."""
        now = time.time()
        newest_up = [float(one["value"][1]) for one in self._api("query", {"query": FRESHNESS})]
        return math.floor(min([*newest_up, now]) / self.step) * self.step

    def query_range(self, start: float, end: float) -> list[dict]:
        if start > end:
            return []
        return self._api(
            "query_range", {"query": QUERY, "start": start, "end": end, "step": self.step}
        )

    def _api(self, endpoint: str, params: dict[str, object]) -> list[dict]:
        url = f"{self.url}/api/v1/{endpoint}?{urlencode(params)}"
        timeout = max(self.collector.settings.scrape_timeout_s, 30.0)
        body = json.loads(fetch(url, timeout, MAX_RESPONSE_BYTES))
        if body.get("status") != "success":
            raise UserError(f"Prometheus at {self.url}: {body.get('error', body)}")
        return body["data"]["result"]


def group_by_step(series: list[dict], default_cluster: str) -> Steps:
    """Matrix results -> {step time: {(cluster, node): (instance, samples)}}."""
    out: Steps = defaultdict(dict)
    for one in series:
        labels = dict(one["metric"])
        name = labels.pop("__name__")
        instance = labels.get("instance", "")
        node = labels.get("node") or instance.rsplit(":", 1)[0]
        key = (labels.get("cluster") or default_cluster, node)
        for ts, value in one["values"]:
            entry = out[ts].setdefault(key, (instance, []))
            entry[1].append(Sample(name, labels, float(value)))
    return out
