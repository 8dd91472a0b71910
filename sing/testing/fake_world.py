"""The files around a fake node: /sys InfiniBand counters, /proc entries and the job mapping.

A fake node's GPUs come from FakeNvml, but its RDMA traffic and job attribution are read by the
real sysfs, procfs and mapping-directory readers. So that those readers run unchanged in the demo,
this module keeps a small tree per node, laid out exactly like Linux's, in step with the state:

    <root>/sys/class/infiniband/<dev>/ports/<port>/counters/*       PortCounters and errors
    <root>/sys/class/infiniband/<dev>/ports/<port>/counters_ext/*   (layout counters_ext only)
    <root>/sys/class/infiniband/<dev>/ports/<port>/hw_counters/*    mlx5-style adapter counters
    <root>/sys/class/infiniband/<dev>/ports/<port>/{rate,state,phys_state,link_layer}
    <root>/proc/<pid>/{cgroup,environ,status}     one process per GPU that runs a job
    <root>/gpu-jobs/<gpu index>                    the job id, as the Slurm prolog writes it
    <root>/sys/fs/cgroup/...                       each job's cgroup (FakeCgroups, below)
    <root>/gpu-jobs.sluid/<SLUID>                  the job id of a run (layout v2_sluid)

RDMA counters grow by the port's `tx_bytes_per_s`/`rx_bytes_per_s` between scrapes; its error
counters read 0 unless `error_counters` sets them (e.g. `{link_downed: 2, symbol_error: 40}`),
and `up: false` shows it "1: DOWN" / "3: Disabled". A port's
`counters` setting picks the kernel's layout (see sing/exporters/rdma.py for the real ones):
`64bit` (default: counters/ is 64-bit, as on mlx5 with extended counters), `32bit` (counters/ is
32-bit and sticks at 2^32 - 1) or `counters_ext` (32-bit counters/ plus 64-bit
counters_ext/*_64, kernels before 4.5). The world models the hardware, the kernel and Slurm
on its own and imports nothing of the readers it feeds.

The `cgroup` section of a device description (docs/exporter.md, "Fake device description")
picks the layout Slurm would make for the jobs and scripts each job's values in SI units:

    cgroup:
      layout: v2          # v1 (/sys/fs/cgroup/<controller>/slurm/uid_<uid>/job_<id>/),
                          # v2 (.../system.slice/slurmstepd.scope/job_<id>/) or
                          # v2_sluid (.../slurmstepd.scope/<SLUID>/, Slurm 26.05's default)
      defaults: {cpus: 8, cpu_busy: 2.0, memory_used: 8.0e+9, memory_limit: 6.4e+10}
      jobs:
        "101": {cpus: 32, cpu_user_s: 100, cpu_busy: 3.0, memory_used: 6.0e+9}

Every job a GPU holds has a directory, and so has every job under `jobs` (a state file's
`cgroup: {jobs: {...}}` overrides them at runtime; `null` removes one). Keys, each a number or a
pattern: `cpus` (the cpuset), `cpu_user_s` and `cpu_system_s` (the counters' values: a lower
value than before is a new cgroup, as after a requeue), `cpu_busy` (cores busy in user mode,
added to `cpu_user_s` as time passes), `memory_used`, `memory_peak` (default: the highest
`memory_used` so far; null: a kernel without memory.peak), `memory_limit` (absent: no limit),
`io_read_bytes`, `io_write_bytes` and their `*_per_s` rates (all absent: no io controller),
`uid` (v1's path), `sluid` (v2_sluid; default `s` and the job id in 13 digits). The kernel's
units are Linux's: v2's cpu.stat in microseconds, v1's cpuacct.usage in nanoseconds and
cpuacct.stat in USER_HZ ticks (100 a second on every architecture sing runs on), v1's unlimited
limit 2^63 less a page, I/O shared by two devices.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from sing.errors import UserError
from sing.testing.fake_nvml import JOB_PID_BASE, FakeNvml, evaluate

IB_WORD_BYTES = 4  # port_xmit_data / port_rcv_data count 4-byte words (IB spec, PortCounters)
MAX_32BIT = 2**32 - 1  # where a 32-bit PortCounters counter sticks
MTU_BYTES = 4096  # packets are counted as if every packet were full
# Error counters every layout has in counters/, zero unless a port's `error_counters` says.
ERROR_COUNTERS = (
    "symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
    "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped", "link_error_recovery", "link_downed",
)  # fmt: skip
# A few of mlx5's hw_counters/, all zero; `lifespan` is their refresh period in ms.
HW_COUNTERS = {"out_of_buffer": 0, "out_of_sequence": 0, "local_ack_timeout_err": 0,
               "np_cnp_sent": 0, "rp_cnp_handled": 0, "lifespan": 10}  # fmt: skip
CGROUP_LAYOUTS = ("v1", "v2", "v2_sluid")
USER_HZ = 100
V1_UNLIMITED = 2**63 - 4096
V2_SCOPE = Path("system.slice/slurmstepd.scope")
# Job cgroup counters grown by a rate: counter -> rate key.
CGROUP_RATES = {
    "cpu_user_s": "cpu_busy",
    "io_read_bytes": "io_read_bytes_per_s",
    "io_write_bytes": "io_write_bytes_per_s",
}
DEVICES = ("8:0", "259:0")  # a disk and an NVMe drive, sharing a job's I/O


def _write(path: Path, text: str) -> None:
    """Replace a file whole, so a concurrent reader never sees it half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Files:
    """Files written whole, each only when its text changed: job files change only when a job
    does, and rewriting ~30 of them per node per scrape was about half of the demo exporter's
    CPU."""

    def __init__(self) -> None:
        self._text: dict[Path, str] = {}

    def write(self, path: Path, text: str | None) -> None:
        """Write `path`; None removes it (a reading the kernel does not offer)."""
        if text is None:
            path.unlink(missing_ok=True)
            self._text.pop(path, None)
        elif self._text.get(path) != text:
            _write(path, text)
            self._text[path] = text

    def remove(self, path: Path) -> None:
        """Remove a file or a directory tree and forget what was written under it."""
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        for known in [p for p in self._text if p == path or path in p.parents]:
            del self._text[known]


class FakeWorld:
    def __init__(self, root: str | Path, nvml: FakeNvml) -> None:
        self.root = Path(root)
        self.nvml = nvml
        self.sysfs_root = self.root / "sys"
        self.proc_root = self.root / "proc"
        self.mapping_dir = self.root / "gpu-jobs"
        self.mapping_dir.mkdir(parents=True, exist_ok=True)
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self._bytes: dict[str, dict[str, float]] = {}
        self._static: dict[str, dict[str, Any]] = {}  # port -> spec its static files show
        self.files = Files()
        self.cgroups = FakeCgroups(nvml, self.sysfs_root, self.mapping_dir, self.files)
        self._at: float | None = None

    @property
    def roots(self) -> tuple[str, str, str]:
        """The sysfs, procfs and job-mapping roots an exporter reads this node from."""
        return str(self.sysfs_root), str(self.proc_root), str(self.mapping_dir)

    def sync(self) -> None:
        self._sync_jobs()
        self._sync_rdma()

    def _sync_jobs(self) -> None:
        live, jobs = set(), set()
        for index in range(self.nvml.count):
            state = self.nvml.gpu_state(index)
            job_id = state.get("job_id")
            mapping = self.mapping_dir / str(index)
            if job_id:
                jobs.add(str(job_id))
            self.files.write(
                mapping, f"{job_id}\n" if job_id and state.get("allocated", True) else None
            )
            if job_id and state.get("has_process", True):
                pid = JOB_PID_BASE + index
                live.add(str(pid))
                user = state.get("user", "")
                proc = self.proc_root / str(pid)
                self.files.write(proc / "cgroup", self.cgroups.proc_cgroup(str(job_id)))
                environ = f"SLURM_JOB_ID={job_id}\0SLURM_JOB_USER={user}\0"
                self.files.write(proc / "environ", environ)
                self.files.write(proc / "status", "Name:\tpython\nUid:\t0\t0\t0\t0\n")
        for stale in self.proc_root.iterdir():
            if stale.name not in live:
                self.files.remove(stale)
        self.cgroups.sync(jobs)

    def ports(self) -> dict[str, dict[str, Any]]:
        """Port specs "dev/port" -> settings: the description's, overridden by the state file's."""
        ports = {k: dict(v) for k, v in (self.nvml.description.get("rdma") or {}).items()}
        if self.nvml.state is not None:
            for name, spec in (self.nvml.state.node(self.nvml.node).get("rdma") or {}).items():
                ports.setdefault(name, {}).update(spec)
        return ports

    def _sync_rdma(self) -> None:
        now = self.nvml.clock()
        dt = 0.0 if self._at is None else now - self._at
        self._at = now
        t = now - self.nvml.start
        for name, spec in self.ports().items():
            device, _, port = name.partition("/")
            totals = self._bytes.setdefault(
                name, {"tx": 0.0, "rx": 0.0, "tx_rate": 0, "rx_rate": 0}
            )
            for way in ("tx", "rx"):  # the rate in force since the last sync applies up to now
                totals[way] += totals[f"{way}_rate"] * dt
                totals[f"{way}_rate"] = float(evaluate(spec.get(f"{way}_bytes_per_s", 0), t, 0, 0))
            base = self.sysfs_root / "class/infiniband" / device / "ports" / (port or "1")
            static = {key: spec.get(key) for key in ("rate", "up", "link_layer", "error_counters")}
            if self._static.get(name) != static:  # files that do not count: on a change only
                self._write_static(base, spec)
                self._static[name] = static
            self._write_traffic(base, spec.get("counters", "64bit"), totals["tx"], totals["rx"])

    def _write_static(self, base: Path, spec: dict[str, Any]) -> None:
        up = spec.get("up", True)
        _write(base / "rate", f"{spec.get('rate', '400 Gb/sec (4X NDR)')}\n")
        _write(base / "state", "4: ACTIVE\n" if up else "1: DOWN\n")
        _write(base / "phys_state", "5: LinkUp\n" if up else "3: Disabled\n")
        _write(base / "link_layer", f"{spec.get('link_layer', 'InfiniBand')}\n")
        errors = spec.get("error_counters") or {}
        for counter in ERROR_COUNTERS:
            _write(base / "counters" / counter, f"{int(errors.get(counter, 0))}\n")
        for counter, value in HW_COUNTERS.items():
            _write(base / "hw_counters" / counter, f"{value}\n")

    def _write_traffic(self, base: Path, layout: str, tx: float, rx: float) -> None:
        """The four traffic counters in the layout's files, in words and packets."""
        full = {
            "port_xmit_data": int(tx // IB_WORD_BYTES),
            "port_rcv_data": int(rx // IB_WORD_BYTES),
            "port_xmit_packets": int(tx // MTU_BYTES),
            "port_rcv_packets": int(rx // MTU_BYTES),
        }
        narrow = layout in ("32bit", "counters_ext")
        for counter, value in full.items():
            shown = min(value, MAX_32BIT) if narrow else value
            _write(base / "counters" / counter, f"{shown}\n")
            if layout == "counters_ext":
                _write(base / "counters_ext" / f"{counter}_64", f"{value}\n")


class FakeCgroups:
    """Keeps `<sysfs>/fs/cgroup` in step with the scripted jobs (the module's docstring)."""

    def __init__(self, nvml: FakeNvml, sysfs_root: Path, mapping_dir: Path, files: Files) -> None:
        self.nvml = nvml
        self.root = sysfs_root / "fs" / "cgroup"
        self.sluid_dir = mapping_dir.with_name(mapping_dir.name + ".sluid")
        self.files = files
        self.layout = (nvml.description.get("cgroup") or {}).get("layout")
        if self.layout not in (None, *CGROUP_LAYOUTS):
            raise UserError(
                f"fake cgroup layout {self.layout!r}: expected one of {', '.join(CGROUP_LAYOUTS)}"
            )
        self._totals: dict[str, dict[str, float]] = {}  # job -> counters grown, rates, peak
        self._paths: dict[str, list[Path]] = {}  # job -> what it has written, to remove

    def _tables(self) -> list[dict[str, Any]]:
        """The `cgroup` sections of the description and of the state file, in that order."""
        tables = [self.nvml.description.get("cgroup") or {}]
        if self.nvml.state is not None:
            tables.append(self.nvml.state.node(self.nvml.node).get("cgroup") or {})
        return tables

    def spec(self, job: str) -> dict[str, Any] | None:
        """Job `job`'s settings: the defaults, the description's, the state file's; None: the
        description or state file removes it."""
        tables = self._tables()
        spec = dict(tables[0].get("defaults") or {})
        for table in tables:
            jobs = {str(k): v for k, v in (table.get("jobs") or {}).items()}  # YAML: 101 or "101"
            if job in jobs and jobs[job] is None:
                return None
            spec.update(jobs.get(job) or {})
        return spec

    def _sluid(self, job: str, spec: dict[str, Any]) -> str:
        """The run's SLUID: the spec's, else `s` and the job id's digits in 13 places."""
        digits = "".join(c for c in job if c.isascii() and c.isdigit())
        return str(spec.get("sluid") or "s" + digits.zfill(13)[-13:])

    def proc_cgroup(self, job: str) -> str:
        """/proc/PID/cgroup of a task of `job` in the layout (v2 by job id without one)."""
        spec = self.spec(job) or {}
        if self.layout == "v1":
            path = f"/slurm/uid_{int(spec.get('uid', 1000))}/job_{job}/step_0"
            return f"11:memory:{path}/task_0\n4:cpuset:{path}\n3:cpu,cpuacct:{path}/task_0\n"
        name = self._sluid(job, spec) if self.layout == "v2_sluid" else f"job_{job}"
        return f"0::/{V2_SCOPE}/{name}/step_0/user/task_0\n"

    def sync(self, held: set[str]) -> None:
        """Write the directories of the jobs the GPUs hold and of those listed under `jobs`."""
        if self.layout is None:
            return
        now = self.nvml.clock()
        t = now - self.nvml.start
        listed = {str(job) for table in self._tables() for job in table.get("jobs") or {}}
        live = {}
        for job in sorted(held | listed):
            if (spec := self.spec(job)) is not None:
                live[job] = {key: evaluate(value, t, 0.0, 0.0) for key, value in spec.items()}
        for gone in set(self._paths) - set(live):
            for path in self._paths.pop(gone):
                self.files.remove(path)
            del self._totals[gone]
        if self.layout != "v1":
            self.files.write(self.root / "cgroup.controllers", "cpuset cpu io memory pids\n")
            self.files.write(self.root / V2_SCOPE / "system" / "cpu.stat", _cpu_stat(5.0, 1.0))
        for job, spec in live.items():
            values = self._grown(job, spec, now)
            if self.layout == "v1":
                self._write_v1(job, spec, values)
            else:
                self._write_v2(job, spec, values)

    def _grown(self, job: str, spec: dict[str, Any], now: float) -> dict[str, Any]:
        """The counters: their described value plus what the rate in force since the last look
        added (as fake_nvml's energy); the memory peak so far."""
        totals = self._totals.setdefault(job, {"at": now})
        dt, totals["at"] = now - totals["at"], now
        values = dict(spec)
        for counter, rate in CGROUP_RATES.items():
            totals[counter] = totals.get(counter, 0.0) + totals.get(rate, 0.0) * dt
            totals[rate] = float(spec.get(rate) or 0.0)
            if counter in spec or rate in spec:
                values[counter] = float(spec.get(counter) or 0.0) + totals[counter]
        if spec.get("memory_used") is not None:
            totals["peak"] = max(totals.get("peak", 0.0), float(spec["memory_used"]))
            values.setdefault("memory_peak", totals["peak"])
        return values

    def _write_v2(self, job: str, spec: dict[str, Any], v: dict[str, Any]) -> None:
        name = f"job_{job}"
        paths = []
        if self.layout == "v2_sluid":
            name = self._sluid(job, spec)
            paths.append(self.sluid_dir / name)
            self.files.write(paths[-1], f"{job}\n")  # as slurm-prolog.sh writes it
        base = self.root / V2_SCOPE / name
        self._paths[job] = [*paths, base]
        write = self.files.write
        write(base / "step_0" / "user" / "task_0" / "cgroup.procs", "")
        if "cpu_user_s" in v or "cpu_system_s" in v:
            write(base / "cpu.stat", _cpu_stat(v.get("cpu_user_s", 0), v.get("cpu_system_s", 0)))
        write(base / "memory.current", _number(v.get("memory_used")))
        write(base / "memory.peak", _number(v.get("memory_peak")))
        write(base / "memory.max", _number(v.get("memory_limit")) or "max\n")
        cpus = v.get("cpus")
        write(base / "cpuset.cpus.effective", f"0-{int(cpus) - 1}\n" if cpus else None)
        if "io_read_bytes" in v or "io_write_bytes" in v:
            write(base / "io.stat", "".join(
                f"{d} rbytes={r} wbytes={w} rios={r // 4096} wios={w // 4096} dbytes=0 dios=0\n"
                for d, r, w in _devices(v)
            ))  # fmt: skip

    def _write_v1(self, job: str, spec: dict[str, Any], v: dict[str, Any]) -> None:
        below = Path("slurm") / f"uid_{int(spec.get('uid', 1000))}" / f"job_{job}"
        cpuacct, memory, cpuset, blkio = (
            self.root / controller / below
            for controller in ("cpuacct", "memory", "cpuset", "blkio")
        )
        self._paths[job] = [cpuacct, memory, cpuset, blkio]
        write = self.files.write
        if "cpu_user_s" in v or "cpu_system_s" in v:
            user, system = v.get("cpu_user_s", 0), v.get("cpu_system_s", 0)
            write(cpuacct / "cpuacct.usage", f"{round((user + system) * 1e9)}\n")
            ticks = f"user {int(user * USER_HZ)}\nsystem {int(system * USER_HZ)}\n"
            write(cpuacct / "cpuacct.stat", ticks)
        write(memory / "memory.usage_in_bytes", _number(v.get("memory_used")))
        write(memory / "memory.max_usage_in_bytes", _number(v.get("memory_peak")))
        limit = _number(v.get("memory_limit")) or f"{V1_UNLIMITED}\n"
        write(memory / "memory.limit_in_bytes", limit)
        cpus = v.get("cpus")
        write(cpuset / "cpuset.cpus", f"0-{int(cpus) - 1}\n" if cpus else None)
        if "io_read_bytes" in v or "io_write_bytes" in v:
            lines = []
            for d, r, w in _devices(v):
                lines += [f"{d} Read {r}", f"{d} Write {w}", f"{d} Sync {r + w}", f"{d} Async 0",
                          f"{d} Discard 0", f"{d} Total {r + w}"]  # fmt: skip
            total = int(v.get("io_read_bytes") or 0) + int(v.get("io_write_bytes") or 0)
            text = "\n".join([*lines, f"Total {total}"]) + "\n"
            write(blkio / "blkio.throttle.io_service_bytes_recursive", text)


def _cpu_stat(user_s: float, system_s: float) -> str:
    """cgroup v2's cpu.stat (Linux 5.x and later) of a cgroup that is never throttled."""
    user, system = round(user_s * 1e6), round(system_s * 1e6)
    return (
        f"usage_usec {user + system}\nuser_usec {user}\nsystem_usec {system}\n"
        "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n"
    )


def _number(value: float | None) -> str | None:
    """A file of one integer, or None (no file) for an unset value."""
    return None if value is None else f"{int(value)}\n"


def _devices(values: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(device, bytes read, bytes written) of a job's I/O, two thirds on the first device."""
    shares = []
    for key in ("io_read_bytes", "io_write_bytes"):
        total = int(values.get(key) or 0)
        shares.append((total * 2 // 3, total - total * 2 // 3))
    return list(zip(DEVICES, *shares, strict=True))
