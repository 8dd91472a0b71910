"""The `[collector]` section of the site config.

Targets: `file_sd` wins if set, then `slurm_targets`, then the plain `targets` list, whose
default is the local exporter, so `sing exporter --fake` plus `sing collector` work with no file.
"""

from __future__ import annotations

import dataclasses

from sing.collector.shard import Shard
from sing.errors import UserError
from sing.warehouse.coverage import DEFAULT_INTERVAL_S


@dataclasses.dataclass(frozen=True)
class CollectorSettings:
    interval_s: float = DEFAULT_INTERVAL_S
    scrape_timeout_s: float = 10.0
    # A payload larger than this is rejected (a normal 8-GPU node is ~30-60 KB).
    max_payload_bytes: int = 8_000_000
    # Scrapes in flight at once.
    concurrency: int = 64
    # Prometheus file_sd JSON/YAML file (relative to the config file); re-read on change.
    file_sd: str = ""
    # Scrape every node `sinfo -N` lists, on `exporter_port`.
    slurm_targets: bool = False
    exporter_port: int = 9410
    # host:port or full URLs; the node name is the host part.
    targets: tuple[str, ...] = ("127.0.0.1:9410",)
    # How targets given as host:port are reached (file_sd's `__scheme__` label wins).
    scheme: str = "http"
    # Exporters behind --web.config.file (sing/collector/client.py); paths relative to the config.
    tls_ca_file: str = ""  # CA that signed the exporters' certificates; "" = system store
    tls_cert_file: str = ""  # client certificate, for exporters that require one
    tls_key_file: str = ""
    basic_auth_username: str = ""
    basic_auth_password_file: str = ""  # the password (one line); never the password itself
    # Several collectors on one warehouse: "k/n" scrapes the targets whose node name hashes to
    # shard k of n (sing/collector/shard.py); "" scrapes them all.
    shard: str = ""
    # Of the collectors writing one warehouse, the holder of its leader lease runs job sync,
    # policy and detection rounds and maintenance; a dead leader's lease lapses after this long.
    leader_lease_ttl_s: float = 60.0
    # Pull mode: read the series from this Prometheus server instead of scraping.
    prometheus_url: str = ""
    # Pull mode: on start, read back at most this far (or from the newest stored sample).
    pull_lookback_s: float = 3600.0
    # Job records: "module:function" called as function(config, warehouse); "" turns it off.
    # Sources must be installed entry points of the group "sing.sources" (sing.collector.plugins).
    # The default syncs the [executor] of the config (off when the config has none).
    job_sync: str = "sing.collector.jobsync:executor_sync"
    job_sync_interval_s: float = 60.0
    # Node list for the `nodes` inventory, read at each job sync: "module:function" called as
    # function(config) -> [sing.executors.records.NodeRecord]; "" turns it off (exporters only).
    # The default lists the [executor]'s nodes (`sinfo` on Slurm; off without [executor]).
    node_inventory: str = "sing.collector.inventory:executor_inventory"
    # Compaction (and retention, when raw_retention_days > 0) runs this often.
    maintenance_interval_s: float = 300.0
    raw_retention_days: int = 0
    # Rows held in memory while the warehouse cannot be written; the oldest go first.
    buffer_max_rows: int = 2_000_000
    # The collector's own /metrics; port 0 turns it off.
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9411

    def __post_init__(self) -> None:
        """The exporter-access settings that only make sense together."""
        where = "[collector]"
        if self.scheme not in ("http", "https"):
            raise UserError(f"{where} scheme must be http or https, not {self.scheme!r}")
        if (self.tls_ca_file or self.tls_cert_file or self.basic_auth_username) and (
            self.scheme != "https"
        ):
            raise UserError(
                f'{where} TLS and basic auth settings need scheme = "https"; '
                "over plain http the password would travel in clear"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise UserError(f"{where} tls_cert_file and tls_key_file go together")
        if bool(self.basic_auth_username) != bool(self.basic_auth_password_file):
            raise UserError(f"{where} basic_auth_username and basic_auth_password_file go together")
        if Shard.parse(self.shard).count > 1 and self.prometheus_url:
            raise UserError(
                f"{where} shard splits scraped targets; pull mode reads the whole Prometheus "
                "server, so run one pulling collector"
            )
        if self.leader_lease_ttl_s < 3:
            raise UserError(f"{where} leader_lease_ttl_s must be at least 3 (seconds)")
