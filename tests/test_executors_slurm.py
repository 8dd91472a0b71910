"""The Slurm executor against a real Slurm 22.05 on loopback (tests/slurm_harness.py).

One cluster and one batch of jobs for the whole module (the cluster takes ~5 s to start, the
timed-out job ~80 s to be killed, so everything runs side by side): jobs are submitted through
`SlurmExecutor.submit` from profiles, as root and as an ordinary user, observed while running,
synced into a warehouse, and every record is checked against what was submitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from sing.errors import UserError
from sing.executors.profile import parse_profile
from sing.executors.records import JobRecord, NodeRecord
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor, run_command
from sing.executors.sync import sync
from sing.warehouse.store import Warehouse
from tests.slurm_harness import TEST_USER, SlurmCluster, running, scratch

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

SETTINGS = ExecutorSettings()
PROFILES = {
    "single": ("root", "name: single\ngpus_per_node: 1\nentry: {commands: 'sleep 2'}\n"),
    # 3 GPUs asked, 4 given (powers of two); runs as the ordinary user.
    "multi": (TEST_USER, "name: multi\ngpus_per_node: 3\nentry: {commands: 'sleep 8'}\n"),
    "twonode": ("root", "name: twonode\nnodes: 2\ngpus_per_node: 2\n"
                "environment: {python: '3', pip: []}\nentry: {commands: 'sleep 8'}\n"),
    "failed": (TEST_USER, "name: failed\ngpus_per_node: 2\nentry: {commands: 'exit 3'}\n"),
    "cancelled": ("root", "name: cancelled\ngpus_per_node: 1\nentry: {commands: 'sleep 300'}\n"),
    "timeout": (TEST_USER, "name: timeout\ngpus_per_node: 1\ntime_limit: 1\n"
                "entry: {commands: 'sleep 300'}\n"),
}  # fmt: skip


@dataclass
class Run:
    cluster: SlurmCluster
    warehouse: Warehouse
    ids: dict[str, str] = field(default_factory=dict)
    submitted_from: datetime | None = None
    submitted_to: datetime | None = None
    running: dict[str, JobRecord] = field(default_factory=dict)
    finished: dict[str, JobRecord] = field(default_factory=dict)


def as_user(user: str, cluster: SlurmCluster):
    """A command runner that runs Slurm clients as `user` from the cluster's jobs directory."""

    def run(argv: list[str], stdin: str | None = None) -> str:
        inner = ["sh", "-c", f'cd {cluster.jobs_dir} && exec "$@"', "sh", *argv]
        if user != "root":
            inner = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={cluster.conf}", *inner]
        return run_command(inner, stdin)

    return run


def wait_for(check, what: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with running(SlurmCluster(scratch("sing-slurm-"))) as cluster:
        yield _submit_and_observe(cluster, Warehouse(tmp_path_factory.mktemp("wh")))


def _submit_and_observe(cluster: SlurmCluster, wh: Warehouse) -> Run:
    result = Run(cluster, wh, submitted_from=datetime.now(UTC).replace(microsecond=0))
    for key, (user, text) in PROFILES.items():
        executor = SlurmExecutor("campus", SETTINGS, as_user(user, cluster))
        result.ids[key] = executor.submit(parse_profile(text, f"{key}.yaml", SETTINGS))
    result.submitted_to = datetime.now(UTC)
    admin = SlurmExecutor("campus", SETTINGS)
    ids = result.ids

    def both_running():
        now = {r.job_id: r for r in admin.running()}
        return now if {ids["multi"], ids["twonode"], ids["cancelled"]} <= now.keys() else None

    running = wait_for(both_running, "multi, twonode, cancelled to run", 30)
    result.running = {key: running[i] for key, i in ids.items() if i in running}
    sync(admin, wh)  # while running: this is when per-GPU indices are known
    admin.cancel(ids["cancelled"])

    def all_done():
        done = {r.job_id: r for r in admin.finished(result.submitted_from - timedelta(minutes=1))}
        return done if set(ids.values()) <= done.keys() else None

    done = wait_for(all_done, "all jobs to end (the timed-out one takes ~80 s)", 200)
    result.finished = {key: done[i] for key, i in ids.items()}
    sync(admin, wh)
    return result


def stored(run: Run, key: str) -> dict:
    con = run.warehouse.connect()
    cursor = con.execute("SELECT * FROM jobs WHERE job_id = ?", [run.ids[key]])
    (row,) = cursor.fetchall()
    return dict(zip([d[0] for d in cursor.description], row, strict=True))


def stored_gpus(run: Run, key: str) -> dict[str, list[int]]:
    rows = run.warehouse.connect().execute(
        "SELECT node, list(gpu_index ORDER BY gpu_index) FROM job_gpus WHERE job_id = ? "
        "GROUP BY node ORDER BY node", [run.ids[key]],
    ).fetchall()  # fmt: skip
    return dict(rows)


@pytest.mark.parametrize(
    ("key", "user", "state", "exit_code", "num_nodes", "gpus"),
    [
        ("single", "root", "COMPLETED", 0, 1, 1),
        ("multi", TEST_USER, "COMPLETED", 0, 1, 4),
        ("twonode", "root", "COMPLETED", 0, 2, 4),
        ("failed", TEST_USER, "FAILED", 3, 1, 2),
        # A job killed by scancel: 22.05 accounts 0:0 or 0:15 depending on timing.
        ("cancelled", "root", "CANCELLED", (0, 143), 1, 1),
        ("timeout", TEST_USER, "TIMEOUT", (0, 143), 1, 1),
    ],
)
def test_records_match_what_was_submitted(run, key, user, state, exit_code, num_nodes, gpus):
    row = stored(run, key)
    assert (row["user"], row["state"]) == (user, state)
    assert row["exit_code"] in (exit_code if isinstance(exit_code, tuple) else (exit_code,))
    assert (row["num_gpus"], row["num_nodes"], row["partition"]) == (gpus, num_nodes, "debug")
    assert len(row["nodes"]) == num_nodes and set(row["nodes"]) <= {"gpu-1", "gpu-2"}
    assert row["gpus_per_node"] == gpus // num_nodes
    assert row["cluster"] == "campus" and row["name"] == key
    for column in ("submit_time", "start_time", "end_time"):
        assert row[column].utcoffset() == timedelta(0), column
    # Slurm stores whole seconds: submit time lies in the window we submitted in.
    assert run.submitted_from <= row["submit_time"] <= run.submitted_to + timedelta(seconds=1)
    assert row["submit_time"] <= row["start_time"] <= row["end_time"]
    assert row["dependencies"] is not None  # declared (possibly empty) and kept via the comment


def test_running_jobs_have_per_node_gpu_indices(run):
    multi, twonode = run.running["multi"], run.running["twonode"]
    (indices,) = multi.gpus.values()
    assert len(indices) == 4 and len(set(indices)) == 4 and all(0 <= i < 8 for i in indices)
    assert sorted(twonode.gpus) == ["gpu-1", "gpu-2"]
    assert all(len(idx) == 2 for idx in twonode.gpus.values())
    # No GPU on a node is held by two running jobs.
    held = [(n, i) for r in run.running.values() for n, idx in r.gpus.items() for i in idx]
    assert len(held) == len(set(held))
    assert multi.user == TEST_USER and multi.start_time.tzinfo is not None


def test_gpu_rows_seen_while_running_get_the_end_time(run):
    assert {n: len(i) for n, i in stored_gpus(run, "twonode").items()} == {"gpu-1": 2, "gpu-2": 2}
    assert sum(map(len, stored_gpus(run, "multi").values())) == 4
    end = stored(run, "twonode")["end_time"]
    ends = (
        run.warehouse.connect()
        .execute("SELECT DISTINCT end_time FROM job_gpus WHERE job_id = ?", [run.ids["twonode"]])
        .fetchall()
    )
    assert ends == [(end,)]


def test_run_time_limits_and_timeout(run):
    row = stored(run, "timeout")
    assert row["time_limit_s"] == 60
    assert timedelta(seconds=55) <= row["end_time"] - row["start_time"] <= timedelta(seconds=150)
    assert stored(run, "single")["time_limit_s"] is None  # partition MaxTime=INFINITE


def test_declared_dependencies_travel_with_the_record(run):
    assert stored(run, "twonode")["dependencies"] == '{"python": "3"}'
    assert run.finished["twonode"].interactive is False


def test_resync_adds_no_duplicates(run):
    count = "SELECT count(*) FROM jobs WHERE job_id IN (SELECT unnest(?))"
    ids = list(run.ids.values())
    before = run.warehouse.connect().execute(count, [ids]).fetchone()[0]
    result = sync(SlurmExecutor("campus", SETTINGS), run.warehouse)
    assert result.finished >= len(PROFILES)  # the overlap window re-reads them, and
    assert run.warehouse.connect().execute(count, [ids]).fetchone()[0] == before == len(ids)


def test_refused_submission_is_a_clear_error(run):
    # The site's rules allow 16 GPUs per node, the nodes have 8: sbatch refuses the job.
    lax = ExecutorSettings(max_gpus_per_node=16)
    too_big = parse_profile("name: big\ngpus_per_node: 16\nentry: {commands: 'true'}\n", "b", lax)
    with pytest.raises(UserError, match="Requested node configuration is not available"):
        SlurmExecutor("campus", lax, as_user("root", run.cluster)).submit(too_big)


def test_inventory_lists_the_nodes_gres_and_partition(run):
    assert SlurmExecutor("campus", SETTINGS).inventory() == [
        NodeRecord("gpu-1", 8, "a100", "debug"),
        NodeRecord("gpu-2", 8, "a100", "debug"),
    ]
