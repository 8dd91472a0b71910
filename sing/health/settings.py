"""The `[health]` section: which signals open an incident and how often the collector looks;
which limits make a node a drain candidate, and whether sing may drain it itself.

The incident defaults follow NVIDIA's Xid catalogue (docs/health.md, "Incidents"): the XIDs
listed there as needing a GPU reset, a node reboot or a service request, not those an
application causes. Draining is off twice over, as the policies' cancellations are: sing only
suggests (prints the `scontrol` command) unless `drain = true` (the site's permission) *and*
`dry_run = false` (docs/health.md, "Drain").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sing.config import ConfigError
from sing.digits import ascii_digits

# 48 double-bit ECC, 63/64 row remapping (pending / failed), 74 NVLink, 79 fallen off the bus,
# 92 high single-bit ECC rate, 94/95 contained / uncontained ECC, 119/120 GSP timeout / error,
# 123 SPI PMU RPC failure, 140 unrecovered ECC.
SERIOUS_XIDS = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140]
# The XIDs whose every new one makes a drain candidate: those above that mean the GPU itself
# needs a reset or service (not 63, a remap that worked, nor the GSP and PMU firmware errors).
DEFAULT_DRAIN_XIDS = {code: 1 for code in ("48", "64", "74", "79", "92", "95")}


@dataclass(frozen=True)
class HealthSettings:
    interval_s: float = 60.0  # the collector runs a detection round this often; 0 = never
    serious_xids: list[int] = field(default_factory=lambda: list(SERIOUS_XIDS))
    ecc_uncorrected_limit: int = 1  # uncorrected ECC errors between two readings that open one
    flapping_downs: int = 3  # a port whose link went down this many times...
    flapping_minutes: float = 10.0  # ...within this many minutes is flapping
    node_down_minutes: float = 10.0  # a node none of whose scrapes answered this long is down
    # Drain (sing.policy.drain).
    drain: bool = False  # the site's permission for sing to drain nodes itself
    dry_run: bool = True  # true: decide and record, drain nothing
    # A node is a drain candidate when any of its readings reaches one of these limits
    # (0 or false: that limit is off). Counters count their increase over drain_window_hours.
    drain_window_hours: float = 24.0
    drain_ecc_uncorrected: int = 1  # ecc_uncorrected_volatile of a GPU now (since driver load)
    drain_row_remap_failed: bool = True  # row_remap_failed flag set now
    drain_retired_pages_pending: bool = True  # retired_pages_pending flag set now
    drain_xid: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_DRAIN_XIDS))
    drain_link_downed: int = 3  # link_downed increase of a port in the window
    # The drain breaker (sing/policy/breaker.py): at most this share of the cluster's nodes (at
    # least one) drained by sing within drain_breaker_window_s; the next drain trips it.
    max_drained_share: float = 0.1
    drain_breaker_window_s: float = 3600.0

    def __post_init__(self) -> None:
        positive = {
            "ecc_uncorrected_limit": self.ecc_uncorrected_limit,
            "flapping_downs": self.flapping_downs,
            "flapping_minutes": self.flapping_minutes,
            "node_down_minutes": self.node_down_minutes,
            "drain_window_hours": self.drain_window_hours,
            "drain_breaker_window_s": self.drain_breaker_window_s,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"[health] {key} = {value!r} must be more than 0")
        if self.interval_s < 0:
            raise ConfigError(f"[health] interval_s = {self.interval_s!r}: use 0 (off) or more")
        bad = [x for x in self.serious_xids if x <= 0]
        if bad:
            raise ConfigError(f"[health] serious_xids: {bad[0]!r} is not an XID code")
        if not 0 <= self.max_drained_share <= 1:
            raise ConfigError(
                f"[health] max_drained_share = {self.max_drained_share!r}: use a share 0 to 1"
            )
        if self.drain_ecc_uncorrected < 0 or self.drain_link_downed < 0:
            raise ConfigError("[health] drain_ecc_uncorrected and drain_link_downed must be >= 0")
        for code, count in self.drain_xid.items():
            # ASCII only: "٧٩" or "７９" passes isdigit() but never names a reading's XID, so the
            # limit would look set and be off.
            if not ascii_digits(code) or count < 0:
                raise ConfigError(
                    f"[health] drain_xid: {code!r} = {count!r}; use XID numbers -> counts >= 0, "
                    'e.g. drain_xid = {"79" = 1}'
                )
