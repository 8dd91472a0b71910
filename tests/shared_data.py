"""Where the read-only public trace data lies: ../shared/traces beside the checkout (CI too).

A test that needs a file calls `require(path)`: run locally without the data it is skipped,
with the reason; under CI (`CI=true`) a missing file fails the run, so a CI without the data
cannot pass green.
"""

import os
from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
PHILLY = SHARED_TRACES / "philly" / "philly_pollux_jobs.csv"


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(path: Path) -> Path:
    """`path` when the shared file is there; else a skip (locally) or a failure (under CI)."""
    if path.is_file():
        return path
    reason = f"shared data file {path} is missing (../shared beside the checkout)"
    if under_ci():
        pytest.fail(f"{reason}; CI=true: missing shared data is a failure", pytrace=False)
    pytest.skip(reason)
