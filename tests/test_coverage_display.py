"""Coverage beside every efficiency figure: `sing job`, `sing report idle` and the Job and My
jobs pages say when a job's figures rest on part of its samples (sing/warehouse/coverage.py).

Two 2-node, 16-GPU jobs at 1% utilisation for 2 hours, sampled every minute: `half` has only
its first node's 8 GPUs in the warehouse (its second node was never scraped), `whole` has all
16. Read as complete, both look idle; only `whole` is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from sing.warehouse.store import Warehouse
from tests.dashboard_app import open_app, serving
from tests.policy_world import NOW, SAMPLE_S, add_job, add_samples
from tests.test_analytics import run_sing
from tests.test_cli_reports import table

START, END = NOW - timedelta(hours=3), NOW - timedelta(hours=1)
LAST_SAMPLE = END - timedelta(seconds=SAMPLE_S)  # 120 samples per GPU: all of the 2 hours
NODES = ["n1", "n2"]
HALF_WORDS = "from 50% of the expected samples"


def gpus(*nodes: str) -> dict[tuple[str, int], float]:
    return {(node, index): 0.01 for node in nodes for index in range(8)}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The warehouse and a config whose collector samples every minute, as the jobs were."""
    root = tmp_path_factory.mktemp("coverage")
    wh = Warehouse(root / "wh")
    for job_id, sampled in (("half", NODES[:1]), ("whole", NODES)):
        job = {"num_nodes": 2, "num_gpus": 16, "gpus_per_node": 8, "nodes": NODES}
        add_job(wh, job_id, START, end_time=END, state="COMPLETED", **job)
        add_samples(wh, job_id, START, LAST_SAMPLE, gpus(*sampled))
    config = root / "sing.toml"
    config.write_text(
        f"[collector]\ninterval_s = {SAMPLE_S}\n"
        '[roles]\nadmins = ["ghopper"]\n'
        '[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n'
    )
    yield wh.root, config


def sing(site: tuple[Path, Path], *args: str) -> str:
    root, config = site
    out = run_sing(
        "--config", str(config), "--warehouse", str(root), *args, "--now", NOW.isoformat()
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_sing_job_gives_the_coverage_beside_the_utilisation(site: tuple[Path, Path]) -> None:
    half = json.loads(sing(site, "job", "half", "--json"))["rows"][0]
    assert half["coverage"] == pytest.approx(0.5)  # 8 x 120 of 16 x 120 samples
    assert half["mean_util"] == pytest.approx(0.01)  # the figure itself stays as it was
    assert half["notes"][0].startswith("These figures rest on part of the job's data: 50%")
    text = sing(site, "job", "half")
    assert f"GPU utilization  [....................]   1% ({HALF_WORDS})" in text
    assert "  * These figures rest on part of the job's data" in text


def test_a_fully_sampled_job_shows_no_coverage_words(site: tuple[Path, Path]) -> None:
    whole = json.loads(sing(site, "job", "whole", "--json"))["rows"][0]
    assert whole["coverage"] == pytest.approx(1.0)
    assert not any("part of the job's data" in note for note in whole["notes"])
    assert "expected samples" not in sing(site, "job", "whole")


def test_the_interval_is_the_sites(site: tuple[Path, Path], tmp_path: Path) -> None:
    """At the built-in 15 s the same samples are a quarter of those expected."""
    root, _ = site
    out = run_sing("--warehouse", str(root), "job", "whole", "--json", "--now", NOW.isoformat())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"][0]["coverage"] == pytest.approx(0.25)


def test_the_idle_report_flags_a_job_under_min_coverage(site: tuple[Path, Path]) -> None:
    text = sing(site, "report", "idle")
    rows = {row["job"]: row for row in table(text.split("\npartial data for")[0])}
    assert (rows["half"]["coverage %"], rows["half"]["partial data"]) == ("50", "yes")
    assert (rows["whole"]["coverage %"], rows["whole"]["partial data"]) == ("100", "no")
    assert "partial data for 1 job(s)" in text and "not evidence that they are idle" in text
    flagged = json.loads(sing(site, "report", "idle", "--json"))["rows"]
    assert {r["job_id"]: r["partial_data"] for r in flagged} == {"half": True, "whole": False}


def test_the_job_page_shows_the_coverage_beside_the_utilisation(site: tuple[Path, Path]) -> None:
    with serving(*site):
        at = open_app("alice", "job", query={"job": "half"})
        assert HALF_WORDS in [caption.value for caption in at.caption]
        assert any("part of the job's data" in w.value for w in at.warning)
        at = open_app("alice", "job", query={"job": "whole"})
        assert not any("expected samples" in caption.value for caption in at.caption)


def test_my_jobs_lists_each_jobs_coverage(site: tuple[Path, Path]) -> None:
    with serving(*site):
        at = open_app("alice", "my_jobs")
        jobs = at.dataframe[0].value
        shown = dict(zip(jobs["job"].str.removeprefix("job?job="), jobs["coverage"], strict=True))
        assert shown == pytest.approx({"half": 0.5, "whole": 1.0})
        at.selectbox(key="detail_job").set_value("half").run()
        assert HALF_WORDS in [caption.value for caption in at.caption]
