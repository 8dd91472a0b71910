"""Dashboards read while another process writes (the warehouse's concurrency design).

A writer process appends a job and its GPU samples every few hundred milliseconds, as the
collector and executors do; meanwhile the dashboards' data functions and the Cluster page run
over and over with their caches cleared. No read may fail, and the numbers must grow.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from sing.dashboards import data
from sing.dashboards.cli import DEMO_ARG
from sing.warehouse.store import Warehouse

APP = str(Path(__file__).parents[1] / "sing" / "dashboards" / "app.py")
START = datetime(2026, 3, 2, tzinfo=UTC)

WRITER = textwrap.dedent(
    """
    import sys, time
    from datetime import datetime, timedelta, UTC
    import pyarrow as pa
    from sing.warehouse.store import Warehouse

    wh = Warehouse(sys.argv[1])
    start = datetime.fromisoformat(sys.argv[2])
    wh.append("nodes", pa.table({
        "cluster": ["c"], "node": ["n1"], "gpus": pa.array([8], pa.int16()),
        "valid_from": [start], "source": ["exporter"],
    }))
    for k in range(int(sys.argv[3])):
        t0 = start + timedelta(minutes=10 * k)
        wh.append("jobs", pa.table({
            "job_id": [str(k)], "cluster": ["c"], "user": ["u%d" % (k % 3)],
            "partition": ["gpu"], "submit_time": [t0], "start_time": [t0],
            "end_time": [t0 + timedelta(minutes=10)], "state": ["COMPLETED"],
            "num_nodes": [1], "num_gpus": [8], "gpus_per_node": [8], "nodes": [["n1"]],
        }))
        ts = [t0 + timedelta(seconds=15 * i) for i in range(40) for _ in range(8)]
        wh.append("gpu_samples", pa.table({
            "ts": ts, "node": ["n1"] * len(ts),
            "gpu_index": pa.array([g for _ in range(40) for g in range(8)], pa.int16()),
            "util": pa.array([0.5] * len(ts), pa.float32()), "job_id": [str(k)] * len(ts),
        }))
        print(k, flush=True)
        time.sleep(0.2)
    """
)


def test_dashboards_read_while_a_writer_appends(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "wh"
    Warehouse(root)
    monkeypatch.setenv("SING_WAREHOUSE", str(root))
    monkeypatch.setattr(sys, "argv", [str(APP), DEMO_ARG])  # as `sing dashboard --demo` starts it
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), START.isoformat(), "40"],
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: list[int] = []
    try:
        while writer.poll() is None:
            st.cache_data.clear()
            span = data.span(str(root))
            if span is not None:
                jobs = data.job_usage(str(root), span.first, span.last + timedelta(hours=1), None)
                util = jobs["mean_util"]
                assert set(util.drop_nulls()) <= {0.5}
                assert util.null_count() <= 1  # only the job whose samples are being written
                seen.append(jobs.height)
            time.sleep(0.05)
        assert writer.returncode == 0
    finally:
        writer.kill()
    assert len(seen) >= 5, seen
    assert seen == sorted(seen) and seen[-1] > seen[0]  # never fewer jobs, and more over time
    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["GPU utilization (all GPUs)"] == "50%"
