"""Reading a trace directory: its tables, its node inventory, and jobs as the simulator
replays them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sing.errors import UserError
from sing.traces.format import JOBS
from sing.traces.package import DATAPACKAGE

SIMULATION_COLUMNS = (
    "job_id",
    "user",
    "submit_time_s",
    "duration_s",
    "num_gpus",
    "num_nodes",
    "gpu_request",
    "gpu_model_request",
    "time_limit_s",
    "start_time_s",
)
# Columns a release may lack (older format versions): read as empty.
OPTIONAL = {
    "gpu_request": pl.Float64,
    "gpu_model_request": pl.String,
    "time_limit_s": pl.Int64,
    "start_s": pl.Float64,
    "num_nodes": pl.Int64,
    "user": pl.String,
    "group": pl.String,
    "censored": pl.Boolean,
}
READ = ("job_id", "user", "submit_s", "start_s", "run_s", "num_gpus", "num_nodes", *OPTIONAL)


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


def jobs_file(path: str | Path) -> Path:
    """The jobs file of a release directory, or the jobs file given (jobs.parquet or jobs.csv)."""
    path = Path(path)
    if path.is_dir():
        read_package(path)  # a clear error for a directory that is no release
        return path / "jobs.parquet"
    if path.suffix not in (".parquet", ".csv"):
        raise UserError(f"{path}: not a release's jobs file (jobs.parquet or jobs.csv)")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    return path


def read_jobs(path: str | Path) -> pl.DataFrame:
    """The columns the simulator reads, with the optional ones filled in as empty."""
    file = jobs_file(path)
    if file.suffix == ".parquet":
        if not file.is_file():
            raise UserError(f"{path}: no {file.name} in this trace")
        names = set(pq.read_schema(file).names)
        table = pq.read_table(file, columns=[c for c in dict.fromkeys(READ) if c in names])
    else:
        header = file.open().readline().strip().split(",")
        types = {f.name: f.type for f in JOBS.fields if f.name in READ}
        table = pacsv.read_csv(
            file,
            convert_options=pacsv.ConvertOptions(
                column_types={c: t for c, t in types.items() if c in header},
                include_columns=[c for c in dict.fromkeys(READ) if c in header],
                strings_can_be_null=True,
            ),
        )
    missing = [
        c for c in ("job_id", "submit_s", "run_s", "num_gpus") if c not in table.column_names
    ]
    if missing:
        raise UserError(f"{file}: not a jobs table of the open format (no {', '.join(missing)})")
    return simulation_columns(pl.DataFrame(table))


def simulation_columns(jobs: pl.DataFrame) -> pl.DataFrame:
    """A jobs table with the optional columns the simulator reads filled in as empty."""
    return jobs.with_columns(
        pl.lit(None, dtype=t).alias(c) for c, t in OPTIONAL.items() if c not in jobs.columns
    )


def read_nodes(path: str | Path) -> pa.Table | None:
    """The trace's node inventory (node, gpus, gpu_model), or None when the release has none."""
    listed = {r.get("name") for r in read_package(path).get("resources", [])}
    return read_table(path, "nodes") if "nodes" in listed else None


def simulation_frame(jobs: pl.DataFrame, include_censored: bool = False) -> pl.DataFrame:
    """The jobs (`read_jobs`, or an imported source's) that ran on GPUs, sorted by submit time,
    as the simulator needs them.

    Columns: job_id, user (the tenant: the job's user, or its group where the source records
    no user, as Philly's jobs file, whose virtual cluster is the group), submit_time_s (seconds
    since the release start), duration_s (run time), num_gpus, num_nodes (0 where the source
    did not record it: place the GPUs anywhere), gpu_request (GPUs, fractional for a share of
    one GPU; num_gpus where not recorded), gpu_model_request ("" = any model), time_limit_s and
    start_time_s (the recorded start; both may be empty). Jobs that never ran (no run time) or
    used no GPU are left out, and so are those still running at the release end (censored: their
    run time is only a lower bound) unless `include_censored`, which replays them cut at the
    end: `simulation_skips` counts them.
    """
    gpus = pl.col("gpu_request").fill_null(pl.col("num_gpus").cast(pl.Float64))
    kept = _uses_gpus() & pl.col("run_s").is_not_null()
    return (
        jobs.filter(kept if include_censored else kept & ~_censored())
        .select(
            pl.col("job_id"),
            pl.col("user").fill_null(pl.col("group")).fill_null(""),
            pl.col("submit_s").alias("submit_time_s"),
            pl.col("run_s").alias("duration_s"),
            pl.col("num_gpus").cast(pl.Int64),
            pl.col("num_nodes").fill_null(0).cast(pl.Int64),
            gpus.alias("gpu_request"),
            pl.col("gpu_model_request").fill_null(""),
            pl.col("time_limit_s").cast(pl.Float64),
            pl.col("start_s").alias("start_time_s"),
        )
        .sort(["submit_time_s", "job_id"])
    )


def simulation_skips(jobs: pl.DataFrame, include_censored: bool = False) -> dict[str, int]:
    """How many jobs `simulation_frame` leaves out, and why: cpu-only, never ran, censored."""
    gpu = jobs.filter(_uses_gpus())
    never = gpu.filter(pl.col("run_s").is_null()).height
    censored = gpu.filter(pl.col("run_s").is_not_null() & _censored()).height
    return {
        "cpu-only": jobs.height - gpu.height,
        "never ran": never,
        "censored": 0 if include_censored else censored,
    }


@dataclass(frozen=True)
class CensoredLoad:
    """The jobs still running at the end and their GPU-time so far: a release whose long jobs
    are cut holds much of its load there (32 pods, 56% of the GPU-hours of Alibaba's 2023 list)."""

    jobs: int
    gpu_seconds: float
    share: float | None  # of the GPU-seconds of all GPU jobs that ran; None when there are none


def censored_load(jobs: pl.DataFrame) -> CensoredLoad:
    ran = jobs.filter(_uses_gpus() & pl.col("run_s").is_not_null()).with_columns(
        gpu_s=pl.col("run_s") * pl.col("gpu_request").fill_null(pl.col("num_gpus"))
    )
    censored = ran.filter(_censored())
    total, cut = float(ran["gpu_s"].sum()), float(censored["gpu_s"].sum())
    return CensoredLoad(censored.height, cut, cut / total if total else None)


def _censored() -> pl.Expr:
    """Still running at the release end (not recorded: finished)."""
    return pl.col("censored").fill_null(False)


def _uses_gpus() -> pl.Expr:
    return (pl.col("num_gpus") > 0) & (
        pl.col("gpu_request").is_null() | (pl.col("gpu_request") > 0)
    )
