"""Which Slurm job holds each GPU, from two independent sources that are cross-checked.

1. Processes: NVML's compute processes on the GPU -> /proc/PID/cgroup, else /proc/PID/environ's
   SLURM_JOB_ID. Slurm names the job's cgroup `job_<id>` (cgroup v1; v2 before 26.05 or with
   `CgroupJobIdPaths=yes`) or, on 26.05+ cgroup v2 by default, by the run's SLUID
   (`.../slurmstepd.scope/s0G2J8K4P1XY05/step_0/...`). A SLUID is turned into its job id by the
   prolog's mapping file (`<mapping dir>.sluid/<SLUID>`, written by root), else by the process's
   SLURM_JOB_ID when its SLURM_JOB_SLUID names the same run. Trust: a user cannot move its
   process out of its job's cgroup, nor write the mapping, but it can set any environment; so
   the cgroup wins, and the environment is only the fallback it always was.
2. Allocations: a directory with one file per GPU index listing the job ids that hold it, written
   by the Slurm prolog and removed by the epilog (dcgm-exporter's --hpc-job-mapping-dir format).
   It also names GPUs that a job holds but runs nothing on.

Job ids only ever appear on info series, never on the sample metrics, so a job ending does not
leave behind series with stale labels on the per-GPU time series.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from sing.digits import ascii_digits
from sing.exporters.errors import ErrorCounter
from sing.exporters.gpu import GpuReading
from sing.sluid import SLUID_TEXT, normal_sluid

_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)")
# Only directly under slurmstepd's scope (`<node>_slurmstepd.scope` with multiple slurmd), so no
# other 14-character directory name is taken for a run.
_CGROUP_SLUID = re.compile(rf"slurmstepd\.scope/({SLUID_TEXT})(?:/|$)")


@dataclass(frozen=True)
class ProcessJob:
    job_id: str | None
    user: str


class JobSource:
    def __init__(self, proc_root: str | Path, mapping_dir: str | Path, errors: ErrorCounter):
        self.proc = Path(proc_root)
        self.mapping_dir = Path(mapping_dir)
        # SLUID -> job id files beside the dcgm-exporter format directory, which stays as it is.
        self.sluid_dir = self.mapping_dir.with_name(self.mapping_dir.name + ".sluid")
        self.errors = errors

    def _read(self, path: Path) -> bytes | None:
        """A /proc file's bytes; None when the process has gone (normal) or is unreadable."""
        try:
            return path.read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return None
        except PermissionError:
            self.errors.count("jobs", "permission_denied")
        except OSError:
            self.errors.count("jobs", "read_error")
        return None

    def process_job(self, pid: int) -> ProcessJob:
        """The Slurm job and user of one process."""
        base = self.proc / str(pid)
        environ = dict(
            item.split(b"=", 1)
            for item in (self._read(base / "environ") or b"").split(b"\0")
            if b"=" in item
        )
        cgroup = (self._read(base / "cgroup") or b"").decode(errors="replace")
        env_job = environ.get(b"SLURM_JOB_ID", b"").decode(errors="replace").strip() or None
        if match := _CGROUP_JOB.search(cgroup):
            job_id = match.group(1)
        elif match := _CGROUP_SLUID.search(cgroup):
            job_id = self._sluid_job(match.group(1), environ, env_job)
        else:
            job_id = env_job
        user = environ.get(b"SLURM_JOB_USER", b"").decode(errors="replace")
        return ProcessJob(job_id, user or self._owner(base))

    def _sluid_job(
        self, sluid: str, environ: dict[bytes, bytes], env_job: str | None
    ) -> str | None:
        """The job id of a SLUID-named cgroup: the prolog's file, else a matching environment."""
        sluid = normal_sluid(sluid) or sluid
        if recorded := self.recorded_job(sluid):
            return recorded
        env_sluid = normal_sluid(environ.get(b"SLURM_JOB_SLUID", b"").decode(errors="replace"))
        if env_sluid == sluid:
            return env_job
        self.errors.count("jobs", "unknown_sluid")
        return None

    def recorded_job(self, sluid: str) -> str | None:
        """The job id the prolog recorded for the run `sluid` (printed form), or None."""
        recorded = (self._read(self.sluid_dir / sluid) or b"").decode(errors="replace").strip()
        return recorded if ascii_digits(recorded) else None

    def _owner(self, base: Path) -> str:
        status = (self._read(base / "status") or b"").decode(errors="replace")
        match = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        if not match:
            return ""
        try:
            return pwd.getpwuid(int(match.group(1))).pw_name
        except KeyError:
            return match.group(1)

    def allocations(self) -> dict[str, set[str]] | None:
        """GPU index -> job ids the prolog recorded; None when no mapping directory exists."""
        try:
            names = os.listdir(self.mapping_dir)
        except (FileNotFoundError, NotADirectoryError):
            return None
        allocated = {}
        for name in names:
            if name.startswith("."):
                continue  # the scripts' lock and half-written files
            try:
                text = (self.mapping_dir / name).read_text()
            except OSError:
                self.errors.count("jobs", "read_error")
                continue
            allocated[name] = {line.split()[0] for line in text.splitlines() if line.strip()}
        return allocated

    def metrics(self, gpus: list[GpuReading]) -> list[Metric]:
        labels = ["gpu", "uuid"]
        info = GaugeMetricFamily(
            "sing_gpu_job_info",
            "The Slurm job holding the GPU.",
            labels=[*labels, "job_id", "user"],
        )
        mismatch = GaugeMetricFamily(
            "sing_gpu_job_mismatch",
            "Process and allocation sources disagree: process_without_allocation or "
            "allocation_without_process.",
            labels=[*labels, "job_id", "case"],
        )
        unattributed = GaugeMetricFamily(
            "sing_gpu_unattributed_processes",
            "Compute processes on the GPU that belong to no Slurm job.",
            labels=labels,
        )
        mapped = GaugeMetricFamily(
            "sing_gpu_job_mapping_present",
            "1 when the prolog's GPU-to-job mapping directory exists: a GPU with no job "
            "info series is then held by no job.",
        )
        running: dict[int, dict[str, str]] = {}  # gpu -> job id -> user
        users: dict[str, str] = {}
        for gpu in gpus:
            jobs = running.setdefault(gpu.index, {})
            orphans = 0
            for proc in gpu.values.get("processes", []):
                found = self.process_job(proc["pid"])
                if found.job_id is None:
                    orphans += 1
                    continue
                jobs[found.job_id] = found.user
                users.setdefault(found.job_id, found.user)
            if "processes" in gpu.values:
                unattributed.add_metric([str(gpu.index), gpu.uuid], orphans)
        allocations = self.allocations()
        if gpus:  # a node without GPUs has nothing to attribute
            mapped.add_metric([], 0 if allocations is None else 1)
        for gpu in gpus:
            key = [str(gpu.index), gpu.uuid]
            jobs = running[gpu.index]
            allocated = (allocations or {}).get(str(gpu.index), set())
            for job_id in sorted(jobs.keys() | allocated):
                info.add_metric([*key, job_id, users.get(job_id, "")], 1)
            if allocations is None or "processes" not in gpu.values:
                continue  # nothing to cross-check against
            for job_id in sorted(jobs.keys() - allocated):
                mismatch.add_metric([*key, job_id, "process_without_allocation"], 1)
            for job_id in sorted(allocated - jobs.keys()):
                mismatch.add_metric([*key, job_id, "allocation_without_process"], 1)
        return [info, mismatch, unattributed, mapped]
