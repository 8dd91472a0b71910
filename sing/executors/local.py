"""The local executor: run profiles as processes on this machine, each on GPUs of its own.

Design (simple on purpose; policies belong to the scheduler package):
- Every job is one JSON record in `STATE/jobs/<id>.json`, rewritten atomically as it moves
  PENDING -> RUNNING -> COMPLETED/FAILED/CANCELLED/TIMEOUT. Records are the same `JobRecord` the
  Slurm executor produces.
- A job is driven by a supervisor: `sing run --local` is one in the foreground; `sing submit`
  starts one detached (`python -m sing.executors.local`), so the job outlives the command.
- GPUs are handed out with one lock file per GPU (`flock`): the kernel guarantees two jobs never
  hold the same GPU, across processes, and a crashed supervisor's GPUs free themselves.
- Queue: first in, first out. A pending job starts only when no older pending job is waiting
  and enough GPUs are free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from sing.config import Config
from sing.errors import UserError
from sing.executors.base import NodeState
from sing.executors.profile import JobProfile
from sing.executors.records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    PENDING,
    RUNNING,
    TIMEOUT,
    JobRecord,
    JobUsage,
    NodeRecord,
    exit_code_from,
)
from sing.executors.script import render_script
from sing.executors.settings import ExecutorSettings

POLL_S = 0.1
KILL_GRACE_S = 5.0
LOCAL_PARTITION = "local"  # the partition of jobs whose profile names none


def detect_gpus() -> list[int]:
    """Indices of the GPUs NVML sees; none when there is no NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: a machine without GPUs
        return []


class LocalExecutor:
    def __init__(
        self,
        cluster: str,
        state_dir: Path,
        gpus: list[int],
        node: str,
        settings: ExecutorSettings | None = None,
    ) -> None:
        self.cluster = cluster
        self.settings = settings or ExecutorSettings()
        self.state_dir = Path(state_dir)
        self.gpus = sorted(gpus)
        self.node = node
        self.jobs_dir = self.state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(
        cls, cluster: str, settings: ExecutorSettings, config: Config
    ) -> LocalExecutor:
        gpus = settings.local_gpus if settings.local_gpus is not None else detect_gpus()
        node = settings.local_node or socket.gethostname()
        return cls(cluster, config.resolve_path(settings.local_state_dir), gpus, node, settings)

    # ---- the executor interface ----------------------------------------------------------

    def submit(self, profile: JobProfile) -> str:
        """Queue the job and start a detached supervisor for it; returns the job id."""
        job_id = self.enqueue(profile)
        log = open(self.jobs_dir / f"{job_id}.out", "ab")  # noqa: SIM115 - handed to the child
        with log:
            subprocess.Popen(
                [sys.executable, "-m", "sing.executors.local", str(self.state_dir), job_id,
                 ",".join(map(str, self.gpus)), self.node],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        return job_id

    def cancel(self, job_id: str) -> None:
        record = self._read(job_id)
        (self.jobs_dir / f"{job_id}.cancel").touch()
        pid = self._job_pid(job_id)
        if record.state == RUNNING and pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)

    def running(self) -> list[JobRecord]:
        return [r for r in self.records() if r.state == RUNNING]

    def finished(self, since: datetime) -> list[JobRecord]:
        return [r for r in self.records() if r.finished and r.end_time and r.end_time >= since]

    def usage(self, job_id: str) -> JobUsage | None:
        """None: the local executor keeps no CPU or memory accounting of its jobs."""
        return None

    def inventory(self) -> list[NodeRecord]:
        """This machine, with the GPUs the executor hands out, in the partition jobs get."""
        return [NodeRecord(self.node, len(self.gpus), partition=LOCAL_PARTITION)]

    def drain(self, node: str, reason: str) -> None:
        """No scheduler to tell: the local executor's one machine is drained by hand."""
        raise UserError(
            f"the local executor cannot drain {node}: it schedules one machine and has no "
            "drain state; stop submitting there by hand"
        )

    def node_state(self, node: str) -> NodeState | None:
        """This machine is always up (it has no drain state); another node is not known."""
        return NodeState("idle", "") if node == self.node else None

    # ---- queue and supervision -----------------------------------------------------------

    def enqueue(self, profile: JobProfile) -> str:
        """Write the PENDING record and the job script; returns the new job id."""
        if profile.nodes != 1:
            raise UserError(f"{profile.source}: nodes: the local executor runs 1-node jobs only")
        if profile.gpus_per_node > len(self.gpus):
            raise UserError(
                f"{profile.source}: gpus_per_node: {profile.gpus_per_node} GPUs asked, this "
                f"machine's pool has {len(self.gpus)} (set [executor] local_gpus)"
            )
        job_id = self._next_id()
        (self.jobs_dir / f"{job_id}.sh").write_text(render_script(profile, self.settings))
        self._write(
            JobRecord(
                job_id=job_id,
                cluster=self.cluster,
                state=PENDING,
                user=getpass.getuser(),
                name=profile.name,
                partition=profile.partition or LOCAL_PARTITION,
                submit_time=datetime.now(UTC),
                nodes=(self.node,),
                num_gpus=profile.gpus_per_node,
                time_limit_s=profile.time_limit_s,
                interactive=profile.interactive,
                dependencies=profile.dependencies(),
            )
        )
        return job_id

    def supervise(self, job_id: str, output: IO | None = None) -> JobRecord:
        """Wait for the job's turn and GPUs, run it, record how it ended; returns the record."""
        record = self._read(job_id)
        (self.jobs_dir / f"{job_id}.supervisor").write_text(str(os.getpid()))
        locks = self._wait_for_gpus(record)
        try:
            if locks is None:
                return self._finish(record, CANCELLED, None, started=False)
            indices = tuple(index for index, _ in locks)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, indices)),
                   "SING_JOB_ID": job_id}  # fmt: skip
            process = subprocess.Popen(
                ["bash", str(self.jobs_dir / f"{job_id}.sh")],
                env=env, stdout=output, stderr=output, start_new_session=True,
            )  # fmt: skip
            (self.jobs_dir / f"{job_id}.pid").write_text(str(process.pid))
            record = dataclasses.replace(
                record, state=RUNNING, start_time=datetime.now(UTC), gpus={self.node: indices}
            )
            self._write(record)
            return self._wait_for_exit(record, process)
        finally:
            for _, handle in locks or ():
                handle.close()  # closing releases the flock

    def _wait_for_gpus(self, record: JobRecord) -> list[tuple[int, IO]] | None:
        """Block until this job is first in line and its GPUs are locked; None if cancelled."""
        while True:
            if self._cancelled(record.job_id):
                return None
            if self._first_in_line(record.job_id):
                locks = self._try_lock(record.num_gpus)
                if locks is not None:
                    return locks
            time.sleep(POLL_S)

    def _try_lock(self, count: int) -> list[tuple[int, IO]] | None:
        held: list[tuple[int, IO]] = []
        for index in self.gpus:
            if len(held) == count:
                break
            handle = open(self.state_dir / f"gpu-{index}.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append((index, handle))
            except BlockingIOError:
                handle.close()
        if len(held) == count:
            return held
        for _, handle in held:
            handle.close()
        return None

    def _first_in_line(self, job_id: str) -> bool:
        waiting = [
            r.job_id
            for r in self.records()
            if r.state == PENDING and self._supervisor_alive(r.job_id)
        ]
        return not waiting or min(waiting, key=int) == job_id

    def _wait_for_exit(self, record: JobRecord, process: subprocess.Popen) -> JobRecord:
        limit = record.time_limit_s
        try:
            code = process.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                code = process.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
        exit_code = exit_code_from(code, 0) if code >= 0 else exit_code_from(0, -code)
        if timed_out:
            state = TIMEOUT
        elif self._cancelled(record.job_id):
            state = CANCELLED
        else:
            state = COMPLETED if code == 0 else FAILED
        return self._finish(record, state, exit_code, started=True)

    def _finish(
        self, record: JobRecord, state: str, exit_code: int | None, started: bool
    ) -> JobRecord:
        now = datetime.now(UTC)
        record = dataclasses.replace(
            record, state=state, exit_code=exit_code, end_time=now,
            start_time=record.start_time if started else None,
        )  # fmt: skip
        self._write(record)
        return record

    # ---- state files ---------------------------------------------------------------------

    def records(self) -> list[JobRecord]:
        out = []
        for path in sorted(self.jobs_dir.glob("*.json"), key=lambda p: int(p.stem)):
            out.append(self._reap(JobRecord.from_json(json.loads(path.read_text()))))
        return out

    def _reap(self, record: JobRecord) -> JobRecord:
        """An unfinished record whose supervisor died (killed, rebooted) is recorded FAILED."""
        if record.finished or self._supervisor_alive(record.job_id):
            return record
        if not (self.jobs_dir / f"{record.job_id}.supervisor").exists():
            return record  # its supervisor is still starting
        return self._finish(record, FAILED, None, started=record.start_time is not None)

    def _supervisor_alive(self, job_id: str) -> bool:
        try:
            pid = int((self.jobs_dir / f"{job_id}.supervisor").read_text())
        except (OSError, ValueError):
            return True  # not started yet: count it as waiting
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _job_pid(self, job_id: str) -> int | None:
        try:
            return int((self.jobs_dir / f"{job_id}.pid").read_text())
        except (OSError, ValueError):
            return None

    def _cancelled(self, job_id: str) -> bool:
        return (self.jobs_dir / f"{job_id}.cancel").exists()

    def _read(self, job_id: str) -> JobRecord:
        path = self.jobs_dir / f"{job_id}.json"
        if not path.is_file():
            raise UserError(f"no local job {job_id} in {self.jobs_dir}")
        return JobRecord.from_json(json.loads(path.read_text()))

    def _write(self, record: JobRecord) -> None:
        path = self.jobs_dir / f"{record.job_id}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record.to_json()))
        tmp.replace(path)

    def _next_id(self) -> str:
        with open(self.state_dir / "next-id.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            current = int(handle.read().strip() or 0) + 1
            handle.seek(0)
            handle.truncate()
            handle.write(str(current))
            return str(current)


if __name__ == "__main__":  # the detached supervisor started by `submit`
    state, job, pool, host = sys.argv[1:5]
    executor = LocalExecutor("", Path(state), [int(i) for i in pool.split(",") if i], host)
    executor.supervise(job)
