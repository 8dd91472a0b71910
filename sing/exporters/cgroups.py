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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from sing.digits import ascii_digits
from sing.exporters.errors import ErrorCounter
from sing.exporters.jobs import JobSource
from sing.sluid import normal_sluid

USER_HZ = os.sysconf("SC_CLK_TCK")  # cpuacct.stat's tick
NO_LIMIT = 2**62  # v1 writes "unlimited" as 2^63 - 4096 (a page below); no node has 4 EiB
V1_CONTROLLERS = ("cpuacct", "memory", "cpuset", "blkio")
# value key -> (name, type, help). cgroup_exporter's CPU counters have no `_total` and are
# untyped here: prometheus_client would write a counter's TYPE line with `_total` appended.
SERIES = {
    "cpu_user_s": ("cgroup_cpu_user_seconds", "unknown", "CPU seconds the job ran in user mode."),
    "cpu_system_s": (
        "cgroup_cpu_system_seconds",
        "unknown",
        "CPU seconds the job ran in the kernel.",
    ),
    "cpu_total_s": ("cgroup_cpu_total_seconds", "unknown", "CPU seconds the job ran."),
    "cpus": ("cgroup_cpus", "gauge", "CPUs in the job's cpuset."),
    "memory_used": (
        "cgroup_memory_used_bytes",
        "gauge",
        "Memory the job uses now, page cache included.",
    ),
    "memory_peak": (
        "cgroup_memory_max_used_bytes",
        "gauge",
        "The most memory the job used at once, page cache included.",
    ),
    "memory_limit": ("cgroup_memory_total_bytes", "gauge", "The job's memory limit."),
    "io_read": ("cgroup_io_read_bytes", "counter", "Bytes the job read from block devices."),
    "io_written": ("cgroup_io_written_bytes", "counter", "Bytes the job wrote to block devices."),
}


@dataclass
class JobCgroup:
    """One job's directory on this node and what was read from it, in SI units."""

    jobid: str  # "" when a SLUID names no known job
    sluid: str  # "" for a `job_<id>` directory
    values: dict[str, float] = field(default_factory=dict)


class CgroupSource:
    """Reads every Slurm job cgroup under `<sysfs_root>/fs/cgroup`, v1 or v2 as the node has.

    The cpuset and the memory limit, which Slurm sets when it makes the job's cgroup, are kept
    once two reads in a row agree, while the job's directory lives: two files fewer per job and
    scrape (the bench's 32 jobs: bench/bench_exporter.py)."""

    def __init__(self, sysfs_root: str, jobs: JobSource, errors: ErrorCounter) -> None:
        self.root = os.path.join(sysfs_root, "fs", "cgroup")
        self.jobs = jobs
        self.errors = errors
        self._runs: dict[str, str] = {}  # SLUID -> job id, for the SLUID directories now live
        # file -> (its value, settled: the last two reads agreed), for the files now live
        self._settings: dict[str, tuple[float | None, bool]] = {}
        self._seen: set[str] = set()

    def read(self) -> list[JobCgroup]:
        self._seen = set()
        if os.path.exists(self.root + "/cgroup.controllers"):
            jobs = [self._read_v2(path, job) for path, job in self._v2_jobs()]
        else:
            jobs = [self._read_v1(paths, job) for paths, job in self._v1_jobs()]
        self._settings = {k: v for k, v in self._settings.items() if k in self._seen}
        return jobs

    def metrics(self) -> list[Metric]:
        """The jobs' series, labelled `jobid` where the job is known and `sluid` where the
        directory is a run's: no empty labels, each costs its share of every scrape."""
        families = {key: Metric(name, doc, kind) for key, (name, kind, doc) in SERIES.items()}
        for job in self.read():
            labels = {"jobid": job.jobid} if job.jobid else {}
            if job.sluid:
                labels["sluid"] = job.sluid
            for key, value in job.values.items():
                family = families[key]
                suffix = "_total" if family.type == "counter" else ""
                family.add_sample(family.name + suffix, labels, value)
        return list(families.values())

    # -- where the jobs are -----------------------------------------------------------------------

    def _v2_jobs(self) -> Iterator[tuple[str, JobCgroup]]:
        live = set()
        for slice_ in _listdir(self.root):
            if not slice_.endswith(".slice"):
                continue
            for scope in _listdir(f"{self.root}/{slice_}"):
                if not scope.endswith("slurmstepd.scope"):
                    continue
                base = f"{self.root}/{slice_}/{scope}"
                for name in _listdir(base):
                    if (job := self._job_of(name, live)) is not None:
                        yield f"{base}/{name}", job
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
            base = f"{self.root}/{controller}"
            for prepend in _listdir(base):
                if not prepend.startswith("slurm"):
                    continue
                for uid in _listdir(f"{base}/{prepend}"):
                    if not uid.startswith("uid_"):
                        continue
                    for name in _listdir(f"{base}/{prepend}/{uid}"):
                        if name.startswith("job_") and ascii_digits(name[4:]):
                            path = f"{base}/{prepend}/{uid}/{name}"
                            found.setdefault((f"{prepend}/{uid}", name[4:]), {})[controller] = path
        for (_, job_id), paths in sorted(found.items()):
            yield paths, JobCgroup(job_id, "")

    # -- what the files say -----------------------------------------------------------------------

    def _read_v2(self, path: str, job: JobCgroup) -> JobCgroup:
        values = job.values
        if (stat := self._text(f"{path}/cpu.stat")) is not None:
            fields = _fields(stat)
            for key, name in (("cpu_user_s", "user_usec"), ("cpu_system_s", "system_usec"),
                              ("cpu_total_s", "usage_usec")):  # fmt: skip
                if name in fields and (usec := self._int(fields[name])) is not None:
                    values[key] = usec / 1e6
        self._put(values, "memory_used", self._number(f"{path}/memory.current"))
        self._put(values, "memory_peak", self._number(f"{path}/memory.peak"))
        self._put(values, "memory_limit", self._setting(f"{path}/memory.max", self._number))
        self._put(values, "cpus", self._setting(f"{path}/cpuset.cpus.effective", self._cpus))
        if (io := self._text(f"{path}/io.stat")) is not None:
            # a line per device: `8:0 rbytes=1 wbytes=2 rios=3 ...`
            devices = [
                dict(i.partition("=")[::2] for i in line.split()) for line in io.splitlines()
            ]
            self._put(values, "io_read", self._sum(d.get("rbytes", "0") for d in devices))
            self._put(values, "io_written", self._sum(d.get("wbytes", "0") for d in devices))
        return job

    def _read_v1(self, paths: dict[str, str], job: JobCgroup) -> JobCgroup:
        values = job.values
        if cpuacct := paths.get("cpuacct"):
            if (stat := self._text(f"{cpuacct}/cpuacct.stat")) is not None:
                fields = _fields(stat)
                for key, name in (("cpu_user_s", "user"), ("cpu_system_s", "system")):
                    if name in fields and (ticks := self._int(fields[name])) is not None:
                        values[key] = ticks / USER_HZ
            if (ns := self._number(f"{cpuacct}/cpuacct.usage")) is not None:
                values["cpu_total_s"] = ns / 1e9
        if memory := paths.get("memory"):
            self._put(values, "memory_used", self._number(f"{memory}/memory.usage_in_bytes"))
            self._put(values, "memory_peak", self._number(f"{memory}/memory.max_usage_in_bytes"))
            limit = self._setting(f"{memory}/memory.limit_in_bytes", self._number)
            self._put(values, "memory_limit", limit)
        if cpuset := paths.get("cpuset"):
            self._put(values, "cpus", self._setting(f"{cpuset}/cpuset.cpus", self._cpus))
        if blkio := paths.get("blkio"):
            io = self._text(f"{blkio}/blkio.throttle.io_service_bytes_recursive")
            if io is not None:  # `8:0 Read 1`, `8:0 Write 2`, ... per device, then `Total 3`
                lines = [line.split() for line in io.splitlines()]
                for key, op in (("io_read", "Read"), ("io_written", "Write")):
                    self._put(
                        values, key, self._sum(p[2] for p in lines if len(p) == 3 and p[1] == op)
                    )
        return job

    @staticmethod
    def _put(values: dict[str, float], key: str, value: float | None) -> None:
        """Set a reading; a limit of `max` or v1's unlimited is no limit (unknown: left out)."""
        if value is not None and not (key == "memory_limit" and value >= NO_LIMIT):
            values[key] = value

    def _setting(self, path: str, reader: Callable[[str], float | None]) -> float | None:
        """A file Slurm writes when it makes the job's cgroup, read until two reads agree."""
        self._seen.add(path)
        kept = self._settings.get(path)
        if kept is not None and kept[1]:
            return kept[0]
        value = reader(path)
        self._settings[path] = (value, kept is not None and kept[0] == value)
        return value

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

    def _int(self, text: str) -> int | None:
        """A count the kernel wrote; None (counted) when the text is not one."""
        text = text.strip()
        if ascii_digits(text):
            return int(text)
        self.errors.count("cgroups", "parse_error")
        return None

    def _number(self, path: str) -> float | None:
        """A file of one number; `max` (no limit) reads as NO_LIMIT."""
        text = self._text(path)
        if text is None:
            return None
        return NO_LIMIT if text.strip() == "max" else self._int(text)

    def _sum(self, counts: Iterable[str]) -> int | None:
        """The sum of several counts (one per device); None when one is not a number."""
        numbers = [self._int(text) for text in counts]
        return None if None in numbers else sum(n for n in numbers if n is not None)

    def _cpus(self, path: str) -> float | None:
        """The count of a cpuset list such as `0-3,8,10-11`; an empty set is unknown."""
        text = (self._text(path) or "").strip()
        count = 0
        for item in text.split(",") if text else ():
            first, _, last = item.partition("-")
            if not ascii_digits(first) or (last and not ascii_digits(last)):
                self.errors.count("cgroups", "parse_error")
                return None
            count += int(last or first) - int(first) + 1
        return count or None


def _fields(text: str) -> dict[str, str]:
    """A flat keyed file's `name value` lines (cpu.stat, cpuacct.stat) by name."""
    return dict(line.partition(" ")[::2] for line in text.splitlines())


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
