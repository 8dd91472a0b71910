"""Importers of public GPU-cluster traces into the open trace format (one module per source).

Each source module has `load(path, timezone) -> Source`; `import_trace` turns it into a trace
directory with the same tables, datapackage.json, datasheet and aggregates as an export.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from traces.importers.common import Source, to_jobs
from traces.package import ReleaseInfo, write_trace

FORMATS = ("philly", "helios", "pai", "acme")


def load(fmt: str, path: str | Path, timezone: str | None = None) -> Source:
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; formats: {', '.join(FORMATS)}")
    module = import_module(f"traces.importers.{fmt}")
    return module.load(Path(path), timezone or module.DEFAULT_TIMEZONE)


def import_trace(
    fmt: str, path: str | Path, out_dir: str | Path, timezone: str | None = None
) -> Path:
    """Import a public trace file into a trace directory at `out_dir` (atomically)."""
    source = load(fmt, path, timezone)
    jobs, release_start = to_jobs(source.jobs)
    info = ReleaseInfo(
        title=source.title,
        release_start=release_start,
        source=f"import:{fmt}",
        collection=source.collection,
        anonymization=[
            "As published by the source: user and job identifiers are the source's own "
            "hashes or ids; job names, hosts and IPs are not imported."
        ],
        biases=source.biases,
    )
    return write_trace(out_dir, jobs, info)
