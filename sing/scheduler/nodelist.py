"""The cluster a replay runs on, as a node list: `--cluster FILE` or a release's `nodes` resource.

Both have the columns `node,gpus,gpu_model` (the open format's `nodes` resource): one row per
node, its GPU count and its GPU model (empty = unnamed); nodes without GPUs are left out. A
release without a node list leaves the cluster to `--nodes`/`--gpus-per-node` or `--cluster`.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa

from sing.errors import UserError
from sing.scheduler.cluster import Node
from sing.traces.read import read_nodes

COLUMNS = ("node", "gpus", "gpu_model")


def read_cluster(path: str | Path) -> list[Node]:
    """The nodes of a cluster CSV file (header node,gpus,gpu_model; gpu_model may be empty)."""
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
            header = [h.strip() for h in (rows[0].keys() if rows else [])]
    except OSError as err:
        raise UserError(f"cannot read cluster file {path}: {err.strerror}") from err
    missing = [c for c in ("node", "gpus") if c not in header]
    if not rows or missing:
        raise UserError(
            f"{path}: a cluster file needs the header {','.join(COLUMNS)} and one row per node"
            + (f" (missing {', '.join(missing)})" if rows else "")
        )
    return _nodes(
        path, [(r["node"], r["gpus"], r.get("gpu_model") or "") for r in rows], first_line=2
    )


def release_nodes(release: Path) -> list[Node] | None:
    """The node list of a release (its `nodes` resource), or None if it carries none."""
    table = read_nodes(release)
    return None if table is None else table_nodes(table, release / "nodes.parquet")


def table_nodes(table: pa.Table, source: Path) -> list[Node]:
    """A `nodes` table of the format (a release's, or the cluster an SWF header describes)."""
    if not {"node", "gpus"} <= set(table.column_names):
        raise UserError(f"{source}: its nodes table needs the columns node and gpus")
    models = table["gpu_model"].to_pylist() if "gpu_model" in table.column_names else None
    names, gpus = table["node"].to_pylist(), table["gpus"].to_pylist()
    rows = zip(names, gpus, models or [""] * len(names), strict=True)
    return _nodes(source, [(n, g, m or "") for n, g, m in rows], first_line=1)


def _nodes(source: Path, rows: list[tuple], first_line: int) -> list[Node]:
    nodes, seen = [], set()
    for line, (name, gpus, model) in enumerate(rows, start=first_line):
        name = str(name or "").strip()
        try:
            count = int(str(gpus).strip())
        except ValueError:
            count = -1
        if not name or count < 0:
            raise UserError(
                f"{source} row {line}: need a node name and a whole number of GPUs >= 0, "
                f"got node={name!r} gpus={gpus!r}"
            )
        if name in seen:
            raise UserError(f"{source} row {line}: node {name!r} listed twice")
        seen.add(name)
        if count:  # a CPU-only node is no part of the GPU cluster
            nodes.append(Node(name, count, str(model).strip()))
    if not nodes:
        raise UserError(f"{source}: no node with GPUs")
    return nodes
