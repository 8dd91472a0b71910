"""The collector's own /metrics, on its own registry (no global-registry side effects, so tests
and the bench can create any number of collectors in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rounds = Counter("sing_collector_rounds", "Rounds finished.", registry=r)
        self.round_seconds = Histogram(
            "sing_collector_round_duration_seconds",
            "Wall time of one round, scrape to write.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60),
            registry=r,
        )
        self.scrape_seconds = Histogram(
            "sing_collector_scrape_duration_seconds",
            "Wall time of one target's scrape.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.scrape_errors = Counter(
            "sing_collector_scrape_errors", "Failed scrapes by kind.", ["kind"], registry=r
        )
        self.samples_dropped = Counter(
            "sing_collector_samples_dropped",
            "Values of a target's page dropped because they fit no warehouse column "
            "(the rest of the page is stored), by reason.",
            ["target", "reason"],
            registry=r,
        )
        self.targets = Gauge("sing_collector_targets", "Targets in the last round.", registry=r)
        self.rows_written = Counter(
            "sing_collector_rows_written", "Rows written to the warehouse.", ["table"], registry=r
        )
        self.write_errors = Counter(
            "sing_collector_write_errors", "Failed warehouse writes.", ["table"], registry=r
        )
        self.rows_dropped = Counter(
            "sing_collector_rows_dropped",
            "Rows dropped because the buffer was full while the warehouse was unwritable.",
            ["table"],
            registry=r,
        )
        self.rows_buffered = Gauge(
            "sing_collector_rows_buffered", "Rows waiting for the warehouse.", registry=r
        )
        self.job_syncs = Counter(
            "sing_collector_job_syncs", "Job record syncs by result.", ["result"], registry=r
        )
        self.command_failures = Counter(
            "sing_executor_command_failures",
            "Scheduler commands (squeue, sacct, sinfo...) that timed out or failed.",
            ["command", "reason"],
            registry=r,
        )
        self.leader = Gauge(
            "sing_collector_leader",
            "1 while this collector holds the warehouse's leader lease and so runs job sync, "
            "policy and detection rounds and maintenance; 0 while another collector does.",
            registry=r,
        )
        self.last_round = Gauge(
            "sing_collector_last_round_timestamp_seconds", "When the last round ended.", registry=r
        )

    def serve(self, address: str, port: int) -> None:
        start_http_server(port, addr=address, registry=self.registry)
