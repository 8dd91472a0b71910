"""The whole exporter against fixture trees and a fake NVML, compared with a golden /metrics page.

Like node_exporter's e2e test: one exact comparison catches names, labels, units and help text.
The fixture node (tests/fixtures/exporter/node.yaml) exercises x4 InfiniBand data words, 64-bit
counters_ext, a saturated 32-bit counter, mW->W, mJ->J, KiB->bytes summed over NVLinks,
NOT_SUPPORTED, a lost GPU, no permission, cgroup v1 and v2 job ids, an
environment-only job id, and both disagreements between processes and allocations; the jobs'
cgroup v2 directories (job id and SLUID named, usec -> s, a file that does not parse); and the
health readings: ECC volatile and aggregate, retired pages (a GPU before Ampere), row remapping
(pending, failed; unsupported under MIG), the clock event (throttle) reason mask (through both
names of NVML's call), PCIe replays, NVLink error totals, InfiniBand port states and error
counters.
Regenerate after an intended change with SING_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sing.exporters.node import NodeCollector, node_registry
from sing.testing.fake_nvml import FakeNvml, load_description

FIXTURES = Path(__file__).parent / "fixtures" / "exporter"
GOLDEN = FIXTURES / "golden.prom"
NOW = 1_800_000_000.0


def fixture_registry(nvml, fixtures: Path = FIXTURES, **options) -> CollectorRegistry:
    """The exporter's registry over the fixture trees, no caching; `options` to NodeCollector."""
    collector = NodeCollector(
        nvml,
        str(fixtures / "sys"),
        str(fixtures / "proc"),
        str(fixtures / "gpu-jobs"),
        0.0,
        wall_clock=nvml.clock,
        **options,
    )
    return node_registry(collector, process_metrics=False)


def scrape(nvml, fixtures: Path = FIXTURES, health: bool = True) -> str:
    return generate_latest(fixture_registry(nvml, fixtures, health=health)).decode()


@pytest.fixture(scope="module")
def page() -> str:
    return scrape(FakeNvml(load_description(FIXTURES / "node.yaml"), clock=lambda: NOW))


def test_metrics_page_matches_golden(page: str) -> None:
    if os.environ.get("SING_UPDATE_GOLDEN"):
        GOLDEN.write_text(page)
    assert page == GOLDEN.read_text()


@pytest.mark.parametrize(
    "line",
    [
        # InfiniBand data counters are 4-byte words: 1000000 words -> 4e6 bytes
        'sing_rdma_transmit_bytes_total{device="mlx5_0",port="1"} 4e+06',
        'sing_rdma_receive_bytes_total{device="mlx5_0",port="1"} 1e+07',
        # counters_ext (64-bit) wins over the saturated 32-bit counters/: 1e10 words
        'sing_rdma_transmit_bytes_total{device="mlx5_1",port="1"} 4e+10',
        'sing_rdma_counter_saturated{counter="port_xmit_data",device="mlx5_1",port="1"} 0.0',
        # a 32-bit counters/ stuck at 2^32-1 with no 64-bit copy: unknown, flagged, left out
        'sing_rdma_counter_saturated{counter="port_xmit_data",device="mlx5_2",port="1"} 1.0',
        'sing_rdma_counter_saturated{counter="port_rcv_packets",device="mlx5_2",port="1"} 1.0',
        'sing_rdma_counter_saturated{counter="port_rcv_data",device="mlx5_2",port="1"} 0.0',
        'sing_rdma_receive_bytes_total{device="mlx5_2",port="1"} 493824.0',
        'sing_rdma_link_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10',
        # NVML's 312345 mW and 123456789 mJ; the lost GPU fails once at start, once per scrape
        'sing_gpu_power_watts{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 312.345',
        'sing_gpu_energy_joules_total{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} '
        "123456.789",
        # NVLink fields count KiB per link: link 3 alone sent 10 KiB, four links got 5 KiB each
        'sing_gpu_nvlink_transmit_bytes_total{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"}'
        " 10240.0",
        'sing_gpu_nvlink_receive_bytes_total{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"}'
        " 20480.0",
        'sing_gpu_nvlink_links{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 4.0',
        'sing_gpu_xid_errors_total{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000",xid="79"}'
        " 2.0",
        # cgroup v1, cgroup v2 (over a disagreeing SLURM_JOB_ID), environ only, allocation only
        'sing_gpu_job_info{gpu="0",job_id="1001",user="alice",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.0',  # noqa: E501
        'sing_gpu_job_info{gpu="1",job_id="2002",user="bob",uuid="GPU-11111111-1111-1111-1111-111111111111"} 1.0',  # noqa: E501
        'sing_gpu_job_info{gpu="4",job_id="4004",user="root",uuid="GPU-44444444-4444-4444-4444-444444444444"} 1.0',  # noqa: E501
        'sing_gpu_job_mismatch{case="allocation_without_process",gpu="2",job_id="3003",uuid="GPU-22222222-2222-2222-2222-222222222222"} 1.0',  # noqa: E501
        'sing_gpu_unattributed_processes{gpu="1",uuid="GPU-11111111-1111-1111-1111-111111111111"} 1.0',  # noqa: E501
        'sing_exporter_errors_total{kind="gpu_is_lost",source="nvml"} 2.0',
        'sing_exporter_errors_total{kind="no_permission",source="nvml"} 2.0',
        'sing_exporter_errors_total{kind="parse_error",source="rdma"} 1.0',
        # health: 3 ECC errors since the driver loaded, 12 over the GPU's life
        'sing_gpu_ecc_errors_total{counter="volatile",gpu="0",type="corrected",uuid="GPU-00000000-0000-0000-0000-000000000000"} 3.0',  # noqa: E501
        'sing_gpu_ecc_errors_total{counter="aggregate",gpu="0",type="corrected",uuid="GPU-00000000-0000-0000-0000-000000000000"} 12.0',  # noqa: E501
        'sing_gpu_ecc_errors_total{counter="aggregate",gpu="0",type="uncorrected",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.0',  # noqa: E501
        # nvmlDeviceGetRetiredPages lists 2 and 1 addresses; the pending status is ENABLED
        'sing_gpu_retired_pages{gpu="1",type="sbe",uuid="GPU-11111111-1111-1111-1111-111111111111"} 2.0',  # noqa: E501
        'sing_gpu_retired_pages{gpu="1",type="dbe",uuid="GPU-11111111-1111-1111-1111-111111111111"} 1.0',  # noqa: E501
        'sing_gpu_retired_pages_pending{gpu="1",uuid="GPU-11111111-1111-1111-1111-111111111111"} 1.0',  # noqa: E501
        'sing_gpu_row_remap_rows{gpu="0",type="correctable",uuid="GPU-00000000-0000-0000-0000-000000000000"} 3.0',  # noqa: E501
        'sing_gpu_row_remap_rows{gpu="0",type="uncorrectable",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.0',  # noqa: E501
        'sing_gpu_row_remap_pending{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.0',
        'sing_gpu_row_remap_failed{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.0',
        # NVML's mask 0xC0: hardware thermal and power brake; GPU 1 through the older name
        # the clock event mask as NVML gives it: hw thermal 0x40 + power brake 0x80; sw thermal
        'sing_gpu_clock_event_reasons{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 192.0',  # noqa: E501
        'sing_gpu_clock_event_reasons{gpu="1",uuid="GPU-11111111-1111-1111-1111-111111111111"} 32.0',  # noqa: E501
        'sing_gpu_pcie_replays_total{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 5.0',
        # NVML's total fields: CRC errors 1 + 2 on links 0 and 2, replays 4 on link 0
        'sing_gpu_nvlink_errors_total{gpu="0",type="crc",uuid="GPU-00000000-0000-0000-0000-000000000000"} 3.0',  # noqa: E501
        'sing_gpu_nvlink_errors_total{gpu="0",type="replay",uuid="GPU-00000000-0000-0000-0000-000000000000"} 4.0',  # noqa: E501
        'sing_gpu_nvlink_errors_total{gpu="0",type="recovery",uuid="GPU-00000000-0000-0000-0000-000000000000"} 0.0',  # noqa: E501
        # InfiniBand: "4: ACTIVE"/"5: LinkUp" and "1: DOWN"/"3: Disabled", and error counters
        'sing_rdma_link_state{device="mlx5_0",port="1"} 4.0',
        'sing_rdma_physical_state{device="mlx5_0",port="1"} 5.0',
        'sing_rdma_link_state{device="mlx5_1",port="1"} 1.0',
        'sing_rdma_physical_state{device="mlx5_1",port="1"} 3.0',
        'sing_rdma_port_errors_total{counter="link_downed",device="mlx5_0",port="1"} 1.0',
        'sing_rdma_port_errors_total{counter="link_error_recovery",device="mlx5_0",port="1"} 2.0',
        'sing_rdma_port_errors_total{counter="symbol_error",device="mlx5_0",port="1"} 7.0',
        'sing_rdma_port_errors_total{counter="port_rcv_errors",device="mlx5_0",port="1"} 3.0',
        # retired pages on 3 Hopper GPUs; GPU 1's row remapper; GPU 2's ECC aggregate, row
        # remapper, throttle reasons and PCIe replays; the 3 of before (power, ECC, minor)
        'sing_exporter_errors_total{kind="not_supported",source="nvml"} 11.0',
        # job 2002's cgroup: cpu.stat in usec, io.stat's two devices summed, a run's SLUID
        'cgroup_cpu_total_seconds{jobid="2002"} 7388.123456',
        'cgroup_io_read_bytes_total{jobid="2002"} 3.145728e+06',
        'cgroup_memory_max_used_bytes{jobid="2002"} 8.589934592e+09',
        'cgroup_cpu_total_seconds{jobid="5005",sluid="s4T9M8MZXRX000"} 1.5',
        'sing_exporter_errors_total{kind="unknown_sluid",source="cgroups"} 1.0',
    ],
)
def test_hand_checked_lines(page: str, line: str) -> None:
    assert line + "\n" in page


def test_failed_readings_are_left_out(page: str) -> None:
    assert 'uuid="GPU-33333333' not in page  # the lost GPU has no series at all
    assert 'sing_gpu_power_watts{gpu="2"' not in page  # NOT_SUPPORTED
    assert 'sing_gpu_ecc_errors_total{gpu="2"' not in page
    assert 'sing_gpu_energy_joules_total{gpu="4"' not in page  # NO_PERMISSION
    assert 'sing_gpu_info{gpu="2",minor="",' in page  # no minor number, still inventoried
    assert 'sing_rdma_transmit_packets_total{device="mlx5_1"' not in page  # "N/A"
    assert 'sing_rdma_transmit_packets_total{device="mlx5_2"' not in page  # "N/A (no PMA)"
    assert 'sing_rdma_transmit_bytes_total{device="mlx5_2"' not in page  # saturated: unknown
    assert 'sing_rdma_receive_packets_total{device="mlx5_2"' not in page
    assert 'counter="lifespan"' not in page  # a setting, not a counter
    # health readings that failed are absent, never 0
    assert 'sing_gpu_retired_pages{gpu="0"' not in page  # NOT_SUPPORTED after Volta/Turing
    assert 'sing_gpu_retired_pages_pending{gpu="0"' not in page
    assert 'sing_gpu_row_remap_rows{gpu="1"' not in page  # no row remapper before Ampere
    assert 'sing_gpu_row_remap_rows{gpu="2"' not in page  # MIG
    assert 'sing_gpu_row_remap_failed{gpu="4"' not in page  # NO_PERMISSION
    assert 'sing_gpu_ecc_errors_total{counter="aggregate",gpu="2"' not in page
    assert 'sing_gpu_clock_event_reasons{gpu="2"' not in page
    assert 'sing_gpu_pcie_replays_total{gpu="2"' not in page
    assert 'sing_gpu_nvlink_errors_total{gpu="1"' not in page  # no NVLink: not even asked
    assert 'kind="function_not_found"' not in page  # the older name answered instead


def test_health_readings_can_be_turned_off() -> None:
    """`[exporter] health = false`: none of the health families, the rest unchanged."""
    text = scrape(
        FakeNvml(load_description(FIXTURES / "node.yaml"), clock=lambda: NOW), health=False
    )
    for family in (
        "sing_gpu_retired_pages",
        "sing_gpu_row_remap",
        "sing_gpu_clock_event_reasons",
        "sing_gpu_pcie_replays",
        "sing_gpu_nvlink_errors",
        'counter="aggregate"',
    ):
        assert family not in text
    assert 'sing_exporter_errors_total{kind="not_supported",source="nvml"} 3.0' in text
    for line in (  # XIDs, volatile ECC and the InfiniBand port health are always read
        'sing_gpu_xid_errors_total{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000",xid="79"}'
        " 2.0",
        'sing_gpu_ecc_errors_total{counter="volatile",gpu="0",type="corrected",uuid="GPU-00000000-0000-0000-0000-000000000000"} 3.0',  # noqa: E501
        'sing_rdma_port_errors_total{counter="link_downed",device="mlx5_0",port="1"} 1.0',
    ):
        assert line + "\n" in text


def test_cgroup_reading_can_be_turned_off() -> None:
    """`[exporter] cgroups = false`: no job cgroup series, nothing of them counted."""
    nvml = FakeNvml(load_description(FIXTURES / "node.yaml"), clock=lambda: NOW)
    text = generate_latest(fixture_registry(nvml, cgroups=False)).decode()
    assert "cgroup_" not in text and 'source="cgroups"' not in text
    assert 'sing_gpu_job_info{gpu="1",job_id="2002"' in text


def test_process_without_allocation_is_flagged(page: str) -> None:
    assert 'sing_gpu_job_mismatch{case="process_without_allocation",gpu="4",job_id="4004",' in page


def test_without_mapping_dir_nothing_is_called_a_mismatch(tmp_path: Path) -> None:
    nvml = FakeNvml(load_description(FIXTURES / "node.yaml"), clock=lambda: NOW)
    collector = NodeCollector(
        nvml,
        str(FIXTURES / "sys"),
        str(FIXTURES / "proc"),
        str(tmp_path / "absent"),
        0.0,
        wall_clock=nvml.clock,
    )
    text = generate_latest(node_registry(collector, process_metrics=False)).decode()
    assert "sing_gpu_job_mismatch" not in text
    assert 'job_id="1001"' in text  # processes still attribute


def test_exporter_keeps_serving_when_nvml_is_gone(tmp_path: Path) -> None:
    """No driver: GPU series vanish, RDMA still served, the failure counted, next scrape retried."""

    class NoDriver:
        def nvmlInit(self):  # noqa: N802
            import pynvml

            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    collector = NodeCollector(NoDriver(), str(FIXTURES / "sys"), str(tmp_path), str(tmp_path), 0.0)
    registry = node_registry(collector, process_metrics=False)
    generate_latest(registry)
    text = generate_latest(registry).decode()
    assert "sing_gpu_" not in text
    assert 'sing_rdma_transmit_bytes_total{device="mlx5_0",port="1"} 4e+06' in text
    assert 'sing_exporter_errors_total{kind="driver_not_loaded",source="nvml"} 2.0' in text


class CountingNvml:
    """The fake NVML, counting the calls made of it by name."""

    def __init__(self, nvml: FakeNvml) -> None:
        self.nvml = nvml
        self.clock = nvml.clock
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        attr = getattr(self.nvml, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


@pytest.mark.parametrize(("refresh_s", "remap_calls"), [(60.0, [4, 4, 4]), (0.0, [4, 8, 12])])
def test_inforom_health_counts_are_read_once_per_refresh(
    refresh_s: float, remap_calls: list[int]
) -> None:
    """Three scrapes in a row: the row remapping counts are asked of each GPU that answers
    (0, 1, 2 and 4; 3 fell off the bus) once within `health_refresh_s`, and every scrape still
    shows them; the clock event reasons are asked every scrape."""
    nvml = CountingNvml(FakeNvml(load_description(FIXTURES / "node.yaml"), clock=lambda: NOW))
    registry = fixture_registry(nvml, health_refresh_s=refresh_s)
    pages, calls = [], []
    for _ in range(3):
        pages.append(generate_latest(registry).decode())
        calls.append(collections.Counter(nvml.calls))
    assert [c["nvmlDeviceGetRemappedRows"] for c in calls] == remap_calls
    assert [c["nvmlDeviceGetCurrentClocksEventReasons"] for c in calls] == [4, 8, 12]
    for page in pages:
        assert 'sing_gpu_row_remap_failed{gpu="0"' in page
        assert 'counter="aggregate",gpu="0",type="uncorrected"' in page
