"""The compiled build (`make native`, sing/scheduler/native.py) does exactly what the sources do.

A build is made from this checkout into a temporary directory (installing a C compiler and the
Python headers with apt as root under CI, as tests/debian.py does for every real component). Then:
the scheduler's own tests run again on the build, in a fresh interpreter that checks it really runs
compiled code; 20,000 Philly jobs replayed on a mixed cluster with shares and model constraints
start at the same times on the same GPUs under every policy, compiled and pure; and a build whose
fingerprint does not match the sources, or SING_NATIVE=0, leaves the sources in charge.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.debian import ensure_packages
from tests.shared_data import PHILLY, require

ROOT = Path(__file__).resolve().parents[1]

# The scheduler tests that hold known answers and properties; run again on the compiled build.
SCHEDULER_TESTS = [
    "tests/test_scheduler_regression.py",
    "tests/test_scheduler_policies.py",
    "tests/test_scheduler_mixed.py",
    "tests/test_scheduler_properties.py",
    "tests/test_scheduler_lane.py",
]

# Replays every policy on the benchmark's mixed cluster and prints starts and placements as JSON,
# with whether the compiled build ran them.
REPLAY = """
import json, sys
sys.path.insert(0, "bench")
from sing import scheduler
from bench_scheduler import MIXED, mixed_workload
from sing.scheduler.settings import POLICIES, SchedulerSettings
from sing.scheduler.simulate import fitting, make_cluster, replay
from sing.scheduler.workload import read_trace

settings = SchedulerSettings()
jobs = read_trace(sys.argv[1]).sorted_by_submit().select(list(range(20_000)))
jobs, _ = fitting(mixed_workload(jobs), make_cluster(MIXED, 0, settings), settings)
runs = {p: replay(jobs, MIXED, 0, settings, p) for p in POLICIES}
print(json.dumps({
    "native": scheduler.NATIVE,
    "runs": {p: [r.start, [r.placement(k) for k in range(len(jobs))]] for p, r in runs.items()},
}))
"""


def _python(env_native: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "SING_NATIVE": env_native},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled build of this checkout's sources."""
    if shutil.which("cc") is None:
        ensure_packages("gcc", "libc6-dev")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        ensure_packages("python3-dev")
    out = tmp_path_factory.mktemp("native")
    made = _python("0", "-m", "sing.scheduler.native", "build", "--out", str(out))
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return out


def test_the_scheduler_tests_pass_on_the_compiled_build(build: Path) -> None:
    run = _python(
        str(build),
        "-c",
        "import sys, pytest; from sing import scheduler; "
        "assert scheduler.NATIVE, 'the build was not used'; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))",
        *SCHEDULER_TESTS,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


def test_compiled_and_pure_replays_start_the_same_jobs_on_the_same_gpus(build: Path) -> None:
    trace = str(require(PHILLY))
    compiled, pure = (_python(native, "-c", REPLAY, trace) for native in (str(build), "0"))
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert pure.returncode == 0, pure.stderr[-3000:]
    compiled_out, pure_out = json.loads(compiled.stdout), json.loads(pure.stdout)
    assert compiled_out["native"] and not pure_out["native"]
    for policy, (starts, placements) in pure_out["runs"].items():
        other_starts, other_placements = compiled_out["runs"][policy]
        assert other_starts == starts, policy
        assert other_placements == placements, policy
        assert len(set(starts)) > 1000  # a real replay, not an empty one


def test_a_stale_build_or_sing_native_0_leaves_the_sources_in_charge(
    build: Path, tmp_path: Path
) -> None:
    probe = (
        "import sing.scheduler.core as c; from sing import scheduler; "
        "print(scheduler.NATIVE, c.__file__)"
    )
    current = _python(str(build), "-c", probe)
    assert current.stdout.startswith("True ") and not current.stdout.strip().endswith(".py")
    off = _python("0", "-c", probe)
    assert off.stdout.startswith("False ") and off.stdout.strip().endswith("core.py")
    stale = tmp_path / "stale"
    shutil.copytree(build, stale)
    (stale / "FINGERPRINT").write_text("0" * 64 + "\n")  # as if built from other sources
    outdated = _python(str(stale), "-c", probe)
    assert outdated.stdout.startswith("False ") and outdated.stdout.strip().endswith("core.py")
