"""Real dcgm-exporter pages (tests/fixtures/dcgm/pages/, an L4, a T4 and an A100 in MIG mode)
through sing's collector path: the text parser, then the conversion to warehouse columns in SI
units. Each expected value is read from the page text by hand, the conversion written out beside
it (MiB x 1024^2, mJ / 1000, % / 100).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sing.collector.convert import WANTED, read_node
from sing.collector.promtext import parse

PAGES = Path(__file__).parent / "fixtures" / "dcgm" / "pages"
MIB = 1024 * 1024


def read(name: str):
    return read_node(parse((PAGES / name).read_text(), WANTED))


def test_l4_idle_page_in_si_units() -> None:
    reading = read("l4-driver-580.105.08.txt")
    uuid = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert reading.gpus == {
        0: {
            "gpu_uuid": uuid,
            "util": 0.0,  # DCGM_FI_DEV_GPU_UTIL 0
            "mem_util": 0.0,  # DCGM_FI_DEV_MEM_COPY_UTIL 0
            "mem_used_bytes": 0,  # DCGM_FI_DEV_FB_USED 0
            "mem_total_bytes": (0 + 22563 + 470) * MIB,  # used + FB_FREE + FB_RESERVED
            "power_w": pytest.approx(16.365),  # DCGM_FI_DEV_POWER_USAGE 16.365000
            "energy_j": pytest.approx(4742.776),  # TOTAL_ENERGY_CONSUMPTION 4742776 mJ
            "temp_c": 31.0,  # DCGM_FI_DEV_GPU_TEMP 31
        }
    }
    assert reading.models == {0: "NVIDIA L4"}
    assert reading.jobs == {}  # no hpc_job label
    assert reading.health == {
        ("gpu", "0", uuid, "pcie_replays"): 0.0,
        ("gpu", "0", uuid, "row_remap_uncorrectable"): 0.0,
        ("gpu", "0", uuid, "row_remap_correctable"): 0.0,
        ("gpu", "0", uuid, "row_remap_failed"): 0.0,
    }  # no XID series on this page (DCGM_EXP_XID_ERRORS_COUNT not enabled)
    assert reading.hardware().gpus == 1
    assert reading.hardware().memory_bytes == 23033 * MIB  # an L4's 24 GB


def test_t4_page_under_load_in_si_units() -> None:
    reading = read("t4-driver-590.48.01.txt")
    uuid = "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"
    assert reading.gpus == {
        0: {
            "gpu_uuid": uuid,
            "util": pytest.approx(0.91),  # DCGM_FI_DEV_GPU_UTIL 91
            "mem_util": pytest.approx(0.73),  # DCGM_FI_DEV_MEM_COPY_UTIL 73
            "mem_used_bytes": 5120 * MIB,  # DCGM_FI_DEV_FB_USED 5120
            "mem_total_bytes": (5120 + 9791 + 447) * MIB,  # used + free + reserved: 15358 MiB
            "power_w": pytest.approx(68.244),
            "energy_j": pytest.approx(15_152_422.938),  # 15152422938 mJ
            "temp_c": 74.0,
        }
    }
    assert reading.models == {0: "Tesla T4"}
    assert reading.health == {("gpu", "0", uuid, "pcie_replays"): 0.0}


MIG_PAGE = "a100-mig-driver-520.56.06.txt"


def test_a100_mig_page_gives_the_physical_gpu_its_whole_card_values() -> None:
    """Every series of a GPU in MIG mode carries GPU_I_ID (dcgm-exporter watches the instances,
    not the GPU). The card's own values, which each instance repeats (power, energy,
    temperature), make the physical GPU's row; an instance's memory is its share, left out
    (docs/collector.md). DCGM_FI_DEV_XID_ERRORS, the last XID, is not read."""
    text = (PAGES / MIG_PAGE).read_text()
    assert not text.endswith("\n")  # as captured
    samples = parse(text, WANTED)
    assert len(samples) == 6 * 3  # FB_FREE/USED, GPU_TEMP, POWER, ENERGY, PCIE_REPLAY x 3 instances
    assert {s.labels["GPU_I_PROFILE"] for s in samples} == {"1g.5gb", "2g.10gb"}
    reading = read_node(samples)
    assert reading.gpus == {
        0: {
            "gpu_uuid": "GPU-7099682b-a20d-2bcc-74ab-b9060454d81e",
            "power_w": pytest.approx(116.163),  # the last instance's reading (2g.10gb, id 5)
            "energy_j": pytest.approx(57_585.599),  # 57585599 mJ
            "temp_c": 37.0,
        }
    }
    assert reading.models == {0: "NVIDIA A100-SXM4-40GB"}


def test_a100_mig_page_still_names_the_gpu_for_the_inventory() -> None:
    hardware = read(MIG_PAGE).hardware()
    assert hardware is not None
    assert (hardware.gpus, hardware.model) == (1, "NVIDIA A100-SXM4-40GB")
