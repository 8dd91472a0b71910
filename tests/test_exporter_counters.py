"""The exporter's readings in the cases real hardware produces, against the scripted fake.

Several scrapers on one exporter, NVLink traffic on any link, InfiniBand counter layouts and
saturated 32-bit counters, a driver reload resetting the energy counter, and a node scripted to
known values end to end. Time is a hand-moved clock, so every expected value is exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from sing.exporters.errors import ErrorCounter
from sing.exporters.gpu import GpuSource
from sing.testing.fake_nvml import FakeNvml, StateFile, load_description
from tests.test_exporter_fake import Clock, sample, world_registry
from tests.test_exporter_golden import FIXTURES, NOW

ROOT = Path(__file__).resolve().parents[1]


def one_gpu(**values: Any) -> dict[str, Any]:
    return {"count": 1, "defaults": {"uuid": "GPU-0", **values}}


def world_page(description: dict[str, Any], clock: Clock, root: Path, state=None):
    """A registry reading a fake node and its fake sysfs/procfs tree, on the hand clock."""
    registry, _ = world_registry(FakeNvml(description, state, node="n1", clock=clock), root, clock)
    return lambda: generate_latest(registry).decode()


# -- 1. utilisation and SM activity cover the exporter's window, whoever scrapes ---------------

SQUARE = {"pattern": "square", "min": 0.0, "max": 1.0, "period_s": 20, "phase_s": 0}
RAMP = {"pattern": "ramp", "min": 0.0, "max": 1.0, "period_s": 30, "phase_s": 0}


def scrape_run(with_second_scraper: bool) -> dict[int, tuple[float, float]]:
    """Scraper A every 15 s, and optionally B every 4 s; A's (util, sm) by second."""
    clock = Clock()
    source = GpuSource(
        FakeNvml(one_gpu(util=SQUARE, sm_active=RAMP), clock=clock), ErrorCounter(), clock
    )
    seen = {}
    for t in range(61):
        clock.t = NOW + t
        source.sample_activity()  # what the sampling thread does on its clock
        if with_second_scraper and t % 4 == 1:
            source.read()
        if t % 15 == 0:
            values = source.read().gpus[0].values
            seen[t] = (values["util"], values["sm_active"])
    return seen


def test_utilisation_and_sm_activity_do_not_depend_on_who_scrapes() -> None:
    alone, together = scrape_run(False), scrape_run(True)
    assert together == alone
    for t in (15, 30, 45, 60):  # the fake driver samples once a second: 15 samples a window
        window = range(t - 14, t + 1)
        util = sum(1.0 if k % 20 < 10 else 0.0 for k in window) / 15  # the square wave
        sm = sum((k % 30) / 30 for k in window) / 15  # the ramp, over the GPM samples' window
        assert alone[t] == (pytest.approx(util), pytest.approx(sm))
    assert alone[0] == (1.0, 0.0)  # at start: the one sample so far, and the activity now


# -- 2. NVLink: every link counts --------------------------------------------------------------


def test_nvlink_totals_sum_every_link() -> None:
    clock = Clock()
    nvml = FakeNvml(
        one_gpu(nvlinks=4, nvlink_tx_bytes_per_s=[0, 0, 0, 1.0e9], nvlink_rx_bytes_per_s=4.0e9),
        clock=clock,
    )
    source = GpuSource(nvml, ErrorCounter(), clock)
    before = source.read().gpus[0].values
    clock.t += 10
    after = source.read().gpus[0].values
    assert after["nvlinks"] == 4
    assert after["nvlink_tx_bytes"] - before["nvlink_tx_bytes"] == 1.0e10  # link 3 alone
    assert after["nvlink_rx_bytes"] - before["nvlink_rx_bytes"] == 4.0e10  # 1 GB/s per link


def test_gpu_without_nvlink_has_no_nvlink_series_and_no_errors() -> None:
    """No NVLink is a capability: only the readings that failed as a whole are counted."""
    clock = Clock()
    errors = ErrorCounter()
    source = GpuSource(
        FakeNvml(one_gpu(pcie_tx_bytes=0, pcie_rx_bytes=0), clock=clock), errors, clock
    )
    reading = source.read().gpus[0]
    assert reading.values["pcie_tx_bytes"] == 0
    assert not {"nvlinks", "nvlink_tx_bytes"} & reading.values.keys()
    assert sum(s.value for s in errors.metric().samples) == len(reading.errors)


def test_the_fake_imports_nothing_it_checks() -> None:
    code = (
        "import sys, sing.testing.fake_nvml, sing.testing.fake_world\n"
        "print(sorted(m for m in sys.modules if m in ('sing.exporters.gpu', 'sing.exporters.rdma',"
        " 'sing.exporters.jobs', 'sing.exporters.node')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


# -- 3. InfiniBand: the real layouts, and a 32-bit counter that saturates ----------------------


def test_rdma_layouts_and_saturated_32bit_counters(tmp_path: Path) -> None:
    clock = Clock()
    ports = {
        "mlx5_0/1": {"counters": "64bit", "tx_bytes_per_s": 1.0e9, "rx_bytes_per_s": 1.0e9},
        "mlx5_1/1": {"counters": "32bit", "tx_bytes_per_s": 1.0e9, "rx_bytes_per_s": 1.0e8},
        "mlx5_2/1": {"counters": "counters_ext", "tx_bytes_per_s": 1.0e9, "rx_bytes_per_s": 0},
    }
    page = world_page({"count": 0, "rdma": ports}, clock, tmp_path)
    page()
    clock.t += 10  # 1e10 bytes = 2.5e9 words: still under 2^32 - 1
    text = page()
    for device in ("mlx5_0", "mlx5_1", "mlx5_2"):
        assert sample(text, f'sing_rdma_transmit_bytes_total{{device="{device}",port="1"}}') == 1e10

    clock.t += 10  # 2e10 bytes = 5e9 words: past what 32 bits hold
    text = page()
    port = tmp_path / "sys/class/infiniband/mlx5_1/ports/1"
    assert (port / "counters/port_xmit_data").read_text() == f"{2**32 - 1}\n"
    assert (port / "hw_counters/out_of_buffer").exists()
    ext = tmp_path / "sys/class/infiniband/mlx5_2/ports/1/counters_ext/port_xmit_data_64"
    assert ext.read_text() == "5000000000\n"
    assert not (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters_ext").exists()

    assert sample(text, 'sing_rdma_transmit_bytes_total{device="mlx5_0",port="1"}') == 2e10
    assert sample(text, 'sing_rdma_transmit_bytes_total{device="mlx5_2",port="1"}') == 2e10
    assert 'sing_rdma_transmit_bytes_total{device="mlx5_1"' not in text  # unknown, not zero
    saturated = 'sing_rdma_counter_saturated{counter="%s",device="%s",port="1"}'
    assert sample(text, saturated % ("port_xmit_data", "mlx5_1")) == 1.0
    assert sample(text, saturated % ("port_rcv_data", "mlx5_1")) == 0.0
    assert sample(text, saturated % ("port_xmit_data", "mlx5_2")) == 0.0  # counters_ext wins
    assert sample(text, 'sing_rdma_receive_bytes_total{device="mlx5_1",port="1"}') == 2e9


# -- 4. energy: a driver reload resets NVML's counter ------------------------------------------


def test_driver_reload_resets_the_energy_counter(tmp_path: Path) -> None:
    state_path = tmp_path / "state.json"
    state_path.write_text("{}")
    clock = Clock()
    nvml = FakeNvml(one_gpu(power_w=300, energy_j=5.0e6), StateFile(state_path), clock=clock)
    source = GpuSource(nvml, ErrorCounter(), clock)
    assert source.read().gpus[0].values["energy_j"] == 5.0e6
    clock.t += 10
    assert source.read().gpus[0].values["energy_j"] == 5.0e6 + 3000
    state_path.write_text(json.dumps({"gpus": {"0": {"driver_loaded_at": NOW + 12}}}))
    os.utime(state_path, ns=(1, 2))
    clock.t += 10
    assert source.read().gpus[0].values["energy_j"] == 300 * 8  # mJ since the reload at 12 s
    clock.t += 10
    assert source.read().gpus[0].values["energy_j"] == 300 * 18


def test_a_reload_scripted_ahead_happens_when_its_time_passes() -> None:
    clock = Clock()
    nvml = FakeNvml(one_gpu(power_w=100, energy_j=1000, driver_loaded_at=NOW + 5), clock=clock)
    source = GpuSource(nvml, ErrorCounter(), clock)
    assert source.read().gpus[0].values["energy_j"] == 1000
    clock.t += 10
    assert source.read().gpus[0].values["energy_j"] == 100 * 5


# -- 5 and 6. a node scripted to known values, end to end --------------------------------------


def test_known_answer_node(tmp_path: Path) -> None:
    clock = Clock()
    page = world_page(load_description(FIXTURES / "known-answer.yaml"), clock, tmp_path)
    first = page()
    clock.t += 10
    text = page()
    for gpu in range(8):
        busy = gpu < 4
        key = f'{{gpu="{gpu}",'
        assert sample(text, f"sing_gpu_utilization_ratio{key}") == pytest.approx(0.8 * busy)
        assert sample(text, f"sing_gpu_sm_active_ratio{key}") == pytest.approx(0.6 * busy)
        assert sample(text, f"sing_gpu_power_watts{key}") == (300 if busy else 60)
        assert sample(text, f"sing_gpu_memory_used_bytes{key}") == (4.0e10 if busy else 0)
        assert sample(text, f"sing_gpu_memory_total_bytes{key}") == 150754820096
        energy = f"sing_gpu_energy_joules_total{key}"
        assert sample(text, energy) - sample(first, energy) == (3000 if busy else 600)
        assert f'sing_gpu_info{key}minor="{gpu}",name="NVIDIA H200"' in text
        job = f'sing_gpu_job_info{key}job_id="101",user="alice"'
        assert (job in text) == busy
    assert "sing_gpu_job_mismatch" not in text  # process and allocation agree
    for way in ("transmit", "receive"):
        counter = f'sing_rdma_{way}_bytes_total{{device="mlx5_0",port="1"}}'
        assert sample(text, counter) - sample(first, counter) == 1.0e10
