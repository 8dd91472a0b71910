"""The user docs are true: the figures they quote are what the code prints today, and their
examples run. Each quoted table or sentence is read from the doc and compared with a fresh run
of the command the doc names.

A change that moves a figure fails here, so the doc is regenerated with the change, never left
to drift (issue 29: docs/scheduler.md said 5,990 jobs for a week the replay counts 14,161 in).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from sing.cli import main
from sing.executors.profile import load_profile
from tests.shared_data import PHILLY, require

ROOT = Path(__file__).parent.parent
BUSY_WEEK = [
    "--nodes",
    "28",
    "--gpus-per-node",
    "8",
    "--since",
    "2017-10-17",
    "--until",
    "2017-10-24",
]


@pytest.fixture(scope="module")
def busy_week() -> dict[str, dict]:
    """`sing simulate` on the busy Philly week, as docs/scheduler.md and README.md quote it."""
    out = _run_json(["simulate", "--trace", str(require(PHILLY)), *BUSY_WEEK])
    rows = out["rows"] if isinstance(out, dict) else out
    return {row["policy"]: row for row in rows}


def _run_json(argv: list[str]) -> dict | list:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main([*argv, "--json"]) == 0
    return json.loads(buffer.getvalue())


def _doc_table(doc: str, after: str) -> dict[str, list[str]]:
    """The first markdown table after the line containing `after`: first cell -> the others."""
    text = (ROOT / doc).read_text()
    lines = text[text.index(after) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_scheduler_doc_busy_week_table_is_todays_replay(busy_week: dict[str, dict]) -> None:
    text = (ROOT / "docs" / "scheduler.md").read_text()
    jobs = {row["jobs"] for row in busy_week.values()}
    assert jobs == {14161}
    assert "the busy week of Oct 17, 14,161 jobs" in text
    table = _doc_table("docs/scheduler.md", "## Measured: the paper's gap on a busy Philly week")
    names = {
        "fcfs": "fcfs",
        "sing (default: reserve at once, age window 120 h)": "sing",
        "easy": "easy",
        "sjf": "sjf",
    }
    assert set(table) == set(names)
    for label, policy in names.items():
        r = busy_week[policy]
        hours = [r[k] / 3600 for k in ("p50_wait_s", "p95_wait_s", "p99_wait_s", "max_wait_s")]
        expected = [
            f"{100 * r['gpu_assignment']:.1f}%",
            f"{100 * r['busy_assignment']:.1f}%",
            f"{r['mean_wait_s'] / 3600:.2f}",
            *(f"{h:.1f}" for h in hours),
            f"{r['mean_bounded_slowdown']:,.1f}",
            f"{r['jain_fairness']:.3f}",
            f"{r['starved_jobs']:,}",
        ]
        assert table[label] == expected, label


def test_readme_busy_week_sentence_is_todays_replay(busy_week: dict[str, dict]) -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    fcfs, sing, easy = busy_week["fcfs"], busy_week["sing"], busy_week["easy"]
    sentence = (
        f"keeps {100 * sing['gpu_assignment']:.1f}% of the GPUs assigned against FCFS's "
        f"{100 * fcfs['gpu_assignment']:.1f}% (EASY with oracle runtimes: "
        f"{100 * easy['gpu_assignment']:.1f}%), with a p99 wait of "
        f"{sing['p99_wait_s'] / 3600:.0f} h against FCFS's {fcfs['p99_wait_s'] / 3600:.0f} h"
    )
    assert sentence in readme
    assert re.search(r"busy week of 2017-10-17 on 28 x 8 GPUs", readme)


def test_every_job_profile_example_in_the_docs_loads(tmp_path: Path) -> None:
    # A YAML block with an `entry:` is a job profile: it must load as the docs show it.
    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        blocks += [
            b for b in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S) if "entry:" in b
        ]
    assert blocks, "the docs show no job profile"
    for number, block in enumerate(blocks):
        path = tmp_path / f"profile{number}.yaml"
        path.write_text(block)
        assert load_profile(path).commands
