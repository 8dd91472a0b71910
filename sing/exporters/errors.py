"""Counting what went wrong while reading a source, for `sing_exporter_errors_total`.

An exporter that runs for months must never stop serving because one reading failed; instead
each failure is left out of the output and counted here under its source and kind.
"""

from __future__ import annotations

import collections
import threading

import pynvml
from prometheus_client.core import CounterMetricFamily

# NVML's own error names, as labels: NVML_ERROR_GPU_IS_LOST -> "gpu_is_lost".
NVML_ERROR_KINDS = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}
NVML_ERROR_CODES = {kind: code for code, kind in NVML_ERROR_KINDS.items()}


def nvml_error_kind(err: pynvml.NVMLError) -> str:
    """The label for an NVML failure, e.g. "not_supported"."""
    return NVML_ERROR_KINDS.get(err.value, f"nvml_error_{err.value}")


class ErrorCounter:
    """Thread-safe running counts of failures by (source, kind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def count(self, source: str, kind: str) -> None:
        with self._lock:
            self._counts[(source, kind)] += 1

    def metric(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "sing_exporter_errors",
            "Readings the exporter could not make and left out, by source and kind.",
            labels=["source", "kind"],
        )
        with self._lock:
            for (source, kind), n in sorted(self._counts.items()):
                family.add_metric([source, kind], n)
        return family
