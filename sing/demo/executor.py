"""The demo's simulated executor, and the job sync the collector runs for it.

It offers the executors' interface over the records file that sing.demo.cluster rewrites every tick,
so the collector pulls the demo's jobs through the same incremental `sing.executors.sync` as a Slurm
site (`[collector] job_sync = "sing.demo.executor:sync"`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from sing.config import Config
from sing.demo.settings import DemoSettings
from sing.errors import UserError
from sing.executors.base import executor_settings
from sing.executors.profile import JobProfile
from sing.executors.records import JobRecord
from sing.executors.sync import SyncResult
from sing.executors.sync import sync as sync_records
from sing.warehouse.store import Warehouse


class SimulatedExecutor:
    """Read-only: jobs come from the demo's workload, not from `sing submit`."""

    def __init__(self, records_file: Path, cluster: str) -> None:
        self.records_file = records_file
        self.cluster = cluster

    def _records(self) -> list[JobRecord]:
        try:
            data = json.loads(self.records_file.read_text())
        except FileNotFoundError:
            return []
        except json.JSONDecodeError as err:
            raise UserError(f"{self.records_file}: not valid JSON: {err}") from err
        return [JobRecord.from_json(r) for r in data["jobs"]]

    def submit(self, profile: JobProfile) -> str:
        raise UserError("the demo's jobs come from its simulated users, not from sing submit")

    def cancel(self, job_id: str) -> None:
        raise UserError("the demo's jobs cannot be cancelled")

    def running(self) -> list[JobRecord]:
        return [r for r in self._records() if not r.finished]

    def finished(self, since: datetime) -> list[JobRecord]:
        return [r for r in self._records() if r.finished and r.end_time and r.end_time >= since]


def sync(config: Config, warehouse: Warehouse) -> SyncResult:
    settings = config.section("demo", DemoSettings)
    executor = SimulatedExecutor(config.resolve_path(settings.records_file), config.site.cluster)
    return sync_records(executor, warehouse, executor_settings(config))
