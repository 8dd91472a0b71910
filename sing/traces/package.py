"""Writing a trace directory: tables, datapackage.json, datasheet and golden aggregates.

Everything is written into a temporary sibling directory that is renamed onto the target only
when complete, so an interrupted or failed export or import leaves nothing half-written where the
user asked for the trace.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from string import Template

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sing.errors import UserError
from sing.traces import aggregates, sql
from sing.traces.conservation import PACKAGE_KEY
from sing.traces.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INCIDENTS,
    JOBS,
    NODES,
    TIMESERIES,
    Resource,
)

DATAPACKAGE = "datapackage.json"
AGGREGATES = "aggregates.json"
DATASHEET_TEMPLATE = Path(__file__).with_name("datasheet.md")


@dataclass
class ReleaseInfo:
    """What the datasheet says about a release besides its data."""

    title: str
    release_start: datetime
    release_end: datetime | None = None
    collection: str = ""
    anonymization: list[str] = field(default_factory=list)
    biases: list[str] = field(default_factory=list)
    source: str = ""  # "sing export" or "import:<format>"
    policy: dict | None = None  # an export's anonymization settings (datapackage.json)
    threat_model: str = ""
    privacy: list[str] = field(default_factory=list)  # the privacy report (Markdown lines)
    privacy_figures: dict | None = None  # the same for scripts (datapackage.json "privacy")
    source_gpu_seconds: float | None = None  # an import's source GPU-time (traces.conservation)


def write_trace(
    out_dir: str | Path,
    jobs: pa.Table,
    info: ReleaseInfo,
    timeseries: pa.Table | None = None,
    write_csv: bool = True,
    nodes: pa.Table | None = None,
    incidents: pa.Table | None = None,
) -> Path:
    """Write a complete trace directory at `out_dir` (which must not exist or be empty);
    the optional resources (timeseries, nodes, incidents) only when given."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: already exists and is not an empty directory; choose a new --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        optional = [(TIMESERIES, timeseries), (NODES, nodes), (INCIDENTS, incidents)]
        tables = [(JOBS, jobs)] + [(spec, data) for spec, data in optional if data is not None]
        formats = ["parquet", "csv"] if write_csv else ["parquet"]
        # The Parquet and CSV writers and SHA-256 release the GIL: each file is written and
        # hashed in its own thread, beside the others and the aggregates query.
        with ThreadPoolExecutor(max_workers=len(formats)) as pool:
            pending = [
                pool.submit(_write_file, tmp, spec, _in_format_order(spec, data), fmt)
                for spec, data in tables
                for fmt in formats
            ]
            figures = aggregates.compute(jobs, timeseries)
            resources = [written.result() for written in pending]
        (tmp / AGGREGATES).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        package = _datapackage(info, resources, figures)
        (tmp / DATAPACKAGE).write_text(json.dumps(package, indent=2) + "\n")
        (tmp / "README.md").write_text(_datasheet(info, package, figures, nodes))
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def zip_trace(trace_dir: str | Path) -> bytes:
    """The trace directory as a zip archive in memory (for a download button)."""
    trace_dir = Path(trace_dir)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(trace_dir.rglob("*")):
            if path.is_file():
                archive.write(path, f"{trace_dir.name}/{path.relative_to(trace_dir)}")
    return buffer.getvalue()


def file_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()


def _in_format_order(spec: Resource, data: pa.Table) -> pa.Table:
    """The table's columns that the format defines, in its order (a release may drop some)."""
    names = set(data.column_names)
    return data.select([f.name for f in spec.fields if f.name in names])


def _write_file(directory: Path, spec: Resource, data: pa.Table, fmt: str) -> dict:
    """Write one table as Parquet or CSV; return its Frictionless resource descriptor."""
    fields = [spec.field(name) for name in data.column_names]
    schema = {
        "fields": [f.descriptor() for f in fields],
        "primaryKey": list(spec.primary_key),
    }
    if fmt == "parquet":
        path = directory / f"{spec.name}.parquet"
        pq.write_table(data, path, compression="zstd")
        return _resource(spec.name, path, fmt, spec, schema, data.num_rows)
    path = directory / f"{spec.name}.csv"
    _write_csv(data, path)
    return _resource(f"{spec.name}-csv", path, fmt, spec, schema, data.num_rows)


def _write_csv(data: pa.Table, path: Path) -> None:
    """CSV with arrays as JSON text (as Frictionless reads them), written by DuckDB.

    One DuckDB thread: keeping the row order, a second one formatted batches for a fifth less
    wall time but a third more CPU time (1M jobs, 2 cores), while the Parquet copy is written
    beside it anyway (`write_trace`).
    """
    columns = []
    for name in data.column_names:
        quoted = '"' + name + '"'
        is_list = pa.types.is_list(data.schema.field(name).type)
        columns.append(f"to_json({quoted})::VARCHAR AS {quoted}" if is_list else quoted)
    con = sql.connect()
    con.execute("SET threads = 1")
    con.register("data", data)
    target = str(path).replace("'", "''")
    con.execute(
        f"COPY (SELECT {', '.join(columns)} FROM data) TO '{target}' "
        "(FORMAT csv, HEADER true, NULLSTR '')"
    )


def _resource(name: str, path: Path, fmt: str, spec: Resource, schema: dict, rows: int) -> dict:
    out = {
        "name": name,
        "path": path.name,
        "profile": "tabular-data-resource",
        "format": fmt,
        "description": spec.description,
        "schema": schema,
        "bytes": path.stat().st_size,
        "hash": file_digest(path),
        "rows": rows,
    }
    if fmt == "csv":
        out["encoding"] = "utf-8"
        out["mediatype"] = "text/csv"
    else:
        out["mediatype"] = "application/vnd.apache.parquet"
    return out


def _datapackage(info: ReleaseInfo, resources: list[dict], figures: dict) -> dict:
    return {
        "profile": "tabular-data-package",
        "name": "sing-trace",
        "title": info.title,
        "version": FORMAT_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "sing_format": {"name": FORMAT_NAME, "version": FORMAT_VERSION},
        "release_start": info.release_start.astimezone(UTC).isoformat(),
        "release_end": info.release_end.astimezone(UTC).isoformat() if info.release_end else None,
        "source": info.source,
        "aggregates": AGGREGATES,
        **({"anonymization": info.policy} if info.policy else {}),
        **({"privacy": info.privacy_figures} if info.privacy_figures else {}),
        **({PACKAGE_KEY: info.source_gpu_seconds} if info.source_gpu_seconds is not None else {}),
        "resources": resources,
    }


def _datasheet(info: ReleaseInfo, package: dict, figures: dict, nodes: pa.Table | None) -> str:
    bullets = lambda lines: "\n".join(f"- {line}" for line in lines) or "- none recorded"  # noqa: E731
    files = [
        f"| `{r['path']}` | {r['description']} ({r['rows']} rows, {r['format']}) |"
        for r in package["resources"]
    ]
    files += [
        f"| `{DATAPACKAGE}` | field descriptions (Frictionless Data Package) |",
        f"| `{AGGREGATES}` | golden aggregates |",
    ]
    jobs_fields = next(r for r in package["resources"] if r["name"] == "jobs")["schema"]["fields"]
    fields = [
        f"| {f['name']} | {f['type']} | {f.get('unit', '')} | {f['description']} |"
        for f in jobs_fields
    ]
    return Template(DATASHEET_TEMPLATE.read_text()).substitute(
        title=info.title,
        format_name=FORMAT_NAME,
        format_version=FORMAT_VERSION,
        release_start=package["release_start"],
        release_end=package["release_end"] or "open (imported trace)",
        jobs=figures["jobs"],
        gpu_jobs=figures["gpu_jobs"],
        gpu_hours=f"{figures['gpu_hours']:.1f}",
        users=figures["users"],
        censored_jobs=figures["censored_jobs"],
        cluster=_cluster_line(nodes),
        collection=info.collection or "Not recorded.",
        anonymization=bullets(info.anonymization),
        threat_model=info.threat_model or "Not assessed: the publisher of the source decided.",
        privacy="\n".join(info.privacy)
        or "Not assessed: the release was not made from a warehouse that knows its owners.",
        biases=bullets(info.biases),
        files="\n".join(files),
        fields="\n".join(fields),
    )


def _cluster_line(nodes: pa.Table | None) -> str:
    """The datasheet's line on the cluster: its size from the nodes resource, if any."""
    if nodes is None:
        return "not included (no nodes resource)"
    gpus = pc.sum(nodes["gpus"]).as_py() if "gpus" in nodes.column_names else None
    return f"{nodes.num_rows} nodes, {gpus or 0} GPUs (`nodes.parquet`)"
