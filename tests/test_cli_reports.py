"""`sing report ...` for people: tables with units, rounded figures, "unknown" for what sing
could not measure; the numbers are the hand-worked ones of tests/test_analytics.py, read back
from the printed table of the real `sing` command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_analytics import (
    GIB,
    add_busy_job,
    add_gpu_samples,
    add_job,
    add_nodes,
    add_rdma_samples,
    at,
    run_sing,
)
from warehouse.store import Warehouse


def table(text: str) -> list[dict[str, str]]:
    """The printed table as rows keyed by heading (cells are two or more spaces apart)."""
    header, *lines = text.splitlines()
    headings = re.split(r"\s{2,}", header.strip())
    rows = []
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(headings), line
        rows.append(dict(zip(headings, cells, strict=True)))
    return rows


def report(root: Path, *args: str) -> str:
    out = run_sing("--warehouse", str(root), "report", *args)
    assert out.returncode == 0, out.stderr
    assert not re.search(r"\b(str|f64|i64|datetime\[)", out.stdout), "a dtype row"
    return out.stdout


@pytest.fixture
def usage_wh(tmp_path: Path) -> Warehouse:
    """Job A: 1 node, 2 GPUs x 2 h, GPU 0 at 80 % (SM 60 %, 40 GiB, 400 W), GPU 1 idle (100 W),
    queued 1 h. Job B: 2 nodes x 4 GPUs x 3 h at 2 %, no SM samples, RDMA 20 MB per node-hour.
    Job C: 4 GPUs at 50 %, running for 3 h at `now`."""
    wh = Warehouse(tmp_path / "wh")
    add_nodes(wh, ["n1", "n2", "n3", "n4"])
    add_job(wh, "A", ["n1"], 2, at(0), at(2), submit=at(-1))
    add_gpu_samples(
        wh, "A", "n1", [0], at(0), at(2), 0.8, sm=0.6, mem_bytes=40 * GIB, power_w=400.0
    )
    add_gpu_samples(wh, "A", "n1", [1], at(0), at(2), 0.0, sm=0.0, mem_bytes=GIB, power_w=100.0)
    add_job(wh, "B", ["n2", "n3"], 4, at(12), at(15), user="bob")
    for node, tx, rx in (("n2", 10**6, 2 * 10**6), ("n3", 3 * 10**6, 4 * 10**6)):
        add_gpu_samples(wh, "B", node, [0, 1, 2, 3], at(12), at(15), 0.02)
        add_rdma_samples(wh, "B", node, at(12), at(15), tx, rx)
    add_busy_job(wh, "C", ["n4"], 4, at(0), None, 0.5, now=at(3), user="carol")
    return wh


def test_jobs_table_units_rounding_and_unknown(usage_wh: Warehouse) -> None:
    rows = {r["job"]: r for r in table(report(usage_wh.root, "jobs", "--now", at(3).isoformat()))}
    a, b, c = rows["A"], rows["B"], rows["C"]
    assert a == {
        "job": "A",
        "user": "alice",
        "account": "alice-lab",
        "state": "COMPLETED",
        "nodes": "1",
        "GPUs": "2",
        "run h": "2.00",
        "queue h": "1.00",
        "GPU-h": "4.0",
        "util %": "40.0",
        "SM active %": "30.0",
        "idle GPU-h": "2.0",
        "peak mem GiB": "40.0",
        "energy kWh": "0.88",  # (400 + 100) W x 6300 s = 3.15 MJ
        "RDMA GB/node-h": "0.00",
    }
    assert (b["GPU-h"], b["util %"], b["SM active %"]) == ("24.0", "2.0", "unknown")
    assert b["RDMA GB/node-h"] == "0.02"  # 120 MB over 2 nodes x 3 h
    assert (c["state"], c["run h"], c["GPU-h"], c["util %"]) == ("RUNNING", "3.00", "12.0", "50.0")


def test_fairness_table_and_jain_line(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "a1", ["n1"], 2, at(0), at(2), user="alice", submit=at(0))
    add_job(wh, "a2", ["n1"], 2, at(2), at(4), user="alice", submit=at(0))
    add_job(wh, "b1", ["n2"], 8, at(1), at(2), user="bob", submit=at(0))
    add_job(wh, "c1", ["n3"], 4, at(0), at(4), user="carol", submit=at(0))
    out = report(wh.root, "fairness", "--until", at(24).isoformat(), "--now", at(24).isoformat())
    *lines, jain = out.splitlines()
    assert jain == "Jain's fairness index 0.889 (1 = every user the same share)"  # 1024 / 1152
    rows = table("\n".join(lines))
    assert rows[0]["user"] == "carol"  # most GPU-hours first
    by_user = {r["user"]: r for r in rows}
    assert by_user["carol"] == {
        "user": "carol",
        "jobs": "1",
        "GPU-h": "16.0",
        "share %": "50.0",
        "equal share %": "33.3",
        "queue mean h": "0.00",
        "queue p95 h": "0.00",
    }
    assert (by_user["alice"]["queue mean h"], by_user["alice"]["queue p95 h"]) == ("1.00", "1.90")


def test_cluster_table_says_unknown_and_why(tmp_path: Path) -> None:
    """Samples only: no inventory, no job records. The figures sing cannot know print as
    "unknown" and the footnotes say what makes them known."""
    wh = Warehouse(tmp_path / "wh")
    add_gpu_samples(wh, None, "n1", [0, 1], at(0), at(1), 0.4)
    out = report(wh.root, "cluster", "--since", at(0).isoformat(), "--now", at(2).isoformat())
    first, *rest = table(out.split("\ncapacity unknown")[0])
    assert not rest
    assert first["from (UTC)"] == "2026-01-05 00:00:00"
    assert first["util %"] == "40.0"
    assert first["allocated GPU-h"] == first["capacity GPU-h"] == first["assigned %"] == "unknown"
    assert "capacity unknown for 1 of 1 bucket(s)" in out
    assert "sing warehouse import jobs FILE" in out


def test_idle_table_lists_nodes(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    add_busy_job(wh, "I1", ["n1", "n2"], 4, at(0), at(4), 0.01)  # 32 GPU-h at 1 %
    (row,) = table(report(wh.root, "idle", "--now", at(24).isoformat()))
    assert (row["job"], row["nodes"], row["GPUs"], row["run h"]) == ("I1", "2", "8", "4.00")
    assert (row["GPU-h"], row["util %"], row["wasted GPU-h"]) == ("32.0", "1.0", "31.7")
    assert (row["low RDMA"], row["node list"]) == ("yes", "n1,n2")


def test_sql_prints_a_table_with_null(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    add_job(wh, "A", ["n1"], 2, at(0), None)
    out = run_sing(
        "--warehouse",
        str(wh.root),
        "warehouse",
        "sql",
        "SELECT job_id, num_gpus, exit_code, num_gpus / 3 AS third FROM jobs",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "job_id  num_gpus  exit_code  third",
        "A              2  NULL       0.667",
    ]
