"""Jobs to replay, as columns, and the trace files they are read from.

The simulator takes a `Workload` (plain lists, one entry per job), so any trace source needs only a
small adapter that fills these columns. Two file formats are read here:

- simple CSV: `job_id,user,submit_time,duration_s,num_gpus[,num_nodes][,time_limit_s]`, where
  submit_time is seconds (any epoch) or an ISO 8601 timestamp (naive = UTC);
- the Philly jobs file (`timestamp,duration,num_gpus,gpu_time,cluster`, e.g.
  ../shared/traces/philly/philly_pollux_jobs.csv): unsorted, naive timestamps read as UTC, no
  user column, so the virtual cluster stands in for the user (VCs are teams), and job ids are
  `philly-<line>`.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sing.errors import UserError

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


def read_trace(path: str | Path) -> Workload:
    """Read a simple CSV or a Philly jobs file (recognised by its header)."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise UserError(f"cannot read trace {path}: {err.strerror}") from err
    with handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if tuple(header) == PHILLY_COLUMNS:
            return _read_rows(path, reader, header, _philly_row)
        missing = [c for c in SIMPLE_COLUMNS if c not in header]
        if missing:
            raise UserError(
                f"{path}: header {','.join(header) or '(empty)'} is neither the Philly jobs format "
                f"({','.join(PHILLY_COLUMNS)}) nor simple CSV; missing column(s) "
                f"{', '.join(missing)}"
            )
        return _read_rows(path, reader, header, _simple_row)


Row = tuple[str, str, float, float, int, int, float | None]


def _read_rows(
    path: Path, reader, header: list[str], parse: Callable[[dict[str, str], int], Row]
) -> Workload:
    columns: list[list] = [[] for _ in dataclasses.fields(Workload)]
    for line, values in enumerate(reader, start=2):
        if not values or not any(v.strip() for v in values):
            continue  # blank lines (the Philly file ends with one)
        if len(values) != len(header):
            raise UserError(f"{path} line {line}: {len(values)} fields, header has {len(header)}")
        try:
            row = parse(dict(zip(header, values, strict=True)), line)
        except ValueError as err:
            raise UserError(f"{path} line {line}: {err}") from err
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    if not columns[0]:
        raise UserError(f"{path}: no jobs")
    ids = columns[0]
    if len(set(ids)) != len(ids):
        raise UserError(f"{path}: job_id values are not unique")
    return Workload(*columns)


def _philly_row(row: dict[str, str], line: int) -> Row:
    submit = _time(row["timestamp"], "timestamp")
    return (
        f"philly-{line}",
        row["cluster"],
        submit,
        _number(row, "duration"),
        _count(row, "num_gpus"),
        0,
        None,
    )


def _simple_row(row: dict[str, str], line: int) -> Row:
    job_id = row["job_id"].strip()
    if not job_id:
        raise ValueError("job_id is empty")
    nodes = _count(row, "num_nodes", minimum=0) if row.get("num_nodes", "").strip() else 0
    limit = _number(row, "time_limit_s") if row.get("time_limit_s", "").strip() else None
    return (
        job_id,
        row["user"].strip(),
        _time(row["submit_time"], "submit_time"),
        _number(row, "duration_s"),
        _count(row, "num_gpus"),
        nodes,
        limit,
    )


def _time(text: str, field: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{field} {text!r} is neither seconds nor an ISO 8601 timestamp") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


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
