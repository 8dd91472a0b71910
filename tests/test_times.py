"""One reading of times (issue 30 item 3): ISO 8601, naive = UTC, in every command. `sing
policy digest --now` read a naive time as the machine's local zone."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta, timezone

import pytest

from sing.cli import build_parser
from sing.times import parse_time, time_option

NAIVE = "2026-11-30T20:00"
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
        ("2026-11-01T12:30", datetime(2026, 11, 1, 12, 30, tzinfo=UTC)),
        ("2026-11-01T12:30Z", datetime(2026, 11, 1, 12, 30, tzinfo=UTC)),
        (" 2026-11-01T12:30+01:00", datetime(2026, 11, 1, 12, 30, tzinfo=timezone(HOUR))),
    ],
)  # fmt: skip
def test_iso_times_are_utc_unless_they_say(text: str, want: datetime) -> None:
    assert parse_time(text) == want and parse_time(text).tzinfo is not None


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "", "1700000000"])
def test_a_bad_time_says_what_works(text: str) -> None:
    with pytest.raises(ValueError, match="is not an ISO 8601 time"):
        parse_time(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 2026-11-01"):
        time_option(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["policy", "digest", "--monthly", "--now", NAIVE],
        ["report", "usage", "--now", NAIVE],
        ["health", "report", "--now", NAIVE],
        ["jobs", "list", "--since", NAIVE],
        ["trace", "export", "--since", NAIVE, "--until", NAIVE, "--out", "x"],
    ],
)
def test_every_command_reads_a_naive_time_as_utc(argv: list[str]) -> None:
    """`sing policy digest --now` took a naive time as the machine's local zone, so a site
    east or west of UTC got another month's digest than `--now` said."""
    args = build_parser(argv[0]).parse_args(argv)
    option = "now" if "--now" in argv else "since"
    assert getattr(args, option) == datetime(2026, 11, 30, 20, 0, tzinfo=UTC)


@pytest.mark.parametrize("argv", [["jobs", "list"], ["policy", "log"], ["incident", "list"]])
def test_people_may_give_a_time_ago_to_any_since(argv: list[str]) -> None:
    """`sing jobs list --since 1h` was refused while `sing policy log --since 24h` worked (the
    first-hour walk of issue 29 tried both)."""
    before = datetime.now(UTC)
    since = build_parser(argv[0]).parse_args([*argv, "--since", "90m"]).since
    assert before - timedelta(minutes=90, seconds=5) < since <= datetime.now(UTC) - HOUR


def test_files_may_not_give_a_time_ago() -> None:
    """A trace's release_start of "7d" would move with the day it is read."""
    with pytest.raises(ValueError, match="is not an ISO 8601 time"):
        parse_time("7d")
