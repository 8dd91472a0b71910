"""The `[health]` section: the limits that make a node a drain candidate, and whether sing may
drain it itself.

Draining is off twice over, as the policies' cancellations are: sing only suggests (prints the
`scontrol` command) unless `drain = true` (the site's permission) *and* `dry_run = false`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sing.config import ConfigError

# XIDs that mean the GPU needs a reset or service (NVIDIA's XID catalogue): 48 double-bit ECC,
# 63/64 row remapping event/failure, 74 NVLink error, 79 fallen off the bus, 92 high single-bit
# ECC rate, 94/95 contained/uncontained ECC error.
DEFAULT_DRAIN_XIDS = {code: 1 for code in ("48", "64", "74", "79", "92", "95")}


@dataclass(frozen=True)
class HealthSettings:
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

    def __post_init__(self) -> None:
        if self.drain_window_hours <= 0:
            raise ConfigError(
                f"[health] drain_window_hours = {self.drain_window_hours} must be > 0"
            )
        if self.drain_ecc_uncorrected < 0 or self.drain_link_downed < 0:
            raise ConfigError("[health] drain_ecc_uncorrected and drain_link_downed must be >= 0")
        for code, count in self.drain_xid.items():
            if not code.isdigit() or count < 0:
                raise ConfigError(
                    f"[health] drain_xid: {code!r} = {count!r}; use XID numbers -> counts >= 0, "
                    'e.g. drain_xid = {"79" = 1}'
                )
