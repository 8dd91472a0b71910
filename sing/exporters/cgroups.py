"""Each Slurm job's CPU time, host memory and I/O on this node, read from the job's cgroup.

Where Slurm puts a job's cgroup (SchedMD/slurm, src/plugins/cgroup/):
- v1 (`v1/xcgroup.c`, `xcgroup_ns_create` and `xcgroup_create_slurm_cg`, the `uid_%u` and
  `job_%u` paths after them): `<CgroupMountpoint>/<controller>/<CgroupPrepend>/uid_<uid>/job_<id>/`,
  mountpoint /sys/fs/cgroup, prepend `/slurm` (`/slurm_<node>` and the like with multiple slurmd),
  one tree per controller: `cpuacct` (JobAcctGatherType=jobacct_gather/cgroup), `memory`,
  `cpuset` (ConstrainCores), `blkio` only where a site adds it.
- v2 (`v2/cgroup_v2.c`, `_set_int_cg_ns` and `cgroup_p_step_create`): `/sys/fs/cgroup/<CgroupSlice,
  default system.slice>/slurmstepd.scope/` (`<node>_slurmstepd.scope` with multiple slurmd), in it
  `job_<id>/` (before 26.05, or `CgroupJobIdPaths=yes`) or the run's SLUID (`s0G2J8K4P1XY05/`,
  26.05's default; `print_sluid`, sing/sluid.py), beside `system/` (slurmstepd's own, no job).
  A SLUID is named by the prolog's mapping file, as for GPU processes (sing/exporters/jobs.py),
  and remembered while its directory lives: a SLUID is never reused.

Files read in the job's directory, every one counting the job's steps and tasks below it:
- v2: `cpu.stat` (usage_usec, user_usec, system_usec), `memory.current`, `memory.peak` (Linux
  5.19+), `memory.max`, `cpuset.cpus.effective`, `io.stat` (rbytes, wbytes per device; only with
  the io controller, cgroup.conf `EnableExtraControllers=io`);
- v1: `cpuacct.usage` (ns), `cpuacct.stat` (user, system in USER_HZ ticks),
  `memory.usage_in_bytes`, `memory.max_usage_in_bytes`, `memory.limit_in_bytes`, `cpuset.cpus`,
  `blkio.throttle.io_service_bytes_recursive` (Read, Write per device; the file without
  `_recursive` leaves out the tasks' child cgroups, so it is not read).
A missing or unreadable file leaves its series out (unknown), never 0; a limit of `max` (v2) or
v1's unlimited (2^63 rounded down to a page) is no limit: no series.

Series (docs/exporter.md says why): cgroup_exporter's names where it has one
(treydock/cgroup_exporter, collector/collector.go), so a jobstats query or Grafana panel written
for it reads this page, labelled `jobid` as its `cgroup_info` and Princeton's fork label jobs;
`sluid` too where the directory is a run's SLUID.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.core import UnknownMetricFamily as UntypedFamily

from sing.digits import ascii_digits
from sing.exporters.errors import ErrorCounter
from sing.exporters.jobs import JobSource
from sing.sluid import normal_sluid

USER_HZ = os.sysconf("SC_CLK_TCK")  # cpuacct.stat's tick
NO_LIMIT = 2**62  # v1 writes "unlimited" as 2^63 - 4096 (a page below); no node has 4 EiB
V1_CONTROLLERS = ("cpuacct", "memory", "cpuset", "blkio")
LABELS = ["jobid", "sluid"]
# value key -> (family, name, help). cgroup_exporter's CPU counters have no `_total` and are
# untyped here: prometheus_client would write a counter's TYPE line with `_total` appended.
SERIES = {
    "cpu_user_s": (
        UntypedFamily,
        "cgroup_cpu_user_seconds",
        "CPU seconds the job ran in user mode.",
    ),
    "cpu_system_s": (
        UntypedFamily,
        "cgroup_cpu_system_seconds",
        "CPU seconds the job ran in the kernel.",
    ),
    "cpu_total_s": (UntypedFamily, "cgroup_cpu_total_seconds", "CPU seconds the job ran."),
    "cpus": (GaugeMetricFamily, "cgroup_cpus", "CPUs in the job's cpuset."),
    "memory_used": (
        GaugeMetricFamily,
        "cgroup_memory_used_bytes",
        "Memory the job uses now, page cache included.",
    ),
    "memory_peak": (
        GaugeMetricFamily,
        "cgroup_memory_max_used_bytes",
        "The most memory the job used at once, page cache included.",
    ),
    "memory_limit": (GaugeMetricFamily, "cgroup_memory_total_bytes", "The job's memory limit."),
    "io_read": (
        CounterMetricFamily,
        "cgroup_io_read_bytes",
        "Bytes the job read from block devices.",
    ),
    "io_written": (
        CounterMetricFamily,
        "cgroup_io_written_bytes",
        "Bytes the job wrote to block devices.",
    ),
}


@dataclass
class JobCgroup:
    """One job's directory on this node and what was read from it, in SI units."""

    jobid: str  # "" when a SLUID names no known job
    sluid: str  # "" for a `job_<id>` directory
    values: dict[str, float] = field(default_factory=dict)


class CgroupSource:
    """Reads every Slurm job cgroup under `<sysfs_root>/fs/cgroup`, v1 or v2 as the node has."""

    def __init__(self, sysfs_root: str, jobs: JobSource, errors: ErrorCounter) -> None:
        self.root = os.path.join(sysfs_root, "fs", "cgroup")
        self.jobs = jobs
        self.errors = errors
        self._runs: dict[str, str] = {}  # SLUID -> job id, for the SLUID directories now live

    def read(self) -> list[JobCgroup]:
        if os.path.exists(os.path.join(self.root, "cgroup.controllers")):
            return [self._read_v2(path, job) for path, job in self._v2_jobs()]
        return [self._read_v1(paths, job) for paths, job in self._v1_jobs()]

    def metrics(self) -> list[Metric]:
        families = {
            key: kind(name, doc, labels=LABELS) for key, (kind, name, doc) in SERIES.items()
        }
        for job in self.read():
            for key, value in job.values.items():
                families[key].add_metric([job.jobid, job.sluid], value)
        return list(families.values())

    # -- where the jobs are -----------------------------------------------------------------------

    def _v2_jobs(self) -> Iterator[tuple[str, JobCgroup]]:
        live = set()
        for slice_ in _listdir(self.root):
            if not slice_.endswith(".slice"):
                continue
            for scope in _listdir(os.path.join(self.root, slice_)):
                if not scope.endswith("slurmstepd.scope"):
                    continue
                base = os.path.join(self.root, slice_, scope)
                for name in _listdir(base):
                    if (job := self._job_of(name, live)) is not None:
                        yield os.path.join(base, name), job
        self._runs = {sluid: job for sluid, job in self._runs.items() if sluid in live}

    def _job_of(self, name: str, live: set[str]) -> JobCgroup | None:
        """The job a v2 directory under slurmstepd's scope belongs to, or None (`system`)."""
        if name.startswith("job_") and ascii_digits(name[4:]):
            return JobCgroup(name[4:], "")
        sluid = normal_sluid(name)
        if sluid is None:
            return None
        live.add(sluid)
        job = self._runs.get(sluid) or self.jobs.recorded_job(sluid)
        if job is None:
            self.errors.count("cgroups", "unknown_sluid")
            return JobCgroup("", sluid)
        self._runs[sluid] = job
        return JobCgroup(job, sluid)

    def _v1_jobs(self) -> Iterator[tuple[dict[str, str], JobCgroup]]:
        """Each job's directory per controller: every controller is a tree of its own."""
        found: dict[tuple[str, str], dict[str, str]] = {}  # (prepend/uid, job id) -> paths
        for controller in V1_CONTROLLERS:
            base = os.path.join(self.root, controller)
            for prepend in _listdir(base):
                if not prepend.startswith("slurm"):
                    continue
                for uid in _listdir(os.path.join(base, prepend)):
                    if not uid.startswith("uid_"):
                        continue
                    for name in _listdir(os.path.join(base, prepend, uid)):
                        if name.startswith("job_") and ascii_digits(name[4:]):
                            path = os.path.join(base, prepend, uid, name)
                            found.setdefault((f"{prepend}/{uid}", name[4:]), {})[controller] = path
        for (_, job_id), paths in sorted(found.items()):
            yield paths, JobCgroup(job_id, "")

    # -- what the files say -----------------------------------------------------------------------

    def _read_v2(self, path: str, job: JobCgroup) -> JobCgroup:
        values = job.values
        stat = self._fields(os.path.join(path, "cpu.stat"))
        for key, name in (("cpu_user_s", "user_usec"), ("cpu_system_s", "system_usec"),
                          ("cpu_total_s", "usage_usec")):  # fmt: skip
            if name in stat:
                values[key] = stat[name] / 1e6
        self._number(values, "memory_used", os.path.join(path, "memory.current"))
        self._number(values, "memory_peak", os.path.join(path, "memory.peak"))
        self._number(values, "memory_limit", os.path.join(path, "memory.max"))
        self._cpus(values, os.path.join(path, "cpuset.cpus.effective"))
        io = self._text(os.path.join(path, "io.stat"))
        if io is not None:  # a line per device: `8:0 rbytes=1 wbytes=2 rios=3 ...`
            devices = [
                dict(i.partition("=")[::2] for i in line.split()[1:]) for line in io.splitlines()
            ]
            values["io_read"] = _total(d.get("rbytes", "0") for d in devices)
            values["io_written"] = _total(d.get("wbytes", "0") for d in devices)
        return self._checked(job)

    def _read_v1(self, paths: dict[str, str], job: JobCgroup) -> JobCgroup:
        values = job.values
        if cpuacct := paths.get("cpuacct"):
            stat = self._fields(os.path.join(cpuacct, "cpuacct.stat"))
            for key, name in (("cpu_user_s", "user"), ("cpu_system_s", "system")):
                if name in stat:
                    values[key] = stat[name] / USER_HZ
            usage = self._text(os.path.join(cpuacct, "cpuacct.usage"))
            if usage is not None:
                values["cpu_total_s"] = _count(usage) / 1e9
        if memory := paths.get("memory"):
            self._number(values, "memory_used", os.path.join(memory, "memory.usage_in_bytes"))
            self._number(values, "memory_peak", os.path.join(memory, "memory.max_usage_in_bytes"))
            self._number(values, "memory_limit", os.path.join(memory, "memory.limit_in_bytes"))
        if cpuset := paths.get("cpuset"):
            self._cpus(values, os.path.join(cpuset, "cpuset.cpus"))
        if blkio := paths.get("blkio"):
            io = self._text(os.path.join(blkio, "blkio.throttle.io_service_bytes_recursive"))
            if io is not None:  # `8:0 Read 1`, `8:0 Write 2`, ... per device, then `Total 3`
                lines = [line.split() for line in io.splitlines()]
                for key, op in (("io_read", "Read"), ("io_written", "Write")):
                    values[key] = _total(p[2] for p in lines if len(p) == 3 and p[1] == op)
        return self._checked(job)

    def _checked(self, job: JobCgroup) -> JobCgroup:
        """The job with its values, or with none where a file did not parse (counted)."""
        if any(value < 0 for value in job.values.values()):  # _count's mark of a bad number
            self.errors.count("cgroups", "parse_error")
            job.values = {k: v for k, v in job.values.items() if v >= 0}
        if job.values.get("memory_limit", 0) >= NO_LIMIT:
            del job.values["memory_limit"]
        return job

    def _text(self, path: str) -> str | None:
        """A cgroup file's text; None when absent (the controller or kernel lacks it)."""
        try:  # os.open/os.read: a third of open()'s cost (sing/exporters/rdma.py)
            fd = os.open(path, os.O_RDONLY)
            try:
                return os.read(fd, 65536).decode(errors="replace")
            finally:
                os.close(fd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            self.errors.count("cgroups", "read_error")
            return None

    def _fields(self, path: str) -> dict[str, int]:
        """A flat keyed file (`name value` lines, as cpu.stat and cpuacct.stat)."""
        text = self._text(path) or ""
        return {k: _count(v) for k, _, v in (line.partition(" ") for line in text.splitlines())}

    def _number(self, values: dict[str, float], key: str, path: str) -> None:
        text = self._text(path)
        if text is not None:
            text = text.strip()
            values[key] = NO_LIMIT if text == "max" else _count(text)

    def _cpus(self, values: dict[str, float], path: str) -> None:
        """The count of a cpuset list such as `0-3,8,10-11`; an empty set is unknown."""
        text = (self._text(path) or "").strip()
        count = 0
        for item in text.split(",") if text else ():
            first, _, last = item.partition("-")
            if not ascii_digits(first) or (last and not ascii_digits(last)):
                count = -1
                break
            count += int(last or first) - int(first) + 1
        if count:
            values["cpus"] = count


def _count(text: str) -> int:
    """A non-negative integer from a cgroup file; -1 when the text is not one."""
    text = text.strip()
    return int(text) if ascii_digits(text) else -1


def _total(counts: Iterable[str]) -> int:
    """The sum of several counts (one per device); -1 when one is not a number."""
    numbers = [_count(text) for text in counts]
    return -1 if -1 in numbers else sum(numbers)


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
