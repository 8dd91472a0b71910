"""The registry of per-GPU signals (sing/signals.py), and its first signal, the memory bandwidth
utilisation, end to end: a fake node scripted to a known value, `sing collector --once`, and
`sing job` showing the job's mean; and dcgm-exporter's series of it."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.collector.convert import read_node
from sing.collector.promtext import parse
from sing.signals import GPU_SIGNALS, GpuSignal, check
from sing.warehouse.store import Warehouse
from tests.ports import free_port
from tests.test_collector_scrape import REPO, http_get, running, sing, wait_for

# GPUs 0-1 run job 101, moving memory 40 % and 20 % of the time; GPU 2 is free at 90 %.
NODE_YAML = """\
model: NVIDIA H200
count: 3
memory_total: 150754820096
defaults:
  util: 0.5
  memory_used: 1.0e+9
  power_w: 300
  energy_j: 0
gpus:
  0: {job_id: "101", mem_util: 0.4}
  1: {job_id: "101", mem_util: 0.2}
  2: {mem_util: 0.9}
"""


def test_a_registry_with_a_repeated_key_or_unknown_rule_is_refused() -> None:
    signal = GPU_SIGNALS[0]
    with pytest.raises(ValueError, match="key repeated: mem_util"):
        check((signal, GpuSignal(**{**signal.__dict__, "metric": "other"})))
    with pytest.raises(ValueError, match="per_job 'median'"):
        check((GpuSignal(**{**signal.__dict__, "per_job": "median"}),))


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_MEM_COPY_UTIL", "sing_gpu_memory_utilization_ratio"])
def test_dcgm_exporter_percent_and_sing_ratio_become_the_same_column(name: str) -> None:
    value = 37 if name.startswith("DCGM") else 0.37
    reading = read_node(parse(f'{name}{{gpu="0",UUID="GPU-1"}} {value}\n', {name}))
    assert reading.gpus[0]["mem_util"] == pytest.approx(0.37)


def test_fake_node_to_sing_job_shows_the_jobs_mean_memory_bandwidth(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text(NODE_YAML)
    port = free_port()
    argv = sing(
        "exporter", "--fake", str(tmp_path / "node.yaml"), "--cache-seconds=0.05",
        "--web.listen-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    wh = tmp_path / "wh"
    collect = sing("--warehouse", str(wh), "collector", "--once", "--target", f"127.0.0.1:{port}")
    with running(argv, tmp_path / "exporter.log"):
        page = wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), what="exporter")
        assert 'sing_gpu_memory_utilization_ratio{gpu="2",' in page
        for _ in range(2):
            collected = subprocess.run(
                collect, capture_output=True, text=True, timeout=120, cwd=REPO
            )
            assert collected.returncode == 0, collected.stderr
    con = Warehouse(wh).connect()
    rows = con.execute(
        "SELECT gpu_index, job_id, mem_util, cluster, node, ts FROM gpu_samples ORDER BY ts"
    ).fetchall()
    assert {(r[0], r[1], round(r[2], 3)) for r in rows} == {
        (0, "101", 0.4),
        (1, "101", 0.2),
        (2, None, 0.9),
    }
    _, _, _, cluster, node, first = rows[0]
    start = first - timedelta(minutes=5)
    job = {
        "job_id": "101", "cluster": cluster, "user": "alice", "account": "physics",
        "partition": "gpu", "state": "RUNNING", "submit_time": start, "start_time": start,
        "num_nodes": 1, "num_gpus": 2, "nodes": [node],
    }  # fmt: skip
    Warehouse(wh).append("jobs", pa.Table.from_pylist([job]))
    now = (rows[-1][5] + timedelta(seconds=1)).isoformat()

    shown = subprocess.run(
        sing("--warehouse", str(wh), "job", "101", "--now", now, "--json"),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["rows"][0]["mean_mem_util"] == pytest.approx(0.3, abs=1e-6)
    screen = subprocess.run(
        sing("--warehouse", str(wh), "job", "101", "--now", now),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert "Memory bandwidth (mean) [######..............]  30%" in screen.stdout, screen.stdout
