"""Pull job records from an executor into the warehouse: incremental, idempotent, all-or-nothing.

- Watermark: the newest `end_time` already stored for this cluster, read from the warehouse
  itself (no side file to lose or get out of step). Each sync asks for jobs that ended since the
  watermark minus an overlap; `jobs`/`job_gpus` upsert by key, so re-reading a job replaces it
  and a re-run adds no duplicates.
- All output is fetched and parsed before anything is written, so malformed or truncated
  squeue/sacct output raises and leaves the warehouse as it was.
- Slurm accounts GPU counts, not indices. The per-GPU rows of a job are seen while it runs
  (`running()`); when it ends, those rows are re-sent with its end time.
- A requeued job keeps its id and starts a new run (Slurm 26.05+ gives it a new SLUID): every
  run that started is a `job_runs` row (key: its start), its `jobs` row is the newest run's
  (`sluid`, `start_time`), and GPU rows are matched to a run by their start time. Rows of an
  earlier run still open are closed at the new run's start, the latest the earlier run can
  have ended (docs/executors.md, "Requeued jobs").
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from sing.executors.base import Executor
from sing.executors.records import JobRecord, runs_table, to_tables
from sing.executors.settings import ExecutorSettings
from sing.schema import table
from sing.warehouse.store import Warehouse


@dataclasses.dataclass(frozen=True)
class SyncResult:
    since: datetime
    finished: int
    running: int
    gpu_rows: int


def watermark(wh: Warehouse, cluster: str) -> datetime | None:
    """The newest end time stored for `cluster`'s jobs, or None before the first sync."""
    con = wh.connect()
    (newest,) = con.execute(
        "SELECT max(end_time) FROM jobs WHERE cluster = ?", [cluster]
    ).fetchone()
    return newest.astimezone(UTC) if newest else None


def sync(
    executor: Executor,
    wh: Warehouse,
    settings: ExecutorSettings | None = None,
    now: datetime | None = None,
) -> SyncResult:
    """Write the executor's running and recently finished jobs into `jobs` and `job_gpus`."""
    settings = settings or ExecutorSettings()
    now = now or datetime.now(UTC)
    newest = watermark(wh, executor.cluster)
    since = (
        newest - timedelta(seconds=settings.sync_overlap_s)
        if newest
        else now - timedelta(days=settings.first_sync_days)
    )
    ended = executor.finished(since)
    finished, running, earlier = newest_runs(ended, executor.running())
    records = finished + running
    stored = _stored_gpus(wh, executor.cluster, records)
    new_runs = _new_runs(wh, executor.cluster, records)
    finished = _with_known_gpus(stored, finished, new_runs)
    jobs, gpus = to_tables(finished + running, recorded_at=now)
    closed = _earlier_runs_closed(stored, finished + running, new_runs, now)
    wh.append("jobs", jobs)
    wh.append("job_runs", runs_table(earlier + finished + running, recorded_at=now))
    wh.append("job_gpus", pa.concat_tables([gpus, closed]))
    return SyncResult(since, len(finished), len(running), gpus.num_rows)


def newest_runs(
    ended: list[JobRecord], holding: list[JobRecord]
) -> tuple[list[JobRecord], list[JobRecord], list[JobRecord]]:
    """Per job, the run that started last: (the ended ones, the running ones), and the ended
    runs before them (a requeued job's earlier runs, for `job_runs` only). A requeued job's
    earlier runs end before its running one starts; a job completing is both ended (sacct) and
    holding (squeue) with one start, and its ended record wins. A run that never started (a
    pending job cancelled) hides no run that did."""
    never = datetime.min.replace(tzinfo=UTC)
    newest: dict[str, tuple[datetime, bool, JobRecord]] = {}
    for is_ended, records in ((False, holding), (True, ended)):
        for record in records:
            key = (record.start_time or never, is_ended)
            before = newest.get(record.job_id)
            if before is None or key >= before[:2]:
                newest[record.job_id] = (*key, record)
    chosen = {id(r) for _, _, r in newest.values()}
    return (
        [r for _, is_ended, r in newest.values() if is_ended],
        [r for _, is_ended, r in newest.values() if not is_ended],
        [r for r in ended if id(r) not in chosen],
    )


def _rows(wh: Warehouse, sql: str, params: list) -> list[dict]:
    cursor = wh.connect().execute(sql, params)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _stored_gpus(wh: Warehouse, cluster: str, records: list[JobRecord]) -> list[dict]:
    """The stored `job_gpus` rows (newest per key) of these records' jobs."""
    return _rows(
        wh,
        "SELECT * FROM job_gpus WHERE cluster = ? AND job_id IN (SELECT unnest(?))",
        [cluster, [r.job_id for r in records]],
    )


def _new_runs(wh: Warehouse, cluster: str, records: list[JobRecord]) -> set[str]:
    """Jobs whose record is of another run than the one stored: the SLUID changed (a requeue,
    Slurm 26.05+). Without SLUIDs (older Slurm) a job's runs are one, as they always were."""
    stored = _rows(
        wh,
        "SELECT job_id, sluid FROM jobs WHERE cluster = ? AND job_id IN (SELECT unnest(?))",
        [cluster, [r.job_id for r in records if r.sluid]],
    )
    before = {row["job_id"]: row["sluid"] for row in stored if row["sluid"]}
    return {r.job_id for r in records if r.sluid and before.get(r.job_id, r.sluid) != r.sluid}


def _earlier_run(row: dict, record: JobRecord, new_runs: set[str]) -> bool:
    """Whether a stored GPU row is of an earlier run than this record's: the record starts a new
    run, or the row was closed by the time this run started."""
    if record.job_id in new_runs:
        return True
    end = row["end_time"]
    return end is not None and record.start_time is not None and end <= record.start_time


def _with_known_gpus(
    stored: list[dict], records: list[JobRecord], new_runs: set[str]
) -> list[JobRecord]:
    """Give ended jobs without GPU indices the indices stored while their run ran, and a GPU
    count no smaller than theirs (sacct counts no GPU where Slurm does not account gres/gpu)."""
    by_job = {r.job_id: r for r in records if not r.gpus}
    known: dict[str, dict[str, tuple[int, ...]]] = {}
    for row in sorted(stored, key=lambda row: row["gpu_index"]):
        record = by_job.get(row["job_id"])
        if record is not None and not _earlier_run(row, record, new_runs):
            nodes = known.setdefault(row["job_id"], {})
            nodes[row["node"]] = (*nodes.get(row["node"], ()), row["gpu_index"])
    return [
        dataclasses.replace(
            r,
            gpus=known[r.job_id],
            num_gpus=max(r.num_gpus, sum(map(len, known[r.job_id].values()))),
        )
        if r.job_id in known and not r.gpus
        else r
        for r in records
    ]


def _earlier_runs_closed(
    stored: list[dict], records: list[JobRecord], new_runs: set[str], now: datetime
) -> pa.Table:
    """Open GPU rows of a requeued job's earlier run, ended at the new run's start (the latest
    it can have ended), unless the new run holds the same GPU (its row wins)."""
    current = {r.job_id: r for r in records if r.job_id in new_runs and r.start_time}
    held = {(r.job_id, node, i) for r in records for node, idx in r.gpus.items() for i in idx}
    closed = [
        {**row, "end_time": current[row["job_id"]].start_time, "recorded_at": now}
        for row in stored
        if row["job_id"] in current
        and row["end_time"] is None
        and (row["job_id"], row["node"], row["gpu_index"]) not in held
    ]
    return pa.Table.from_pylist(closed, schema=table("job_gpus").schema)
