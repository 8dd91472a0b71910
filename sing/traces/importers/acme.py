"""Shanghai AI Lab AcmeTrace (2023): per-cluster job traces of Seren and Kalos.

Columns: job_id, user, gpu_num, cpu_num, node_num, state, submit_time, start_time, end_time,
duration, queue, type. Times may carry an offset (kept); naive ones are read in --timezone.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sing.traces.importers.common import Source, number, read_table, require, times

DEFAULT_TIMEZONE = "Asia/Shanghai"
REQUIRED = ("job_id", "user", "gpu_num", "node_num", "state", "submit_time")


def load(path: Path, timezone: str) -> Source:
    df = read_table(path, required=REQUIRED)
    submit = times(df, "submit_time", path, timezone)
    require(df, submit, "submit_time", path)
    has = set(df.columns)
    jobs = pl.DataFrame(
        {
            "job_id": df["job_id"],
            "user": df["user"],
            "partition": df["type"] if "type" in has else None,
            "state": df["state"],
            "submit": submit,
            "start": times(df, "start_time", path, timezone) if "start_time" in has else None,
            "end": times(df, "end_time", path, timezone) if "end_time" in has else None,
            "run_s": number(df, "duration", path) if "duration" in has else None,
            "queue_s": number(df, "queue", path) if "queue" in has else None,
            "num_gpus": number(df, "gpu_num", path, pl.Int64),
            "num_nodes": number(df, "node_num", path, pl.Int64),
        }
    )
    return Source(
        jobs,
        "AcmeTrace GPU cluster trace (2023), imported",
        "Shanghai AI Laboratory's Seren and Kalos clusters, Mar-Aug 2023 (InternLM/AcmeTrace, "
        "CC-BY-4.0; Hu et al., NSDI'24). Imported by sing; `type` becomes the partition.",
        ["CPU-only jobs (gpu_num 0) are kept; the GPU figures in aggregates.json exclude them."],
    )
