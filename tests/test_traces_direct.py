"""A source that `sing simulate --trace FILE` reads directly replays exactly as its import
(issue 31 item 5): `sing trace import` then `sing simulate --trace RELEASE` gives the figures of
`sing simulate --trace FILE` (jobs, assignment, waits, fairness: every figure of every policy),
in windows given as dates and as seconds from the trace start.

Today the sources with a direct path are the Philly jobs file and SWF logs; the first test
finds them by trying every importer's fixtures, so a new direct path cannot go unchecked.
Philly's naive times are UTC (sing/traces/importers/philly.py says why) on both paths, and its
virtual cluster is the release's `group`, the tenant of the replay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sing.cli import main
from sing.errors import UserError
from sing.scheduler.workload import load_trace
from sing.traces.importers import FORMATS
from tests.shared_data import PHILLY, require

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
# Each importer's fixtures, in the structure of the public files.
SOURCES = {
    "philly": ["philly_busy_night.csv", "philly_jobs.csv", "philly_cluster_job_log.json"],
    "helios": ["helios_cluster_log.csv"],
    "pai": ["pai_job_table.csv"],
    "acme": ["acme_kalos_job_trace.csv"],
    "pods": ["openb_pod_list.csv"],
    "swf": ["ipsc_like.swf"],
}
# The hand-made Philly night (tests/fixtures/traces/philly_busy_night.csv): 26 jobs of three
# virtual clusters arriving 2017-10-16 21:00 to 2017-10-17 03:00 UTC, unsorted, three in one
# second, on 2 x 8 GPUs (offered load 1.05, so queues form and the policies differ).
NIGHT = FIXTURES / "philly_busy_night.csv"
CLUSTER = ["--nodes", "2", "--gpus-per-node", "8"]
# A window across the UTC midnight: a shifted clock moves jobs in or out of it.
DATES = [*CLUSTER, "--since", "2017-10-17", "--until", "2017-10-17T02:00"]
CASES = [
    pytest.param("philly", NIGHT, CLUSTER, id="philly-night"),
    pytest.param("philly", NIGHT, DATES, id="philly-night-dates"),
    # seconds from the trace start: both paths start at midnight UTC of the first arrival's day
    pytest.param(
        "philly",
        NIGHT,
        [*CLUSTER, "--since", "79200s", "--until", "93600s"],
        id="philly-night-seconds",
    ),  # fmt: skip
    pytest.param("philly", FIXTURES / "philly_jobs.csv", CLUSTER, id="philly-jobs"),
    pytest.param("swf", FIXTURES / "ipsc_like.swf", [], id="swf"),
]
# The busy Philly week of docs/scheduler.md and README.md.
BUSY_WEEK = ["--nodes", "28", "--gpus-per-node", "8", "--since", "2017-10-17", "--until",
             "2017-10-24"]  # fmt: skip


def test_every_importer_with_a_direct_path_is_checked() -> None:
    direct = set()
    for fmt, names in SOURCES.items():
        for name in names:
            try:
                load_trace(FIXTURES / name)
            except UserError:
                continue
            direct.add(fmt)
    assert set(SOURCES) == set(FORMATS)
    assert direct == {"philly", "swf"} == {case.values[0] for case in CASES}


@pytest.mark.parametrize(("fmt", "source", "args"), CASES)
def test_import_then_simulate_gives_the_figures_of_the_source(
    fmt: str, source: Path, args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = imported(fmt, source, tmp_path, capsys)
    direct, imported_ = figures(source, args, capsys), figures(release, args, capsys)
    assert direct == imported_
    assert direct[0]["jobs"] > 0


def test_philly_night_window_and_tenants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figures the equality above is about: the date window holds the jobs that arrived
    from midnight to 02:00 UTC (read as US Pacific, the release held other ones), and the
    three virtual clusters are three tenants on both paths."""
    release = imported("philly", NIGHT, tmp_path, capsys)
    group = pq.read_table(release / "jobs.parquet", columns=["job_id", "group"]).to_pylist()
    assert {r["group"] for r in group} == {"6214e9", "11cb48", "ee9e8c"}
    for trace in (NIGHT, release):
        loaded = load_trace(trace)
        assert sorted(set(loaded.workload.user)) == ["11cb48", "6214e9", "ee9e8c"]
        assert loaded.origin == 1508112000.0  # 2017-10-16 00:00 UTC
    window = figures(NIGHT, DATES, capsys)
    assert {r["jobs"] for r in window} == {7}


def test_real_philly_busy_week_imports_and_replays_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real jobs file's busy week (14,161 jobs from the file read as it is, UTC) replays
    with the same figures from the file and from its import. Slower: two replays of 14 k jobs
    under four policies; runs where the shared data is (skipped locally without it)."""
    release = imported("philly", require(PHILLY), tmp_path, capsys)
    direct, imported_ = figures(PHILLY, BUSY_WEEK, capsys), figures(release, BUSY_WEEK, capsys)
    assert direct == imported_
    assert {r["jobs"] for r in direct} == {14_161}
    assert {round(r["jain_fairness"], 3) for r in direct} != {1.0}  # per-VC fairness is kept


def imported(fmt: str, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / f"{source.stem}-release"
    assert main(["trace", "import", "--format", fmt, str(source), "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def figures(trace: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict]:
    """Every figure of every policy's row, but the replay's speed."""
    code = main(["simulate", "--trace", str(trace), *args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return [
        {k: v for k, v in r.items() if k != "jobs_per_s"} for r in json.loads(captured.out)["rows"]
    ]
