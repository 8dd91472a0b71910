"""The `[policy]` section: rules, their action ladders, and how messages reach people.

Dry run is the default twice over: nothing is sent or cancelled unless `[policy] dry_run` is
false *and* the rule itself says `dry_run = false`, so a site turns actions on rule by rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sing.collector.settings import CollectorSettings
from sing.config import Config, ConfigError
from sing.warehouse.coverage import DEFAULT_MIN_COVERAGE, CoverageNeeds


@dataclass(frozen=True)
class PolicySettings:
    dry_run: bool = True  # false: rules whose own dry_run is false act for real
    interval_s: float = 300.0  # the collector evaluates the rules this often; 0 = not at all
    max_data_age_s: float = 600.0  # a job whose least recently heard GPU is older waits
    # A verdict needs this share of the samples its allocated GPUs should have given over the
    # window ([collector] interval_s apart); under it the verdict is "incomplete" and waits.
    min_coverage: float = DEFAULT_MIN_COVERAGE
    # The circuit breaker (sing/policy/breaker.py): the cancel past this many real cancels within an
    # hour trips it; nothing is cancelled until `sing policy resume`.
    max_cancels_per_hour: int = 5
    # One table per rule, [policy.rules.NAME]; sing.policy.rules checks each against its schema.
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Messages.
    smtp_host: str = ""  # "" = no email
    smtp_port: int = 25
    smtp_starttls: bool = False
    smtp_username: str = ""
    smtp_password_file: str = ""
    mail_from: str = "sing@localhost"
    mail_domain: str = ""  # a user's address is USER@mail_domain; "" = no email to users
    admin_emails: list[str] = field(default_factory=list)  # copied on warnings and actions
    webhook_url: str = ""  # chat webhook (Slack/Mattermost-compatible JSON); "" = none
    templates_dir: str = ""  # overrides of the built-in message templates
    timezone: str = "UTC"  # of quiet_hours and weekly digests (an account month is UTC)
    quiet_hours: str = ""  # e.g. "22:00-07:00": messages wait until it ends; "" = none
    user_message_period_s: float = 86400.0  # at most one message per user per period (per rule)
    job_end_reports: bool = False  # send each finished job's report to its owner
    job_end_opt_out: list[str] = field(default_factory=list)  # users who want none
    weekly_digests: bool = False  # per user, Mondays
    monthly_account_digests: bool = False  # per account, to account_contacts
    account_contacts: dict[str, str] = field(default_factory=dict)  # account -> PI address

    def __post_init__(self) -> None:
        self.zone  # noqa: B018 - a zone that does not exist stops every command at config load
        if not 0.0 < self.min_coverage <= 1.0:
            raise ConfigError(
                f"[policy] min_coverage = {self.min_coverage!r}: a share of the expected samples, "
                "above 0 and at most 1 (e.g. 0.8)"
            )

    @property
    def sends_reports(self) -> bool:
        """Job-end reports or digests, which the policy round sends with or without rules."""
        return self.job_end_reports or self.weekly_digests or self.monthly_account_digests

    def has_work(self) -> bool:
        """Whether the collector has policy rounds to run: rules or reports, at an interval.
        Known before the engine is imported (it loads polars, 31 MB, which a collector without
        them never needs: bench/bench_collector.py)."""
        return self.interval_s > 0 and bool(self.rules or self.sends_reports)

    @property
    def zone(self) -> ZoneInfo:
        """The site's time zone (`timezone`), for quiet hours, digests and the pages."""
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as err:
            raise ConfigError(
                f"[policy] timezone = {self.timezone!r} is not a known time zone"
            ) from err


def site_coverage(config: Config) -> CoverageNeeds:
    """The site's sampling interval and coverage bar, from its config file. A `[policy]`
    section that does not load (a bad time zone) leaves the default bar: the figures still
    show, and the policy commands and pages name the error."""
    try:
        min_coverage = config.section("policy", PolicySettings).min_coverage
    except ConfigError:
        min_coverage = DEFAULT_MIN_COVERAGE
    return CoverageNeeds(config.section("collector", CollectorSettings).interval_s, min_coverage)
