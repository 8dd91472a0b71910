"""Pull mode: read the series from a Prometheus server's HTTP API instead of scraping nodes.

For sites that already run Prometheus next to their exporters (or outgrow one scraper): each
round asks `query_range` for every wanted series since the last stored step, at the collector's
interval as the step, and feeds the values through the same conversion as a scrape (the
Prometheus samples become the same `Sample`s the text parser yields), so units, job stamping and
RDMA deltas are identical. `up` and `scrape_duration_seconds` become `scrapes` rows.
Nodes are named by the `node` label, else the host part of `instance`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from datetime import UTC, datetime
from urllib.parse import urlencode

from collector.convert import WANTED, read_node
from collector.promtext import ParseError, Sample
from collector.scrape import fetch
from collector.service import Collector, RoundSummary
from sing.errors import UserError

log = logging.getLogger(__name__)

# Prometheus refuses more than 11,000 points per series in one query_range.
MAX_STEPS = 10_000
HEALTH = ("up", "scrape_duration_seconds", "scrape_samples_scraped")
QUERY = '{__name__=~"' + "|".join(sorted(WANTED | set(HEALTH))) + '"}'
MAX_RESPONSE_BYTES = 512_000_000


class PrometheusPull:
    """Pull rounds for one collector from the Prometheus server at `url`."""

    def __init__(self, collector: Collector, url: str) -> None:
        self.collector = collector
        self.url = url.rstrip("/")
        self.step = collector.settings.interval_s
        newest = newest_sample(collector)
        start = time.time() - collector.settings.pull_lookback_s
        if newest is not None:
            start = max(start, newest + self.step)
        self.next_ts = math.ceil(start / self.step) * self.step

    def pull_round(self) -> RoundSummary:
        """Read every step from `next_ts` to now and write it as one batch per table."""
        started = time.monotonic()
        end = math.floor(time.time() / self.step) * self.step
        rows = self.collector.new_rows()
        targets, up = 0, 0
        while self.next_ts <= end:
            chunk_end = min(end, self.next_ts + (MAX_STEPS - 1) * self.step)
            series = self.query_range(self.next_ts, chunk_end)
            by_step = group_by_step(series)
            for ts in sorted(by_step):
                when = datetime.fromtimestamp(ts, UTC)
                for node, (instance, samples) in sorted(by_step[ts].items()):
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
                    rows.add_node(when, node, reading)
            self.next_ts = chunk_end + self.step
        return self.collector.finish_round(rows, targets, up, started)

    def query_range(self, start: float, end: float) -> list[dict]:
        params = urlencode({"query": QUERY, "start": start, "end": end, "step": self.step})
        url = f"{self.url}/api/v1/query_range?{params}"
        timeout = max(self.collector.settings.scrape_timeout_s, 30.0)
        body = json.loads(fetch(url, timeout, MAX_RESPONSE_BYTES))
        if body.get("status") != "success":
            raise UserError(f"Prometheus at {self.url}: {body.get('error', body)}")
        return body["data"]["result"]


def group_by_step(series: list[dict]) -> dict[float, dict[str, tuple[str, list[Sample]]]]:
    """Matrix results -> {step time: {node: (instance, samples)}}."""
    out: dict[float, dict[str, tuple[str, list[Sample]]]] = defaultdict(dict)
    for one in series:
        labels = dict(one["metric"])
        name = labels.pop("__name__")
        instance = labels.get("instance", "")
        node = labels.get("node") or instance.rsplit(":", 1)[0]
        for ts, value in one["values"]:
            entry = out[ts].setdefault(node, (instance, []))
            entry[1].append(Sample(name, labels, float(value)))
    return out


def newest_sample(collector: Collector) -> float | None:
    con = collector.warehouse.connect()
    try:
        (newest,) = con.execute("SELECT epoch(max(ts)) FROM gpu_samples").fetchone()
    finally:
        con.close()
    return newest
