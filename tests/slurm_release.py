"""The Slurm releases the real-Slurm tests run against: Debian 12's 22.05 and Debian 13's 24.11.

22.05 is the host's own packages (tests/debian.py installs them). 24.11 lives in a Debian 13
("trixie") minbase root, built once per machine under `TRIXIE_ROOT` (a version stamp in the name:
change `ROOT_PACKAGES` or the build steps and bump it), behind a lock so two suites never build
at once; ../shared/tools/fresh-check.sh builds its roots the same way.

How 24.11 runs beside the host:
* Daemons and root-only admin commands run `in_root`: a private mount namespace (`unshare -m`)
  that binds /proc, /sys, /dev, the cluster's scratch directory and the repository at the same
  paths inside the root, then `chroot`. The mounts die with the process, so nothing is left
  mounted whatever way a test ends; chroot shares the network, so loopback ports just work.
* Client commands (sbatch, squeue, sacct, ...) run on the host through wrapper scripts that start
  the root's own binary with the root's dynamic loader and libraries. No chroot, so an ordinary
  user can run them (`runuser -u USER -- sbatch`), against the host's users and files.
  The root holds a link from its own path to `/`, so `PluginDir=<root>/usr/lib/...` in
  slurm.conf names the 24.11 plugins both for the host-side clients and inside the root.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.debian import IN_CI, ensure_packages

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("22.05", "24.11")
TRIXIE_ROOT = Path("/var/tmp/sing-test-trixie-v3")
# MariaDB is the host's (tests/slurm_harness.py says why); the mysql plugin brings its client.
ROOT_PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "slurm-wlm-mysql-plugin",
    "munge",
    "python3-minimal",  # sing's job scripts check the declared python on the node
)
CLIENTS = (
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
    "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger",
)  # fmt: skip
LIBDIR = "usr/lib/x86_64-linux-gnu"
WRAPPER = """\
#!/bin/sh
# Slurm 24.11's {name}, from {root}, run on the host (tests/slurm_release.py).
exec {root}/lib64/ld-linux-x86-64.so.2 --library-path {root}/{lib}:{root}/{lib}/slurm-wlm \\
    {root}/usr/bin/{name} "$@"
"""
# $1 root, $2 scratch directory, $3 repository, then the command.
IN_ROOT = (
    'R=$1 B=$2 P=$3; shift 3; for m in proc sys dev; do mount --rbind /$m "$R/$m" || exit 1; done; '
    'mount --bind "$B" "$R$B" && mount --bind "$P" "$R$P" && exec chroot "$R" "$@"'
)


@dataclass(frozen=True)
class Release:
    """One Slurm release: how to run its daemons and clients for a cluster in `base`."""

    name: str
    root: Path | None = None  # None: the host's own packages

    def command(self, base: Path, argv: list[str]) -> list[str]:
        """`argv` as run by root for the cluster in `base` (inside the release's root if any)."""
        if self.root is None:
            return argv
        for path in (base, REPO):
            (self.root / str(path).lstrip("/")).mkdir(parents=True, exist_ok=True)
        script = ["sh", "-c", IN_ROOT, "sh", str(self.root), str(base), str(REPO)]
        return ["unshare", "--mount", "--propagation", "private", *script, *argv]

    def conf_lines(self) -> str:
        """Extra slurm.conf lines: the release's plugins, for clients on the host too."""
        return "" if self.root is None else f"PluginDir={self.root}/{LIBDIR}/slurm-wlm\n"

    def client_dir(self, base: Path) -> Path | None:
        """A directory of client wrappers to put first on PATH (None: the host's clients)."""
        if self.root is None:
            return None
        bin_dir = base / "bin"
        bin_dir.mkdir(exist_ok=True)
        for name in CLIENTS:
            wrapper = bin_dir / name
            wrapper.write_text(WRAPPER.format(name=name, root=self.root, lib=LIBDIR))
            wrapper.chmod(0o755)
        return bin_dir

    def add_users(self, *users: str) -> None:
        """Give the root the host's test users (same ids), so slurmd can start their jobs."""
        if self.root is None:
            return
        with _locked():
            for user in users:
                entry = pwd.getpwnam(user)
                group = grp.getgrgid(entry.pw_gid)
                passwd = f"{user}:x:{entry.pw_uid}:{entry.pw_gid}::{entry.pw_dir}:/bin/sh"
                _append_once(self.root / "etc" / "passwd", user, passwd)
                group_line = f"{group.gr_name}:x:{group.gr_gid}:"
                _append_once(self.root / "etc" / "group", group.gr_name, group_line)


def release(name: str) -> Release:
    """The release called `name`, its root built if needed: a build failure fails the test
    under CI (as tests/debian.py does for packages) and skips it elsewhere."""
    if name == "22.05":
        return Release(name)
    if name != "24.11":
        raise ValueError(f"unknown Slurm release {name!r}; known: {', '.join(RELEASES)}")
    try:
        return Release(name, trixie_root())
    except (OSError, RuntimeError) as err:
        (pytest.fail if IN_CI else pytest.skip)(f"no Debian 13 root for Slurm 24.11: {err}")
        raise  # unreachable: fail and skip raise


def trixie_root() -> Path:
    """The cached Debian 13 root with Slurm 24.11, built on first use (about 40 s here)."""
    root = TRIXIE_ROOT
    stamp = root / ".sing-built"
    if stamp.exists():
        return root
    if os.geteuid() != 0:
        raise RuntimeError("building it needs root")
    ensure_packages("debootstrap")
    with _locked():
        if not stamp.exists():
            _build(root)
            stamp.write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    return root


def _build(root: Path) -> None:
    """debootstrap a minbase trixie, the host's apt sources with the suite renamed, the
    packages installed with service starts refused (policy-rc.d exits 101)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = root.with_name(root.name + ".log")
    _run(["debootstrap", "--variant=minbase", "trixie", str(root)], log)
    etc = root / "etc"
    (etc / "apt" / "sources.list").unlink(missing_ok=True)
    sources = Path("/etc/apt/sources.list.d/debian.sources").read_text()
    (etc / "apt" / "sources.list.d" / "debian.sources").write_text(
        sources.replace("bookworm", "trixie")
    )
    for conf in Path("/etc/apt/apt.conf.d").glob("99*"):  # this workplace's mirror settings
        shutil.copy(conf, etc / "apt" / "apt.conf.d" / conf.name)
    for name in ("resolv.conf", "hosts"):
        shutil.copy(Path("/etc") / name, etc / name)
    certs = Path("/etc/ssl/certs/ca-certificates.crt")
    if certs.exists():
        (etc / "ssl" / "certs").mkdir(parents=True, exist_ok=True)
        shutil.copy(certs, etc / "ssl" / "certs" / certs.name)
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["chroot", str(root), "apt-get", "update", "-q"], log, env)
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *ROOT_PACKAGES]
    _run(["chroot", str(root), *install], log, env)
    _run(["chroot", str(root), "apt-get", "clean"], log, env)
    link = root / str(root).lstrip("/")  # <root><root> -> /, see the module's docstring
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("/")


def _run(argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({result.returncode}); see {log}")


class _locked:
    """An exclusive lock beside the root: one build, one /etc/passwd edit at a time."""

    def __enter__(self) -> None:
        TRIXIE_ROOT.parent.mkdir(parents=True, exist_ok=True)
        self._file = TRIXIE_ROOT.with_name(TRIXIE_ROOT.name + ".lock").open("w")
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def _append_once(path: Path, name: str, line: str) -> None:
    if not any(row.split(":", 1)[0] == name for row in path.read_text().splitlines()):
        with path.open("a") as out:
            out.write(line + "\n")
