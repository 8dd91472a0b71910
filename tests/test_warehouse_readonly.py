"""Read-only use (issue 29 item 2): every read command against a warehouse this process may
not write, with no lock file there, on a real read-only bind mount and as a user who may read
but not write. Writers say in one line that the warehouse is read-only here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sing.dashboards import data
from tests.cli_as_user import sing_as_nobody

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SING_")}
END = "2026-03-02T00:00:00+00:00"


def sing(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sing.cli", *args], capture_output=True, text=True, env=ENV
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo warehouse, its lock files removed: a reader must not need them."""
    root = tmp_path_factory.mktemp("ro") / "wh"
    done = sing("demo-data", "--nodes", "2", "--days", "1", "--end", END, "--warehouse", str(root))
    assert done.returncode == 0, done.stderr
    (root / ".maintenance.lock").unlink()
    shutil.rmtree(root / ".locks", ignore_errors=True)
    return root


@pytest.fixture(scope="module")
def mounted(source: Path) -> Iterator[Path]:
    """`source` on a real read-only bind mount."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    target = source.parent / "mnt"
    target.mkdir()
    for argv in (["mount", "--bind", source, target], ["mount", "-o", "remount,bind,ro", target]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            subprocess.run(["umount", target], capture_output=True)
            pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.strip()}")
    yield target
    subprocess.run(["umount", target], check=True)


def job_id(root: Path) -> str:
    done = sing(
        "warehouse", "sql", "SELECT max(job_id) FROM jobs", "--json", "--warehouse", str(root)
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    return row["max(job_id)"]


def read_commands(root: Path, out: Path) -> list[list[str]]:
    """Each read command, with the warehouse and any writable output outside it."""
    key = out.parent / "release.key"
    return [
        [*argv, "--warehouse", str(root)]
        for argv in (
            ["job", job_id(root)],
            ["jobs", "list"],
            ["report", "usage", "--since", "2026-03-01", "--until", END],
            ["report", "jobs", "--since", "2026-03-01", "--until", END],
            ["report", "cluster", "--since", "2026-03-01", "--until", END],
            ["warehouse", "sql", "SELECT count(*) FROM gpu_samples"],
            ["--config", str(every_job_kept(out.parent)), "trace", "export"]
            + ["--since", "2026-03-01", "--until", END, "--out", str(out), "--key-file", str(key)],
        )
    ]


def every_job_kept(directory: Path) -> Path:
    """A configuration whose k rule keeps each job of the small demo day (a release that keeps
    none is refused), readable by anyone."""
    config = directory / "k1.toml"
    config.write_text("[trace]\nk = 1\n")
    config.chmod(0o644)
    return config


def test_read_commands_on_a_read_only_mount(mounted: Path, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        (mounted / "probe").write_text("x")  # the mount really is read-only
    for argv in read_commands(mounted, tmp_path / "trace"):
        done = sing(*argv)
        assert done.returncode == 0, (argv, done.stderr)
        assert "Traceback" not in done.stderr
    assert (tmp_path / "trace" / "datapackage.json").is_file()
    assert data.connect(str(mounted)).execute("SELECT count(*) FROM jobs").fetchone()[0] > 0
    assert data.span(str(mounted)) is not None


def test_writer_on_a_read_only_mount_says_so(mounted: Path) -> None:
    done = sing("warehouse", "compact", "--warehouse", str(mounted))
    assert (done.returncode, "Traceback" in done.stderr) == (1, False)
    assert done.stderr.strip() == (
        f"sing: warehouse {mounted} is read-only here and this command writes to it; "
        "run it as a user who may write there, or on the host that owns it"
    )


@pytest.fixture
def shared(source: Path) -> Iterator[Path]:
    """A copy of `source` that other users can reach (pytest's own temporary directories are
    root's alone), owned by root, mode 755: readable, not writable, for them."""
    top = Path(tempfile.mkdtemp(prefix="sing-readonly-"))
    try:
        top.chmod(0o755)
        shutil.copytree(source, top / "wh")
        yield top / "wh"
    finally:
        shutil.rmtree(top)


def test_read_commands_as_a_user_who_may_only_read(shared: Path) -> None:
    """`nobody` reads root's warehouse and writes a trace into a directory of its own; the
    warehouse is left exactly as it was: no lock file, no repair, nothing."""
    out = shared.parent / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    commands = read_commands(shared, out / "trace")
    (shared / ".maintenance.lock").unlink()  # left by root's opening in `read_commands`
    before = sorted(p.relative_to(shared) for p in shared.rglob("*"))
    for argv in commands:
        done = sing_as_nobody(*argv)
        assert done.returncode == 0, (argv, done.stderr)
        assert "Traceback" not in done.stderr
    assert (out / "trace" / "datapackage.json").is_file()
    refused = sing_as_nobody("warehouse", "compact", "--warehouse", str(shared))
    assert refused.returncode == 1 and "is read-only here" in refused.stderr
    assert sorted(p.relative_to(shared) for p in shared.rglob("*")) == before
