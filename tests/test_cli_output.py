"""What `sing` prints when there is nothing, and the same output conventions everywhere:
one `--json` envelope, "nodes" a count and "node list" the names, newest first, bytes scaled
for people (issue 29 items 5 and 7). Every answer comes from the records of tests/cli_world.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sing.tables import scaled_bytes
from tests import cli_world
from tests.cli_world import FIRST_START, LAST_END, sing
from tests.test_cli_reports import table

NOW = "2026-11-03T12:00:00Z"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cli_world.build(tmp_path_factory.mktemp("cli-output"))


@pytest.mark.parametrize(
    ("report", "noun"),
    [
        ("jobs", "jobs"),
        ("by-nodes", "jobs"),
        ("fairness", "users with jobs"),
        ("cluster", "cluster figures"),
        ("rightsize", "jobs"),
    ],
)
def test_an_empty_window_says_so_with_the_jobs_there_are(
    root: Path, report: str, noun: str
) -> None:
    done = sing(root, "report", report, "--since", "2025-01-01", "--until", "2025-01-02")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"no {noun} in 2025-01-01 00:00 to 2025-01-02 00:00 UTC: none of the warehouse's jobs "
        f"falls in it (its 3 started jobs run {FIRST_START} to {LAST_END} UTC)"
    )


def test_a_warehouse_without_jobs_says_where_jobs_come_from(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("node,cluster,gpus,valid_from\ngpu01,campus,8,2026-11-01T00:00:00Z\n")
    root = tmp_path / "wh"
    assert sing(root, "warehouse", "import", "nodes", str(nodes)).returncode == 0
    done = sing(root, "report", "jobs")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no jobs in the whole history: the warehouse has no started jobs")
    assert "sing warehouse import jobs FILE" in done.stdout


def test_idle_running_with_no_such_job_says_so(root: Path) -> None:
    """No job runs on 3 nodes (`wide`, the widest, has 2)."""
    done = sing(root, "report", "idle", "--running", "--min-nodes", "3", "--now", NOW)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no running idle multi-node jobs at 2026-11-03 12:00 UTC: ")
    assert "no job on 3 or more nodes" in done.stdout


def test_reports_list_the_newest_first(root: Path) -> None:
    done = sing(root, "report", "jobs", "--now", NOW)
    assert done.returncode == 0, done.stderr
    assert [row["job"] for row in table(done.stdout)] == ["small", "wide", "old"]


def test_nodes_is_a_count_and_node_list_the_names_in_both_commands(root: Path) -> None:
    listed = {r["job"]: r for r in table(sing(root, "jobs", "list").stdout)}
    reported = {r["job"]: r for r in table(sing(root, "report", "jobs", "--now", NOW).stdout)}
    assert listed["wide"]["nodes"] == reported["wide"]["nodes"] == "2"
    assert listed["wide"]["node list"] == "gpu01,gpu02"


def test_jobs_list_by_user_and_since(root: Path) -> None:
    mine = table(sing(root, "jobs", "list", "--user", "alice").stdout)
    assert [r["job"] for r in mine] == ["small", "old"]  # newest submitted first
    recent = sing(root, "jobs", "list", "--user", "alice", "--since", "2026-11-02")
    assert [r["job"] for r in table(recent.stdout)] == ["small"]
    nobody = sing(root, "jobs", "list", "--user", "mallory")
    assert nobody.stdout.strip() == (
        "no jobs of cluster campus with user mallory in the warehouse "
        "(it holds 3 of that cluster's)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "jobs", "--now", NOW],
        ["report", "usage", "--now", NOW],
        ["report", "rightsize", "--now", NOW],
        ["jobs", "list"],
        ["policy", "log"],
        ["policy", "check"],
        ["incident", "list"],
        ["job", "wide", "--now", NOW],
        ["report", "workload", "--now", NOW],
        ["health", "report", "--now", NOW],
        ["health", "drain", "--dry-run", "--now", NOW],
        ["warehouse", "sql", "SELECT 1 AS one"],
    ],
)
def test_every_json_is_one_envelope_of_rows(root: Path, argv: list[str]) -> None:
    done = sing(root, *argv, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert isinstance(out, dict) and isinstance(out["rows"], list)


def test_the_envelope_holds_the_rows_each_command_shows(root: Path) -> None:
    """`sing job`'s one row is the job; SQL rows come with their columns in order; times are
    ISO 8601 everywhere."""
    (job,) = json.loads(sing(root, "job", "wide", "--now", NOW, "--json").stdout)["rows"]
    assert (job["job_id"], job["num_nodes"], job["nodes"]) == ("wide", 2, ["gpu01", "gpu02"])
    query = "SELECT job_id, start_time FROM jobs ORDER BY job_id"
    out = json.loads(sing(root, "warehouse", "sql", query, "--json").stdout)
    assert out["columns"] == ["job_id", "start_time"]
    assert [r["job_id"] for r in out["rows"]] == ["old", "small", "wide"]
    assert all("T" in r["start_time"] for r in out["rows"])
    causes = json.loads(sing(root, "health", "report", "--now", NOW, "--json").stdout)
    assert sum(r["jobs"] for r in causes["rows"]) == causes["jobs"]


def test_jobs_json_rows_are_the_records(root: Path) -> None:
    rows = json.loads(sing(root, "jobs", "list", "--json").stdout)["rows"]
    assert {r["job_id"]: (r["num_nodes"], r["nodes"]) for r in rows} == {
        "old": (1, ["gpu01"]),
        "wide": (2, ["gpu01", "gpu02"]),
        "small": (1, ["gpu02"]),
    }


def test_sing_job_shows_the_time_limit(root: Path) -> None:
    done = sing(root, "job", "old", "--now", NOW)
    assert done.returncode == 0, done.stderr
    assert "time limit 4.00 h" in done.stdout  # the record's 14,400 s


def test_drain_with_no_readings_is_not_all_fine(root: Path) -> None:
    done = sing(root, "health", "drain", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("No health readings in the warehouse, so no node can be judged")
    assert "No node crosses" not in done.stdout


@pytest.mark.parametrize(
    ("value", "binary", "shown"),
    [
        (265_624.51e9, False, "265.6 TB"),  # the "265624.51 GB"
        (999, False, "999 B"),
        (1000, False, "1.0 kB"),
        (80 * 2**30, True, "80.0 GiB"),
        (None, False, "unknown"),
    ],
)
def test_bytes_are_scaled_for_people(value: float | None, binary: bool, shown: str) -> None:
    assert scaled_bytes(value, binary=binary) == shown
