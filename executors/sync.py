"""Pull job records from an executor into the warehouse: incremental, idempotent, all-or-nothing.

- Watermark: the newest `end_time` already stored for this cluster, read from the warehouse
  itself (no side file to lose or get out of step). Each sync asks for jobs that ended since the
  watermark minus an overlap; `jobs`/`job_gpus` upsert by key, so re-reading a job replaces it
  and a re-run adds no duplicates.
- All output is fetched and parsed before anything is written, so malformed or truncated
  squeue/sacct output raises and leaves the warehouse as it was.
- Slurm accounts GPU counts, not indices. The per-GPU rows of a job are seen while it runs
  (`running()`); when it ends, those rows are re-sent with its end time.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from executors.base import Executor
from executors.records import JobRecord, to_tables
from executors.settings import ExecutorSettings
from warehouse.store import Warehouse


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
    finished = executor.finished(since)
    done = {r.job_id for r in finished}
    running = [r for r in executor.running() if r.job_id not in done]
    finished = _with_known_gpus(wh, executor.cluster, finished)
    jobs, gpus = to_tables(finished + running, recorded_at=now)
    wh.append("jobs", jobs)
    wh.append("job_gpus", gpus)
    return SyncResult(since, len(finished), len(running), gpus.num_rows)


def _with_known_gpus(wh: Warehouse, cluster: str, records: list[JobRecord]) -> list[JobRecord]:
    """Give ended jobs without GPU indices the indices stored while they ran, and a GPU count no
    smaller than theirs (sacct counts no GPU where Slurm does not account gres/gpu)."""
    missing = [r.job_id for r in records if not r.gpus]
    if not missing:
        return records
    rows = (
        wh.connect()
        .execute(
            "SELECT job_id, node, list(gpu_index ORDER BY gpu_index) FROM job_gpus "
            "WHERE cluster = ? AND job_id IN (SELECT unnest(?)) GROUP BY job_id, node",
            [cluster, missing],
        )
        .fetchall()
    )
    known: dict[str, dict[str, tuple[int, ...]]] = {}
    for job_id, node, indices in rows:
        known.setdefault(job_id, {})[node] = tuple(indices)
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
