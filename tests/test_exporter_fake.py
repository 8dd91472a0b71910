"""The fake backend as the demo and the tests meet it: replay, record, runtime state, fake world."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sing.cli import main
from sing.exporters.node import NodeCollector, node_registry
from sing.exporters.recording import Recorder
from sing.testing.fake_nvml import FakeNvml, StateFile, load_description
from sing.testing.fake_world import FakeWorld
from tests.test_exporter_golden import FIXTURES, NOW, scrape


class Clock:
    """A clock the test moves by hand, so counters and patterns have known values."""

    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def sample(page: str, prefix: str) -> float:
    """The value of the one series whose line starts with `prefix`."""
    (line,) = [line for line in page.splitlines() if line.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


def world_registry(nvml: FakeNvml, root: Path, clock: Clock) -> tuple[CollectorRegistry, FakeWorld]:
    """A registry reading a fake node and its fake sysfs/procfs tree at `root`, no caching."""
    world = FakeWorld(root, nvml)
    collector = NodeCollector(nvml, *world.roots, 0.0, before_read=world.sync, wall_clock=clock)
    return node_registry(collector, process_metrics=False), world


def test_replays_the_h200_recording_frame_by_frame_and_loops() -> None:
    clock = Clock()
    recording = FIXTURES / "h200-recording.jsonl"
    nvml = FakeNvml(load_description(recording), clock=clock)
    collector = NodeCollector(
        nvml, "/nonexistent", "/nonexistent", "/nonexistent", 0.0, wall_clock=clock
    )
    registry = node_registry(collector, process_metrics=False)
    uuid = 'gpu="0",uuid="GPU-b8165666-1092-95bb-2e75-a9fdb498f280"'

    clock.t = NOW + 12.5  # frame 12 (recorded 12.12 s in): the GPU under load
    page = generate_latest(registry).decode()
    assert sample(page, f"sing_gpu_power_watts{{{uuid}}}") == 689.878
    # utilisation is the mean of the fake driver's samples, one a second, each showing the
    # frame recorded at or before it: frames ~1.01 s apart, seconds 0-12 of the replay
    frames = [json.loads(line) for line in recording.read_text().splitlines()]
    shown = [
        max(i for i, f in enumerate(frames) if f["t"] - frames[0]["t"] <= k) for k in range(13)
    ]
    expected = sum(frames[i]["gpus"][0]["util"] for i in shown) / len(shown)
    assert sample(page, f"sing_gpu_utilization_ratio{{{uuid}}}") == pytest.approx(expected)
    assert sample(page, f"sing_gpu_energy_joules_total{{{uuid}}}") == 4765.538
    assert sample(page, f"sing_gpu_memory_total_bytes{{{uuid}}}") == 150754820096
    assert 'name="NVIDIA H200"' in page

    clock.t = NOW + 21 + 12.5  # one 21-frame loop later: same frame, energy keeps counting
    page = generate_latest(registry).decode()
    assert sample(page, f"sing_gpu_power_watts{{{uuid}}}") == 689.878
    assert sample(page, f"sing_gpu_energy_joules_total{{{uuid}}}") == pytest.approx(
        4765.538 + (9690.888 - 2670.832)
    )


def test_record_then_replay_gives_the_same_page(tmp_path: Path) -> None:
    """Values, failures, lost GPU, MIG, XIDs and processes all survive the round trip."""
    recording = tmp_path / "node.jsonl"
    recorder = Recorder(recording)
    original_nvml = FakeNvml(load_description(FIXTURES / "node.yaml"), clock=lambda: NOW)
    collector = NodeCollector(
        original_nvml,
        str(FIXTURES / "sys"),
        str(FIXTURES / "proc"),
        str(FIXTURES / "gpu-jobs"),
        0.0,
        on_reading=recorder.write,
    )
    original = generate_latest(node_registry(collector, process_metrics=False)).decode()
    recorder.close()
    assert json.loads(recording.read_text())["gpus"][2]["errors"]["power"] == "not_supported"
    replayed = scrape(FakeNvml(load_description(recording), clock=lambda: NOW))
    assert replayed == original


def test_state_file_drives_gpus_jobs_and_rdma_at_runtime(tmp_path: Path) -> None:
    state_path = tmp_path / "state.json"
    state_path.write_text(
        json.dumps(
            {
                "gpus": {
                    "0": {"util": 0.42, "job_id": "777", "user": "carol"},
                    "1": {"job_id": "888", "has_process": False},
                },
                "rdma": {"mlx5_0/1": {"tx_bytes_per_s": 1.0e9, "rx_bytes_per_s": 0}},
            }
        )
    )
    clock = Clock()
    nvml = FakeNvml(load_description(None), StateFile(state_path), clock=clock)
    registry, world = world_registry(nvml, tmp_path / "world", clock)
    page = generate_latest(registry).decode()
    assert sample(page, 'sing_gpu_utilization_ratio{gpu="0"') == 0.42
    assert 'sing_gpu_job_info{gpu="0",job_id="777",user="carol"' in page
    assert 'sing_gpu_job_mismatch{case="allocation_without_process",gpu="1",job_id="888"' in page
    assert (world.mapping_dir / "0").read_text() == "777\n"

    clock.t += 10  # 10 s at 1 GB/s; GPU 6 idles at 75 W, so 750 J
    state_path.write_text(json.dumps({"gpus": {"0": {"util": 0.9}}}))
    os.utime(state_path, ns=(1, 2))  # a new mtime even on coarse-grained filesystems
    page = generate_latest(registry).decode()
    assert sample(page, 'sing_rdma_transmit_bytes_total{device="mlx5_0",port="1"}') == 1e10
    assert sample(page, 'sing_rdma_transmit_bytes_total{device="mlx5_1",port="1"}') > 0
    assert sample(page, 'sing_gpu_energy_joules_total{gpu="6"') == 750.0
    # the samples of seconds 1-10 see the new 0.9, that of second 0 the old 0.42
    assert sample(page, 'sing_gpu_utilization_ratio{gpu="0"') == pytest.approx((0.42 + 9) / 11)
    assert "sing_gpu_job_info" not in page  # the job ended: files and processes are gone
    assert not (world.mapping_dir / "0").exists()


def test_half_written_state_file_keeps_the_last_good_state(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text("gpus: {0: {util: 0.3}}\n")
    state = StateFile(path)
    assert state.node(None)["gpus"][0]["util"] == 0.3
    path.write_text("gpus: {0: {util: 0.")
    os.utime(path, ns=(1, 2))
    assert state.node(None)["gpus"][0]["util"] == 0.3


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read"),
        ("count: [8\n", "not valid YAML"),
        ("- a list\n", "expected a mapping"),
        ("defaults: {util: {pattern: zigzag}}\n", "defaults.util: unknown pattern 'zigzag'"),
        ("gpus: {2: {errors: {power: melted}}}\n", "gpus.2.errors.power: unknown NVML error"),
        ("count: eight\n", "count must be a number"),
    ],
)
def test_bad_description_is_a_clear_error(tmp_path: Path, capsys, content, message) -> None:
    path = tmp_path / "node.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["exporter", "--fake", str(path), "--port", "0", "--duration", "0"]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "node.yaml" in err


def test_bad_recording_line_is_named(tmp_path: Path, capsys) -> None:
    path = tmp_path / "rec.jsonl"
    lines = (FIXTURES / "h200-recording.jsonl").read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"t": 1}', *lines[1:]]) + "\n")
    assert main(["exporter", "--fake", str(path), "--port", "0", "--duration", "0"]) == 1
    assert "rec.jsonl line 2: not a frame" in capsys.readouterr().err


def test_bad_node_option_is_a_clear_error(capsys) -> None:
    assert main(["exporter", "--fake", "--node", "gpu01", "--duration", "0"]) == 1
    assert "expected NAME:PORT" in capsys.readouterr().err
    assert main(["exporter", "--node", "gpu01:9501", "--duration", "0"]) == 1
    assert "add --fake" in capsys.readouterr().err


def test_a_gpu_that_falls_off_the_bus_still_reports_its_xid_79(tmp_path: Path) -> None:
    """NVML answers nothing about a lost GPU, but the XID that said so is the news: its count
    is exported under the GPU's last UUID, and nothing else about it."""
    state_path = tmp_path / "state.json"
    state_path.write_text("{}")
    clock = Clock()
    nvml = FakeNvml(load_description(None), StateFile(state_path), clock=clock)
    registry, _ = world_registry(nvml, tmp_path / "world", clock)
    page = generate_latest(registry).decode()
    (uuid,) = {
        line.split('uuid="')[1].split('"')[0]
        for line in page.splitlines()
        if line.startswith('sing_gpu_power_watts{gpu="3"')
    }
    lost = {"gpus": {"3": {"errors": {"all": "gpu_is_lost"}, "xids": {"79": 1}}}}
    state_path.write_text(json.dumps(lost))
    os.utime(state_path, ns=(1, 2))
    clock.t += 10
    page = generate_latest(registry).decode()
    gpu3 = [line for line in page.splitlines() if 'gpu="3"' in line]
    assert gpu3 == [f'sing_gpu_xid_errors_total{{gpu="3",uuid="{uuid}",xid="79"}} 1.0']
