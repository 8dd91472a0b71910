"""A missing shared data file skips a local run but fails a CI run (CI=true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared_data import require


def test_missing_shared_file_skips_locally_and_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "philly.csv"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="shared data file .*philly.csv is missing"):
        require(missing)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: missing shared data is a failure"):
        require(missing)


def test_present_shared_file_is_returned(tmp_path: Path) -> None:
    present = tmp_path / "philly.csv"
    present.write_text("timestamp\n")
    assert require(present) == present
