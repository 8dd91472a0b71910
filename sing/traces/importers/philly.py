"""Microsoft Philly (2017): the per-job CSV used by simulators, or the raw `cluster_job_log` JSON.

CSV (`timestamp,duration,num_gpus,gpu_time,cluster`, e.g. Pollux's philly.csv): one row per job,
`timestamp` is the arrival time (naive, UTC: below), `duration` the run time, `cluster` the virtual
cluster; no user, state or start time. JSON: a list of jobs `{jobid, user, vc, status,
submitted_time, attempts: [{start_time, end_time, detail: [{ip, gpus: [...]}]}]}`; a job's start
is its first attempt's, its end its last attempt's, its GPUs those of its last attempt. The
virtual cluster (the team whose quota the job ran in) is both the job's `group` and its
`partition`.

Times: the job log's naive times are UTC. Its job ids are YARN application ids,
`application_<ResourceManager start, epoch ms>_<sequence>`, and read as UTC the first
applications after each ResourceManager restart are submitted seconds to minutes after that
start (application_1512440382012_0001: RM up 2017-12-05 02:19:42 UTC, submitted
"2017-12-05 02:19:54"); read as US Pacific they would come 7-8 h after it, with nothing before
them. The per-job CSV's `timestamp` is the job log's `submitted_time`, copied unchanged. (The
trace's machine-utilisation logs say PDT/PST; the job log says nothing and is not in Pacific
time.) `sing simulate` reads the CSV through this module, so a file and its import replay alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from sing.errors import UserError
from sing.traces.importers.common import LINE, Source, number, read_table, require, times

# The job log's naive times are UTC (the module docstring says why).
DEFAULT_TIMEZONE = "UTC"
TITLE = "Microsoft Philly GPU cluster trace (2017), imported"
COLLECTION = (
    "Microsoft's Philly clusters, Aug-Dec 2017 (msr-fiddle/philly-traces, CC-BY-4.0; "
    "Jeon et al., ATC'19). Imported by sing; the job log's naive times are UTC, kept as they are."
)


def load(path: Path, timezone: str) -> Source:
    if path.suffix.lower() == ".json":
        return _load_job_log(path, timezone)
    df = read_table(path, required=("timestamp", "duration", "num_gpus", "cluster"))
    submit = times(df, "timestamp", path, timezone)
    require(df, submit, "timestamp", path)
    jobs = pl.DataFrame(
        {
            "job_id": _line_ids(df[LINE]),
            "group": df["cluster"],
            "partition": df["cluster"],
            "submit": submit,
            "run_s": number(df, "duration", path),
            "num_gpus": number(df, "num_gpus", path, pl.Int64),
            "state": pl.Series([None] * df.height, dtype=pl.String),
        }
    )
    gpu_time = number(df, "gpu_time", path).sum() if "gpu_time" in df.columns else None
    return Source(
        jobs,
        TITLE,
        COLLECTION + " Per-job CSV: arrival time, run time, GPUs and virtual cluster only.",
        [
            "Only the jobs of this file (a subset of the full trace; Pollux kept about half "
            "of its GPU-seconds); no users, states, queueing delays or node counts.",
            "job_id is the job's line in the source file (philly-000002 = line 2).",
            "No users: the virtual cluster (a team's quota) is each job's group and partition; "
            "sing simulate counts it as the tenant.",
        ],
        gpu_seconds=gpu_time,
    )


def _load_job_log(path: Path, timezone: str) -> Source:
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not a readable JSON cluster_job_log: {err}") from err
    if not isinstance(entries, list) or not entries:
        got = type(entries).__name__ if entries else "no jobs"
        raise UserError(f"{path}: expected a JSON list of jobs, got {got}")
    rows = []
    for i, job in enumerate(entries):
        try:
            attempts = job.get("attempts") or []
            last = attempts[-1]["detail"] if attempts else []
            rows.append(
                {
                    "job_id": str(job["jobid"]),
                    "user": job.get("user"),
                    "group": job.get("vc"),
                    "partition": job.get("vc"),
                    "state": job.get("status"),
                    "timestamp": _time(job.get("submitted_time")),
                    "start": _time(attempts[0].get("start_time")) if attempts else None,
                    "end": _time(attempts[-1].get("end_time")) if attempts else None,
                    "num_gpus": sum(len(d.get("gpus") or []) for d in last) if attempts else None,
                    "num_nodes": len(last) if attempts else None,
                }
            )
        except (AttributeError, KeyError, TypeError, IndexError) as err:
            raise UserError(f"{path}: job {i + 1} (jobid {_id(job)}): malformed: {err!r}") from err
    df = pl.DataFrame(
        rows,
        schema_overrides={"num_gpus": pl.Int64, "num_nodes": pl.Int64},
        infer_schema_length=None,
    )
    df = df.with_columns(
        [pl.col(c).cast(pl.String) for c in ("timestamp", "start", "end")]
    ).with_row_index(LINE, offset=1)
    submit = times(df, "timestamp", path, timezone)
    require(df, submit, "submitted_time", path)
    jobs = df.select(
        "job_id", "user", "group", "partition", "state", "num_gpus", "num_nodes"
    ).with_columns(
        submit=submit,
        start=times(df, "start", path, timezone),
        end=times(df, "end", path, timezone),
    )
    return Source(
        jobs,
        TITLE,
        COLLECTION + " Raw cluster_job_log: one entry per job with its scheduling attempts.",
        [
            "A job's run time spans its attempts, including gaps between retries.",
            "Jobs still running at the end of the log have no end time.",
        ],
    )


def _line_ids(lines: pl.Series) -> pl.Series:
    """`philly-000002` for line 2: zero-padded to one width, so that ids sort as lines do (the
    release orders jobs of one submit time by id, as the file orders them)."""
    width = max(6, len(str(lines.max())))
    return lines.cast(pl.String).str.pad_start(width, "0").str.replace("^", "philly-")


def _id(job: object) -> str:
    return str(job.get("jobid", "?")) if isinstance(job, dict) else "?"


def _time(value: object) -> object:
    """The job log writes a missing time as the string "None"."""
    return None if value in (None, "", "None") else value
