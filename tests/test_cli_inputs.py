"""Inputs checked against what they mean (issue 29 items 5 and 6): a window that ends before it
starts, a threshold given as a percent or below zero, a node the warehouse never saw, and an
incident on one GPU that names only the jobs on that GPU. Through the real `sing` command on a
warehouse imported from tests/cli_world.py's records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import cli_world
from tests.cli_world import sing


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cli_world.build(tmp_path_factory.mktemp("cli-inputs"))


INVERTED = ("--since", "2026-11-03", "--until", "2026-11-01")


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "jobs"],
        ["report", "idle"],
        ["report", "cluster"],
        ["report", "usage"],
        ["report", "workload"],
        ["health", "report"],
    ],
)
def test_an_inverted_window_is_one_line_and_rc_2(root: Path, argv: list[str]) -> None:
    done = sing(root, *argv, *INVERTED)
    assert done.returncode == 2
    assert done.stderr == (
        "sing: --since 2026-11-03 00:00 is not before --until 2026-11-01 00:00; "
        "give the earlier time as --since\n"
    )
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("50", "50 looks like a percent; give a ratio such as 0.5"),
        ("-1", "-1 is not a ratio from 0 to 1; give one such as 0.5"),
        ("half", "'half' is not a number; give a ratio such as 0.5"),
    ],
)
def test_threshold_is_a_ratio(root: Path, value: str, message: str) -> None:
    done = sing(root, "report", "idle", "--threshold", value)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(f"argument --threshold: {message}")
    assert "Traceback" not in done.stderr


def test_threshold_one_half_lists_the_idle_report(root: Path) -> None:
    done = sing(root, "report", "idle", "--threshold", "0.5", "--json")
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout)["rows"], list)


def test_an_incident_on_a_node_never_seen_names_the_known_ones(root: Path) -> None:
    done = sing(root, "incident", "open", "gpu2", "--class", "xid", "--note", "typo")
    assert done.returncode == 1
    assert done.stderr == (
        "sing: node 'gpu2' is not in the inventory or job records of cluster campus; "
        "did you mean gpu02, gpu01?\n"
    )
    assert json.loads(sing(root, "incident", "list", "--json").stdout) == {"rows": []}


def test_an_incident_on_one_gpu_lists_only_the_jobs_on_it(tmp_path: Path) -> None:
    """On gpu02, `wide` holds GPUs 0-7 and `small` GPU 3 (tests/cli_world.py's job_gpus)."""
    root = cli_world.build(tmp_path, job_gpus=True)
    for device in ("3", "0", None):
        extra = ["--device", device] if device else []
        opened = sing(root, "incident", "open", "gpu02", "--class", "xid", "--note", "x", *extra)
        assert opened.returncode == 0, opened.stderr
    rows = json.loads(sing(root, "incident", "list", "--json").stdout)["rows"]
    jobs = {row["device"]: sorted(row["jobs"]) for row in rows}
    assert jobs == {"3": ["small", "wide"], "0": ["wide"], None: ["small", "wide"]}


TYPO = '[site]\nwarehous = "elsewhere"\n'
TYPO_ERROR = "[site] has unknown key 'warehous' (did you mean 'warehouse'?)"


def test_a_site_typo_fails_the_same_with_or_without_warehouse(root: Path, tmp_path: Path) -> None:
    config = tmp_path / "sing.toml"
    config.write_text(TYPO)
    without = cli_world.run_sing("--config", str(config), "report", "jobs")
    given = sing(root, "--config", str(config), "report", "jobs")
    assert without.returncode == given.returncode == 2
    assert without.stderr == given.stderr and TYPO_ERROR in given.stderr
    assert given.stdout == ""


def test_doctor_says_a_config_typo_in_words(tmp_path: Path) -> None:
    config = tmp_path / "sing.toml"
    config.write_text(TYPO)
    done = cli_world.run_sing("--config", str(config), "doctor", "head")
    assert done.returncode == 1
    assert TYPO_ERROR in done.stdout.splitlines()[0]
    # the checks that need [site] say so in the same words, not as a Python repr
    assert f"check_warehouse        not checked: {config}: {TYPO_ERROR}" in done.stdout
    assert "raised" not in done.stdout and "ConfigError(" not in done.stdout
