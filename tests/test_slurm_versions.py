"""sing's Slurm executor against every Slurm release tests/slurm_release.py provides.

On Debian 13's Slurm 24.11 this module runs tests/test_executors_slurm.py's tests unchanged
(imported below, so there is one copy of them): jobs submitted through `SlurmExecutor.submit` as
root and as an ordinary user, read back from `squeue --json`, `sacct --json` and `sacct -P`,
GPU counts and per-node indices, a cancel, a time-out, a sync into a warehouse. That module
runs them on 22.05. A requeue, which it does not cover, runs here on both releases.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from sing.executors.profile import parse_profile
from sing.executors.slurm import SlurmExecutor
from sing.executors.sync import sync
from sing.warehouse.store import Warehouse
from tests.slurm_harness import SlurmCluster, running, scratch
from tests.slurm_release import RELEASES
from tests.test_executors_slurm import (  # noqa: F401  collected here against 24.11
    SETTINGS,
    _submit_and_observe,
    as_user,
    test_declared_dependencies_travel_with_the_record,
    test_gpu_rows_seen_while_running_get_the_end_time,
    test_inventory_lists_the_nodes_gres_and_partition,
    test_records_match_what_was_submitted,
    test_refused_submission_is_a_clear_error,
    test_resync_adds_no_duplicates,
    test_run_time_limits_and_timeout,
    test_running_jobs_have_per_node_gpu_indices,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]


@pytest.fixture(scope="module", params=RELEASES)
def cluster(request):
    with running(SlurmCluster(scratch("sing-slurmv-"), slurm=request.param)) as up:
        yield up


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    if cluster.release.name == "22.05":
        pytest.skip("tests/test_executors_slurm.py runs these on 22.05")
    return _submit_and_observe(cluster, Warehouse(tmp_path_factory.mktemp("wh")))


def test_the_release_is_the_one_asked_for(cluster):
    out = subprocess.run(["sinfo", "--version"], env=cluster.env, capture_output=True, text=True)
    package, version = out.stdout.split()  # "slurm-wlm 24.11.5" (Debian's name)
    assert package.startswith("slurm") and version.startswith(cluster.release.name + ".")


def test_a_requeued_job_runs_again_and_each_run_is_kept(cluster, tmp_path):
    """24.11's sacct without --duplicates gives a requeued job's new PENDING record alone
    (tests/executors_data/slurm-24.11/sacct-requeued*); sing asks for every run, and keeps
    each in `job_runs`: the first with its end and state, the second running."""
    admin = SlurmExecutor("campus", SETTINGS)
    since = datetime.now(UTC) - timedelta(minutes=1)
    text = "name: requeued\ngpus_per_node: 2\nentry: {commands: 'sleep 300'}\n"
    job = SlurmExecutor("campus", SETTINGS, as_user("root", cluster)).submit(
        parse_profile(text, "requeued.yaml", SETTINGS)
    )

    def running_record():
        return next((r for r in admin.running() if r.job_id == job), None)

    first = wait_for(running_record, "the job to run", 30)
    wh = Warehouse(tmp_path / "wh")
    sync(admin, wh)  # the first run seen running
    subprocess.run(["scontrol", "requeue", job], env=cluster.env, check=True)
    # Slurm holds a requeued job back for a while before it may start again; it is pending.
    wait_for(lambda: running_record() is None, "the requeued job to leave the running set", 30)
    rows = subprocess.run(
        ["sacct", "-n", "-X", "-P", "--duplicates", "-j", job, "-o", "JobIDRaw,State"],
        env=cluster.env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert f"{job}|REQUEUED" in rows

    def requeued_run():
        runs = [r for r in admin.finished(since) if r.job_id == job and r.state == "REQUEUED"]
        return runs[0] if runs else None

    last = wait_for(requeued_run, "the requeued run in sacct", 30)
    assert (first.num_gpus, last.num_gpus) == (2, 2) and last.name == "requeued"
    assert last.start_time == first.start_time and last.end_time >= last.start_time
    # Let it start again at once, not after Slurm's hold: its second run.
    subprocess.run(
        ["scontrol", "update", f"jobid={job}", "starttime=now"], env=cluster.env, check=True
    )

    def second_run():
        record = running_record()
        return record if record and record.start_time > first.start_time else None

    second = wait_for(second_run, "the job's second run", 90)
    for _ in range(2):  # a re-sync adds no run
        sync(admin, wh)
    admin.cancel(job)
    con = wh.connect()
    runs = con.execute(
        "SELECT state, start_time, end_time, nodes, num_gpus FROM job_runs WHERE job_id = ? "
        "ORDER BY start_time",
        [job],
    ).fetchall()
    assert runs == [
        ("REQUEUED", first.start_time, last.end_time, list(first.nodes), 2),
        ("RUNNING", second.start_time, None, list(second.nodes), 2),
    ]
    (state,) = con.execute("SELECT state FROM jobs WHERE job_id = ?", [job]).fetchone()
    assert state == "RUNNING"
