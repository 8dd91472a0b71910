"""Importers: real Philly data, hand-made fixtures of each public format, bad input, SWF."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from sing.cli import main
from sing.errors import UserError
from tests.shared_data import PHILLY, require
from traces.importers import import_trace
from traces.read import SIMULATION_COLUMNS, jobs_for_simulation
from traces.swf import write_swf
from traces.validate import validate

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def rows(trace: Path, *columns: str) -> list[tuple]:
    table = pq.read_table(trace / "jobs.parquet", columns=list(columns))
    return [tuple(r.values()) for r in table.to_pylist()]


def figures(trace: Path) -> dict:
    return json.loads((trace / "aggregates.json").read_text())


def test_philly_jobs_file_keeps_every_job_and_all_gpu_seconds(tmp_path):
    require(PHILLY)
    source = pl.read_csv(PHILLY).drop_nulls()  # the file ends with a blank line
    out = import_trace("philly", PHILLY, tmp_path / "philly")
    agg = figures(out)
    assert agg["jobs"] == 82_247 == source.height
    assert agg["gpu_seconds"] == source["gpu_time"].sum()  # integers: the sum is exact
    assert validate(out) == []
    sim = jobs_for_simulation(out)
    assert sim.height == 82_247 and sim["submit_time_s"].is_sorted()


def test_philly_csv_times_are_pacific_unsorted_and_blank_line_skipped(tmp_path):
    out = import_trace("philly", FIXTURES / "philly_jobs.csv", tmp_path / "t")
    package = json.loads((out / "datapackage.json").read_text())
    # earliest arrival 2017-10-03 06:13:03 PDT = 13:13:03 UTC; release starts that UTC day
    assert package["release_start"] == "2017-10-03T00:00:00+00:00"
    assert rows(out, "job_id", "submit_s", "run_s", "num_gpus") == [
        ("philly-000003", 47_583.0, 2951.0, 4),
        ("philly-000005", 111_600.0, 10.0, 8),  # 2017-10-04 00:00 PDT = 07:00 UTC
        ("philly-000002", 568_915.0, 66.0, 1),
        # 01:30 on 2017-11-05 happened twice (DST ended); the first, PDT, is taken
        ("philly-000004", 2_881_800.0, 100.0, 2),
    ]
    assert figures(out)["gpu_seconds"] == 66 + 11_804 + 200 + 80


def test_philly_raw_job_log(tmp_path):
    out = import_trace("philly", FIXTURES / "philly_cluster_job_log.json", tmp_path / "t")
    got = rows(out, "user", "queue_s", "run_s", "num_gpus", "num_nodes", "state", "censored")
    assert got == [
        # start of the first attempt to end of the last; GPUs and nodes of the last attempt
        ("ee0a85", 60.0, 7200.0, 8, 2, "completed", False),
        ("f4b8a1", None, None, None, None, "cancelled", False),
        ("ee0a85", 1800.0, None, 1, 1, "running", True),  # end time "None": still running
    ]
    assert validate(out) == []


def test_helios_times_in_china_time_missing_fields_and_jobname_dropped(tmp_path):
    out = import_trace("helios", FIXTURES / "helios_cluster_log.csv", tmp_path / "t")
    assert rows(out, "job_id", "submit_s", "queue_s", "run_s", "state", "gpus_per_node") == [
        ("1", 0.0, 30.0, 60.0, "failed", 1),  # 08:00 CST = 00:00 UTC
        ("2", 1800.0, None, 0.0, "cancelled", 0),  # never started: no start time
        ("3", 3600.0, 600.0, 3600.0, "completed", 8),
        ("4", 61_200.0, 0.0, 7200.0, "timeout", 8),  # 16 GPUs on 2 nodes
    ]
    agg = figures(out)
    assert (agg["gpu_jobs"], agg["gpu_seconds"]) == (3, 60 + 3600 * 8 + 7200 * 16)
    assert (agg["mean_queue_s"], agg["median_run_s"]) == (210.0, 3600.0)
    assert all(b"secret" not in p.read_bytes() for p in out.iterdir())


def test_acme_offsets_are_honoured(tmp_path):
    out = import_trace("acme", FIXTURES / "acme_kalos_job_trace.csv", tmp_path / "t")
    assert rows(out, "job_id", "submit_s", "queue_s", "num_gpus", "partition") == [
        ("dlctk0", 54_000.0, 0.0, 0, "Other"),  # 23:00+08:00 = 15:00 UTC on 2023-04-30
        ("dlctk1", 93_600.0, 60.0, 8, "Pretrain"),
        ("dlctk2", 100_800.0, 1800.0, 64, "SFT"),
    ]
    assert figures(out)["gpu_seconds"] == 3600 * 8 + 600 * 64


def test_pai_headerless_tables_with_fractional_gpus(tmp_path):
    out = import_trace("pai", FIXTURES / "pai_job_table.csv", tmp_path / "t")
    assert rows(out, "job_id", "queue_s", "run_s", "num_gpus", "state", "censored") == [
        ("joba", 10.0, 90.0, 1, "failed", False),  # half a GPU, rounded up
        ("jobb", 50.0, 3550.0, 2, "completed", False),  # 2 x 100% + a ps task without GPU
        ("jobc", 200.0, None, 2, "running", True),  # 4 x 50%
    ]
    assert validate(out) == []


@pytest.mark.parametrize(
    ("fmt", "name", "message"),
    [
        ("philly", "philly_bad_duration.csv", "line 3: column duration: 'ten' is not a number"),
        ("helios", "helios_bad_time.csv", "line 3: column submit_time: '2020-13-01 08:00:00'"),
        ("helios", "philly_jobs.csv", "missing column(s) job_id, user, vc"),
    ],
)
def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, fmt, name, message):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=name) as err:
        import_trace(fmt, FIXTURES / name, out)
    assert message in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_non_empty_out_and_keeps_it(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    code = main(
        [
            "trace",
            "import",
            "--format",
            "helios",
            str(FIXTURES / "helios_cluster_log.csv"),
            "--out",
            str(out),
        ]
    )
    assert code == 1
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_validate_catches_edited_copy(tmp_path, capsys):
    out = import_trace("helios", FIXTURES / "helios_cluster_log.csv", tmp_path / "t")
    assert main(["trace", "validate", str(out)]) == 0
    csv = out / "jobs.csv"
    csv.write_text(csv.read_text().replace(",3600.0,", ",3601.0,", 1))
    assert main(["trace", "validate", str(out)]) == 1
    report = capsys.readouterr().out
    assert "jobs.csv: SHA-256 differs" in report and "row(s) differ from the Parquet file" in report


def test_swf_export(tmp_path):
    out = import_trace("helios", FIXTURES / "helios_cluster_log.csv", tmp_path / "t")
    n = write_swf(out, tmp_path / "h.swf")
    lines = (tmp_path / "h.swf").read_text().splitlines()
    header = [line for line in lines if line.startswith(";")]
    records = [line.split() for line in lines if not line.startswith(";")]
    assert n == 4 and len(records) == 4
    assert "; UnixStartTime: 1585699200" in header  # 2020-04-01T00:00Z
    assert len(records[0]) == 18
    # job 1: submit 0, wait 30, run 60, 1 GPU, failed (0), user u1 -> 1, queue vcA -> 1
    assert records[0] == [
        "1",
        "0",
        "30",
        "60",
        "1",
        "-1",
        "-1",
        "1",
        "-1",
        "-1",
        "0",
        "1",
        "-1",
        "-1",
        "1",
        "-1",
        "-1",
        "-1",
    ]
    assert records[1][2:5] == ["-1", "0", "0"]  # never started: wait unknown


def test_jobs_for_simulation_leaves_out_cpu_and_unstarted_jobs(tmp_path):
    out = import_trace("helios", FIXTURES / "helios_cluster_log.csv", tmp_path / "t")
    sim = jobs_for_simulation(out)
    assert sim.columns == list(SIMULATION_COLUMNS)
    assert sim.rows() == [
        ("1", "u1", 0.0, 60.0, 1, 1, 1.0, "", None, 30.0),
        ("3", "u2", 3600.0, 3600.0, 8, 1, 8.0, "", None, 4200.0),
        ("4", "u3", 61_200.0, 7200.0, 16, 2, 16.0, "", None, 61_200.0),
    ]
