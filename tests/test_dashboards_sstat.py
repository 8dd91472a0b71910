"""The Job and My jobs pages ask Slurm for a running job's figures so far as `sing job` does:
sstat through the Slurm executor, only for the site's own cluster, a failure said in the notes
while the page stands, and only once the viewer may see the job (sstat runs as the dashboard's
user, whom slurmd may answer for anybody's job).

A stand-in `sstat` on $PATH (a real executable the executor runs) logs the job ids it is asked
for and answers in sstat's `-P` text; the app runs under Streamlit's AppTest, `sing job` as a
subprocess with the same config and $PATH. tests/test_slurm_cgroups.py checks the same page
against the real sstat of a job on a real Slurm.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import streamlit as st

from sing.warehouse.store import Warehouse
from tests.dashboard_app import metrics, open_app
from tests.real_path.processes import run
from tests.test_analytics import GIB, add_host_samples, add_job, at
from tests.test_collector_scrape import sing

ADMIN, ALICE, BOB = "ghopper", "alice", "bob"
# Job ids: alice's running job, bob's, alice's whose sstat fails, alice's of another cluster.
MINE, THEIRS, FAILING, ELSEWHERE = "101", "102", "103", "104"
SSTAT = f"""\
#!/bin/sh
# sing's executor runs: sstat -a -P -n -j JOB -o JobID,TRESUsageInTot,TRESUsageInMax
printf '%s\\n' "$5" >> "$(dirname "$0")/asked"
if [ "$5" = {FAILING} ]; then
    echo "sstat: error: slurm_job_step_stat: Socket timed out on send/recv operation" >&2
    exit 1
fi
echo "$5.0|cpu=04:06:00,mem=7G|cpu=04:06:00,mem=7G"
"""
CONFIG = """\
[site]
cluster = "test"
warehouse = "wh"
[executor]
kind = "{kind}"
[collector]
interval_s = 900
[roles]
admins = ["ghopper"]
[dashboard]
auth = "oidc"
allowed_domains = ["campus.edu"]
"""
SSTAT_LINE = (
    "Slurm (sstat): CPU 4.1 core-hours, memory 7.0 GiB; the node's cgroups: CPU 4.0 core-hours"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four running jobs, each with 2 cores busy for 2 hours and an 8 GiB peak on its node, and
    a finished one that puts the end of the data at 2 hours."""
    root = tmp_path_factory.mktemp("sstat")
    wh = Warehouse(root / "wh")
    jobs = {MINE: ALICE, THEIRS: BOB, FAILING: ALICE, ELSEWHERE: ALICE}
    for job_id, user in jobs.items():
        cluster = "other" if job_id == ELSEWHERE else "test"
        add_job(wh, job_id, [f"n{job_id}"], 0, at(0), None, user=user, cluster=cluster)
        add_host_samples(wh, job_id, f"n{job_id}", at(0), at(2), 2.0, cpus=4, mem_peak=8 * GIB,
                         mem_limit=16 * GIB, cluster=cluster)  # fmt: skip
    add_job(wh, "100", ["n100"], 0, at(0), at(2), user=BOB)
    for kind in ("slurm", "local"):
        (root / f"{kind}.toml").write_text(CONFIG.format(kind=kind))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "sstat").write_text(SSTAT)
    (bin_dir / "sstat").chmod(stat.S_IRWXU)
    return root


@pytest.fixture
def app(site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The app on the Slurm config, the stand-in sstat first on $PATH, its log and the
    dashboards' cache empty (a cached report would not ask sstat again)."""
    monkeypatch.setenv("SING_CONFIG", str(site / "slurm.toml"))
    monkeypatch.setenv("SING_WAREHOUSE", str(site / "wh"))
    monkeypatch.setenv("PATH", f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (site / "bin" / "asked").unlink(missing_ok=True)
    st.cache_data.clear()
    return site


def asked(site: Path) -> list[str]:
    """The job ids the stand-in sstat was asked for, in order."""
    log = site / "bin" / "asked"
    return log.read_text().split() if log.exists() else []


def captions(at) -> list[str]:
    return [c.value for c in at.caption]


def test_the_job_page_shows_sstat_as_sing_job_does(app: Path) -> None:
    page = open_app(ALICE, "job", query={"job": MINE})
    assert SSTAT_LINE in captions(page) and asked(app) == [MINE]
    # The page's clock is the end of the data (2 hours in); the CLI is told the same.
    job = ["--config", str(app / "slurm.toml"), "job", MINE, "--now", at(2).isoformat()]
    label, words = SSTAT_LINE.split(": ", 1)
    assert f"{label:17}{words}\n" in run(sing(*job), os.environ.copy())  # the same line
    (cli,) = json.loads(run(sing(*job, "--json"), os.environ.copy()))["rows"]
    assert (cli["slurm_source"], cli["slurm_cpu_s"]) == ("sstat", 246 * 60)
    assert [w.value for w in page.warning] == cli["notes"]  # within the tolerances: no check note
    assert not any("Slurm's accounting" in note for note in cli["notes"])


def test_my_jobs_shows_the_same_figures_for_the_job_in_detail(app: Path) -> None:
    at = open_app(ALICE, "my_jobs")
    at.selectbox(key="detail_job").set_value(MINE).run()
    assert SSTAT_LINE in captions(at) and MINE in asked(app)


def test_a_failed_sstat_is_a_note_and_the_page_stands(app: Path) -> None:
    at = open_app(ALICE, "job", query={"job": FAILING})
    assert metrics(at)["CPU efficiency"] == "50%"  # 2 of 4 cores, from the node's cgroups
    assert at.warning[-1].value == (
        "Slurm's figures for this running job could not be read: sstat -a failed (exit 1): "
        "sstat: error: slurm_job_step_stat: Socket timed out on send/recv operation"
    )
    assert not any(c.startswith("Slurm (") for c in captions(at))


def test_sstat_is_not_a_way_into_another_users_job(app: Path) -> None:
    at = open_app(ALICE, "job", query={"job": THEIRS})
    assert at.error[0].value == f"No job {THEIRS} that you may see." and not at.caption
    at = open_app(ALICE, "job", query={"job": MINE})
    at.text_input(key="job_id").set_value(THEIRS).run()
    assert "that you may see" in at.error[0].value
    assert THEIRS not in asked(app)  # refused before sstat was asked
    at = open_app(ADMIN, "job", query={"job": THEIRS})  # admins see any job, sstat's figures too
    assert SSTAT_LINE in captions(at) and asked(app)[-1] == THEIRS


def test_sstat_only_for_the_sites_own_cluster_and_slurm(app: Path, monkeypatch) -> None:
    at = open_app(ALICE, "job", query={"job": ELSEWHERE})
    assert "CPU efficiency" in metrics(at) and asked(app) == []  # another cluster's job
    monkeypatch.setenv("SING_CONFIG", str(app / "local.toml"))
    at = open_app(ALICE, "job", query={"job": MINE})
    assert "CPU efficiency" in metrics(at) and asked(app) == []  # the local executor
    assert not any(c.startswith("Slurm (") for c in captions(at))
