"""The one interface every executor offers, and the factory that picks one from the config."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from executors.profile import JobProfile
from executors.records import JobRecord, NodeRecord
from executors.settings import ExecutorSettings
from sing.config import Config
from sing.errors import UserError


class Executor(Protocol):
    cluster: str

    def submit(self, profile: JobProfile) -> str:
        """Queue the job; returns its id."""

    def cancel(self, job_id: str) -> None: ...

    def running(self) -> list[JobRecord]:
        """Jobs holding resources now, with per-node GPU indices."""

    def finished(self, since: datetime) -> list[JobRecord]:
        """Jobs that ended at or after `since` (UTC)."""

    def inventory(self) -> list[NodeRecord]:
        """The nodes jobs can run on now, with their GPU count and partition."""

    def drain(self, node: str, reason: str) -> None:
        """Let `node`'s jobs finish and start no new one there (health.drain); `reason` is
        what the scheduler shows admins. Raises UserError where the executor cannot."""


def executor_settings(config: Config) -> ExecutorSettings:
    return config.section("executor", ExecutorSettings)


def make_executor(config: Config, kind: str | None = None) -> Executor:
    """The executor named by `kind`, or by `[executor] kind`."""
    settings = executor_settings(config)
    kind = kind or settings.kind
    cluster = config.site.cluster
    if kind == "slurm":
        from executors.slurm import SlurmExecutor

        return SlurmExecutor(cluster, settings)
    if kind == "local":
        from executors.local import LocalExecutor

        return LocalExecutor.from_settings(cluster, settings, config)
    raise UserError(f"[executor] kind = {kind!r} is not known; use 'local' or 'slurm'")
