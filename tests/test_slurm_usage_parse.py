"""CPU and memory per job from Slurm's own accounting, read from output captured on a real Slurm
22.05 and 24.11 (tests/executors_data/slurm-22.05/README.md says how; the same jobs on both).

sing reads ended jobs' figures from `sacct --json`; each is checked against what the same sacct
printed as text for the same jobs (`sacct -P` with its steps: AllocCPUS, ReqMem, the job's
TotalCPU, the steps' TRESUsageInTot), read with sing's parser of Slurm's units, the one the
running jobs' `sstat` text needs; and against what each job asked for and did.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from sing.errors import UserError
from sing.executors.records import JobUsage, to_tables
from sing.executors.slurm_parse import (
    SACCT_TEXT_FIELDS,
    SSTAT_FIELDS,
    parse_sacct,
    parse_squeue,
    parse_sstat,
)
from sing.executors.slurm_units import duration_s, size_bytes, usage_tres
from sing.schema import table
from sing.warehouse.store import Warehouse
from tests.test_slurm_captured_24_11 import columns

DATA = Path(__file__).parent / "executors_data"
RELEASES = ("22.05", "24.11")
MIB = 1 << 20


def captured(release: str, name: str) -> str:
    return (DATA / f"slurm-{release}" / name).read_text()


def text_lines(release: str) -> dict[str, dict[str, str]]:
    """The captured `sacct -P` (jobs and their steps), by JobID: {column: value}."""
    header, *lines = captured(release, "sacct-usage-P.txt").splitlines()
    names = header.split("|")
    rows = [dict(zip(names, line.split("|"), strict=True)) for line in lines]
    return {r["JobID"]: r for r in rows}


def ended(release: str) -> dict:
    """sing's records of the captured ended jobs, from the JSON and the `-X -P` text it reads."""
    text = columns(DATA / f"slurm-{release}" / "sacct-usage-X-P.txt", SACCT_TEXT_FIELDS)
    return {r.job_id: r for r in parse_sacct(captured(release, "sacct-usage.json"), text, "c")}


def test_durations_sizes_and_usage_as_slurm_prints_them() -> None:
    durations = {"1-02:03:04": 93784, "02:03:04": 7384, "00:04.762": 4.762, "00:00:00": 0,
                 "00:01:05": 65, "59:59.999": 3599.999}  # fmt: skip
    assert {text: duration_s(text, "t") for text in durations} == durations
    sizes = {"12048K": 12337152, "2G": 2 << 30, "2.50G": 2684354560, "1000M": 1000 * MIB,
             "0": 0, "300": 300, "1T": 1 << 40}  # fmt: skip
    assert {text: size_bytes(text, "t") for text in sizes} == sizes
    assert usage_tres("cpu=00:00:03,energy=0,fs/disk=32613,mem=12048K,vmem=NONE", "t") == {
        "cpu": 3.0, "energy": 0, "fs/disk": 32613, "mem": 12337152, "vmem": None,
    }  # fmt: skip
    for bad in ("1-02:03", "4.762", "1:2:3", "UNLIMITED", "INVALID", ""):
        with pytest.raises(UserError, match="is not a Slurm duration"):
            duration_s(bad, "sstat")
    for bad in ("12Q", "-5", "1.5.5K", "K", ""):
        with pytest.raises(UserError, match="is not a Slurm size"):
            size_bytes(bad, "sstat")
    with pytest.raises(UserError, match="'mem' is not NAME=VALUE"):
        usage_tres("cpu=00:00:01,mem", "sstat")


@pytest.mark.parametrize("release", RELEASES)
def test_ended_jobs_figures_are_what_sacct_prints(release: str) -> None:
    records, text = ended(release), text_lines(release)
    assert sorted(records) == ["1", "2", "3", "5"]
    for job_id, record in records.items():
        job = text[job_id]
        steps = [usage_tres(r["TRESUsageInTot"], r["JobID"]) for r in text.values()
                 if r["JobID"].startswith(f"{job_id}.")]  # fmt: skip
        assert record.alloc_cpus == int(job["AllocCPUS"])
        assert record.req_mem_bytes == size_bytes(job["ReqMem"], "ReqMem")
        # TotalCPU text keeps milliseconds; the JSON has microseconds.
        assert record.slurm_cpu_s == pytest.approx(duration_s(job["TotalCPU"], "t"), abs=1e-3)
        seff_mem = max((step.get("mem") or 0 for step in steps), default=0)
        assert record.slurm_max_rss_bytes == (seff_mem or None)


@pytest.mark.parametrize("release", RELEASES)
def test_ended_jobs_cpus_memory_asked_and_used(release: str) -> None:
    """1 `burn`: -c 2 --mem=1000M, a step of two tasks each touching 100 MiB and burning 2 s,
    then 50 MiB and 0.5 s in the batch step; 2 `percpu`: 2 nodes, one CPU each,
    --mem-per-cpu=300M; 3 `failed`: --mem=2G, `exit 3` at once; 5 `running`: cancelled."""
    records = ended(release)
    got = {job: (r.alloc_cpus, r.req_mem_bytes) for job, r in records.items()}
    assert got == {"1": (2, 1000 * MIB), "2": (2, 600 * MIB), "3": (1, 2048 * MIB),
                   "5": (1, 500 * MIB)}  # fmt: skip
    burn = records["1"]
    assert 4.5 <= burn.slurm_cpu_s <= 5.5  # 2 x 2 s + 0.5 s, and the interpreters, srun, bash
    # seff's memory: the larger step's task peaks summed, more than one task could hold.
    assert 200 * MIB < burn.slurm_max_rss_bytes < 2 * 140 * MIB
    failed = records["3"]  # its step ran too briefly to be sampled: no memory figure
    assert failed.slurm_max_rss_bytes is None and 0 < failed.slurm_cpu_s < 0.1


@pytest.mark.parametrize("release", RELEASES)
def test_running_jobs_take_cpus_and_memory_from_squeue(release: str) -> None:
    records = {r.job_id: r for r in parse_squeue(captured(release, "squeue-usage.json"), "c")}
    assert records["5"].name == "running" and "4" not in records  # 4 held: pending
    expected = {"1": (2, 1000 * MIB), "2": (2, 600 * MIB), "5": (1, 500 * MIB)}
    for job_id, record in records.items():
        assert (record.alloc_cpus, record.req_mem_bytes) == expected[job_id]
        assert (record.slurm_cpu_s, record.slurm_max_rss_bytes) == (None, None)


@pytest.mark.parametrize("release", RELEASES)
def test_sstat_of_a_running_job(release: str) -> None:
    """Job 5 while its step held 80 MiB after burning 2.5 s; `--noconvert` prints the same
    figures in bytes (the default text loses nothing)."""
    usage, raw = (
        parse_sstat(columns(DATA / f"slurm-{release}" / name, SSTAT_FIELDS))
        for name in ("sstat-P.txt", "sstat-noconvert-P.txt")
    )
    assert usage == raw
    assert usage.cpu_s == 2
    assert 80 * MIB < usage.max_rss_bytes < 120 * MIB
    assert parse_sstat("") is None  # sstat of a job with no running step prints nothing


def test_sstat_lines_of_another_shape_are_refused() -> None:
    with pytest.raises(UserError, match="sstat -P line 1: expected 3 fields"):
        parse_sstat("5.0|cpu=00:00:01\n")
    with pytest.raises(UserError, match=r"line 1 \(step 5.0\): mem: '1Q' is not a Slurm size"):
        parse_sstat("5.0|cpu=00:00:01,mem=1Q|cpu=00:00:01\n")
    assert parse_sstat("5.0|cpu=00:00:00,mem=0|\n") == JobUsage(None, None)


def test_a_warehouse_from_before_these_columns_takes_them_at_its_next_sync(tmp_path: Path) -> None:
    """Adding columns needs no migration step (sing/warehouse/migrations.py): older rows read
    NULL, and the next upsert of a job adds the columns to the table's Delta schema."""
    wh = Warehouse(tmp_path / "wh")
    new = ("alloc_cpus", "req_mem_bytes", "slurm_cpu_s", "slurm_max_rss_bytes")
    old = pa.schema([field for field in table("jobs").schema if field.name not in new])
    before = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [{"job_id": job_id, "cluster": "c", "state": "COMPLETED", "recorded_at": before}
            for job_id in ("1", "9")]  # fmt: skip
    wh.append("jobs", pa.Table.from_pylist(rows, schema=old))
    select = f"SELECT job_id, {', '.join(new)} FROM jobs ORDER BY job_id"
    assert wh.connect().execute(select).fetchall() == [("1", *[None] * 4), ("9", *[None] * 4)]
    jobs, _ = to_tables([ended("24.11")["1"]], recorded_at=before + timedelta(days=1))
    wh.append("jobs", jobs)
    (one, nine) = wh.connect().execute(select).fetchall()
    assert one[:3] == ("1", 2, 1000 * MIB) and one[3] > 4 and one[4] > 200 * MIB
    assert nine == ("9", *[None] * 4)
