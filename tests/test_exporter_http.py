"""A real `sing exporter` process, scraped over HTTP, as Prometheus and the demo meet it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port


def get(port: int, deadline_s: float = 30) -> str:
    """GET /metrics, waiting for the server to come up."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def values(page: str, name: str) -> dict[str, float]:
    """gpu index -> value for one metric, parsed as Prometheus would."""
    return {
        s.labels["gpu"]: s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == name
    }


def info_uuids(page: str) -> set[str]:
    return {
        s.labels["uuid"]
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == "sing_gpu_info"
    }


def test_two_fake_nodes_in_one_process_follow_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"nodes": {"a": {"gpus": {"0": {"util": 0.11}}}}}))
    port_a, port_b = free_port(), free_port()
    cmd = [sys.executable, "-m", "sing.cli", "exporter", "--fake", "--fake-state", str(state),
           "--node", f"a:{port_a}", "--node", f"b:{port_b}", "--listen-address", "127.0.0.1",
           "--cache-seconds", "0", "--fake-root", str(tmp_path / "world")]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        page_a, page_b = get(port_a), get(port_b)
        assert values(page_a, "sing_gpu_utilization_ratio")["0"] == 0.11
        assert values(page_b, "sing_gpu_utilization_ratio")["0"] != 0.11
        uuids = [info_uuids(page_a), info_uuids(page_b)]
        assert len(uuids[0]) == 8 and not uuids[0] & uuids[1]  # 8 GPUs each, distinct nodes
        assert "process_resident_memory_bytes" in page_a  # the exporter's own process metrics
        assert 'sing_rdma_link_state{device="mlx5_3",port="1"} 4.0' in page_b

        state.write_text(json.dumps({"nodes": {"b": {"gpus": {"3": {"job_id": "42"}}}}}))
        os.utime(state, ns=(1, 2))
        time.sleep(0.2)  # the fake re-evaluates at most every 0.1 s
        page_b = get(port_b)
        # no user in the state: the process owner in the fake /proc, root, stands in
        assert 'sing_gpu_job_info{gpu="3",job_id="42",user="root"' in page_b
        assert (tmp_path / "world" / "b" / "gpu-jobs" / "3").read_text() == "42\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "sing.cli", "exporter", "--fake", "--port", str(port),
             "--listen-address", "127.0.0.1", "--duration", "1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
