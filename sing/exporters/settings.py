"""The `[exporter]` section of the site config: where the node exporter listens and reads."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ExporterSettings:
    """Defaults suit a Slurm GPU node; command-line options override each one."""

    # 9400 is dcgm-exporter's and 9100 node_exporter's; 9410 lets all three share a node.
    port: int = 9410
    # Loopback until a site says where: the page names users and their jobs (docs/exporter.md).
    listen_address: str = "127.0.0.1"
    # Prometheus exporter-toolkit web config (TLS, basic auth), relative to the config file.
    web_config_file: str = ""
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    # Written by sing/exporters/deploy/slurm-prolog.sh (dcgm-exporter's --hpc-job-mapping-dir
    # format).
    job_mapping_dir: str = "/run/sing/gpu-jobs"
    # Scrapes within this many seconds share one reading, so parallel scrapers cost one read.
    cache_seconds: float = 1.0
    # How often `--record` writes a frame of the device state.
    record_interval: float = 1.0
    # GPU health readings (ECC aggregate, retired pages, row remapping, throttle reasons, PCIe
    # replays, NVLink errors; docs/health.md); off saves their NVML calls. XIDs are always read.
    health: bool = True
    # The health readings the GPU keeps in its InfoROM (ECC aggregate, retired pages, row
    # remapping) change a few times in its life: read them this often, not every scrape.
    health_refresh_s: float = 60.0
    # Each Slurm job's CPU time, memory and I/O from its cgroup (docs/exporter.md); off where
    # cgroup_exporter already serves the same series from this node.
    cgroups: bool = True
