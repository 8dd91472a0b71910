"""sing's allocated GPU-hours per account against Slurm's own accounting (tests/slurm_harness.py).

GPU jobs of known sizes and durations run for two accounts on the loopback Slurm (whose nodes
declare typed GPUs, `gpu:a100:8`, so sacct lists both `gres/gpu=N` and `gres/gpu:a100=N`), are
synced into a warehouse the way the collector does it (`sing.collector.jobsync.executor_sync`, i.e.
`sing jobs sync` through the real squeue and sacct), and sing's per-account GPU-seconds must
equal both `sreport cluster AccountUtilizationByUser -T gres/gpu` and sacct's AllocTRES
`gres/gpu` x ElapsedRaw for the same jobs.

sreport reads slurmdbd's hourly rollup, which slurmdbd computes only for hours that are over;
the test asks slurmdbd for the rollup of the jobs' hours through Slurm's own API
(`slurmdb_usage_roll`, the call behind newer sacctmgr's `rollup` command), as an admin does.
Reports are in seconds: the jobs run for seconds, which minutes would round away.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from sing.accounting.settings import AccountingSettings
from sing.accounting.usage import usage
from sing.collector.jobsync import executor_sync
from sing.config import Config
from sing.executors.settings import ExecutorSettings
from sing.executors.slurm import SlurmExecutor
from sing.warehouse.store import Warehouse
from tests.slurm_harness import (
    CLUSTER,
    TEST_ACCOUNT,
    TEST_USER,
    TEST_USER2,
    SlurmCluster,
    running,
    scratch,
)
from tests.test_executors_slurm import as_user, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

SECOND_ACCOUNT = "chem"
# (user, account, sbatch GPU options, seconds): typed and untyped requests, one and two nodes.
JOBS = (
    (TEST_USER, TEST_ACCOUNT, ["--gres=gpu:a100:2"], 6),
    (TEST_USER, TEST_ACCOUNT, ["--gres=gpu:1"], 4),
    (TEST_USER2, SECOND_ACCOUNT, ["-N", "2", "--gres=gpu:a100:1"], 5),
    (TEST_USER2, SECOND_ACCOUNT, ["--gres=gpu:a100:4"], 3),
)
LIBSLURM = "/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so"
ROLL_UP = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # its plugins link against it
lib.slurm_init(None)
lib.slurmdb_connection_get.restype = ctypes.c_void_p
conn = ctypes.c_void_p(lib.slurmdb_connection_get(None))
rc = lib.slurmdb_usage_roll(conn, ctypes.c_long(int(sys.argv[2])), ctypes.c_long(int(sys.argv[3])),
                            ctypes.c_uint16(0), None)
lib.slurmdb_connection_close(ctypes.byref(conn))
sys.exit(rc)
"""


def hour_floor(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The jobs run to the end and synced; (cluster, warehouse, [since, until) hour window)."""
    with running(SlurmCluster(scratch("sing-accounting-"))) as cluster:
        env = {**cluster.env, "TZ": "UTC"}
        for command in (
            ["sacctmgr", "-i", "add", "account", SECOND_ACCOUNT],
            ["sacctmgr", "-i", "add", "user", TEST_USER2, f"account={SECOND_ACCOUNT}"],
        ):
            subprocess.run(command, env=env, check=True, capture_output=True)
        began = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
        ids = []
        for user, account, gpus, seconds in JOBS:
            argv = ["sbatch", "--parsable", "-A", account, *gpus, "--wrap", f"sleep {seconds}"]
            ids.append(as_user(user, cluster)(argv).strip().split(";")[0])
        admin = SlurmExecutor("campus", ExecutorSettings())

        def all_done():
            done = {r.job_id for r in admin.finished(began - timedelta(minutes=1))}
            return set(ids) <= done

        wait_for(all_done, "the jobs to end", 120)
        wh = Warehouse(tmp_path_factory.mktemp("wh"))
        config = Config({"site": {"cluster": "campus"}, "executor": {"kind": "slurm"}})
        executor_sync(config, wh)
        ended = datetime.now(UTC)
        since, until = hour_floor(began), hour_floor(ended) + timedelta(hours=1)
        rolled = subprocess.run(
            [sys.executable, "-c", ROLL_UP, LIBSLURM, str(int(since.timestamp())),
             str(int(until.timestamp()))],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert rolled.returncode == 0, rolled.stderr
        yield cluster, wh, ids, since, until


def sing_gpu_seconds(wh: Warehouse, since: datetime, until: datetime) -> dict[str, int]:
    frame = usage(wh.connect(), "account", since, until, AccountingSettings())
    return {r["account"]: round(r["allocated_gpu_hours"] * 3600) for r in frame.to_dicts()}


def test_sing_matches_sreport(ran) -> None:
    cluster, wh, _, since, until = ran
    out = subprocess.run(
        ["sreport", "-n", "-P", "-t", "Seconds", "-T", "gres/gpu", "cluster",
         "AccountUtilizationByUser", f"cluster={CLUSTER}",
         f"start={since:%Y-%m-%dT%H:%M:%S}", f"end={until:%Y-%m-%dT%H:%M:%S}",
         "format=Account,Login,Used"],
        env={**cluster.env, "TZ": "UTC"}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # account totals are the rows without a login; root's row sums every account
    sreport = {
        account: int(used)
        for account, login, used in (line.split("|")[:3] for line in out.splitlines())
        if not login and account != "root"
    }
    assert sreport.keys() == {TEST_ACCOUNT, SECOND_ACCOUNT}, out
    assert sing_gpu_seconds(wh, since, until) == sreport


def test_sing_matches_sacct_alloc_tres(ran) -> None:
    """AllocTRES carries gres/gpu=N and gres/gpu:a100=N for each job: summing every gres/gpu*
    entry would double the typed jobs; sing counts each GPU once, as gres/gpu does."""
    cluster, wh, ids, since, until = ran
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "--format=Account,AllocTRES,ElapsedRaw"],
        env=cluster.env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    sacct: dict[str, int] = {}
    naive: dict[str, int] = {}
    for line in out.splitlines():
        account, tres, elapsed = line.split("|")
        gpus = int(re.search(r"(?:^|,)gres/gpu=(\d+)", tres).group(1))
        every_gpu_entry = sum(int(n) for n in re.findall(r"gres/gpu[^=,]*=(\d+)", tres))
        sacct[account] = sacct.get(account, 0) + gpus * int(elapsed)
        naive[account] = naive.get(account, 0) + every_gpu_entry * int(elapsed)
    assert len(out.splitlines()) == len(JOBS)
    assert sing_gpu_seconds(wh, since, until) == sacct
    assert naive != sacct  # the typed entries are there to double count


def test_jobs_ran_with_the_sizes_asked(ran) -> None:
    """The synced records carry what was submitted: GPUs per job and (about) the sleep."""
    _, wh, ids, since, until = ran
    rows = (
        wh.connect()
        .execute(
            "SELECT job_id, account, num_gpus, epoch(end_time - start_time) FROM jobs "
            "ORDER BY try_cast(job_id AS INTEGER)"
        )
        .fetchall()
    )
    assert [r[0] for r in rows] == ids
    assert [(r[1], r[2]) for r in rows] == [
        (TEST_ACCOUNT, 2), (TEST_ACCOUNT, 1), (SECOND_ACCOUNT, 2), (SECOND_ACCOUNT, 4)
    ]  # fmt: skip
    for (_, _, _, seconds), (*_, ran_s) in zip(JOBS, rows, strict=True):
        assert seconds <= ran_s <= seconds + 5
    users = usage(wh.connect(), "user", since, until, AccountingSettings())
    assert set(users["user"]) == {TEST_USER, TEST_USER2}
