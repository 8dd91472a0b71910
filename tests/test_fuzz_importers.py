"""Fuzzing every trace importer (sing/traces/importers) with Hypothesis.

One test per importer, 2,000 inputs each (tests/fuzzing.py scales them). Sources are tables
with each format's columns (some left out, some unknown added) and cells drawn from values near
the ones the importers parse: times in and out of range, across daylight-saving gaps, with and
without offsets; numbers that overflow, NaN, text; quotes, commas and blank lines; pod lists
with and without a node list (--nodes). Property: a complete trace directory or
sing.errors.UserError; on an error nothing is written beside the sources (no trace, no
half-written temporary directory).
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from sing.errors import UserError
from sing.traces.importers import import_trace
from sing.traces.package import DATAPACKAGE
from tests.fuzzing import fuzz

# 2,000 imports take two to three minutes of CPU; a loaded machine stretches that several times.
pytestmark = pytest.mark.timeout(1800)

# Per kind of column: values that parse (drawn more often) and values near them that may not.
GOOD = {
    "time": ["2017-10-03 06:13:03", "2020-04-01 08:00:00", "2017-11-05 01:30:00",
             "2017-03-12 02:30:00", "2017-10-03 06:13:03.5", "2020-04-01T08:00:00"],
    "number": ["0", "1", "8", "-5", "1.5", "460", "1000", "3600", "1507532515"],
    "text": ["a", "u1", "COMPLETED", "FAILED", "Running", "Succeeded", "Pending", "é", 'a "q"',
             "a,b", "x\ny"],
}  # fmt: skip
ODD = ["", "None", "-", "NAN", " ", "2023-05-01 10:00:00+08:00", "2023-05-01 10:00:00Z",
       "2020-13-01 08:00:00", "0001-01-01 00:00:00", "9999-12-31 23:59:59", "2017-10-03",
       "1e400", "-1e400", "inf", "9" * 25, "1e18", "-1e18", "0x10", "ten"]  # fmt: skip


def mostly(good: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`good` 19 times in 20, else `odd`: rows that import, with the odd value here and there."""
    return st.integers(0, 19).flatmap(lambda n: odd if n == 0 else good)


CELLS = {kind: mostly(st.sampled_from(good), st.sampled_from(ODD)) for kind, good in GOOD.items()}
CELL = st.sampled_from(sum(GOOD.values(), []) + ODD)
TIME_COLUMNS = {"timestamp", "submit_time", "start_time", "end_time"}
NUMBER_COLUMNS = {"duration", "num_gpus", "gpu_time", "gpu_num", "cpu_num", "node_num", "queue",
                  "inst_num", "plan_cpu", "plan_mem", "plan_gpu", "cpu_milli", "memory_mib",
                  "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time",
                  "gpu"}  # fmt: skip


def kind(column: str, fmt: str) -> str:
    if column in TIME_COLUMNS:
        return "number" if fmt == "pai" else "time"  # PAI times are shifted Unix seconds
    return "number" if column in NUMBER_COLUMNS else "text"


COLUMNS = {
    "philly": ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"],
    "helios": ["job_id", "user", "vc", "jobname", "gpu_num", "cpu_num", "node_num", "state",
               "submit_time", "start_time", "end_time", "duration", "queue"],
    "acme": ["job_id", "user", "gpu_num", "cpu_num", "node_num", "state", "submit_time",
             "start_time", "end_time", "duration", "queue", "type"],
    "pai": ["job_name", "inst_id", "user", "status", "start_time", "end_time"],
    "pods": ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
             "pod_phase", "creation_time", "deletion_time", "scheduled_time"],
}  # fmt: skip
NODE_LIST = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
PAI_TASKS = ["job_name", "task_name", "inst_num", "status", "start_time", "end_time",
             "plan_cpu", "plan_mem", "plan_gpu", "gpu_type"]  # fmt: skip


@st.composite
def table(draw: st.DrawFn, columns: list[str], fmt: str) -> tuple[list[str], str]:
    """(header, CSV text): most columns kept, in order, maybe an unknown one, a few rows."""
    kept = [c for c in columns if draw(st.integers(0, 29))] + draw(st.sampled_from([[], ["x"]]))
    row = st.tuples(*(CELLS[kind(c, fmt)] for c in kept))
    rows = draw(st.lists(row, min_size=1, max_size=4))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(rows)
    return kept, out.getvalue() + draw(mostly(st.just(""), st.sampled_from(["\n", "a,b\n", '"\n'])))


def csv_source(fmt: str) -> st.SearchStrategy[dict[str, str]]:
    """The files of a source of format `fmt`, by name; the first is the one imported."""
    if fmt == "pai":
        return st.builds(
            lambda jobs, tasks: {
                "pai_job_table.csv": jobs[1],
                "pai_job_table.header": ",".join(jobs[0]),
                **(
                    {"pai_task_table.csv": tasks[1], "pai_task_table.header": ",".join(tasks[0])}
                    if tasks
                    else {}
                ),
            },  # fmt: skip
            table(COLUMNS["pai"], fmt),
            st.none() | table(PAI_TASKS, fmt),
        )
    if fmt == "pods":  # a pod list, with a node list (--nodes) or without
        return st.builds(
            lambda pods, nodes: {
                "pods.csv": ",".join(pods[0]) + "\n" + pods[1],
                **({"nodes.csv": ",".join(nodes[0]) + "\n" + nodes[1]} if nodes else {}),
            },
            table(COLUMNS["pods"], fmt),
            st.none() | table(NODE_LIST, fmt),
        )
    name = {"philly": "philly.csv", "helios": "cluster_log.csv", "acme": "trace.csv"}[fmt]
    return table(COLUMNS[fmt], fmt).map(lambda t: {name: ",".join(t[0]) + "\n" + t[1]})


TIME, TEXT = CELLS["time"], CELLS["text"]
DETAIL = st.fixed_dictionaries({"ip": TEXT, "gpus": st.lists(TEXT, max_size=3)})
ATTEMPT = st.fixed_dictionaries(
    {"start_time": TIME, "end_time": mostly(TIME, st.just("None")),
     "detail": mostly(st.lists(DETAIL, max_size=2), CELL)},
)  # fmt: skip
JOB = st.fixed_dictionaries(
    {"jobid": mostly(TEXT, st.integers()), "user": TEXT, "vc": TEXT, "status": TEXT,
     "submitted_time": mostly(TIME, st.none()),
     "attempts": mostly(st.lists(ATTEMPT, max_size=2), st.none() | CELL)},
)  # fmt: skip
JOB_LOG = st.lists(mostly(JOB, CELL), min_size=1, max_size=4).map(
    lambda jobs: {"cluster_job_log.json": json.dumps(jobs)}
)


# Naive times that leave the years 1-9999 once moved to UTC (from Los Angeles, Shanghai).
LAST, FIRST = "9999-12-31 23:59:59", "0001-01-01 00:00:00"
# A task asking for 1e25 GPUs: more than a job's 64-bit GPU count holds.
PAI_HUGE_TASK = {
    "pai_job_table.csv": "j,u,s,1,2\n",
    "pai_job_table.header": "job_name,user,status,start_time,end_time",
    "pai_task_table.csv": "j,1,1,1e25\n",
    "pai_task_table.header": "job_name,inst_num,start_time,plan_gpu",
}
# Each importer's sources ({file name: text}; the first file is the one imported).
SOURCES = {
    "philly": csv_source("philly") | JOB_LOG,
    **{fmt: csv_source(fmt) for fmt in ("helios", "acme", "pai", "pods")},
}


# Inputs that once broke an importer, tried first.
KNOWN = {
    "philly": [
        {"cluster_job_log.json": "[]"},
        {"p.csv": "timestamp,duration,num_gpus,cluster\n" + LAST + ",1,1,a\n"},
    ],
    "acme": [{"t.csv": "job_id,user,gpu_num,node_num,state,submit_time\n,,,,," + FIRST}],
    "pai": [PAI_HUGE_TASK],
    # only blank rows: no deletion time at all to take the trace's end from
    "pods": [{"pods.csv": ",".join(COLUMNS["pods"]) + "\n" + ",".join([""] * 11) + "\n\n"}],
}


def whole_trace_or_nothing(fmt: str, files: dict[str, str]) -> None:
    """Import `files` as `fmt`: a complete trace, or UserError with nothing written."""
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        for name, text in files.items():
            (base / name).write_text(text)
        (base / "out").mkdir()
        try:
            nodes = base / "nodes.csv" if "nodes.csv" in files else None  # --nodes
            trace = import_trace(fmt, base / next(iter(files)), base / "out" / "trace", nodes=nodes)
        except UserError:
            event(f"{fmt}: refused")
            assert sorted(p.name for p in base.iterdir()) == sorted([*files, "out"])
            assert list((base / "out").iterdir()) == []
            return
        event(f"{fmt}: imported")
        assert (trace / DATAPACKAGE).is_file() and (trace / "jobs.parquet").is_file()


def fuzz_importer(fmt: str):
    """A test trying 2,000 sources of `fmt` (the inputs that once broke it first)."""

    @fuzz(2000)
    @given(files=SOURCES[fmt])
    def test(files: dict[str, str]) -> None:
        whole_trace_or_nothing(fmt, files)

    for files in KNOWN.get(fmt, []):
        test = example(files=files)(test)
    return test


test_philly_importer_writes_a_whole_trace_or_nothing = fuzz_importer("philly")
test_helios_importer_writes_a_whole_trace_or_nothing = fuzz_importer("helios")
test_acme_importer_writes_a_whole_trace_or_nothing = fuzz_importer("acme")
test_pai_importer_writes_a_whole_trace_or_nothing = fuzz_importer("pai")
test_pods_importer_writes_a_whole_trace_or_nothing = fuzz_importer("pods")
