"""The one interface every executor offers, and the factory that picks one from the config."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from sing.config import Config
from sing.errors import UserError
from sing.executors.profile import JobProfile
from sing.executors.records import JobRecord, JobUsage, NodeRecord
from sing.executors.settings import ExecutorSettings

if TYPE_CHECKING:  # the report's module loads duckdb: not for every executor user
    from collections.abc import Callable

    from sing.warehouse.job_report import RunningAccounting

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


def running_accounting(executor: Executor, cluster: str, job_id: str) -> RunningAccounting:
    """A running job's figures from the scheduler's own accounting, for `sing job` to show
    beside the cgroups': none for another cluster's job (this executor cannot ask there), and
    a failed command said in words, never raised: the report stands without them."""
    figures: RunningAccounting = {"slurm_cpu_s": None, "slurm_max_rss_bytes": None,
                                  "slurm_source": None, "slurm_error": None}  # fmt: skip
    if cluster != executor.cluster:
        return figures
    try:
        usage = executor.usage(job_id)
    except CommandError as err:
        return figures | {"slurm_error": str(err)}  # type: ignore[return-value]
    if usage is None:
        return figures
    return {"slurm_cpu_s": usage.cpu_s, "slurm_max_rss_bytes": usage.max_rss_bytes,
            "slurm_source": "sstat", "slurm_error": None}  # fmt: skip


def running_accounting_for(
    config: Config, job_id: str
) -> Callable[[str], RunningAccounting] | None:
    """How `sing job` and the Job page ask the site's scheduler for a running job's figures so
    far (`job_report(..., running_accounting=...)`): Slurm's sstat; None with the local
    executor, which keeps no accounting (and would make its state directory to say so)."""
    if executor_settings(config).kind != "slurm":
        return None
    return lambda cluster: running_accounting(make_executor(config), cluster, job_id)
