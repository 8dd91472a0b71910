"""The one interface every executor offers, and the factory that picks one from the config."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sing.config import Config
from sing.errors import UserError
from sing.executors.profile import JobProfile
from sing.executors.records import JobRecord, JobUsage, NodeRecord
from sing.executors.settings import ExecutorSettings

TIMEOUT, FAILED = "timeout", "failed"  # why a command failed: CommandError.reason


class CommandError(UserError):
    """A scheduler command that could not run, failed or did not answer within its timeout:
    one error type for all of them, so callers count and record failures by `command` and
    `reason` (TIMEOUT or FAILED) instead of catching OSError and friends."""

    def __init__(self, command: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.command = command
        self.reason = reason


@dataclass(frozen=True)
class NodeState:
    """A node's state as the scheduler shows it (Slurm: "idle", "drained", "draining", ...) and
    the reason an admin or sing gave for it ("" when none)."""

    state: str
    reason: str

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job starts there."""
        return "drain" in self.state


class Executor(Protocol):
    cluster: str

    def submit(self, profile: JobProfile) -> str:
        """Queue the job; returns its id."""

    def cancel(self, job_id: str) -> None: ...

    def running(self) -> list[JobRecord]:
        """Jobs holding resources now, with per-node GPU indices."""

    def finished(self, since: datetime) -> list[JobRecord]:
        """Runs of jobs that ended at or after `since` (UTC): one per job, or, for a job
        requeued (Slurm), each of its runs that ended."""

    def usage(self, job_id: str) -> JobUsage | None:
        """A running job's CPU time and memory so far from the scheduler's accounting (ended
        jobs carry theirs in their record); None where it has none."""

    def inventory(self) -> list[NodeRecord]:
        """The nodes jobs can run on now, with their GPU count and partition."""

    def drain(self, node: str, reason: str) -> None:
        """Let `node`'s jobs finish and start no new one there (sing.policy.drain); `reason` is
        what the scheduler shows admins. Raises UserError where the executor cannot."""

    def node_state(self, node: str) -> NodeState | None:
        """`node`'s state now (None: the executor does not know the node), so that a drain
        whose outcome went unrecorded can be reconciled with what the scheduler did."""


def executor_settings(config: Config) -> ExecutorSettings:
    return config.section("executor", ExecutorSettings)


def make_executor(config: Config, kind: str | None = None) -> Executor:
    """The executor named by `kind`, or by `[executor] kind`."""
    settings = executor_settings(config)
    kind = kind or settings.kind
    cluster = config.site.cluster
    if kind == "slurm":
        from sing.executors.slurm import SlurmExecutor

        return SlurmExecutor(cluster, settings)
    if kind == "local":
        from sing.executors.local import LocalExecutor

        return LocalExecutor.from_settings(cluster, settings, config)
    raise UserError(f"[executor] kind = {kind!r} is not known; use 'local' or 'slurm'")
