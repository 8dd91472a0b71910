"""Job records from the executor adapter, and the running allocations they imply.

The source is pluggable (`[collector] job_sync = "module:function"` of an installed
`sing.sources` entry point, called as `function(config, warehouse)`), so the collector does not
depend on how a site runs jobs; the default, `executor_sync`, runs the executors package's
incremental sync (`sing jobs sync`) for the configured `[executor]`, which upserts `jobs` and
`job_gpus` (the record tables upsert by key, so re-running it adds no duplicates) with the
site's cluster on every row. Without an `[executor]` section, or with a source that cannot be
loaded, job sync is off; a source that is not installed is refused (sing.collector.plugins).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sing.collector.plugins import load_source
from sing.collector.rows import Allocations
from sing.config import Config
from sing.jobids import job_order
from sing.warehouse.store import Warehouse

JobSync = Callable[[Config, Warehouse], Any]
DEFAULT = "sing.collector.jobsync:executor_sync"


def load_job_sync(spec: str, config: Config) -> JobSync | None:
    """The job record source named `module:function`, or None when it is off or missing."""
    return load_source(spec, config, DEFAULT, "job_sync")


def executor_sync(config: Config, warehouse: Warehouse) -> Any:
    """The default source: `sing jobs sync` for the site's configured executor."""
    from sing.executors.base import executor_settings, make_executor
    from sing.executors.sync import sync

    return sync(make_executor(config), warehouse, executor_settings(config))


def running_allocations(warehouse: Warehouse) -> Allocations:
    """(cluster, node, GPU index) -> job id for allocations of jobs not yet ended, as last
    synced, in every cluster; a GPU held by several jobs goes to the lowest id."""
    con = warehouse.connect()
    try:
        rows = con.execute(
            """
            SELECT g.cluster, g.node, g.gpu_index, g.job_id
            FROM job_gpus g JOIN jobs j USING (cluster, job_id)
            WHERE g.end_time IS NULL AND j.end_time IS NULL
            """
        ).fetchall()
    finally:
        con.close()
    allocations: Allocations = {}
    for cluster, node, index, job in rows:
        key = (cluster, node, int(index))
        if key not in allocations or job_order(job) < job_order(allocations[key]):
            allocations[key] = job
    return allocations
