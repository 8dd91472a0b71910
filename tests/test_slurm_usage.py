"""CPU and memory per job from Slurm's own accounting, on a real Slurm: 22.05 and, from a Debian
13 root, 24.11 (tests/slurm_harness.py, tests/slurm_release.py).

Two jobs per release, each asking for CPUs and memory, their tasks holding a known amount of
touched memory and burning a known CPU time (`time.process_time()`, so the figure does not
depend on how loaded the machine is):
- `ended`: 2 CPUs, `--mem=1000M`; one step of two tasks, each 100 MiB and 2 s of CPU. Synced
  once it ended: seff's figures, 4 s of CPU and the sum of the two tasks' peaks (over 200 MiB,
  which one task alone cannot reach).
- `running`: 1 CPU, `--mem=500M`; one task that holds 80 MiB, burns 2.2 s and sleeps. Read with
  `usage()` (sstat) once it burnt them, synced while it runs (squeue's CPUs and memory), then
  cancelled: `usage()` is None, and sacct has the 2.2 s and the 80 MiB.

The harness's slurm.conf has jobacct_gather/linux sampling every 30 s, which would sample these
short tasks at most once; each job asks for a sample every second (`--acctg-freq=task=1`).
CPU time is not sampled: slurmstepd takes it from the task's rusage when it ends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor, run_command
from sing.executors.sync import sync
from sing.warehouse.store import Warehouse
from tests.slurm_harness import SlurmCluster, running, scratch
from tests.slurm_release import RELEASES
from tests.test_executors_slurm import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

MIB = 1 << 20
# argv: MiB to touch, CPU seconds to burn, seconds to sleep after (holding the memory).
BURN = """\
import sys, time
held = b"\\1" * (int(sys.argv[1]) << 20)
while time.process_time() < float(sys.argv[2]):
    pass
time.sleep(float(sys.argv[3]))
"""
JOBS = {
    "ended": ("--cpus-per-task=2 --mem=1000M", "--ntasks=2 --cpus-per-task=1", "100 2 0"),
    "running": ("--cpus-per-task=1 --mem=500M", "--ntasks=1", "80 2.2 600"),
}
# What a task holds beyond what it touched: the interpreter (about 10 MiB seen), its stack.
OVERHEAD = 40 * MIB


@pytest.fixture(scope="module", params=RELEASES)
def cluster(request):
    with running(SlurmCluster(scratch("sing-usage-"), slurm=request.param)) as up:
        yield up


def submit(cluster: SlurmCluster, name: str) -> str:
    job, step, args = JOBS[name]
    script = (
        f"#!/bin/bash\n#SBATCH --job-name={name} {job} --acctg-freq=task=1\n"
        f"#SBATCH --chdir={cluster.jobs_dir} --output={cluster.jobs_dir}/{name}.out\n"
        f"srun {step} python3 burn.py {args}\n"
    )
    return run_command(["sbatch", "--parsable"], script).strip()


def row(wh: Warehouse, job_id: str) -> dict:
    cursor = wh.connect().execute(
        "SELECT state, alloc_cpus, req_mem_bytes, slurm_cpu_s, slurm_max_rss_bytes FROM jobs "
        "WHERE job_id = ?",
        [job_id],
    )
    (values,) = cursor.fetchall()
    return dict(zip([d[0] for d in cursor.description], values, strict=True))


def test_cpu_and_memory_of_a_running_and_an_ended_job(cluster, tmp_path):
    (cluster.jobs_dir / "burn.py").write_text(BURN)
    since = datetime.now(UTC) - timedelta(minutes=1)
    admin = SlurmExecutor("campus", ExecutorSettings())
    ids = {name: submit(cluster, name) for name in JOBS}

    # sstat's CPU is whole seconds of sampled /proc times (each whole ticks): 2 s burnt can
    # read 1.98, so the task burns 2.2.
    def burnt():
        usage = admin.usage(ids["running"])
        return usage if usage and (usage.cpu_s or 0) >= 2 else None

    usage = wait_for(burnt, "sstat to show the running task's 2 s of CPU", 120)
    assert usage.cpu_s == 2 and 80 * MIB <= usage.max_rss_bytes <= 80 * MIB + OVERHEAD
    wh = Warehouse(tmp_path / "wh")
    sync(admin, wh)
    assert row(wh, ids["running"]) == {
        "state": "RUNNING",
        "alloc_cpus": 1,
        "req_mem_bytes": 500 * MIB,
        "slurm_cpu_s": None,  # sacct's, once it ended
        "slurm_max_rss_bytes": None,
    }

    admin.cancel(ids["running"])
    wait_for(lambda: admin.usage(ids["running"]) is None, "sstat to find no running step", 60)

    def both_ended():
        return set(ids.values()) <= {r.job_id for r in admin.finished(since)}

    wait_for(both_ended, "both jobs in sacct", 120)
    sync(admin, wh)
    ended = row(wh, ids["ended"])
    assert (ended["state"], ended["alloc_cpus"], ended["req_mem_bytes"]) == (
        "COMPLETED",
        2,
        1000 * MIB,
    )
    # Two tasks of 2 s each; the rest is srun, bash and the interpreters' exits.
    assert 4 <= ended["slurm_cpu_s"] <= 5
    # seff's memory: the step's two task peaks summed, each 100 MiB and an interpreter.
    assert 200 * MIB <= ended["slurm_max_rss_bytes"] <= 2 * (100 * MIB + OVERHEAD)
    cancelled = row(wh, ids["running"])
    # The measured figures, for `pytest -s`.
    print(f"Slurm {cluster.release.name}: {ended=} {usage=} {cancelled=}")
    assert cancelled["state"] == "CANCELLED" and cancelled["alloc_cpus"] == 1
    assert 2.2 <= cancelled["slurm_cpu_s"] <= 2.7
    assert 80 * MIB <= cancelled["slurm_max_rss_bytes"] <= 80 * MIB + OVERHEAD
