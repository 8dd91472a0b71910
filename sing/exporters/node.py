"""One node's `/metrics`: the sources read together at scrape time, behind a short cache.

The collector reads fresh values when scraped (no polling loop to drift or die), and scrapes that
arrive within `cache_seconds` of a reading share it, so several Prometheus servers scraping at
once cost one round of NVML calls. Only GPM samples are taken on a clock (GpuSource's
sample_activity, driven by a thread in sing/exporters/cli.py, else by the reads themselves), so that
SM activity covers a window that no scraper's timing shortens. Each node gets its own
CollectorRegistry, never the global one, so several nodes can live in one process and importing
this module registers nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric

from sing.exporters.cgroups import CgroupSource
from sing.exporters.errors import ErrorCounter
from sing.exporters.gpu import GpuSource, NodeReading, gpu_metrics
from sing.exporters.jobs import JobSource
from sing.exporters.rdma import RdmaSource


class NodeCollector:
    """A prometheus_client custom collector for GPU, RDMA, job-attribution and job cgroup
    metrics (`cgroups`: read the jobs' cgroups)."""

    def __init__(
        self,
        nvml: Any,
        sysfs_root: str,
        proc_root: str,
        job_mapping_dir: str,
        cache_seconds: float = 1.0,
        before_read: Callable[[], None] | None = None,
        on_reading: Callable[[NodeReading], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        health: bool = True,
        health_refresh_s: float = 60.0,
        cgroups: bool = True,
    ) -> None:
        self.errors = ErrorCounter()
        self.gpus = GpuSource(nvml, self.errors, wall_clock, health, health_refresh_s)
        self.rdma = RdmaSource(sysfs_root, self.errors)
        self.jobs = JobSource(proc_root, job_mapping_dir, self.errors)
        self.cgroups = CgroupSource(sysfs_root, self.jobs, self.errors) if cgroups else None
        self.cache_seconds = cache_seconds
        self.before_read = before_read  # the fake world advances its counters here
        self.on_reading = on_reading  # `--record` writes each fresh reading here
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: list[Metric] = []
        self._read_at: float | None = None

    def describe(self) -> list[Metric]:
        return []  # registering must not touch NVML; names are checked by the golden tests

    def collect(self) -> list[Metric]:
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.cache_seconds:
                self._cached = self._read()
                self._read_at = now
            return self._cached

    def _read(self) -> list[Metric]:
        if self.before_read:
            self.before_read()
        reading = self.gpus.read()
        if self.on_reading:
            self.on_reading(reading)
        families = [
            *gpu_metrics(reading),
            *self.jobs.metrics(reading.gpus),
            *self.rdma.metrics(),
            *(self.cgroups.metrics() if self.cgroups else ()),
            self.errors.metric(),
        ]
        return [f for f in families if f.samples]


def node_registry(collector: NodeCollector, process_metrics: bool = True) -> CollectorRegistry:
    """A registry serving one node; with the exporter's own process metrics unless told not to."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry
