"""Reading a trace directory: its tables, its node inventory, and jobs as the simulator
replays them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from sing.errors import UserError
from traces.package import DATAPACKAGE

SIMULATION_COLUMNS = ("job_id", "user", "submit_time_s", "duration_s", "num_gpus", "num_nodes")


def read_package(path: str | Path) -> dict:
    """The trace's datapackage.json."""
    file = Path(path) / DATAPACKAGE
    if not file.is_file():
        raise UserError(f"{path}: not a trace directory (no {DATAPACKAGE})")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{file}: not valid JSON: {err}") from err


def read_table(path: str | Path, name: str = "jobs") -> pa.Table:
    """One table of a trace (from its Parquet file)."""
    file = Path(path) / f"{name}.parquet"
    if not file.is_file():
        raise UserError(f"{path}: no {file.name} in this trace")
    return pq.read_table(file)


def read_nodes(path: str | Path) -> pa.Table | None:
    """The trace's node inventory (node, gpus, gpu_model), or None when the release has none."""
    listed = {r.get("name") for r in read_package(path).get("resources", [])}
    return read_table(path, "nodes") if "nodes" in listed else None


def jobs_for_simulation(path: str | Path) -> pl.DataFrame:
    """The trace's jobs that ran on GPUs, sorted by submit time, as the simulator needs them.

    Columns: job_id, user, submit_time_s (seconds since the release start), duration_s (run
    time), num_gpus, num_nodes (0 where the source did not record it: place the GPUs anywhere).
    Jobs that never ran (no run time) or used no GPU are left out.
    """
    jobs = pl.from_arrow(
        read_table(path).select(["job_id", "user", "submit_s", "run_s", "num_gpus", "num_nodes"])
    )
    return (
        jobs.filter(pl.col("run_s").is_not_null() & (pl.col("num_gpus") > 0))
        .select(
            pl.col("job_id"),
            pl.col("user"),
            pl.col("submit_s").alias("submit_time_s"),
            pl.col("run_s").alias("duration_s"),
            pl.col("num_gpus").cast(pl.Int64),
            pl.col("num_nodes").fill_null(0).cast(pl.Int64),
        )
        .sort(["submit_time_s", "job_id"])
    )
