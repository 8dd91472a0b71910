"""On a real NVIDIA GPU: record the device state and scrape /metrics once, checking plausibility.

Run on the GPU machine with `SING_GPU_OUT=DIR pytest -m gpu tests/test_exporter_gpu.py`; the
recording and the scraped page are copied to DIR and become the replay fixture
tests/fixtures/exporter/h200-recording.jsonl. Elsewhere the test is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# A short burst of matrix products so the recording shows a busy GPU, not only an idle one.
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 8
while time.time() < end:
    b = a @ a
torch.cuda.synchronize()
"""


def _gpu_present() -> bool:
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except pynvml.NVMLError:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_present(), reason="needs an NVIDIA GPU and driver"),
]


def test_record_and_scrape_real_gpu(tmp_path: Path) -> None:
    recording, port = tmp_path / "recording.jsonl", free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "sing.exporters", "--port", str(port),
         "--listen-address", "127.0.0.1",
         "--record", str(recording), "--record-interval", "1", "--duration", "22"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    time.sleep(5)  # idle frames first
    load = subprocess.Popen([sys.executable, "-c", LOAD])
    time.sleep(6)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    load.wait(timeout=60)
    assert exporter.wait(timeout=60) == 0
    out = os.environ.get("SING_GPU_OUT")
    if out:
        shutil.copy(recording, Path(out) / "h200-recording.jsonl")
        (Path(out) / "h200-metrics.txt").write_text(page)

    frames = [json.loads(line) for line in recording.read_text().splitlines()]
    assert len(frames) >= 15, len(frames)
    gpu_series = {
        g["index"]: [x for f in frames for x in f["gpus"] if x["index"] == g["index"]]
        for g in frames[0]["gpus"]
    }
    for series in gpu_series.values():
        first, last = series[0], series[-1]
        print(json.dumps({k: v for k, v in last.items() if k != "processes"}))
        assert UUID.match(first["uuid"]), first["uuid"]
        assert 130e9 < first["memory_total"] < 160e9  # an H200 shows 143771 MiB
        assert all(0 <= s["util"] <= 1 for s in series)
        assert all(50 <= s["power_w"] <= 800 for s in series)
        assert all(20 <= s["temperature_c"] <= 90 for s in series)
        assert last["energy_j"] > first["energy_j"]
        # energy counter vs power: the joules spent match the mean power within 30 %
        spent = last["energy_j"] - first["energy_j"]
        mean_power = sum(s["power_w"] for s in series) / len(series)
        duration = frames[-1]["t"] - frames[0]["t"]
        assert 0.7 < spent / (mean_power * duration) < 1.3
    # the load showed up: 8 s at ~0.99 in a 15 s utilisation window peaks near 0.53
    assert max(s["util"] for s in gpu_series[0]) > 0.4

    families = {f.name: f for f in text_string_to_metric_families(page)}
    for name in (
        "sing_gpu_info",
        "sing_gpu_utilization_ratio",
        "sing_gpu_memory_total_bytes",
        "sing_gpu_power_watts",
        "sing_gpu_energy_joules",
        "sing_gpu_temperature_celsius",
    ):
        assert families[name].samples, name  # fmt: skip
    print(page)
