"""Each Slurm job's CPU time, host memory and I/O on a node, from cgroup_exporter's series.

Three exporters serve them under the same names (docs/collector.md):
- sing's (sing/exporters/cgroups.py), labelled `jobid`, and `sluid` for a Slurm 26.05 run;
- Princeton's cgroup_exporter fork (jobstats), labelled `jobid`, `step` and `task`: only the
  job's own series (no step, no task) are read, as jobstats reads them;
- treydock/cgroup_exporter, labelled by `cgroup` path, the job in `cgroup_info{cgroup,jobid}`.
Values become `job_host_samples` columns in SI units. What no job is named for (a user's slice,
a run no mapping names) is left out; so is what cgroup_exporter writes for an unknown reading:
a cpuset count of 0, a limit of `max` (2^64 - 1) or v1's unlimited.
"""

from __future__ import annotations

import math
from typing import Any

from sing.collector.promtext import Sample

# name -> job_host_samples column; columns starting with "_" are helpers.
HOST_METRICS = {
    "cgroup_cpu_total_seconds": "cpu_s",
    "cgroup_cpu_user_seconds": "_cpu_user_s",
    "cgroup_cpu_system_seconds": "_cpu_system_s",
    "cgroup_cpus": "cpuset_cpus",
    "cgroup_memory_used_bytes": "mem_used_bytes",
    "cgroup_memory_max_used_bytes": "mem_peak_bytes",
    "cgroup_memory_total_bytes": "mem_limit_bytes",
    "cgroup_io_read_bytes_total": "io_read_bytes",
    "cgroup_io_written_bytes_total": "io_write_bytes",
}
CGROUP_INFO = "cgroup_info"  # treydock/cgroup_exporter: {cgroup, jobid, uid, username} 1
HOST_WANTED = frozenset(HOST_METRICS) | {CGROUP_INFO}
NO_LIMIT = 2**62  # a limit this large is "unlimited" written as a number
# job id -> its job_host_samples columns (and `sluid`)
JobHostValues = dict[str, dict[str, Any]]


class HostSeries:
    """One payload's job series, gathered as they come (cgroup_info may follow the values)."""

    def __init__(self) -> None:
        self.by_job: JobHostValues = {}
        self.by_cgroup: dict[str, dict[str, Any]] = {}
        self.cgroup_jobs: dict[str, str] = {}

    def add(self, s: Sample) -> None:
        labels = s.labels
        if s.name == CGROUP_INFO:
            if labels.get("jobid") and labels.get("cgroup"):
                self.cgroup_jobs[labels["cgroup"]] = labels["jobid"]
            return
        if labels.get("step") or labels.get("task") or not math.isfinite(s.value):
            return  # a step's or a task's share, or no number
        if job := labels.get("jobid"):
            row = self.by_job.setdefault(job, {})
            if labels.get("sluid"):
                row["sluid"] = labels["sluid"]
        elif cgroup := labels.get("cgroup"):
            row = self.by_cgroup.setdefault(cgroup, {})
        else:
            return  # sing's series of a run no mapping names
        row[HOST_METRICS[s.name]] = s.value

    def values(self) -> JobHostValues:
        """The jobs' columns, integers where the column is one."""
        for cgroup, values in self.by_cgroup.items():
            if job := self.cgroup_jobs.get(cgroup):
                self.by_job.setdefault(job, {}).update(values)
        out = {}
        for job, row in self.by_job.items():
            user, system = row.pop("_cpu_user_s", None), row.pop("_cpu_system_s", None)
            if "cpu_s" not in row and user is not None and system is not None:
                row["cpu_s"] = user + system
            for column in ("cpuset_cpus", "mem_used_bytes", "mem_peak_bytes", "mem_limit_bytes",
                           "io_read_bytes", "io_write_bytes"):  # fmt: skip
                if column in row:
                    row[column] = int(row[column])
            if not row.get("cpuset_cpus"):
                row.pop("cpuset_cpus", None)
            if row.get("mem_limit_bytes", 0) >= NO_LIMIT:
                del row["mem_limit_bytes"]
            out[job] = row
        return out
