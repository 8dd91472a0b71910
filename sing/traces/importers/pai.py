"""Alibaba PAI (2020): `pai_job_table.csv`, headerless, column names in `pai_job_table.header`.

Job table: job_name, inst_id, user, status, start_time, end_time, with times in seconds shifted
by a secret constant. The GPUs a job asked for live in the task table: when
`pai_task_table.csv` (+ .header) sits beside the job table, a job's GPU request is the sum over
its tasks of plan_gpu (percent of one GPU) x inst_num / 100 (num_gpus: rounded up), and its
start is its first task's start; without it GPUs are unknown and the start is the job's
start_time. A time of 0 is PAI's "none" (as in the publisher's own analysis code).

A job never started when no task of it started, or when it ended before its first task
started: it gets no start or run time, and is pending if PAI still shows it Waiting or Running,
else cancelled (not a run with start = submit). Without the task table only Waiting jobs are
known not to have started.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sing.errors import UserError
from sing.traces.importers.common import (
    Source,
    header_file,
    number,
    read_table,
    require,
    seconds_since_epoch,
)

DEFAULT_TIMEZONE = "UTC"  # unused: PAI times are shifted Unix seconds


def load(path: Path, timezone: str) -> Source:
    df = read_table(
        path,
        columns=header_file(path.with_suffix(".header")),
        required=("job_name", "user", "status", "start_time", "end_time"),
    )
    submit = seconds_since_epoch(df, "start_time", path)
    require(df, submit, "start_time", path)
    jobs = pl.DataFrame(
        {
            "job_id": df["job_name"],
            "user": df["user"],
            "state": df["status"],
            "submit": submit,
            "start": submit,
            "end": _time(df, "end_time", path),
        }
    )
    tasks_file = path.with_name("pai_task_table.csv")
    biases = ["Times are shifted by a secret constant: release_start is not a real date."]
    if tasks_file.is_file():
        tasks = _task_summary(tasks_file)
        jobs = jobs.drop("start").join(tasks, on="job_id", how="left")
        biases.append("num_gpus rounds shares of a GPU up; gpu_request keeps the fraction.")
    else:
        waiting = jobs["state"].str.strip_chars().str.to_lowercase() == "waiting"
        jobs = jobs.with_columns(start=pl.when(~waiting).then(pl.col("start")))
        biases.append("No pai_task_table.csv beside the job table: GPUs and queueing unknown.")
    return Source(
        _never_started(jobs),
        "Alibaba PAI GPU cluster trace (2020), imported",
        "Alibaba's PAI cluster, Jul-Aug 2020 (alibaba/clusterdata cluster-trace-gpu-v2020, "
        "CC-BY-4.0; Weng et al., NSDI'22). Imported by sing.",
        biases,
    )


def _task_summary(path: Path) -> pl.DataFrame:
    df = read_table(
        path,
        columns=header_file(path.with_suffix(".header")),
        required=("job_name", "inst_num", "start_time", "plan_gpu"),
    )
    tasks = pl.DataFrame(
        {
            "job_id": df["job_name"],
            "gpus": number(df, "plan_gpu", path).fill_null(0) * number(df, "inst_num", path) / 100,
            "start": _time(df, "start_time", path),
        }
    )
    jobs = tasks.group_by("job_id").agg(pl.col("gpus").sum(), pl.col("start").min())
    huge = jobs.filter(pl.col("gpus").abs() >= 2**53)  # past this a float sum is not exact
    if huge.height:
        raise UserError(
            f"{path}: job {huge['job_id'][0]}: {huge['gpus'][0]:g} GPUs is out of range"
        )
    return jobs.select(
        "job_id",
        pl.col("gpus").ceil().cast(pl.Int64).alias("num_gpus"),
        pl.col("gpus").alias("gpu_request"),
        "start",
    )


def _time(df: pl.DataFrame, column: str, path: Path) -> pl.Series:
    """Shifted Unix seconds as UTC times; 0 (PAI's "not yet") becomes empty."""
    times = seconds_since_epoch(df, column, path)
    return pl.select(pl.when(number(df, column, path) != 0).then(times)).to_series()


def _never_started(jobs: pl.DataFrame) -> pl.DataFrame:
    """Jobs with no start, or an end before it, did not run: no start, pending or cancelled."""
    never = pl.col("start").is_null() | (pl.col("end") < pl.col("start")).fill_null(False)
    waiting = pl.col("state").str.strip_chars().str.to_lowercase().is_in(["waiting", "running"])
    return jobs.with_columns(
        start=pl.when(~never).then(pl.col("start")),
        state=pl.when(never & waiting)
        .then(pl.lit("Waiting"))
        .when(never)
        .then(pl.lit("Cancelled"))
        .otherwise(pl.col("state")),
    )
