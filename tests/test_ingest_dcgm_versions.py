"""dcgm-exporter across versions: sing/collector/dcgm_fields.py's names and units checked against
the real CSVs of NVIDIA/dcgm-exporter (3.1.8 to 4.5.3-4.8.2) and DCGM 4.6.0's renames, and pages
under old and new names read to the same SI values.

Pages are laid out as dcgm-exporter's template writes them (internal/pkg/rendermetrics/
render_metrics.go: gpu, UUID, pci_bus_id, device, modelName, then Hostname - `hostname` since
commit d5e5f510 - then the transformers' labels such as hpc_job).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sing.collector.convert import WANTED, read_node
from sing.collector.dcgm_fields import DCGM_FIELDS, markdown_table, names
from sing.collector.promtext import parse

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"
ROOT = Path(__file__).parent.parent
CSVS = sorted(FIXTURES.glob("*.csv"))
# (the CSV help's unit, the table's unit) that mean the same. Older CSVs say "MB" for the
# framebuffer: DCGM divides NVML's bytes by 1024 * 1024 (dcgmlib/src/DcgmCacheManager.cpp,
# ReadAndCacheFBMemoryInfo), so it is MiB.
SAME_UNIT = {
    ("%", "%"),
    ("MB", "MiB"),
    ("MiB", "MiB"),
    ("W", "W"),
    ("mJ", "mJ"),
    ("C", "°C"),
    ("ns", "ns"),
}


def csv_fields(path: Path) -> dict[str, str]:
    """Every field a dcgm-exporter CSV lists, enabled or commented out -> its help text."""
    fields = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^#?\s*((?:DCGM_FI|DCGM_EXP)_[A-Z0-9_]+)\s*,\s*\w+\s*,\s*(.*)$", line)
        if match:
            fields[match[1]] = match[2]
    return fields


def exporter_version(csv: Path) -> tuple[int, ...]:
    """dcgm-exporter's own version from a fixture's tag, e.g. 4.4.2-4.7.0 -> (4, 7, 0)."""
    tag = re.search(r"-(\d+)\.(\d+)\.(\d+)$", csv.stem)
    assert tag, csv
    return tuple(int(part) for part in tag.groups())


def renames() -> dict[str, str]:
    """DCGM 4.6.0's `#define OLD NEW` aliases."""
    text = (FIXTURES / "dcgm_fields-4.6.0-renames.h").read_text()
    return dict(re.findall(r"^#define (DCGM_FI_\w+)\s+(DCGM_FI_\w+)", text, re.M))


@pytest.mark.parametrize("csv", CSVS, ids=lambda p: p.stem)
def test_every_field_sing_knows_in_a_real_csv_is_read_with_the_csv_unit(csv: Path) -> None:
    by_name = {name: f for f in DCGM_FIELDS for name in f.names}
    known = {name: help for name, help in csv_fields(csv).items() if name in by_name}
    assert len(known) >= 15  # the CSV lists most of what sing reads
    for name, help in known.items():
        field = by_name[name]
        assert field.kind == "unread" or name in WANTED
        unit = re.search(r"\(in ([^)]+)\)", help)
        if unit is None:
            continue
        if field.unit == "ns" and unit[1] == "us":
            # the help text said "us" until 4.4.2-4.7.1 (commit e61056b9, a help-text fix)
            assert exporter_version(csv) < (4, 7, 1)
            continue
        assert (unit[1], field.unit) in SAME_UNIT, name


def test_names_sing_reads_are_dcgm_4_6_renames_of_each_other() -> None:
    alias = renames()
    for field in DCGM_FIELDS:
        if field.kind == "unread" and len(field.names) > 2:
            continue  # the violation fields: six fields, not one renamed
        old, *new = field.names
        if old.startswith("DCGM_EXP_"):
            continue  # dcgm-exporter's own series, not a DCGM field
        assert [alias[old]] == new if new else old not in alias, old


def test_violation_fields_are_ns_in_dcgm() -> None:
    text = (FIXTURES / "dcgm_fields-4.6.0-renames.h").read_text()
    assert "Power Violation time in ns" in text and "Thermal Violation time in ns" in text
    (violations,) = [f for f in DCGM_FIELDS if "DCGM_FI_DEV_POWER_VIOLATION" in f.names]
    assert (violations.unit, violations.factor) == ("ns", 1e-9)


def test_xid_count_series_exists_since_3_3_5() -> None:
    by_tag = {p.stem: "DCGM_EXP_XID_ERRORS_COUNT" in csv_fields(p) for p in CSVS}
    assert by_tag["default-counters-3.1.8-3.1.5"] is False
    assert by_tag["default-counters-3.3.5-3.4.0"] is True


def page(names_by_column: dict[str, str], host_label: str, job: str = "") -> str:
    """One GPU's page: used 1024, free 80000, reserved 512 MiB, 250.5 W, 7500 mJ, 87 %, 61 C."""
    values = {
        "util": 87,
        "sm_active": 0.61,
        "mem_used_bytes": 1024,
        "_mem_free_bytes": 80000,
        "_mem_reserved_bytes": 512,
        "power_w": 250.5,
        "energy_j": 7500,
        "temp_c": 61,
    }
    labels = (
        'gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:3B:00.0",'
        f'device="nvidia0",modelName="NVIDIA L4",{host_label}="n1"'
    )
    if job:
        labels += f',hpc_job="{job}"'
    return "".join(f"{names_by_column[c]}{{{labels}}} {v}\n" for c, v in values.items())


OLD = {f.target: f.names[0] for f in DCGM_FIELDS if f.kind == "column"}
NEW = {f.target: f.names[-1] for f in DCGM_FIELDS if f.kind == "column"}
MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("names_by_column", "host_label"),
    [(OLD, "Hostname"), (NEW, "Hostname"), (OLD, "hostname"), (NEW, "hostname")],
)
def test_old_and_new_names_and_host_labels_read_the_same(names_by_column, host_label) -> None:
    reading = read_node(parse(page(names_by_column, host_label), WANTED))
    assert reading.gpus[0] == {
        "gpu_uuid": "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",
        "util": 0.87,  # percent under both names
        "sm_active": 0.61,
        "mem_used_bytes": 1024 * MIB,
        "mem_total_bytes": (1024 + 80000 + 512) * MIB,
        "power_w": 250.5,
        "energy_j": 7.5,
        "temp_c": 61,
    }
    assert reading.models == {0: "NVIDIA L4"}


@pytest.mark.parametrize("order", [("10", "9"), ("9", "10")])
def test_shared_gpu_is_stamped_with_the_lowest_job_in_either_order(order) -> None:
    # dcgm-exporter's hpc mapper repeats each series once per job in the GPU's mapping file
    text = "".join(page(OLD, "Hostname", job) for job in order)
    assert read_node(parse(text, WANTED)).jobs == {0: "9"}


def test_windowed_xid_counts_and_clock_event_reasons_are_health_signals() -> None:
    uuid0, uuid1 = "GPU-a", "GPU-b"
    text = f"""\
DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="{uuid0}",device="nvidia0",modelName="L4",hostname="n1",window_size_in_ms="300000",xid="79"}} 2
DCGM_EXP_XID_ERRORS_COUNT{{gpu="1",UUID="{uuid1}",device="nvidia1",modelName="L4",hostname="n1",window_size_in_ms="300000"}} 0
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu="1",UUID="{uuid1}",device="nvidia1",modelName="L4",hostname="n1"}} 72
DCGM_FI_DEV_ROW_REMAP_FAILED{{gpu="1",UUID="{uuid1}",device="nvidia1",modelName="L4",hostname="n1"}} 1
DCGM_FI_DEV_ROW_REMAP_FAILURE{{gpu="0",UUID="{uuid0}",device="nvidia0",modelName="L4",hostname="n1"}} 0
"""  # noqa: E501
    health = read_node(parse(text, WANTED)).health
    assert health == {
        ("gpu", "0", uuid0, "xid_79"): 2.0,
        ("gpu", "0", uuid0, "row_remap_failed"): 0.0,
        ("gpu", "1", uuid1, "row_remap_failed"): 1.0,
        # 72 = 0x40 HW thermal + 0x8 HW slowdown
        ("gpu", "1", uuid1, "throttle_hw_slowdown"): 1.0,
        ("gpu", "1", uuid1, "throttle_sw_thermal"): 0.0,
        ("gpu", "1", uuid1, "throttle_hw_thermal"): 1.0,
        ("gpu", "1", uuid1, "throttle_hw_power_brake"): 0.0,
    }


def test_every_table_name_is_wanted_or_marked_unread() -> None:
    for kind in ("column", "signal", "throttle_mask", "xid_count"):
        assert set(names(kind)) <= WANTED
    assert not set(names("unread")) & WANTED


def test_docs_show_the_table() -> None:
    assert markdown_table() in (ROOT / "docs" / "collector.md").read_text()
