"""A real Slurm 22.05 on loopback for tests: munge, MariaDB, slurmdbd, slurmctld, 2 GPU nodes.

Everything lives under one scratch directory and uses free ports chosen at `up()`
(tests/ports.py), so it never touches a site's Slurm and two copies of the suite can run side by
side. Every daemon runs in the foreground in its own process group (tests/daemons.py): `down()`
stops those groups, and should pytest die first, its exit hooks do; daemons left by a run killed
with SIGKILL are reaped by the next `up()` (only those whose pytest is gone). Configs follow
../shared/recipes/slurm-loopback.md (measured on this machine kind): no systemd, no cgroups
(unless `cgroups=True`), munge on its own socket, `AccountingStoragePass` pointing at that
socket, fake GPU device nodes.

The two nodes declare typed GPUs (`Gres=gpu:a100:8`) so accounting carries both `gres/gpu=N` and
`gres/gpu:a100=N`, the case that double-counts in a naive AllocTRES parser. Each node has its own
fake device nodes `dev/<node>/nvidia0..7`, so GPU indices are per node, as on real machines.

Options for the known-answer test of the whole path (tests/test_real_path.py):
`gpu_job_mapping=True` installs the project's own Slurm prolog and epilog
(sing/exporters/deploy/slurm-{prolog,epilog}.sh) with `PrologFlags=Alloc`; both slurmd run on one
host, so a two-line wrapper gives each node its own mapping directory (`mapping_dir(node)`).
`cgroups=True` confines jobs in cgroups as a jobstats site does (proctrack/cgroup, task/cgroup,
jobacct_gather/cgroup; cgroup.conf ConstrainCores and ConstrainRAMSpace; memory a consumable
resource): Slurm makes each job's directories under the machine's real /sys/fs/cgroup (v1 here).
`first_job_id` sets Slurm's FirstJobId (e.g. 8, so ids cross from one digit to two), and a
second ordinary user, TEST_USER2, exists in the same account.

Command line: `python -m tests.slurm_harness up|down BASE` (prints `export SLURM_CONF=...`); the
cluster it starts outlives the command, and `down` stops it by the daemons' pid files.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import daemons
from tests.debian import IN_CI, ensure_packages
from tests.ports import free_port_block, free_ports
from tests.slurm_release import Release, release

REPO = Path(__file__).resolve().parents[1]

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server")
NODES = ("gpu-1", "gpu-2")
GPUS_PER_NODE = 8
TEST_USER = "singtest"
TEST_USER2 = "singtest2"
TEST_ACCOUNT = "research"
CLUSTER = "testcluster"

SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/run/munge/munge.socket.2
SlurmctldPort={ctld}
StateSaveLocation={base}/state/ctld
SlurmdSpoolDir={base}/state/d/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType={proctrack}
TaskPlugin={task}
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters={select}
SlurmdParameters=config_overrides
MinJobAge=300
KillWait=2
InactiveLimit=0
Waittime=0
GresTypes=gpu
JobCompType=jobcomp/none
JobAcctGatherType={jobacct}
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={dbd}
AccountingStoragePass={base}/run/munge/munge.socket.2
AccountingStorageTRES=gres/gpu,gres/gpu:a100
AccountingStoreFlags=job_comment
NodeName=gpu-[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[{slurmd0}-{slurmd1}] \
CPUs=16 Sockets=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:a100:{gpus} \
State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
{extra}"""

# The project's prolog/epilog as a site installs them, plus PrologFlags=Alloc so the prolog runs
# on every node of a job when it is allocated (by default only where a step starts: a batch job
# would leave its other nodes' GPUs unattributed).
MAPPING_CONF = """\
Prolog={base}/etc/prolog.sh
Epilog={base}/etc/epilog.sh
PrologFlags=Alloc
"""

# One slurmd per host on a real cluster; here both share one host, so each gets its own directory.
MAPPING_WRAPPER = """\
#!/bin/sh
SING_GPU_JOB_DIR={base}/gpu-jobs/$SLURMD_NODENAME exec {script}
"""

# With `cgroups=True`: Slurm confines each job in cgroups (v1 on this machine kind: its
# controllers are mounted one per tree under /sys/fs/cgroup, cgroup2 only at .../unified), as a
# site with jobstats does. The node's CPUs=16 (config_overrides) exceed this machine's cores, so
# a job confined to cores this machine lacks would fail: a job of 2 CPUs on an idle node gets
# cores 0-1, which exist.
# Slurm names its directories after the node (`<controller>/slurm_gpu-1/`), not the cluster, and
# leaves them behind: tests/test_slurm_cgroups.py runs one such cluster per machine at a time and
# removes them.
CGROUP_PLUGINS = {
    "proctrack": "proctrack/cgroup",
    "task": "task/cgroup",
    "jobacct": "jobacct_gather/cgroup",
    "select": "CR_Core_Memory",  # else a job's --mem is not allocated: its memory cgroup unlimited
}
NO_CGROUP_PLUGINS = {
    "proctrack": "proctrack/linuxproc",
    "task": "task/none",
    "jobacct": "jobacct_gather/linux",
    "select": "CR_Core",
}
CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=yes
"""

GRES_CONF = """\
AutoDetect=off
NodeName=gpu-1 Name=gpu Type=a100 File={base}/dev/gpu-1/nvidia[0-7]
NodeName=gpu-2 Name=gpu Type=a100 File={base}/dev/gpu-2/nvidia[0-7]
"""

SLURMDBD_CONF = """\
AuthType=auth/munge
AuthInfo=socket={base}/run/munge/munge.socket.2
DbdHost=localhost
DbdPort={dbd}
SlurmUser=root
PidFile={base}/run/slurmdbd.pid
LogFile={base}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={mysql}
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
"""

MY_CNF = """\
[mariadbd]
datadir={base}/mysql/data
socket={base}/mysql/run/mysqld.sock
pid-file={base}/mysql/run/mysqld.pid
bind-address=127.0.0.1
port={mysql}
user=mysql
skip-name-resolve
innodb_buffer_pool_size=128M
innodb_log_file_size=16M
innodb_lock_wait_timeout=900
innodb_flush_log_at_trx_commit=0
"""


def install() -> None:
    """Install the packages (tests.debian rules: CI installs, elsewhere skip if impossible).

    Debian's postinst would start MariaDB and munge on their default paths; a policy-rc.d that
    refuses service starts (as this image ships) is put in place for the install if missing.
    """
    policy = Path("/usr/sbin/policy-rc.d")
    added = os.geteuid() == 0 and not policy.exists()
    if added:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        ensure_packages(*PACKAGES)
    finally:
        if added:
            policy.unlink()


def scratch(prefix: str) -> Path:
    """Install Slurm and make a scratch directory for a test module's cluster: not under pytest's
    0700 tmp dir, since the test users' jobs must reach it. Fails under CI without root."""
    install()
    if os.geteuid() != 0:
        (pytest.fail if IN_CI else pytest.skip)("the loopback Slurm needs root")
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    return base


@contextlib.contextmanager
def running(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster up with $SLURM_CONF pointing at it; afterwards down, $SLURM_CONF restored
    and its directory removed."""
    saved = {name: os.environ.get(name) for name in ("SLURM_CONF", "PATH")}
    os.environ.update(SLURM_CONF=str(cluster.conf), PATH=cluster.path)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(cluster.base, ignore_errors=True)


class SlurmCluster:
    """One loopback Slurm cluster rooted at `base`; `up()` starts it, `down()` stops it.

    `owned=False` (the command line's `up`) leaves the daemons running when this process exits.
    """

    def __init__(
        self,
        base: Path,
        gpu_job_mapping: bool = False,
        first_job_id: int | None = None,
        owned: bool = True,
        slurm: str = "22.05",
        cgroups: bool = False,
    ) -> None:
        self.base = Path(base).resolve()
        self.conf = self.base / "etc" / "slurm.conf"
        self.jobs_dir = self.base / "jobs"
        self.gpu_job_mapping = gpu_job_mapping
        self.first_job_id = first_job_id
        self.cgroups = cgroups
        self.release: Release = release(slurm)  # tests/slurm_release.py
        self.bin_dir = self.release.client_dir(self.base)
        self._mark = daemons.owner_mark(str(self.base)) if owned else None
        self._daemons: dict[str, subprocess.Popen] = {}  # name -> its process, in start order

    def mapping_dir(self, node: str) -> Path:
        """Where the prolog of `node` writes its GPU-to-job files (with gpu_job_mapping)."""
        return self.base / "gpu-jobs" / node

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands (sbatch, squeue, sacct) against this cluster:
        the release's clients first on PATH."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": self.path}

    @property
    def path(self) -> str:
        """$PATH with this release's client commands first."""
        path = os.environ.get("PATH", os.defpath)
        return path if self.bin_dir is None else f"{self.bin_dir}{os.pathsep}{path}"

    def up(self) -> None:
        daemons.reap_orphans()
        self._write_configs()
        self._start_munge()
        self._start_mariadb()
        self._daemon("slurmdbd", ["slurmdbd", "-D"])
        self._wait(lambda: self._ok(["sacctmgr", "-n", "list", "cluster"]), "slurmdbd answering")
        self._daemon("slurmctld", ["slurmctld", "-D"])
        self._wait(lambda: self._ok(["scontrol", "ping"], expect="UP"), "slurmctld UP")
        for node in NODES:
            self._daemon(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self._wait(self._nodes_idle, "both slurmd nodes idle")
        self._add_test_users()

    def down(self) -> None:
        """Stop this cluster's daemons (TERM, then KILL after 15 s); leave files for logs."""
        ctld = self._daemons.get("slurmctld")
        if self.conf.exists() and (ctld is None or ctld.poll() is None):
            for user in ("root", TEST_USER, TEST_USER2):
                subprocess.run(["scancel", "-u", user], env=self.env, capture_output=True)
            # Let the slurmstepds finish their jobs while slurmd can still hear them; otherwise
            # they linger as orphans after the daemons are gone.
            with contextlib.suppress(RuntimeError):
                self._wait(self._no_jobs_running, "cancelled jobs to end", timeout=20)
        if self._mark is None:
            self._stop_by_pid_files()
            return
        for process in reversed(self._daemons.values()):
            daemons.stop(process)
        daemons.reap(lambda mark: mark == self._mark)  # what the daemons forked and left behind

    def _stop_by_pid_files(self) -> None:
        """The command line's `down`: the daemons were started by another process."""
        pids = [pid for pid in map(self._pid_from, self._pid_files()) if pid]
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        for pid in pids:
            _signal(pid, signal.SIGKILL)

    # -- set-up steps ------------------------------------------------------------------------

    def _write_configs(self) -> None:
        b = self.base
        for sub in (
            "etc",
            "run/munge",
            "log",
            "state/ctld",
            "state/d",
            "jobs",
            *(f"dev/{node}" for node in NODES),
            "mysql/data",
            "mysql/run",
        ):
            (b / sub).mkdir(parents=True, exist_ok=True)
        self.jobs_dir.chmod(0o1777)
        ctld, dbd, mysql = free_ports(3)
        slurmd = free_port_block(len(NODES))  # slurm.conf gives the nodes one range of ports
        values = {
            "base": b,
            "cluster": CLUSTER,
            "ctld": ctld,
            "dbd": dbd,
            "mysql": mysql,
            "slurmd0": slurmd,
            "slurmd1": slurmd + len(NODES) - 1,
            "gpus": GPUS_PER_NODE,
        }
        extra = self.release.conf_lines()
        extra += MAPPING_CONF.format(**values) if self.gpu_job_mapping else ""
        if self.first_job_id is not None:
            extra += f"FirstJobId={self.first_job_id}\n"
        plugins = CGROUP_PLUGINS if self.cgroups else NO_CGROUP_PLUGINS
        self.conf.write_text(SLURM_CONF.format(**values, **plugins, extra=extra))
        if self.cgroups:
            (b / "etc" / "cgroup.conf").write_text(CGROUP_CONF)
        if self.gpu_job_mapping:
            for step in ("prolog", "epilog"):
                wrapper = b / "etc" / f"{step}.sh"
                script = REPO / "sing" / "exporters" / "deploy" / f"slurm-{step}.sh"
                wrapper.write_text(MAPPING_WRAPPER.format(base=b, script=script))
                wrapper.chmod(0o755)
        (b / "etc" / "gres.conf").write_text(GRES_CONF.format(**values))
        (b / "etc" / "my.cnf").write_text(MY_CNF.format(**values))
        dbd = b / "etc" / "slurmdbd.conf"
        dbd.write_text(SLURMDBD_CONF.format(**values))
        dbd.chmod(0o600)
        for node in NODES:
            for i in range(GPUS_PER_NODE):
                device = b / "dev" / node / f"nvidia{i}"
                if not device.exists():
                    # A real character device (NVIDIA major 195) keeps slurmd's logs quiet.
                    os.mknod(device, 0o666 | 0o020000, os.makedev(195, i))

    def _start_munge(self) -> None:
        run = self.base / "run" / "munge"
        key = self.base / "etc" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        _check(self._root(["chown", "munge:munge", str(key), str(run)]))  # the release's munge
        self._daemon(
            "munged",
            [
                "runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground",
                f"--socket={run}/munge.socket.2", f"--key-file={key}",
                f"--pid-file={run}/munged.pid", f"--log-file={run}/munged.log",
                f"--seed-file={run}/munged.seed",
            ],
        )  # fmt: skip
        answering = self._root(["munge", f"--socket={run}/munge.socket.2", "--no-input"])
        self._wait(lambda: self._ok(answering), "munged answering")

    def _start_mariadb(self) -> None:
        mysql = self.base / "mysql"
        subprocess.run(["chown", "-R", "mysql:mysql", str(mysql)], check=True)
        if not (mysql / "data" / "mysql").exists():
            _check(
                [
                    "mariadb-install-db", "--no-defaults", "--user=mysql",
                    f"--datadir={mysql}/data", "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ]
            )  # fmt: skip
        # The host's MariaDB for every release: Debian 13's slurmdbd 24.11 cannot use Debian 13's
        # MariaDB 11.8 (fatal: _check_mysql_concat_is_sane, client error 5027), but works
        # with Debian 12's 10.11 over TCP.
        command = ["/usr/sbin/mariadbd", f"--defaults-file={self.base}/etc/my.cnf"]
        self._daemon("mariadbd", command, in_root=False)
        sock = f"--socket={mysql}/run/mysqld.sock"
        self._wait(lambda: self._ok(["mariadb-admin", sock, "ping"]), "MariaDB answering")
        sql = (
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        _check(["mariadb", sock, "-u", "root", "-e", sql])

    def _add_test_users(self) -> None:
        commands = [["sacctmgr", "-i", "add", "account", TEST_ACCOUNT]]
        for user in (TEST_USER, TEST_USER2):
            _ensure_user(user)
            self.release.add_users(user)
            account = f"DefaultAccount={TEST_ACCOUNT}"
            commands.append(["sacctmgr", "-i", "add", "user", user, account])
        for command in commands:
            subprocess.run(command, env=self.env, capture_output=True)  # exists on a re-run

    # -- helpers ----------------------------------------------------------------------------

    def _daemon(self, name: str, command: list[str], in_root: bool = True) -> None:
        """Start a daemon in the foreground, in its own process group, output in log/NAME.out;
        `in_root`: the release's own daemon (for 24.11, run inside its root)."""
        log = self.base / "log" / f"{name}.out"
        argv = self._root(command) if in_root else command
        self._daemons[name] = daemons.spawn(argv, log, self.env, self._mark)

    def _root(self, command: list[str]) -> list[str]:
        """`command` as the release runs root's commands (for 24.11: inside its root)."""
        return self.release.command(self.base, command)

    def _ok(self, command: list[str], expect: str = "") -> bool:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True)
        return result.returncode == 0 and expect in result.stdout

    def _nodes_idle(self) -> bool:
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True
        )
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in NODES)

    def _no_jobs_running(self) -> bool:
        result = subprocess.run(
            ["squeue", "-h", "-t", "RUNNING,COMPLETING"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        return result.returncode != 0 or not result.stdout.strip()

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        """Poll `ready`; fail after `timeout` s, or at once when a daemon has exited."""
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [name for name, process in self._daemons.items() if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                reason = f"{', '.join(dead)} exited" if dead else "timed out"
                raise RuntimeError(
                    f"loopback Slurm: {reason} waiting for {what}; logs in {self.base}/log"
                )
            time.sleep(0.2)

    def _pid_files(self) -> list[Path]:
        run = self.base / "run"
        return [
            *(run / f"slurmd-{node}.pid" for node in NODES),
            run / "slurmctld.pid",
            run / "slurmdbd.pid",
            run / "munge" / "munged.pid",
            self.base / "mysql" / "run" / "mysqld.pid",
        ]

    @staticmethod
    def _pid_from(path: Path) -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None


def _check(command: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr}")


def _ensure_user(user: str) -> None:
    """Create the local user unless it exists; another copy of the suite may be creating it at
    the same moment (useradd then fails: the user exists, or /etc/passwd is locked)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            pwd.getpwnam(user)
            return
        except KeyError:
            pass
        result = subprocess.run(
            ["useradd", "-m", "-s", "/bin/bash", user], capture_output=True, text=True
        )
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"useradd {user} failed ({result.returncode}): {result.stderr}")
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


if __name__ == "__main__":
    action, base = sys.argv[1], Path(sys.argv[2])
    cluster = SlurmCluster(base, owned=False)
    if action == "up":
        cluster.up()
        print(f"export SLURM_CONF={cluster.conf}")
    elif action == "down":
        cluster.down()
    else:
        sys.exit(f"usage: python -m tests.slurm_harness up|down BASE (not {action!r})")
