"""`sing job JOB_ID`: the figures, and each plain-language note firing on the job built for it.

Every job below runs 2 hours from 10:00 and is built to trigger exactly one note of
sing/warehouse/job_notes.toml (or none: `healthy`), so a note that fires too often or never fails
here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from sing.config import Thresholds
from sing.errors import UserError
from sing.warehouse.coverage import CoverageNeeds
from sing.warehouse.job_report import DEFAULT_NOTES, job_report, load_notes, render
from sing.warehouse.store import Warehouse
from tests.test_analytics import (
    GIB,
    add_gpu_samples,
    add_host_samples,
    add_job,
    add_nodes,
    add_rdma_samples,
    at,
    run_sing,
)

BUSY_RDMA = 250_000_000  # bytes each way per 15-minute sample: 2 GB per node-hour
# The samples come every 15 minutes (tests/test_analytics.py's STEP): the jobs are fully covered.
EVERY_15_MIN = CoverageNeeds(interval_s=900)


def make_job(
    wh: Warehouse,
    job_id: str,
    nodes: int,
    gpus_per_node: int,
    util: float,
    *,
    unused_gpus: int = 0,
    mem_bytes: int = 40 * GIB,
    rdma: int = BUSY_RDMA,
    state: str = "COMPLETED",
) -> None:
    """A 2-hour job; its last `unused_gpus` GPUs stay at 0; multi-node jobs get RDMA traffic."""
    names = [f"{job_id}-{n}" for n in range(nodes)]
    add_job(wh, job_id, names, gpus_per_node, at(0), at(2), state=state)
    total = nodes * gpus_per_node
    for n, node in enumerate(names):
        for g in range(gpus_per_node):
            used = n * gpus_per_node + g < total - unused_gpus
            add_gpu_samples(
                wh, job_id, node, [g], at(0), at(2), util if used else 0.0, mem_bytes=mem_bytes
            )
        if nodes > 1:
            add_rdma_samples(wh, job_id, node, at(0), at(2), rdma, rdma)


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("jobs") / "wh")
    add_nodes(wh, ["healthy-0"])
    make_job(wh, "healthy", 1, 4, 0.7)
    make_job(wh, "never", 4, 4, 0.8, unused_gpus=4)  # 12 of 16 GPUs at 0.8: mean 0.6
    make_job(wh, "idle", 1, 2, 0.02)  # above the 1 % never-used mark, below idle_util
    make_job(wh, "low", 1, 2, 0.10)
    make_job(wh, "lonely", 2, 4, 0.5, rdma=1000)  # 8 kB per node-hour
    make_job(wh, "spread", 2, 4, 0.2)
    make_job(wh, "smallmem", 1, 4, 0.7, mem_bytes=4 * GIB)
    make_job(wh, "timeout", 1, 4, 0.7, state="TIMEOUT")
    make_job(wh, "fewcores", 1, 4, 0.7)  # 3 of 32 cores busy
    add_host_samples(wh, "fewcores", "fewcores-0", at(0), at(2), 3.0, cpus=32,
                     mem_peak=120 * GIB, mem_limit=256 * GIB)  # fmt: skip
    make_job(wh, "bigmem", 1, 4, 0.7)  # 6 GiB of 256 GiB; 7 of 8 cores busy
    add_host_samples(wh, "bigmem", "bigmem-0", at(0), at(2), 7.0, cpus=8,
                     mem_peak=6 * GIB, mem_limit=256 * GIB)  # fmt: skip
    add_job(wh, "blind", ["b1"], 4, at(0), at(2))  # no telemetry at all
    queued = {"job_id": "queued", "cluster": "test", "state": "PENDING", "submit_time": at(0)}
    wh.append("jobs", pl.DataFrame([queued]))
    return wh


def report(wh: Warehouse, job_id: str, thresholds: Thresholds | None = None) -> dict:
    thresholds = thresholds or Thresholds()
    return job_report(
        wh.connect(), job_id, thresholds, load_notes(None), at(24), needs=EVERY_15_MIN
    )


# The expected note of each job, as its first words (job_notes.toml's wording).
ONE_NOTE = {
    "blind": "No GPU samples were recorded for this job, so its GPU use is unknown.",
    "never": "4 of 16 GPUs were never used.",
    "idle": "The GPUs were essentially idle (mean utilization 2%).",
    "low": "GPU utilization was low (10%).",
    "lonely": "Multi-node job with almost no RDMA traffic (0.00 GB per node-hour)",
    "spread": "On this cluster multi-node jobs use their GPUs much less",
    "smallmem": "Peak GPU memory was 4.0 GiB of 80 GiB",
    "timeout": "The job hit its time limit.",
    "fewcores": "This job used about 3.0 of its 32 CPU cores (CPU efficiency 9%).",
    "bigmem": "Peak host memory was 6.0 GiB per node of the 256 GiB requested: ask for about "
    "8 GiB next time (--mem=8G)",
}


def test_healthy_job_has_no_notes(wh: Warehouse) -> None:
    assert report(wh, "healthy")["notes"] == []


@pytest.mark.parametrize("job_id", sorted(ONE_NOTE))
def test_each_note_fires_on_its_job_only(wh: Warehouse, job_id: str) -> None:
    notes = report(wh, job_id)["notes"]
    assert len(notes) == 1, notes
    assert notes[0].startswith(ONE_NOTE[job_id])


def test_every_default_note_is_exercised() -> None:
    assert len(load_notes(DEFAULT_NOTES)) == len(ONE_NOTE)


def test_job_figures(wh: Warehouse) -> None:
    job = report(wh, "never")
    assert job["gpu_hours"] == pytest.approx(32.0)  # 16 GPUs x 2 h
    assert job["mean_util"] == pytest.approx(0.6)
    assert job["idle_gpu_hours"] == pytest.approx(8.0)  # 4 of 16 GPUs idle all the time
    assert (job["gpus_never_used"], job["num_gpus"]) == (4, 16)
    assert len(job["per_gpu"]) == 16
    assert [g["mean_util"] for g in job["per_gpu"][-5:]] == pytest.approx([0.8, 0, 0, 0, 0])
    # Per node: 8 samples x 250 MB each way.
    assert [r["node"] for r in job["per_node_rdma"]] == [f"never-{n}" for n in range(4)]
    assert all(r["tx_bytes"] == r["rx_bytes"] == 2 * 10**9 for r in job["per_node_rdma"])
    assert job["rdma_bytes_per_node_hour"] == pytest.approx(2e9)


def test_thresholds_move_the_notes(wh: Warehouse) -> None:
    assert report(wh, "low", Thresholds(low_util=0.05))["notes"] == []
    assert report(wh, "lonely", Thresholds(low_rdma_bytes_per_node_hour=1.0))["notes"] == []
    notes = report(wh, "healthy", Thresholds(memory_low_ratio=0.6))["notes"]
    assert notes == [
        "Peak GPU memory was 40.0 GiB of 80 GiB: a larger batch size may use the GPUs better."
    ]


def test_job_without_samples_is_not_called_idle(wh: Warehouse) -> None:
    """No telemetry is not evidence of idleness: mean utilisation is unknown, not 0 %."""
    job = report(wh, "blind")
    assert job["mean_util"] is None and job["gpu_hours"] == pytest.approx(8.0)
    assert not any("idle" in n for n in job["notes"]), job["notes"]
    assert "n/a" in render(job)


def test_unstarted_and_unknown_jobs_are_clear_errors(wh: Warehouse) -> None:
    with pytest.raises(UserError, match="job queued has not started \\(state PENDING\\)"):
        report(wh, "queued")
    with pytest.raises(UserError, match="no job nosuch in the warehouse"):
        report(wh, "nosuch")


# ---- notes files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[note]]\nwhen = "mean_util < 0.5"\n', "note 1 needs exactly the keys 'when' and 'say'"),
        ('[[note]]\nwhen = "x"\nsay = "y"\nlevel = 2\n', "note 1 needs exactly the keys"),
        ("[[note]\nwhen = 1", "job notes file"),  # not TOML
        ('[[note]]\nwhen = "true"\nsay = "{mean_util:.0q}"\n', "note 1: message '{mean_util:.0q}'"),
        ('[[note]]\nwhen = "true"\nsay = "unbalanced {mean_util"\n', "note 1: message"),
    ],
)
def test_malformed_notes_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "notes.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as err:
        load_notes(path)
    assert str(path) in str(err.value)


def test_missing_notes_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="job notes file .*nope.toml"):
        load_notes(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "note",
    [
        {"when": "mean_utl < 0.5", "say": "typo in the figure's name"},
        {"when": "mean_util <<< 0.5", "say": "not SQL"},
    ],
)
def test_note_condition_that_is_not_sql_is_a_user_error(
    wh: Warehouse, note: dict[str, str]
) -> None:
    con = wh.connect()
    with pytest.raises(UserError, match="note"):
        job_report(con, "healthy", Thresholds(), [note], at(24))


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ("(SELECT count(*) FROM read_text('{secret}')) > 0", "'SELECT' is not a figure"),
        ("length(read_text('{secret}')) > 0", "'length' is not a figure"),
        (
            "true); COPY (SELECT 1) TO '{secret}'; SELECT (1",
            "'; COPY (SELECT 1) TO' is not allowed",
        ),
        ('"mean_util" < 1', "'\"mean_util\" < 1' is not allowed"),
    ],
)
def test_note_condition_cannot_read_or_write_files(
    wh: Warehouse, tmp_path: Path, when: str, message: str
) -> None:
    """A notes file holds conditions, not queries: no functions, subqueries or statements."""
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    note = {"when": when.format(secret=secret), "say": "leaked"}
    with pytest.raises(UserError, match=re.escape(message)):
        job_report(wh.connect(), "healthy", Thresholds(), [note], at(24))
    assert secret.read_text() == "private"


# ---- the `sing job` command -------------------------------------------------------------


def test_sing_job_human_report(wh: Warehouse) -> None:
    out = run_sing("--warehouse", str(wh.root), "job", "never")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Job never  user alice  account alice-lab  partition gpu" in text
    assert "State COMPLETED  exit code 0  4 node(s), 16 GPU(s)  run time 2.00 h" in text
    assert "time limit 24.00 h" in text  # tests.test_analytics.add_job's 86,400 s
    assert re.search(r"Peak GPU memory  [\d.]+ GiB of 80.0 GiB", text), text  # 80 GiB GPUs
    # 16 GPUs x 100 W x 6300 s between first and last energy reading = 10.08 MJ = 2.80 kWh.
    assert "GPU-hours allocated 32.0   idle GPU-hours 8.0   energy 2.80 kWh" in text
    assert "GPU utilization  [############........]  60%" in text
    assert "  never-3:3  util [....................]   0%" in text
    assert "  never-0  sent 2.0 GB  received 2.0 GB" in text
    assert "  * 4 of 16 GPUs were never used." in text


def test_sing_job_json(wh: Warehouse, tmp_path: Path) -> None:
    config = tmp_path / "sing.toml"
    config.write_text("[collector]\ninterval_s = 900\n")  # fully covered: no partial-data note
    out = run_sing("--config", str(config), "--warehouse", str(wh.root), "job", "lonely", "--json")
    assert out.returncode == 0, out.stderr
    (job,) = json.loads(out.stdout)["rows"]
    assert job["job_id"] == "lonely" and job["num_nodes"] == 2
    assert job["gpu_hours"] == pytest.approx(16.0)
    assert job["rdma_bytes_per_node_hour"] == pytest.approx(8000.0)  # 8 x 1 kB x 2 / 2 h
    assert len(job["per_gpu"]) == 8 and len(job["notes"]) == 1
    # Byte counts are JSON numbers, not strings (sums of BIGINT are HUGEINT -> Decimal).
    assert job["per_node_rdma"][0] == {"node": "lonely-0", "tx_bytes": 8000, "rx_bytes": 8000}


def test_sing_job_unknown_exits_1(wh: Warehouse) -> None:
    out = run_sing("--warehouse", str(wh.root), "job", "nosuch")
    assert out.returncode == 1
    assert out.stderr.strip() == "sing: no job nosuch in the warehouse"
    assert out.stdout == ""


def test_sing_job_custom_notes_file(wh: Warehouse, tmp_path: Path) -> None:
    """[thresholds] notes_file, relative to the config file, replaces the default notes."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "my-notes.toml").write_text(
        '[[note]]\nwhen = "mean_util >= low_util"\nsay = "Busy: {mean_util:.0%} of {num_gpus}."\n'
    )
    config = tmp_path / "site" / "sing.toml"
    config.write_text(
        '[thresholds]\nnotes_file = "my-notes.toml"\nlow_util = 0.65\n'
        "[collector]\ninterval_s = 900\n"  # fully covered: no partial-data note
    )
    for job_id, notes in (("healthy", ["Busy: 70% of 4."]), ("never", [])):
        out = run_sing(
            "--config", str(config), "--warehouse", str(wh.root), "job", job_id, "--json"
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["rows"][0]["notes"] == notes

    (tmp_path / "site" / "my-notes.toml").write_text('[[note]]\nsay = "no condition"\n')
    out = run_sing("--config", str(config), "--warehouse", str(wh.root), "job", "healthy")
    assert out.returncode == 1
    assert "my-notes.toml: note 1 needs exactly the keys 'when' and 'say'" in out.stderr


def test_job_id_in_two_clusters_needs_a_cluster(tmp_path: Path) -> None:
    """Job ids repeat across clusters: `sing job 7` names both, `--cluster` picks one."""
    wh = Warehouse(tmp_path / "wh")
    for cluster, util in (("a", 0.8), ("b", 0.2)):
        add_job(wh, "7", ["n1"], 1, at(0), at(2), cluster=cluster)
        add_gpu_samples(wh, "7", "n1", [0], at(0), at(2), util, cluster=cluster)
    with pytest.raises(UserError, match=r"job 7 is in several clusters \(a, b\): name one"):
        job_report(wh.connect(), "7", Thresholds(), [], at(24))
    job = job_report(wh.connect(), "7", Thresholds(), [], at(24), cluster="b")
    assert job["mean_util"] == pytest.approx(0.2) and len(job["per_gpu"]) == 1
    out = run_sing("--warehouse", str(wh.root), "job", "7", "--cluster", "a", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"][0]["mean_util"] == pytest.approx(0.8)
    with pytest.raises(UserError, match="no job 7 of cluster c in the warehouse"):
        job_report(wh.connect(), "7", Thresholds(), [], at(24), cluster="c")
