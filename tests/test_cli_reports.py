"""`sing report ...` for people: tables with units, rounded figures, "unknown" for what sing
could not measure; the numbers are the hand-worked ones of tests/test_analytics.py, read back
from the printed table of the real `sing` command."""

from __future__ import annotations

import re
from pathlib import Path

from sing.warehouse.store import Warehouse
from tests.test_analytics import (  # noqa: F401 - `usage_wh` is a fixture
    add_busy_job,
    add_gpu_samples,
    add_job,
    at,
    run_sing,
    usage_wh,
)


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
    """`sing report ARGS` with the samples' 15-minute interval as the collector's."""
    config = root.parent / "every-15-min.toml"
    config.write_text("[collector]\ninterval_s = 900\n")
    out = run_sing("--config", str(config), "--warehouse", str(root), "report", *args)
    assert out.returncode == 0, out.stderr
    assert not re.search(r"\b(str|f64|i64|datetime\[)", out.stdout), "a dtype row"
    return out.stdout


def test_jobs_table_units_rounding_and_unknown(
    usage_wh: Warehouse,  # noqa: F811 - the imported fixture
) -> None:
    """tests.test_analytics's jobs: A (1 node, 2 GPUs x 2 h, one idle, 40 GiB, 500 W together,
    queued 1 h), B (2 nodes x 4 GPUs x 3 h at 2 %, no SM samples, 20 MB RDMA per node-hour) and
    C (4 GPUs at 50 %, running 3 h at `now`)."""
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
        "coverage %": "100",  # 8 samples per GPU, one every 15 minutes over 2 h
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
