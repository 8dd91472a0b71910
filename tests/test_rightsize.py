"""`sing report rightsize`: single-GPU GPU-hours that would have fit a MIG slice of their GPU
model, and the cores and host memory jobs held unused, per user and per account. The
warehouse comes through sing's own ingest: job records and the node inventory by `sing
warehouse import`, GPU and cgroup samples by the collector's rows; every figure below is
worked out by hand from them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from sing.collector.convert import NodeReading
from sing.warehouse.store import Warehouse
from tests.cli_world import sing
from tests.policy_world import SAMPLE_S, cgroup_readings, collect
from tests.test_cli_reports import table

GB, GIB = 10**9, 2**30
START = datetime.fromisoformat("2026-03-01T10:00:00+00:00")
END = START + timedelta(hours=2)  # every job runs 10:00-12:00: 2 h
WINDOW = ("--since", "2026-03-01", "--until", "2026-03-02", "--now", "2026-03-02T12:00:00")
# g1: an H100 80GB (NVML's 81559 MiB), g2: an H200 (143771 MiB), g3: a V100, whose MIG
# slices sing does not know.
NODES_CSV = """\
node,cluster,gpus,gpu_model,gpu_memory_bytes,partition,source,valid_from
g1,campus,4,NVIDIA H100 80GB HBM3,85520809984,gpu,exporter,2026-02-01T00:00:00Z
g2,campus,4,NVIDIA H200,150755278848,gpu,exporter,2026-02-01T00:00:00Z
g3,campus,4,Tesla V100-SXM2-32GB,34359738368,gpu,exporter,2026-02-01T00:00:00Z
"""
# job: user, account, node, GPUs, peak GPU memory (bytes), SM activity; the verdict:
# a1: 8 GB and 10 % fit 1g (10 GB, 1/7 = 14 %); a2: 15 GB, 20 % fit 2g (20 GB, 29 %);
# a3: 50 % of the SMs fits no slice up to 3g (43 %); b1 on the H200: 30 GB, 35 % fits 3g
# (70.5 GB, 43 %) but not 2g (29 %); b2 on the V100: not judged; c1 holds 2 GPUs: not a
# single-GPU job.
GPU_JOBS = {
    "a1": ("alice", "lab-a", "g1", 1, 8 * GB, 0.10),
    "a2": ("alice", "lab-a", "g1", 1, 15 * GB, 0.20),
    "a3": ("alice", "lab-a", "g1", 1, 30 * GB, 0.50),
    "b1": ("bob", "lab-b", "g2", 1, 30 * GB, 0.35),
    "b2": ("bob", "lab-b", "g3", 1, 1 * GB, 0.05),
    "c1": ("carol", "lab-a", "g1", 2, 40 * GB, 0.90),
}
# job: alloc_cpus, cores busy, req_mem_bytes, peak host memory; the other jobs' cgroups were
# not read (they count nowhere in the core and memory figures).
HOST = {
    "a1": (16, 4.0, 64 * GIB, 16 * GIB),  # 25 % of 16 cores; 16 of 64 GiB
    "b1": (8, 8.0, 32 * GIB, 32 * GIB),  # everything used
    "c1": (32, 8.0, 256 * GIB, 64 * GIB),  # 25 % of 32 cores; 64 of 256 GiB
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("rightsize")
    root = tmp / "wh"
    lines = ["job_id,cluster,user,account,partition,state,submit_time,start_time,end_time,"
             "num_nodes,num_gpus,time_limit_s,nodes,alloc_cpus,req_mem_bytes"]  # fmt: skip
    for job, (user, account, node, gpus, _, _) in GPU_JOBS.items():
        cpus, _, mem, _ = HOST.get(job, (None, None, None, None))
        lines.append(
            f"{job},campus,{user},{account},gpu,COMPLETED,{START.isoformat()},"
            f"{START.isoformat()},{END.isoformat()},1,{gpus},86400,{node},"
            f"{cpus or ''},{mem or ''}"
        )
    for name, text in (("nodes", NODES_CSV), ("jobs", "\n".join(lines) + "\n")):
        (tmp / f"{name}.csv").write_text(text)
        done = sing(root, "warehouse", "import", name, str(tmp / f"{name}.csv"))
        assert done.returncode == 0, done.stderr
    readings = []
    index = {"g1": 0, "g2": 0, "g3": 0}  # the next free GPU of each node
    for job, (_, _, node, gpus, peak, sm) in GPU_JOBS.items():
        first, index[node] = index[node], index[node] + gpus
        ts = START
        while ts <= END:
            values = {"util": 0.5, "sm_active": sm, "mem_used_bytes": peak}
            reading = NodeReading(
                gpus={i: dict(values) for i in range(first, first + gpus)},
                jobs={i: job for i in range(first, first + gpus)},
            )
            readings.append((ts, node, reading))
            ts += timedelta(seconds=SAMPLE_S)
    wh = Warehouse(root)
    collect(wh, readings)
    for job, (_, busy, _, peak) in HOST.items():
        node = GPU_JOBS[job][2]
        used = {"mem_used_bytes": peak, "mem_peak_bytes": peak}
        collect(wh, cgroup_readings(job, node, START, END, [(START, busy)], **used))
    return root


def rightsize(root: Path, *args: str) -> dict[str, dict]:
    done = sing(root, "report", "rightsize", *args, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out["mig_models"]) == {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}
    key = "account" if "account" in args else "user"
    return {row.pop(key): row for row in out["rows"]}


def test_per_user_known_answers(root: Path) -> None:
    rows = rightsize(root, *WINDOW)
    assert rows["alice"] == pytest.approx({
        "jobs": 3, "gpu_hours": 6.0, "mig_judged_gpu_hours": 6.0,
        "fit_1g_gpu_hours": 2.0, "fit_2g_gpu_hours": 2.0, "fit_3g_gpu_hours": 0.0,
        "mig_unjudged_gpu_hours": 0.0, "host_jobs": 1,
        "core_hours": 32.0, "unused_core_hours": 24.0,  # 16 cores x 2 h, 75 % idle
        "mem_gib_hours": 128.0, "unused_mem_gib_hours": 96.0,  # (64 - 16) GiB x 2 h
    })  # fmt: skip
    assert rows["bob"] == pytest.approx({
        "jobs": 2, "gpu_hours": 4.0, "mig_judged_gpu_hours": 2.0,
        "fit_1g_gpu_hours": 0.0, "fit_2g_gpu_hours": 0.0, "fit_3g_gpu_hours": 2.0,
        "mig_unjudged_gpu_hours": 2.0, "host_jobs": 1,  # b2's V100 has no known slices
        "core_hours": 16.0, "unused_core_hours": 0.0,
        "mem_gib_hours": 64.0, "unused_mem_gib_hours": 0.0,
    })  # fmt: skip
    carol = rows["carol"]  # one 2-GPU job: nothing to say about MIG, so unknown, not 0
    assert (carol["fit_1g_gpu_hours"], carol["mig_judged_gpu_hours"]) == (None, None)
    assert (carol["core_hours"], carol["unused_core_hours"]) == (64.0, 48.0)
    assert (carol["mem_gib_hours"], carol["unused_mem_gib_hours"]) == (512.0, 384.0)


def test_per_account_and_clipped_to_the_window(root: Path) -> None:
    # from 11:00: one of each job's two hours
    rows = rightsize(root, "--by", "account", *WINDOW[2:], "--since", "2026-03-01T11:00:00")
    lab_a = rows["lab-a"]  # alice and carol
    assert (lab_a["jobs"], lab_a["gpu_hours"]) == (4, pytest.approx(5.0))
    assert (lab_a["fit_1g_gpu_hours"], lab_a["fit_2g_gpu_hours"]) == pytest.approx((1.0, 1.0))
    assert (lab_a["core_hours"], lab_a["unused_core_hours"]) == pytest.approx((48.0, 36.0))
    assert lab_a["unused_mem_gib_hours"] == pytest.approx(240.0)  # (48 + 192) GiB x 1 h
    assert rows["lab-b"]["fit_3g_gpu_hours"] == pytest.approx(1.0)


def test_the_table_for_people(root: Path) -> None:
    done = sing(root, "report", "rightsize", *WINDOW)
    assert done.returncode == 0, done.stderr
    head, note = done.stdout.rsplit("\n", 2)[0], done.stdout.splitlines()[-1]
    rows = {row["user"]: row for row in table(head)}
    assert rows["alice"]["1g-fit GPU-h"] == "2.0" and rows["bob"]["3g-fit GPU-h"] == "2.0"
    assert rows["carol"]["1g-fit GPU-h"] == "-"  # no single-GPU job on a known model
    assert rows["alice"]["unused core-h"] == "24.0"
    assert rows["carol"]["unused mem GiB-h"] == "384.0"
    assert "H100-80GB" in note and "H200-141GB" in note
