"""The files around a fake node: /sys InfiniBand counters, /proc entries and the job mapping.

A fake node's GPUs come from FakeNvml, but its RDMA traffic and job attribution are read by the
real sysfs, procfs and mapping-directory readers. So that those readers run unchanged in the demo,
this module keeps a small tree per node, laid out exactly like Linux's, in step with the state:

    <root>/sys/class/infiniband/<dev>/ports/<port>/{counters/*,rate,state,phys_state,link_layer}
    <root>/proc/<pid>/{cgroup,environ,status}     one process per GPU that runs a job
    <root>/gpu-jobs/<gpu index>                    the job id, as the Slurm prolog writes it

RDMA counters grow by the port's `tx_bytes_per_s`/`rx_bytes_per_s` between scrapes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from exporters.fake_nvml import JOB_PID_BASE, FakeNvml, evaluate
from exporters.rdma import DATA_WORD_BYTES

MTU_BYTES = 4096  # packets are counted as if every packet were full


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
        self._at: float | None = None

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
                _write(mapping, f"{job_id}\n")
            else:
                mapping.unlink(missing_ok=True)
            if job_id and state.get("has_process", True):
                pid = JOB_PID_BASE + index
                live.add(str(pid))
                user = state.get("user", "")
                proc = self.proc_root / str(pid)
                _write(proc / "cgroup", f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_0\n")
                _write(proc / "environ", f"SLURM_JOB_ID={job_id}\0SLURM_JOB_USER={user}\0")
                _write(proc / "status", "Name:\tpython\nUid:\t0\t0\t0\t0\n")
        for stale in self.proc_root.iterdir():
            if stale.name not in live:
                shutil.rmtree(stale, ignore_errors=True)

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
            counters = {
                "port_xmit_data": totals["tx"] // DATA_WORD_BYTES,
                "port_rcv_data": totals["rx"] // DATA_WORD_BYTES,
                "port_xmit_packets": totals["tx"] // MTU_BYTES,
                "port_rcv_packets": totals["rx"] // MTU_BYTES,
                "symbol_error": 0,
                "link_downed": 0,
            }
            for counter, value in counters.items():
                _write(base / "counters" / counter, f"{int(value)}\n")
            _write(base / "rate", f"{spec.get('rate', '400 Gb/sec (4X NDR)')}\n")
            _write(base / "state", "4: ACTIVE\n" if spec.get("up", True) else "1: DOWN\n")
            _write(base / "phys_state", "5: LinkUp\n" if spec.get("up", True) else "3: Disabled\n")
            _write(base / "link_layer", f"{spec.get('link_layer', 'InfiniBand')}\n")
