"""ASCII digits only (issue 27, item 7.4). `str.isdigit()` also takes "٧٩" (Arabic-Indic) or
"７９" (fullwidth): a drain limit keyed so looks set and never matches a reading's `xid_79`, so
it is off; a superscript "²" passes and then makes `int()` fail with a traceback. Every check
of outside text goes through `sing.digits.ascii_digits`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sing.cli.simulate import when
from sing.config import Config, ConfigError
from sing.errors import UserError
from sing.health.settings import HealthSettings
from sing.times import parse_time_or_ago
from sing.warehouse.legacy import DataFile

NOT_ASCII = ["٧٩", "７９", "৭৯", "²"]


@pytest.mark.parametrize("code", NOT_ASCII)
def test_a_drain_xid_key_in_other_digits_is_refused_by_name(tmp_path: Path, code: str) -> None:
    file = tmp_path / "sing.toml"
    file.write_text(f'[health]\ndrain_xid = {{"{code}" = 1}}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=f"drain_xid: '{code}' = 1"):
        Config.load(file).section("health", HealthSettings)
    with pytest.raises(ConfigError, match="drain_xid"):
        HealthSettings(drain_xid={"79": 1, code: 1})
    assert HealthSettings(drain_xid={"79": 1}).drain_xid == {"79": 1}


@pytest.mark.parametrize("count", ["٢٤", "２４", "²"])
def test_policy_since_takes_ascii_counts_only(count: str) -> None:
    """'٢٤h' was read as 24 hours, '²h' was a ValueError traceback: both are user errors now."""
    now = datetime(2026, 1, 5, tzinfo=UTC)
    assert parse_time_or_ago("24h", "--since", now) == datetime(2026, 1, 4, tzinfo=UTC)
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time_or_ago(f"{count}h", "--since", now)


@pytest.mark.parametrize("seconds", ["٣", "３.5", "²"])
def test_simulate_times_take_ascii_seconds_only(seconds: str) -> None:
    """`<seconds>s` from the trace start: other digits are not seconds (and need no trace)."""
    with pytest.raises(UserError, match="neither an ISO 8601 time"):
        when(f"{seconds}s", "--from", trace=None)


def test_legacy_file_names_need_ascii_numbers() -> None:
    assert DataFile.parse(Path("1-2-abc.parquet")) is not None
    assert DataFile.parse(Path("١-٢-abc.parquet")) is None
