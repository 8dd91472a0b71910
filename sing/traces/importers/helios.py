"""SenseTime Helios (2020): `cluster_log.csv` of the Venus, Earth, Saturn and Uranus clusters.

Columns: job_id, user, vc, [jobname], gpu_num, cpu_num, node_num, state, submit_time, start_time,
end_time, duration, queue; times without zone (China Standard Time). `jobname` is never read.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sing.traces.importers.common import Source, number, read_table, require, times

DEFAULT_TIMEZONE = "Asia/Shanghai"
REQUIRED = ("job_id", "user", "vc", "gpu_num", "node_num", "state", "submit_time")


def load(path: Path, timezone: str) -> Source:
    df = read_table(path, required=REQUIRED)
    submit = times(df, "submit_time", path, timezone)
    require(df, submit, "submit_time", path)
    optional = {c: c in df.columns for c in ("start_time", "end_time", "duration", "queue")}
    jobs = pl.DataFrame(
        {
            "job_id": df["job_id"],
            "user": df["user"],
            "partition": df["vc"],
            "state": df["state"],
            "submit": submit,
            "start": times(df, "start_time", path, timezone) if optional["start_time"] else None,
            "end": times(df, "end_time", path, timezone) if optional["end_time"] else None,
            "run_s": number(df, "duration", path) if optional["duration"] else None,
            "queue_s": number(df, "queue", path) if optional["queue"] else None,
            "num_gpus": number(df, "gpu_num", path, pl.Int64),
            "num_nodes": number(df, "node_num", path, pl.Int64),
        }
    )
    return Source(
        jobs,
        "SenseTime Helios GPU cluster trace (2020), imported",
        "SenseTime's Helios clusters, Apr-Sep 2020 (S-Lab-System-Group/HeliosData, CC-BY-4.0; "
        "Hu et al., SC'21). Imported by sing; times converted from China Standard Time to UTC.",
        [
            "CPU-only jobs (gpu_num 0) are kept; the GPU figures in aggregates.json exclude them.",
            "User ids and virtual clusters are the source's own pseudonyms.",
        ],
    )
