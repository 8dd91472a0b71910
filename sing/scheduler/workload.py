"""Jobs to replay, as columns, and the trace files they are read from.

The simulator takes a `Workload` (plain lists, one entry per job), so any trace source needs only a
small adapter that fills these columns. `load_trace` reads four formats:

- a release of the open format (its directory, or its jobs.parquet / jobs.csv): times count from
  its `release_start`; a `nodes` resource, if present, is its cluster (sing.scheduler.nodelist);
- simple CSV: `job_id,user,submit_time,duration_s,num_gpus[,num_nodes][,time_limit_s]
  [,gpu_request][,gpu_model_request]`, where submit_time is seconds (any epoch) or an ISO 8601
  timestamp (naive = UTC), and gpu_request < 1 asks for a share of one GPU;
- the Philly jobs file (`timestamp,duration,num_gpus,gpu_time,cluster`, e.g. Pollux's
  philly.csv), read by the Philly importer (traces.importers.philly), so it replays as its
  import does: naive timestamps are UTC (the importer says why), times count from midnight UTC
  of the first arrival's day, job ids are `philly-<line>` zero-padded, and with no user column
  the virtual cluster (the job's group: VCs are teams) is the tenant;
- a Standard Workload Format log (`.swf`), read by the SWF importer (traces.importers.swf), so
  it replays as its import does: one processor is one GPU-equivalent slot, times count from the
  header's UnixStartTime, and MaxNodes/MaxProcs give the cluster.

`load_site` reads a fifth source, the site's own record in its warehouse (`sing simulate
--from-warehouse`): the jobs and node inventory a release of the window would be built from
(traces.export.site_record), not anonymized, times counting from the window start.

A source that has an importer is read only through it (`_read_source`): the direct read and
`sing trace import` share one time rule and one set of columns, and a test replays both.

Jobs the simulator cannot replay are counted, not refused: CPU-only jobs (0 GPUs), jobs that
never ran (a release's jobs without a run time) and censored ones (still running at the release
end: their run time is only a lower bound), which are replayed cut at the end on request
(`include_censored`); `Trace.censored` says how much of the GPU-time they hold.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import polars as pl

from sing.errors import UserError
from sing.scheduler.cluster import WHOLE, Node
from sing.scheduler.nodelist import release_nodes, table_nodes
from sing.times import parse_time
from sing.traces.export import SiteRecord, site_record
from sing.traces.importers import load
from sing.traces.importers.common import to_jobs
from sing.traces.read import (
    CensoredLoad,
    censored_load,
    jobs_file,
    read_jobs,
    read_package,
    simulation_columns,
    simulation_frame,
    simulation_skips,
)
from sing.warehouse.store import Warehouse

SIMPLE_COLUMNS = ("job_id", "user", "submit_time", "duration_s", "num_gpus")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


@dataclasses.dataclass
class Workload:
    """One entry per job in each list; times in seconds (submit: since the epoch, UTC)."""

    job_id: list[str]
    user: list[str]
    submit: list[float]
    duration: list[float]
    num_gpus: list[int]
    num_nodes: list[int]  # 0: placement decides
    time_limit: list[float | None]
    share: list[int] = dataclasses.field(default_factory=list)  # thousandths of a GPU; 0 = whole
    model: list[str] = dataclasses.field(default_factory=list)  # GPU model needed; "" = any
    recorded_start: list[float | None] = dataclasses.field(default_factory=list)  # as the trace ran

    def __post_init__(self) -> None:
        n = len(self.job_id)
        self.share = self.share or [0] * n
        self.model = self.model or [""] * n
        self.recorded_start = self.recorded_start or [None] * n

    def __len__(self) -> int:
        return len(self.job_id)

    def select(self, keep: list[int]) -> Workload:
        """The jobs at positions `keep`, in that order."""
        return Workload(*([column[k] for k in keep] for column in self._columns()))

    def sorted_by_submit(self) -> Workload:
        return self.select(sorted(range(len(self)), key=self.submit.__getitem__))

    def window(self, since: float | None = None, until: float | None = None) -> Workload:
        """Jobs submitted in [since, until)."""
        lo = -float("inf") if since is None else since
        hi = float("inf") if until is None else until
        return self.select([k for k, t in enumerate(self.submit) if lo <= t < hi])

    def _columns(self) -> list[list]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


@dataclasses.dataclass
class Trace:
    """A workload with what its file says beyond the jobs."""

    workload: Workload
    origin: float  # epoch seconds of the trace start (windows in seconds count from here)
    nodes: list[Node] | None  # the cluster the trace ran on, if it carries a node list
    skipped: dict[str, int]  # jobs left out, by reason ("cpu-only", "never ran", "censored")
    censored: CensoredLoad | None = None  # None: the format records no censoring


def load_trace(path: str | Path, include_censored: bool = False) -> Trace:
    """Read a release of the open format, an SWF log, a simple CSV or a Philly jobs file;
    `include_censored` keeps a release's censored jobs, cut at its end."""
    path = Path(path)
    if path.suffix.lower() == ".swf":
        return _read_source("swf", path, include_censored)
    if path.is_dir() or path.suffix == ".parquet":
        return _read_release(path, include_censored)
    header = _csv_header(path)
    if "submit_s" in header:
        return _read_release(path, include_censored)
    if tuple(header) == PHILLY_COLUMNS:
        return _read_source("philly", path, include_censored)
    workload, skipped = _read_csv(path)
    origin = min(workload.submit) if len(workload) else 0.0
    return Trace(workload, origin, None, skipped)


def load_site(
    warehouse: Warehouse,
    since: datetime | None,
    until: datetime | None,
    include_censored: bool = False,
) -> tuple[Trace, SiteRecord]:
    """The jobs the warehouse recorded as submitted in [since, until) on the cluster its
    inventory held then, and the record they came from (its window, the earlier jobs still in
    flight at its start). Each job is held to the GPU model of the node it ran on: a partition
    or a typed request kept it there, as far as the record tells."""
    record = site_record(warehouse, since, until)
    jobs = pl.from_arrow(record.jobs).rename({"gpu_model": "gpu_model_request"})
    nodes = None if record.nodes is None else table_nodes(record.nodes, warehouse.root / "nodes")
    trace = _trace(simulation_columns(jobs), record.since.timestamp(), nodes, include_censored)
    return trace, record


def read_trace(path: str | Path) -> Workload:
    """The jobs of `load_trace`."""
    return load_trace(path).workload


def _csv_header(path: Path) -> list[str]:
    try:
        with path.open(newline="") as handle:
            return [h.strip() for h in next(csv.reader(handle), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []  # _read_csv says why


def _read_release(path: Path, include_censored: bool) -> Trace:
    release = path if path.is_dir() else jobs_file(path).parent
    origin, nodes = 0.0, None
    if (release / "datapackage.json").is_file():
        origin = parse_time(read_package(release)["release_start"], "release_start").timestamp()
        nodes = release_nodes(release)
    return _trace(read_jobs(path), origin, nodes, include_censored)


def _read_source(fmt: str, path: Path, include_censored: bool) -> Trace:
    """A public trace file as its import would release it (the same jobs, times, tenants,
    start and cluster): read by its importer with the importer's default time zone."""
    source = load(fmt, path)
    table, release_start = to_jobs(source.jobs, source.origin)
    nodes = None if source.nodes is None else table_nodes(source.nodes, path)
    jobs = simulation_columns(pl.from_arrow(table))
    return _trace(jobs, release_start.timestamp(), nodes, include_censored)


def _trace(
    all_jobs: pl.DataFrame, origin: float, nodes: list[Node] | None, include_censored: bool
) -> Trace:
    """The replayable jobs of a jobs table whose times count from `origin` (epoch seconds)."""
    jobs = simulation_frame(all_jobs, include_censored)
    request = jobs["gpu_request"].to_list()
    shares = [_share(r) for r in request]
    limits = jobs["time_limit_s"].to_list()
    starts = jobs["start_time_s"].to_list()
    workload = Workload(
        job_id=jobs["job_id"].to_list(),
        user=jobs["user"].to_list(),
        submit=[origin + t for t in jobs["submit_time_s"].to_list()],
        duration=jobs["duration_s"].to_list(),
        num_gpus=[1 if s else g for s, g in zip(shares, jobs["num_gpus"].to_list(), strict=True)],
        num_nodes=jobs["num_nodes"].to_list(),
        time_limit=limits,
        share=shares,
        model=jobs["gpu_model_request"].to_list(),
        recorded_start=[None if t is None else origin + t for t in starts],
    )
    skipped = simulation_skips(all_jobs, include_censored)
    return Trace(workload, origin, nodes, skipped, censored_load(all_jobs))


def _share(gpu_request: float) -> int:
    """Thousandths of one GPU for a fractional request; 0 for whole GPUs."""
    share = round(gpu_request * WHOLE)
    return max(1, share) if share < WHOLE else 0


def _read_csv(path: Path) -> tuple[Workload, dict[str, int]]:
    """Read a simple CSV (a Philly jobs file, recognised by its header, is read before)."""
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise UserError(f"cannot read trace {path}: {err.strerror}") from err
    with handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in SIMPLE_COLUMNS if c not in header]
        if missing:
            raise UserError(
                f"{path}: header {','.join(header) or '(empty)'} is neither the Philly jobs format "
                f"({','.join(PHILLY_COLUMNS)}) nor simple CSV; missing column(s) "
                f"{', '.join(missing)}"
            )
        return _read_rows(path, reader, header, _simple_row)


Row = tuple[str, str, float, float, int, int, float | None, int, str]
ROW = (
    "job_id",
    "user",
    "submit",
    "duration",
    "num_gpus",
    "num_nodes",
    "time_limit",
    "share",
    "model",
)


def _read_rows(
    path: Path, reader, header: list[str], parse: Callable[[dict[str, str], int], Row]
) -> tuple[Workload, dict[str, int]]:
    columns: list[list] = [[] for _ in ROW]
    cpu_only = 0
    for line, values in enumerate(reader, start=2):
        if not values or not any(v.strip() for v in values):
            continue  # blank lines
        if len(values) != len(header):
            raise UserError(f"{path} line {line}: {len(values)} fields, header has {len(header)}")
        try:
            row = parse(dict(zip(header, values, strict=True)), line)
        except ValueError as err:
            raise UserError(f"{path} line {line}: {err}") from err
        if not row[4]:
            cpu_only += 1
            continue
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    if not columns[0] and not cpu_only:
        raise UserError(f"{path}: no jobs")
    ids = columns[0]
    if len(set(ids)) != len(ids):
        raise UserError(f"{path}: job_id values are not unique")
    return Workload(**dict(zip(ROW, columns, strict=True))), {
        "cpu-only": cpu_only,
        "never ran": 0,
        "censored": 0,
    }


def _simple_row(row: dict[str, str], line: int) -> Row:
    job_id = row["job_id"].strip()
    if not job_id:
        raise ValueError("job_id is empty")
    nodes = _count(row, "num_nodes", minimum=0) if row.get("num_nodes", "").strip() else 0
    limit = _number(row, "time_limit_s") if row.get("time_limit_s", "").strip() else None
    gpus = _count(row, "num_gpus", minimum=0)
    share = 0
    if row.get("gpu_request", "").strip():
        request = _number(row, "gpu_request")
        gpus, share = (gpus, _share(request)) if request else (0, 0)
    return (
        job_id,
        row["user"].strip(),
        _time(row["submit_time"], "submit_time"),
        _number(row, "duration_s"),
        1 if share and gpus else gpus,
        nodes,
        limit,
        share,
        row.get("gpu_model_request", "").strip(),
    )


def _time(text: str, field: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_time(text).timestamp()
    except ValueError:
        raise ValueError(f"{field} {text!r} is neither seconds nor an ISO 8601 timestamp") from None


def _number(row: dict[str, str], field: str) -> float:
    try:
        value = float(row[field])
    except ValueError:
        raise ValueError(f"{field} {row[field]!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{field} {row[field]!r} must be a finite number >= 0")
    return value


def _count(row: dict[str, str], field: str, minimum: int = 1) -> int:
    text = row[field].strip()
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(f"{field} {text!r} is not a whole number") from None
    if value != float(text) or value < minimum:
        raise ValueError(f"{field} {text!r} must be a whole number >= {minimum}")
    return value
