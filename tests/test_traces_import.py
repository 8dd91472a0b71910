"""Importers: real Philly data, hand-made fixtures of each public format, bad input, SWF."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from sing.cli import main
from sing.errors import UserError
from sing.traces.importers import import_trace
from sing.traces.read import (
    SIMULATION_COLUMNS,
    read_jobs,
    read_nodes,
    simulation_frame,
)
from sing.traces.swf import write_swf
from sing.traces.validate import validate
from tests.shared_data import PHILLY, require

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
    sim = simulation_frame(read_jobs(out))
    assert sim.height == 82_247 and sim["submit_time_s"].is_sorted()


def test_philly_csv_times_are_utc_unsorted_and_blank_line_skipped(tmp_path):
    out = import_trace("philly", FIXTURES / "philly_jobs.csv", tmp_path / "t")
    package = json.loads((out / "datapackage.json").read_text())
    # naive times are UTC (the job log's YARN ids date them): earliest arrival 2017-10-03
    # 06:13:03, so the release starts at midnight UTC of that day
    assert package["release_start"] == "2017-10-03T00:00:00+00:00"
    assert rows(out, "job_id", "submit_s", "run_s", "num_gpus", "group", "partition") == [
        ("philly-000003", 22_383.0, 2951.0, 4, "6214e9", "6214e9"),
        ("philly-000005", 86_400.0, 10.0, 8, "6214e9", "6214e9"),
        ("philly-000002", 543_715.0, 66.0, 1, "11cb48", "11cb48"),
        # 01:30 on 2017-11-05, when US Pacific time fell back, is one time in UTC
        ("philly-000004", 2_856_600.0, 100.0, 2, "6c71a0", "6c71a0"),
    ]
    assert figures(out)["gpu_seconds"] == 66 + 11_804 + 200 + 80
    # --timezone still reads a file whose times are local, for a copy that was converted
    local = import_trace(
        "philly", FIXTURES / "philly_jobs.csv", tmp_path / "pacific", "America/Los_Angeles"
    )
    assert rows(local, "submit_s")[0] == (47_583.0,)  # 06:13:03 PDT = 13:13:03 UTC


def test_philly_raw_job_log(tmp_path):
    out = import_trace("philly", FIXTURES / "philly_cluster_job_log.json", tmp_path / "t")
    got = rows(out, "user", "group", "queue_s", "run_s", "num_gpus", "num_nodes", "state")
    assert got == [
        # start of the first attempt to end of the last; GPUs and nodes of the last attempt;
        # the virtual cluster is the group
        ("ee0a85", "6214e9", 60.0, 7200.0, 8, 2, "completed"),
        ("f4b8a1", "11cb48", None, None, None, None, "cancelled"),
        ("ee0a85", "11cb48", 1800.0, None, 1, 1, "running"),  # end time "None": still running
    ]
    assert [c for (c,) in rows(out, "censored")] == [False, False, True]
    package = json.loads((out / "datapackage.json").read_text())
    assert package["release_start"] == "2017-10-03T00:00:00+00:00"  # 07:54:37 UTC
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
    got = rows(out, "job_id", "queue_s", "run_s", "num_gpus", "gpu_request", "state", "censored")
    assert got == [
        ("joba", 10.0, 90.0, 1, 0.5, "failed", False),  # half a GPU, rounded up
        ("jobb", 50.0, 3550.0, 2, 2.0, "completed", False),  # 2 x 100% + a ps task without GPU
        ("jobc", 200.0, None, 2, 2.0, "running", True),  # 4 x 50%
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
    sim = simulation_frame(read_jobs(out))
    assert sim.columns == list(SIMULATION_COLUMNS)
    assert sim.rows() == [
        ("1", "u1", 0.0, 60.0, 1, 1, 1.0, "", None, 30.0),
        ("3", "u2", 3600.0, 3600.0, 8, 1, 8.0, "", None, 4200.0),
        ("4", "u3", 61_200.0, 7200.0, 16, 2, 16.0, "", None, 61_200.0),
    ]


def test_pods_with_node_list_known_answer(tmp_path):
    """Seven hand-made pods (fixture) whose figures are worked out by hand below."""
    out = import_trace(
        "pods",
        FIXTURES / "openb_pod_list.csv",
        tmp_path / "t",
        nodes=FIXTURES / "openb_node_list.csv",
    )
    assert rows(out, "job_id", "submit_s", "start_s", "end_s", "run_s", "queue_s") == [
        ("openb-pod-0000", 0.0, 0.0, 5000.0, 5000.0, 0.0),  # scheduled at 0: 0 is a real time
        ("openb-pod-0001", 100.0, 130.0, 10_000.0, 9870.0, 30.0),
        ("openb-pod-0002", 200.0, 260.0, 3800.0, 3540.0, 60.0),
        ("openb-pod-0003", 300.0, 300.0, 400.0, 100.0, 0.0),
        ("openb-pod-0004", 400.0, None, 700.0, None, None),  # never scheduled, deleted
        ("openb-pod-0005", 500.0, 502.0, 10_000.0, 9498.0, 2.0),
        ("openb-pod-0006", 600.0, None, 10_000.0, None, None),  # still waiting at the end
    ]
    got = rows(out, "state", "censored", "num_gpus", "gpu_request", "gpu_model_request")
    assert got == [
        ("cancelled", False, 1, 1.0, None),  # deleted at 5000 while Running
        ("running", True, 1, 0.46, None),  # 460 milli-GPU; alive at the end (10,000 s)
        ("completed", False, 8, 8.0, None),
        ("failed", False, 1, 1.0, "V100M16|V100M32"),  # the allowed models as written
        ("cancelled", False, 1, 1.0, None),
        ("running", True, 0, 0.0, None),  # CPU-only pod kept
        ("pending", True, 2, 2.0, "G2"),
    ]
    assert rows(out, "partition", "num_nodes", "gpus_per_node")[2] == ("Burstable", 1, 8)
    agg = figures(out)
    # GPU-seconds: 5000 x 1 + 9870 x 0.46 + 3540 x 8 + 100 x 1 (pod 5 has no GPU): pod 1 holds
    # 0.46 of a GPU, and its share, not a whole GPU, counts
    assert agg["gpu_seconds"] == pytest.approx(5000 + 0.46 * 9870 + 8 * 3540 + 100)
    assert (agg["jobs"], agg["gpu_jobs"]) == (7, 6)
    assert agg["jobs_by_state"] == {
        "cancelled": 2,
        "completed": 1,
        "failed": 1,
        "pending": 1,
        "running": 2,
    }
    assert agg["median_run_s"] == (5000.0 + 3540.0) / 2  # of 9870, 3540, 100, 5000 (GPU pods)
    package = json.loads((out / "datapackage.json").read_text())
    assert package["release_start"] == "1970-01-01T00:00:00+00:00"
    assert package["sing_format"]["version"] == "1.3"
    assert read_nodes(out).to_pylist() == [
        {"node": "openb-node-0000", "gpus": 2, "gpu_model": "P100"},
        {"node": "openb-node-0001", "gpus": 8, "gpu_model": "V100M32"},
        {"node": "openb-node-0002", "gpus": 4, "gpu_model": "V100M16"},
        {"node": "openb-node-0003", "gpus": 1, "gpu_model": "V100M16"},
        {"node": "openb-node-0004", "gpus": 0, "gpu_model": None},  # a CPU node
    ]
    assert validate(out) == []
    nodes_csv = out / "nodes.csv"
    nodes_csv.write_text(nodes_csv.read_text().replace(",8,", ",4,"))
    assert any("nodes.csv: SHA-256 differs" in p for p in validate(out))


def test_pods_cli_prints_jobs_and_cluster(tmp_path, capsys):
    code = main(
        [
            "trace",
            "import",
            "--format",
            "pods",
            str(FIXTURES / "openb_pod_list.csv"),
            "--nodes",
            str(FIXTURES / "openb_node_list.csv"),
            "--out",
            str(tmp_path / "t"),
        ]
    )
    assert code == 0
    assert "7 jobs, 10.5 GPU-hours; 5 nodes, 15 GPUs" in capsys.readouterr().out


def test_release_without_node_list_has_no_nodes(tmp_path):
    out = import_trace("pods", FIXTURES / "openb_pod_list.csv", tmp_path / "t")
    assert read_nodes(out) is None and not (out / "nodes.parquet").exists()


POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


@pytest.mark.parametrize(
    ("pods", "nodes", "message"),
    [
        ("p1,1,1,1,500,,LS,Running,0,9,0\np1,1,1,1,500,,LS,Running,1,9,1\n", None,
         "pods.csv: line 3: pod name listed twice"),
        ("p1,1,1,1,0,,LS,Running,0,9,0\n", None,
         "line 2: column gpu_milli: a GPU pod asks for 1 to 1000 thousandths"),
        ("p1,1,1,1,1500,,LS,Running,0,9,0\n", None, "line 2: column gpu_milli"),
        ("p1,1,1,-1,0,,LS,Running,0,9,0\n", None, "line 2: column num_gpu: a GPU count is 0"),
        ("p1,1,1,1,1000,,LS,Running,,9,0\n", None, "line 2: column creation_time is empty"),
        ("p1,1,1,1,1000,,LS,Running,0,9,soon\n", None,
         "line 2: column scheduled_time: 'soon' is not a number"),
        ("p1,1,1,1,1000,,LS,Running,0,9,0\n", "a,1,1,8,A100\na,1,1,8,A100\n",
         "nodes.csv: line 3: node listed twice"),
        ("p1,1,1,1,1000,,LS,Running,0,9,0\n", "a,1,1,-8,A100\n",
         "nodes.csv: line 2: column gpu: a node has 0 GPUs or more"),
    ],
)  # fmt: skip
def test_pods_bad_rows_name_their_line_and_write_nothing(tmp_path, pods, nodes, message):
    (tmp_path / "pods.csv").write_text(POD_HEADER + pods)
    node_list = None
    if nodes is not None:
        node_list = tmp_path / "nodes.csv"
        node_list.write_text(NODE_HEADER + nodes)
    with pytest.raises(UserError) as err:
        import_trace("pods", tmp_path / "pods.csv", tmp_path / "out", nodes=node_list)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()


def test_node_list_needs_its_columns(tmp_path):
    (tmp_path / "nodes.csv").write_text("host,gpu\na,8\n")
    with pytest.raises(UserError, match=r"missing column\(s\) node or sn, gpu_model or model"):
        import_trace(
            "helios",
            FIXTURES / "helios_cluster_log.csv",
            tmp_path / "out",
            nodes=tmp_path / "nodes.csv",
        )


def test_pai_jobs_that_never_started_are_not_runs(tmp_path):
    """PAI writes 0 for a time that never came; a job whose tasks never started, or that ended
    before its first task started, has no start or run time."""
    (tmp_path / "pai_job_table.header").write_text(
        "job_name,inst_id,user,status,start_time,end_time"
    )
    (tmp_path / "pai_job_table.csv").write_text(
        "ran,i1,u,Terminated,100,400\n"  # task started at 150: queue 50, run 250
        "waiting,i2,u,Waiting,200,0\n"  # task start 0: never started, still waiting
        "killed,i3,u,Failed,300,350\n"  # its task never started (empty): cancelled
        "early,i4,u,Terminated,400,450\n"  # ended before its task's start at 500
    )
    (tmp_path / "pai_task_table.header").write_text(
        "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type"
    )
    (tmp_path / "pai_task_table.csv").write_text(
        "ran,worker,2,Terminated,150,400,100,1,25,T4\n"
        "waiting,worker,1,Waiting,0,0,100,1,100,\n"
        "killed,worker,1,Failed,,,100,1,100,\n"
        "early,worker,1,Terminated,500,450,100,1,100,\n"
    )
    out = import_trace("pai", tmp_path / "pai_job_table.csv", tmp_path / "t")
    got = rows(out, "job_id", "start_s", "queue_s", "run_s", "state", "censored", "gpu_request")
    assert got == [
        ("ran", 150.0, 50.0, 250.0, "completed", False, 0.5),  # 2 x 25 %
        ("waiting", None, None, None, "pending", True, 1.0),
        ("killed", None, None, None, "cancelled", False, 1.0),
        ("early", None, None, None, "cancelled", False, 1.0),
    ]
    assert rows(out, "num_gpus")[0] == (1,)  # half a GPU, rounded up
    assert validate(out) == []


def test_pai_without_task_table_waiting_jobs_did_not_run(tmp_path):
    (tmp_path / "pai_job_table.header").write_text(
        "job_name,inst_id,user,status,start_time,end_time"
    )
    (tmp_path / "pai_job_table.csv").write_text("a,i1,u,Terminated,100,400\nb,i2,u,Waiting,200,\n")
    out = import_trace("pai", tmp_path / "pai_job_table.csv", tmp_path / "t")
    assert rows(out, "job_id", "start_s", "run_s", "state") == [
        ("a", 100.0, 300.0, "completed"),  # start unknown: the submit time, as documented
        ("b", None, None, "pending"),
    ]


def test_pod_never_deleted_is_cut_at_the_end_and_keeps_its_gpu_time(tmp_path):
    """An empty deletion_time means alive at the end (Alibaba 2025): the run is cut at the
    trace's end (the last time recorded, 100 s), censored, not a pod that never ran."""
    (tmp_path / "pods.csv").write_text(
        POD_HEADER + "p1,1,1,1,1000,,LS,Succeeded,0,100,0\np2,1,1,2,1000,,LS,Running,10,,20\n"
    )
    out = import_trace("pods", tmp_path / "pods.csv", tmp_path / "t")
    assert rows(out, "job_id", "start_s", "end_s", "run_s", "state", "censored") == [
        ("p1", 0.0, 100.0, 100.0, "completed", False),
        ("p2", 20.0, 100.0, 80.0, "running", True),
    ]
    assert figures(out)["gpu_seconds"] == 100 * 1 + 80 * 2
    assert json.loads((out / "datapackage.json").read_text())["source_gpu_seconds"] == 260
    assert validate(out) == []


def test_pods_created_before_the_trace_start_move_the_release_start(tmp_path):
    (tmp_path / "pods.csv").write_text(
        POD_HEADER + "p1,1,1,1,1000,,LS,Succeeded,-50,100,-40\np2,1,1,1,1000,,LS,Failed,10,60,20\n"
    )
    out = import_trace("pods", tmp_path / "pods.csv", tmp_path / "t")
    package = json.loads((out / "datapackage.json").read_text())
    assert package["release_start"] == "1969-12-31T23:59:10+00:00"  # 50 s before the start
    assert rows(out, "job_id", "submit_s", "start_s", "end_s", "run_s") == [
        ("p1", 0.0, 10.0, 150.0, 140.0),
        ("p2", 60.0, 70.0, 110.0, 40.0),
    ]
    assert validate(out) == []


@pytest.mark.parametrize("count", ["1.5", "0.5", "2.0000001"])
def test_fractional_gpu_count_is_refused_not_rounded(tmp_path, count):
    (tmp_path / "pods.csv").write_text(POD_HEADER + f"p1,1,1,{count},1000,,LS,Running,0,9,0\n")
    with pytest.raises(UserError, match=f"line 2: column num_gpu: '{count}' is not a whole"):
        import_trace("pods", tmp_path / "pods.csv", tmp_path / "out")


def test_validate_fails_a_release_that_lost_gpu_time_of_its_source(tmp_path, capsys):
    """The Alibaba 2025 release kept 347,841 of 2,375,875 GPU-hours and was called valid."""
    out = import_trace("pods", FIXTURES / "openb_pod_list.csv", tmp_path / "t")
    package = json.loads((out / "datapackage.json").read_text())
    kept = figures(out)["gpu_seconds"]
    assert package["source_gpu_seconds"] == pytest.approx(kept)
    package["source_gpu_seconds"] = kept / 0.146
    (out / "datapackage.json").write_text(json.dumps(package))
    assert validate(out) == [
        "GPU-time not conserved: the release holds 10.5 GPU-hours of the source's 72.2 (14.6%)"
    ]
    assert main(["trace", "validate", str(out)]) == 1
    assert "INVALID" in capsys.readouterr().out


def test_philly_import_conserves_the_files_gpu_time(tmp_path):
    out = import_trace("philly", FIXTURES / "philly_jobs.csv", tmp_path / "t")
    package = json.loads((out / "datapackage.json").read_text())
    assert package["source_gpu_seconds"] == pytest.approx(figures(out)["gpu_seconds"])


def test_swf_archive_log_known_answer(tmp_path):
    """A log in the Parallel Workloads Archive's layout: header comments, -1 for unknown, a job
    cancelled before it ran (status 5, run time -1), a CPU-only one."""
    out = import_trace("swf", FIXTURES / "ipsc_like.swf", tmp_path / "t")
    package = json.loads((out / "datapackage.json").read_text())
    assert package["release_start"] == "1993-10-01T07:00:00+00:00"  # UnixStartTime 749458800
    assert rows(out, "job_id", "submit_s", "start_s", "end_s", "run_s", "num_gpus", "state") == [
        ("1", 0.0, 10.0, 110.0, 100.0, 4, "completed"),
        ("2", 50.0, 50.0, 250.0, 200.0, 8, "completed"),
        ("3", 60.0, None, None, None, 2, "cancelled"),  # never ran: the requested processors
        ("4", 100.0, 120.0, 150.0, 30.0, 2, "failed"),
        ("5", 400.0, 400.0, 450.0, 50.0, 1, "unknown"),  # status -1
        ("6", 410.0, 415.0, 475.0, 60.0, 0, "completed"),
    ]
    assert rows(out, "user", "group", "partition", "time_limit_s")[3:5] == [
        ("3", "2", "0", None),
        (None, None, None, None),  # -1: unknown
    ]
    assert figures(out)["gpu_seconds"] == package["source_gpu_seconds"] == 2110
    assert read_nodes(out).num_rows == 8 and set(read_nodes(out)["gpus"].to_pylist()) == {1}
    assert validate(out) == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1 0 10 100 4 -1 -1 4 3600 -1 1 1 1 -1 1 -1 -1\n", "line 2: 17 fields, SWF has 18"),
        ("1 0 -5 100 4 -1 -1 4 3600 -1 1 1 1 -1 1 -1 -1 -1\n", "wait is below 0 and not -1"),
        ("1 -1 0 100 4 -1 -1 4 3600 -1 1 1 1 -1 1 -1 -1 -1\n", "line 2: submit time is -1"),
        ("1 0 0 1e 4 -1 -1 4 3600 -1 1 1 1 -1 1 -1 -1 -1\n", "column run: '1e' is not a number"),
    ],
)
def test_swf_bad_lines_name_their_line(tmp_path, line, message):
    (tmp_path / "log.swf").write_text("; UnixStartTime: 0\n" + line)
    with pytest.raises(UserError, match=message):
        import_trace("swf", tmp_path / "log.swf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
