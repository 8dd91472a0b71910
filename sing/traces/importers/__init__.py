"""Importers of public GPU-cluster traces into the open trace format (one module per source).

Each source module has `load(path, timezone) -> Source`; `import_trace` turns it into a trace
directory with the same tables, datapackage.json, datasheet and aggregates as an export, and
with the `nodes` resource when a node list is given (`--nodes`, any format) or the source
describes its cluster (an SWF header). Where the source states its GPU-time, the release must
hold it (traces.conservation): an import that would lose some writes nothing.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from sing.errors import UserError
from sing.traces import aggregates
from sing.traces.conservation import gpu_time_problem
from sing.traces.importers.common import Source, read_nodes, to_jobs
from sing.traces.package import ReleaseInfo, write_trace

FORMATS = ("philly", "helios", "pai", "acme", "pods", "swf")


def load(fmt: str, path: str | Path, timezone: str | None = None) -> Source:
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; formats: {', '.join(FORMATS)}")
    module = import_module(f"sing.traces.importers.{fmt}")
    return module.load(Path(path), timezone or module.DEFAULT_TIMEZONE)


def import_trace(
    fmt: str,
    path: str | Path,
    out_dir: str | Path,
    timezone: str | None = None,
    nodes: str | Path | None = None,
) -> Path:
    """Import a public trace file (and its node list, if any) into a trace directory at
    `out_dir` (atomically)."""
    source = load(fmt, path, timezone)
    inventory = read_nodes(Path(nodes)) if nodes is not None else source.nodes
    jobs, release_start = to_jobs(source.jobs, source.origin)
    if source.gpu_seconds is not None:
        problem = gpu_time_problem(source.gpu_seconds, aggregates.compute(jobs)["gpu_seconds"])
        if problem:
            raise UserError(f"{path}: {problem}; nothing written")
    info = ReleaseInfo(
        title=source.title,
        release_start=release_start,
        source=f"import:{fmt}",
        collection=source.collection,
        anonymization=[
            "As published by the source: user and job identifiers are the source's own "
            "hashes or ids; job names, hosts and IPs are not imported."
            + (" Node names in nodes.csv are the node list's own." if nodes is not None else "")
        ],
        biases=source.biases,
        source_gpu_seconds=source.gpu_seconds,
    )
    return write_trace(out_dir, jobs, info, nodes=inventory)
