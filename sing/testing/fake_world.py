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

RDMA counters grow by the port's `tx_bytes_per_s`/`rx_bytes_per_s` between scrapes; its error
counters read 0 unless `error_counters` sets them (e.g. `{link_downed: 2, symbol_error: 40}`),
and `up: false` shows it "1: DOWN" / "3: Disabled". A port's
`counters` setting picks the kernel's layout (see sing/exporters/rdma.py for the real ones):
`64bit` (default: counters/ is 64-bit, as on mlx5 with extended counters), `32bit` (counters/ is
32-bit and sticks at 2^32 - 1) or `counters_ext` (32-bit counters/ plus 64-bit
counters_ext/*_64, kernels before 4.5). The world models the hardware on its own and imports
nothing of the RDMA reader it feeds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

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


def _write(path: Path, text: str) -> None:
    """Replace a file whole, so a concurrent reader never sees it half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
        # What each job file holds now: they change only when a job does, and rewriting ~30
        # of them per node per scrape was about half of the demo exporter's CPU.
        self._job_files: dict[Path, str] = {}
        self._at: float | None = None

    @property
    def roots(self) -> tuple[str, str, str]:
        """The sysfs, procfs and job-mapping roots an exporter reads this node from."""
        return str(self.sysfs_root), str(self.proc_root), str(self.mapping_dir)

    def sync(self) -> None:
        self._sync_jobs()
        self._sync_rdma()

    def _sync_jobs(self) -> None:
        live = set()
        for index in range(self.nvml.count):
            state = self.nvml.gpu_state(index)
            job_id = state.get("job_id")
            mapping = self.mapping_dir / str(index)
            if job_id and state.get("allocated", True):
                self._write_job_file(mapping, f"{job_id}\n")
            else:
                self._job_files.pop(mapping, None)
                mapping.unlink(missing_ok=True)
            if job_id and state.get("has_process", True):
                pid = JOB_PID_BASE + index
                live.add(str(pid))
                user = state.get("user", "")
                proc = self.proc_root / str(pid)
                cgroup = f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_0\n"
                self._write_job_file(proc / "cgroup", cgroup)
                environ = f"SLURM_JOB_ID={job_id}\0SLURM_JOB_USER={user}\0"
                self._write_job_file(proc / "environ", environ)
                self._write_job_file(proc / "status", "Name:\tpython\nUid:\t0\t0\t0\t0\n")
        for stale in self.proc_root.iterdir():
            if stale.name not in live:
                shutil.rmtree(stale, ignore_errors=True)
                for path in [p for p in self._job_files if p.parent == stale]:
                    del self._job_files[path]

    def _write_job_file(self, path: Path, text: str) -> None:
        if self._job_files.get(path) != text:
            _write(path, text)
            self._job_files[path] = text

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
