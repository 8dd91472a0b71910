"""dcgm-exporter's series across DCGM 3.x to 4.6: every name a field has had, its unit, and what
sing makes of it. The one table (ending with the series of sing/signals.py's registered signals);
sing/collector/convert.py (columns) and sing/collector/health.py (signals) are built from it,
and docs/collector.md shows it (`markdown_table`).

dcgm-exporter names each series after the DCGM field its CSV lists (etc/default-counters.csv),
so a field's series name is the DCGM name the site's CSV uses. DCGM 4.6.0 renamed many fields
(dcgmlib/dcgm_fields.h, "Deprecated: renamed per DCGM Field Naming Standard"); the old names stay
as aliases of the same field id, so a site may run either, and both are read here. A rename
keeps the field's id, type and unit: DCGM_FI_DEV_GPU_UTIL_RATIO is field 203, an integer
percent, despite its name (dcgmlib/src/dcgm_fields.cpp: DCGM_FT_INT64, 0-100).
"""

from __future__ import annotations

from dataclasses import dataclass

from sing.signals import GPU_SIGNALS

MIB = 1024 * 1024


@dataclass(frozen=True)
class DcgmField:
    """One DCGM field as dcgm-exporter exports it."""

    names: tuple[str, ...]  # series names, the pre-4.6 one first; every one is read
    unit: str  # as DCGM defines the value
    factor: float  # value x factor = SI
    kind: str  # "column" (gpu_samples), "signal" (health), "throttle_mask", "xid_count", "unread"
    target: str  # the column or signal; "" for unread fields
    note: str = ""


DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"),
        "%",
        0.01,
        "column",
        "util",
        "renamed in DCGM 4.6.0 and still a percent (field 203, INT64)",
    ),
    DcgmField(
        ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"),
        "ratio",
        1.0,
        "column",
        "sm_active",
    ),
    DcgmField(("DCGM_FI_DEV_FB_USED",), "MiB", MIB, "column", "mem_used_bytes"),
    DcgmField(
        ("DCGM_FI_DEV_FB_FREE",),
        "MiB",
        MIB,
        "column",
        "_mem_free_bytes",
        "mem_total_bytes = used + free + reserved",
    ),
    DcgmField(("DCGM_FI_DEV_FB_RESERVED",), "MiB", MIB, "column", "_mem_reserved_bytes"),
    DcgmField(
        ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"), "W", 1.0, "column", "power_w"
    ),
    DcgmField(
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),
        "mJ",
        1e-3,
        "column",
        "energy_j",
        "not renamed in DCGM 4.6.0: no joules-named energy field exists there",
    ),
    DcgmField(
        ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"), "°C", 1.0, "column", "temp_c"
    ),
    DcgmField(("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), "count", 1.0, "signal", "ecc_corrected_volatile"),
    DcgmField(
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "count", 1.0, "signal", "ecc_uncorrected_volatile"
    ),
    DcgmField(
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",), "count", 1.0, "signal", "ecc_corrected_aggregate"
    ),
    DcgmField(
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",), "count", 1.0, "signal", "ecc_uncorrected_aggregate"
    ),
    DcgmField(
        ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL"),
        "pages",
        1.0,
        "signal",
        "retired_pages_sbe",
    ),
    DcgmField(
        ("DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL"),
        "pages",
        1.0,
        "signal",
        "retired_pages_dbe",
    ),
    DcgmField(
        ("DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PAGE_RETIRED_PENDING"),
        "flag",
        1.0,
        "signal",
        "retired_pages_pending",
    ),
    DcgmField(
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"),
        "rows",
        1.0,
        "signal",
        "row_remap_correctable",
    ),
    DcgmField(
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
        "rows",
        1.0,
        "signal",
        "row_remap_uncorrectable",
    ),
    DcgmField(("DCGM_FI_DEV_ROW_REMAP_PENDING",), "flag", 1.0, "signal", "row_remap_pending"),
    DcgmField(
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
        "flag",
        1.0,
        "signal",
        "row_remap_failed",
    ),
    DcgmField(
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
        "count",
        1.0,
        "signal",
        "pcie_replays",
    ),
    DcgmField(
        (
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
        ),
        "count",
        1.0,
        "signal",
        "nvlink_crc_errors",
    ),
    DcgmField(
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL"),
        "count",
        1.0,
        "signal",
        "nvlink_replay_errors",
    ),
    DcgmField(
        (
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
        ),
        "count",
        1.0,
        "signal",
        "nvlink_recovery_errors",
    ),
    DcgmField(
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        "bitmask",
        1.0,
        "throttle_mask",
        "throttle_*",
        "CLOCKS_EVENT_REASONS since DCGM 4.0; the old name is its alias",
    ),
    DcgmField(
        ("DCGM_EXP_XID_ERRORS_COUNT",),
        "count in the last window",
        1.0,
        "xid_count",
        "xid_<code>",
        "dcgm-exporter's own series `{xid, window_size_in_ms}` since 3.3.5-3.4.0 (January 2024); "
        "a count over a sliding window, not since start",
    ),
    DcgmField(
        ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"),
        "last XID code",
        1.0,
        "unread",
        "",
        "the last XID seen, not a count",
    ),
    DcgmField(
        (
            "DCGM_FI_DEV_POWER_VIOLATION",
            "DCGM_FI_DEV_THERMAL_VIOLATION",
            "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
            "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
            "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
            "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        ),
        "ns",
        1e-9,
        "unread",
        "",
        "always ns (dcgm_fields.h); the CSV help said 'in us' until 4.4.2-4.7.1 (a text fix, "
        "not a unit change)",
    ),
)


# The registered signals' dcgm-exporter series (sing/signals.py), after the fields above.
DCGM_FIELDS += tuple(
    DcgmField(s.dcgm_names, s.dcgm_unit, s.dcgm_to_si, "column", s.key, "sing/signals.py")
    for s in GPU_SIGNALS
    if s.dcgm_names
)


def names(kind: str) -> dict[str, DcgmField]:
    """Every series name of the fields of one kind -> its field."""
    return {name: f for f in DCGM_FIELDS if f.kind == kind for name in f.names}


def markdown_table() -> str:
    """The table as docs/collector.md shows it."""
    lines = ["| series (the older name first) | unit | sing stores | note |", "|---|---|---|---|"]
    for f in DCGM_FIELDS:
        series = ", ".join(f"`{name}`" for name in f.names)
        if not f.target:
            stored = "-"
        elif f.target.startswith("_"):  # a helper column, folded into mem_total_bytes
            stored = "`mem_total_bytes`"
        else:
            stored = f"`{f.target}`"
        lines.append(f"| {series} | {f.unit} | {stored} | {f.note} |")
    return "\n".join(lines) + "\n"
