"""Kubernetes pod lists: the Alibaba GPU trace of 2023 (`openb_pod_list_*.csv`) and its kind.

Columns: name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
creation_time, deletion_time, scheduled_time. Times are seconds from the trace's start, which
becomes the release start, so submit_s = creation_time. A pod holds `num_gpu` GPUs; one GPU
pod may ask for a share of its GPU in thousandths (`gpu_milli` 460 = 0.46 GPU). `gpu_spec`
lists the GPU models a pod may run on ('V100M16|V100M32'), empty for any; it is kept as text.

How a pod's phase becomes a state. The list records each pod's last phase before the pod
object was deleted, and the trace's end (the last time the list records; 12,902,960 s in openb)
cuts the pods still alive: those with an empty deletion time or deleted at that end. A pod
never scheduled (empty scheduled_time; 0 is a real time: the first pod was created and scheduled
at 0) has no start or run time: pending if still waiting at the end, else cancelled. A scheduled
pod that exited on its own is completed (Succeeded) or failed (Failed); one deleted before it
exited is cancelled (deletion is Kubernetes' scancel), unless the trace's end cut it, which
leaves it running and censored. Its run time is deletion (or the trace's end, for a pod never
deleted) minus scheduled time: how long it held its resources, so a pod alive at the end keeps
the GPU-time it had held by then.

A pod created before the trace's start has a negative creation time; the release then starts at
the earliest such time (release_start before 1970-01-01), so that no time is negative, and every
time is the source's plus that shift.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from sing.errors import UserError
from sing.traces.importers.common import (
    Source,
    number,
    read_table,
    reject,
    require,
    seconds_since_epoch,
)

DEFAULT_TIMEZONE = "UTC"  # unused: times are seconds from the trace's start
REQUIRED = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time",
            "scheduled_time")  # fmt: skip
TRACE_START = datetime(1970, 1, 1, tzinfo=UTC)  # what seconds from the trace start count from


def load(path: Path, timezone: str) -> Source:
    df = read_table(path, required=REQUIRED)
    if df.height == 0:
        raise UserError(f"{path}: no pods")
    name = df["name"].str.strip_chars()
    require(df, name, "name", path)
    reject(df, name.is_duplicated() & ~name.is_first_distinct(), path, "pod name listed twice")
    created = seconds_since_epoch(df, "creation_time", path)
    require(df, created, "creation_time", path)
    deleted = seconds_since_epoch(df, "deletion_time", path)
    scheduled = seconds_since_epoch(df, "scheduled_time", path)
    gpus = number(df, "num_gpu", path, pl.Int64)
    require(df, gpus, "num_gpu", path)
    reject(df, gpus < 0, path, "column num_gpu: a GPU count is 0 or more")
    trace_end = pl.concat([created, scheduled, deleted]).max()
    ended = deleted.fill_null(trace_end)
    request = _gpu_request(df, gpus, path)
    held_s = (ended - scheduled).dt.total_microseconds() / 1e6
    earliest = pl.concat([created, scheduled]).min()
    jobs = pl.DataFrame(
        {
            "job_id": name,
            "partition": df["qos"] if "qos" in df.columns else None,
            "state": _state(df["pod_phase"], scheduled, ended),
            "submit": created,
            "start": scheduled,
            "end": ended,
            "num_gpus": gpus,
            "num_nodes": pl.Series([1] * df.height, dtype=pl.Int64),  # a pod runs on one node
            "gpu_request": request,
            "gpu_model_request": (
                df["gpu_spec"].str.strip_chars() if "gpu_spec" in df.columns else None
            ),
        }
    )
    return Source(
        jobs,
        "Kubernetes pod list, imported",
        "A Kubernetes pod list in the shape of Alibaba's GPU cluster trace of 2023 "
        "(alibaba/clusterdata cluster-trace-gpu-v2023, openb_pod_list_*.csv; Weng et al., "
        "ATC'23). Imported by sing; `qos` becomes the partition.",
        [
            "Times count from the trace's start: release_start 1970-01-01 is not a real date.",
            "A pod's run time is from its scheduling to its deletion (the time it held its "
            "resources), also for pods that had finished before they were deleted.",
            "Pods deleted while running are 'cancelled': the list does not say whether their "
            "work was done. No users: every pod is its own job.",
            "CPU-only pods (num_gpu 0) are kept; the GPU figures in aggregates.json exclude "
            "them, and count a share of a GPU as a whole GPU (num_gpus).",
            "Pods alive at the trace's end are cut there (censored): their run time is a lower "
            "bound, and they hold the GPU-time they had used by then.",
        ],
        origin=min(TRACE_START, earliest),
        gpu_seconds=float((request * held_s).sum()),
    )


def _gpu_request(df: pl.DataFrame, gpus: pl.Series, path: Path) -> pl.Series:
    """GPUs asked for: num_gpu x gpu_milli / 1000, 0 for a CPU-only pod; an empty gpu_milli
    means whole GPUs."""
    milli = number(df, "gpu_milli", path).fill_null(1000)
    reject(
        df,
        (gpus > 0) & ((milli <= 0) | (milli > 1000)),
        path,
        "column gpu_milli: a GPU pod asks for 1 to 1000 thousandths of each GPU",
    )
    return pl.select(pl.when(gpus > 0).then(gpus * milli / 1000).otherwise(0.0)).to_series()


def _state(phase: pl.Series, scheduled: pl.Series, ended: pl.Series) -> pl.Series:
    """The source state to normalise (module docstring): the phase, or what deletion meant;
    `ended` is the deletion time, or the trace's end for a pod never deleted."""
    pods = pl.DataFrame({"phase": phase, "scheduled": scheduled, "ended": ended})
    at_end = pl.col("ended") == pl.col("ended").max()
    exited = pl.col("phase").str.strip_chars().str.to_lowercase().is_in(["succeeded", "failed"])
    never = pl.col("scheduled").is_null()
    return pods.select(
        pl.when(never & at_end)
        .then(pl.lit("Pending"))
        .when(never)
        .then(pl.lit("Cancelled"))
        .when(exited)
        .then(pl.col("phase"))
        .when(at_end)
        .then(pl.lit("Running"))
        .otherwise(pl.lit("Cancelled"))
    ).to_series()
