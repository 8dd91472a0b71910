"""Standard Workload Format (SWF 2.2): the logs of the Parallel Workloads Archive and HPC
simulators.

One job per line, 18 whitespace-separated numbers: job number, submit time, wait time, run time,
allocated processors, average CPU time, used memory, requested processors, requested time,
requested memory, status, user id, group id, executable, queue, partition, preceding job, think
time. -1 is unknown. Lines starting with ';' are the header (`; UnixStartTime: 749001600`,
`; MaxNodes: 128`, ...). Times are seconds from UnixStartTime, which becomes the release start,
so submit_s is the log's submit time (1970-01-01 when the header gives no start).

Processors become GPUs: sing replays GPU jobs, so a log of CPU processors is replayed with one
processor as one GPU-equivalent slot (the figures are the log's, in processor units). A job holds
its allocated processors, the requested ones where the allocation is unknown. The header's
MaxNodes and MaxProcs (when MaxProcs is a multiple of MaxNodes) give the cluster: MaxNodes nodes
of MaxProcs / MaxNodes slots, the `nodes` resource of the release.

Status: 1 completed, 0 failed, 5 cancelled; 3 and 4 (the last part of a checkpointed job) are
completed and failed; 2 (a part that will be continued) and -1 are unknown. A job with run time
-1 never ran (a job cancelled while waiting); the queue becomes the partition, as `sing trace swf`
writes a release's partition as the queue.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa

from sing.errors import UserError
from sing.traces.format import NODES, conform
from sing.traces.importers.common import LINE, Source, number, reject

DEFAULT_TIMEZONE = "UTC"  # unused: times are seconds from the header's UnixStartTime
FIELDS = (
    "job", "submit", "wait", "run", "procs", "cpu_time", "memory", "req_procs", "req_time",
    "req_memory", "status", "user", "group", "executable", "queue", "partition", "preceding",
    "think",
)  # fmt: skip
UNKNOWN = -1
STATUS = {1: "COMPLETED", 0: "FAILED", 5: "CANCELLED", 3: "COMPLETED", 4: "FAILED"}
LOG_START = datetime(1970, 1, 1, tzinfo=UTC)  # without UnixStartTime: seconds from the log's start
SLOT_NOTE = "one SWF processor = one GPU-equivalent slot"


def load(path: Path, timezone: str) -> Source:
    header, df = _read_log(path)
    values = {name: _known(df, name, path) for name in FIELDS[1:]}
    reject(df, values["submit"].is_null(), path, "submit time is -1: a job needs one")
    start = _start_time(header, path)
    submit_s = values["submit"]
    start_s = submit_s + values["wait"]
    procs = values["procs"].fill_null(values["req_procs"]).round(0).cast(pl.Int64)
    run_s = values["run"]
    jobs = pl.DataFrame(
        {
            "job_id": df["job"],
            "user": _identifier(values["user"]),
            "group": _identifier(values["group"]),
            "partition": _identifier(values["queue"]),
            "state": values["status"].replace_strict(STATUS, default=None, return_dtype=pl.String),
            "submit": _at(start, submit_s),
            "start": _at(start, start_s),
            "end": _at(start, start_s + run_s),
            "run_s": run_s,
            "queue_s": values["wait"],
            "num_gpus": procs,
            "time_limit_s": values["req_time"].round(0).cast(pl.Int64),
        }
    )
    return Source(
        jobs,
        f"{header.get('Computer', 'SWF workload log')}, imported",
        "A workload log in the Standard Workload Format (Parallel Workloads Archive, "
        f"Feitelson et al.). Imported by sing; {SLOT_NOTE}.",
        [
            f"Processors, not GPUs: {SLOT_NOTE}; GPU-hours are processor-hours.",
            "No GPU models, node counts or censoring: the log records finished jobs.",
            "Users, groups and queues are the log's numbers.",
        ],
        origin=start,
        gpu_seconds=float((run_s * procs).sum()),
        nodes=_cluster(header),
    )


def _read_log(path: Path) -> tuple[dict[str, str], pl.DataFrame]:
    """The header's `; Key: value` lines and the jobs as text, with their line numbers."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a readable SWF log: {err}") from err
    header: dict[str, str] = {}
    rows: list[list[str]] = []
    numbers: list[int] = []
    for line_number, line in enumerate(lines, start=1):
        text = line.strip()
        if text.startswith(";"):
            key, colon, value = text.lstrip("; ").partition(":")
            if colon and key.strip().isidentifier():
                header.setdefault(key.strip(), value.strip())
            continue
        if not text:
            continue
        fields = text.split()
        if len(fields) != len(FIELDS):
            raise UserError(f"{path}: line {line_number}: {len(fields)} fields, SWF has 18")
        rows.append(fields)
        numbers.append(line_number)
    if not rows:
        raise UserError(f"{path}: no jobs (an SWF log has one job per line after its header)")
    df = pl.DataFrame(rows, schema=list(FIELDS), orient="row").with_columns(
        pl.Series(LINE, numbers)
    )
    reject(df, df["job"].is_duplicated() & ~df["job"].is_first_distinct(), path, "job listed twice")
    return header, df


def _known(df: pl.DataFrame, column: str, path: Path) -> pl.Series:
    """A field's numbers, -1 (unknown) as empty; any other negative number is an error."""
    values = number(df, column, path)
    reject(df, (values < 0) & (values != UNKNOWN), path, f"{column} is below 0 and not -1")
    return pl.select(pl.when(values != UNKNOWN).then(values)).to_series().alias(column)


def _identifier(values: pl.Series) -> pl.Series:
    return values.cast(pl.Int64).cast(pl.String)


def _start_time(header: dict[str, str], path: Path) -> datetime:
    text = header.get("UnixStartTime")
    if text is None:
        return LOG_START
    try:
        return LOG_START + timedelta(seconds=int(text))
    except (ValueError, OverflowError):
        raise UserError(f"{path}: header UnixStartTime {text!r} is not Unix seconds") from None


def _at(start: datetime, seconds: pl.Series) -> pl.Series:
    """Seconds from the log's start as UTC times."""
    micros = int((start - LOG_START).total_seconds()) * 1_000_000 + seconds * 1e6
    return micros.round(0).cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")


def _cluster(header: dict[str, str]) -> pa.Table | None:
    """MaxNodes nodes of MaxProcs / MaxNodes slots, when the header gives both and they divide."""
    try:
        nodes, procs = int(header["MaxNodes"]), int(header["MaxProcs"])
    except (KeyError, ValueError):
        return None
    if nodes < 1 or procs < nodes or procs % nodes:
        return None
    width = len(str(nodes))
    table = pl.DataFrame(
        {
            "node": [f"swf-node-{k:0{width}d}" for k in range(1, nodes + 1)],
            "gpus": [procs // nodes] * nodes,
        }
    )
    return conform(NODES, table.to_arrow())
