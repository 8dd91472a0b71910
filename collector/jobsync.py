"""Job records from the executor adapter, and the running allocations they imply.

The source is pluggable (`[collector] job_sync = "module:function"`, called as
`function(config, warehouse)`), so the collector does not depend on how a site runs jobs; the
default, `executor_sync`, runs the executors package's incremental sync (`sing jobs sync`) for
the configured `[executor]`, which upserts `jobs` and `job_gpus` (the record tables upsert by
key, so re-running it adds no duplicates). Without an `[executor]` section, or with a source
that cannot be imported, job sync is off, said in one log line, and scraping goes on.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from collector.rows import Allocations
from sing.config import Config
from sing.errors import UserError
from warehouse.store import Warehouse

log = logging.getLogger(__name__)

JobSync = Callable[[Config, Warehouse], Any]
DEFAULT = "collector.jobsync:executor_sync"


def load_job_sync(spec: str, config: Config) -> JobSync | None:
    """The function named `module:function`, or None (logged) when it is off or missing."""
    if not spec:
        return None
    if spec == DEFAULT and "executor" not in config.data:
        log.info("job sync off: the config has no [executor] section")
        return None
    module_name, _, function_name = spec.partition(":")
    if not function_name:
        raise UserError(f"[collector] job_sync = {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        log.warning("job sync off: cannot import %s (%s)", module_name, err)
        return None
    function = getattr(module, function_name, None)
    if not callable(function):
        log.warning("job sync off: %s has no function %s", module_name, function_name)
        return None
    return function


def executor_sync(config: Config, warehouse: Warehouse) -> Any:
    """The default source: `sing jobs sync` for the site's configured executor."""
    from executors.base import executor_settings, make_executor
    from executors.sync import sync

    return sync(make_executor(config), warehouse, executor_settings(config))


def running_allocations(warehouse: Warehouse, cluster: str) -> Allocations:
    """(node, GPU index) -> job id for allocations of jobs not yet ended, as last synced."""
    con = warehouse.connect()
    try:
        rows = con.execute(
            """
            SELECT g.node, g.gpu_index, min(g.job_id)
            FROM job_gpus g JOIN jobs j USING (cluster, job_id)
            WHERE g.cluster = ? AND g.end_time IS NULL AND j.end_time IS NULL
            GROUP BY ALL
            """,
            [cluster],
        ).fetchall()
    finally:
        con.close()
    return {(node, int(index)): job for node, index, job in rows}
