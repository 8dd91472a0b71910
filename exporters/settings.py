"""The `[exporter]` section of the site config: where the node exporter listens and reads."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ExporterSettings:
    """Defaults suit a Slurm GPU node; command-line options override each one."""

    # 9400 is dcgm-exporter's and 9100 node_exporter's; 9410 lets all three share a node.
    port: int = 9410
    listen_address: str = "0.0.0.0"
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    # Written by exporters/deploy/slurm-prolog.sh (dcgm-exporter's --hpc-job-mapping-dir format).
    job_mapping_dir: str = "/run/sing/gpu-jobs"
    # Scrapes within this many seconds share one reading, so parallel scrapers cost one read.
    cache_seconds: float = 1.0
    # How often `--record` writes a frame of the device state.
    record_interval: float = 1.0
