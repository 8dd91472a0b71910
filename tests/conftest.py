"""Shared test set-up: Hypothesis profiles, and installing a job source as a site would.

Hypothesis profiles: "ci" (chosen when CI=true) derandomizes, so a CI run tries the same inputs
every time and a red run is reproducible; "dev" (otherwise) draws fresh inputs each run.
`SING_HYPOTHESIS_PROFILE` picks either explicitly. Neither has a deadline: a slow example on a
busy shared machine is not a bug. How many inputs each fuzz test tries is set in the test and
scaled by `SING_FUZZ_SCALE` (bench/bench_fuzz.py runs longer that way).

Hermetic environment: every `SING_*` variable of the caller's shell (SING_CONFIG, SING_WAREHOUSE,
SING_DASHBOARD_DEMO, ...) would steer the code under test, and every process a test starts, to
the caller's site; they are removed when this file is imported (before any project module reads
them, and before session fixtures start daemons). Kept are only the
suite's own knobs, which no product code reads (`TEST_KNOBS`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TEST_KNOBS = frozenset(
    {
        "SING_HYPOTHESIS_PROFILE",  # above
        "SING_FUZZ_SCALE",  # tests/fuzzing.py
        "SING_UPDATE_GOLDEN",  # tests/test_exporter_golden.py
        "SING_GPU_OUT",  # tests/test_exporter_gpu.py
        "SING_TEST_OUTPUT",  # tests/test_dashboards_browser.py
        "SING_TEST_ARTIFACTS",  # tests/test_demo_e2e.py
    }
)


def scrub_sing_variables() -> None:
    """Remove this process's `SING_*` variables, but for the suite's own knobs."""
    for name in [n for n in os.environ if n.startswith("SING_") and n not in TEST_KNOBS]:
        del os.environ[name]


scrub_sing_variables()

from tests.shared_data import under_ci  # noqa: E402 - after the scrub, like every project import

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("SING_HYPOTHESIS_PROFILE") or ("ci" if under_ci() else "dev"))


@pytest.fixture
def install_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Register `module:function` in the `sing.sources` entry point group the way installing a
    site's package does: a .dist-info with entry_points.txt on sys.path."""

    def install(value: str) -> None:
        site = tmp_path / "site-packages"
        info = site / "site_sources-1.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: site-sources\nVersion: 1.0\n")
        entries = info / "entry_points.txt"
        old = entries.read_text() if entries.exists() else "[sing.sources]\n"
        entries.write_text(old + f"source{old.count('=')} = {value}\n")
        monkeypatch.syspath_prepend(str(site))

    return install
