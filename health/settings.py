"""The `[health]` section: which signals open an incident, and how often the collector looks.

The defaults follow NVIDIA's Xid catalogue (docs/health.md, "Incidents"): the XIDs listed there
as needing a GPU reset, a node reboot or a service request, not those an application causes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sing.config import ConfigError

# 48 double-bit ECC, 63/64 row remapping (pending / failed), 74 NVLink, 79 fallen off the bus,
# 92 high single-bit ECC rate, 94/95 contained / uncontained ECC, 119/120 GSP timeout / error,
# 123 SPI PMU RPC failure, 140 unrecovered ECC.
SERIOUS_XIDS = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140]


@dataclass(frozen=True)
class HealthSettings:
    interval_s: float = 60.0  # the collector runs a detection round this often; 0 = never
    serious_xids: list[int] = field(default_factory=lambda: list(SERIOUS_XIDS))
    ecc_uncorrected_limit: int = 1  # uncorrected ECC errors between two readings that open one
    flapping_downs: int = 3  # a port whose link went down this many times...
    flapping_minutes: float = 10.0  # ...within this many minutes is flapping
    node_down_minutes: float = 10.0  # a node none of whose scrapes answered this long is down

    def __post_init__(self) -> None:
        positive = {
            "ecc_uncorrected_limit": self.ecc_uncorrected_limit,
            "flapping_downs": self.flapping_downs,
            "flapping_minutes": self.flapping_minutes,
            "node_down_minutes": self.node_down_minutes,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"[health] {key} = {value!r} must be more than 0")
        if self.interval_s < 0:
            raise ConfigError(f"[health] interval_s = {self.interval_s!r}: use 0 (off) or more")
        bad = [x for x in self.serious_xids if x <= 0]
        if bad:
            raise ConfigError(f"[health] serious_xids: {bad[0]!r} is not an XID code")
