"""Monthly statements: one HTML page per account that its PI can read without sing.

A statement is the account's line of `sing.accounting.usage` for a period (GPU-hours allocated,
used and idle, charge units, the allocation and what is left of it, energy, carbon), the same
figures for each of its users, and the method notes that say what every figure includes. The
figures are formatted by the columns of `sing.tables`, so a statement rounds and names units as
the terminal reports do. The page is rendered by Jinja2 with autoescaping: account and user
names come from the scheduler and are never trusted as HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import jinja2

from sing.accounting.periods import period_window
from sing.accounting.settings import AccountingSettings
from sing.accounting.usage import method, usage
from sing.errors import UserError
from sing.tables import Column, cell

# The account's figures, top to bottom; the users' table shows the ones marked `per_user`.
SUMMARY = (
    Column("jobs", "Jobs"),
    Column("allocated_gpu_hours", "GPU-hours allocated", digits=1),
    Column("used_gpu_hours", "GPU-hours used (allocated × utilisation)", digits=1),
    Column("idle_gpu_hours", "GPU-hours idle", digits=1),
    Column("unmeasured_gpu_hours", "GPU-hours without samples", digits=1),
    Column("charge_units", "Charge units", digits=1),
    Column("allocation_units", "Allocation (charge units)", digits=1, missing="none configured"),
    Column("remaining_units", "Allocation balance (charge units)", digits=1, missing="n/a"),
    Column("energy_kwh", "Energy (kWh)", digits=2),
    Column("carbon_kg", "Carbon (kg CO2e)", digits=2),
    Column("mean_wait_s", "Mean wait before start (h)", digits=2, per=3600, missing="n/a"),
)
USERS = (
    Column("user", "User"),
    Column("jobs", "Jobs"),
    Column("allocated_gpu_hours", "Allocated GPU-h", digits=1),
    Column("used_gpu_hours", "Used GPU-h", digits=1),
    Column("idle_gpu_hours", "Idle GPU-h", digits=1),
    Column("charge_units", "Charge units", digits=1),
    Column("energy_kwh", "Energy kWh", digits=2),
    Column("carbon_kg", "Carbon kg CO2e", digits=2),
)
METHOD_NOTES = {
    "window": "Period",
    "allocated": "Allocated",
    "used_idle": "Used and idle",
    "charge": "Charge units",
    "energy": "Energy",
    "carbon": "Carbon",
    "model": "GPU model",
}
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("sing.accounting", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,  # a misspelt field fails the test, not the page
)


@dataclass(frozen=True)
class Statement:
    """What one account's statement shows: its line of usage, its users' lines, the method."""

    account: str
    period: str
    since: datetime
    until: datetime
    now: datetime
    total: dict
    users: list[dict]
    method: dict[str, str]

    @property
    def overdrawn(self) -> bool:
        return (self.total.get("remaining_units") or 0) < 0


def statements(
    con: duckdb.DuckDBPyConnection,
    period: str,
    settings: AccountingSettings,
    accounts: list[str] | None = None,
    now: datetime | None = None,
    cluster: str | None = None,
) -> list[Statement]:
    """The statements of `accounts` (None: every account with jobs or an allocation in the
    period; jobs without an account have nobody to send a statement to). Two usage queries
    serve them all (by account; by account and user), so a month of every account stays fast."""
    since, until = period_window(period, "--period")
    window = {"since": since, "until": until, "settings": settings, "now": now or datetime.now(UTC)}
    totals = usage(con, "account", **window, cluster=cluster)
    by_account = {row["account"]: row for row in totals.to_dicts()}
    per_user = usage(con, ("account", "user"), **window, cluster=cluster).to_dicts()
    wanted = accounts if accounts is not None else sorted(a for a in by_account if a is not None)
    missing = [a for a in wanted if a not in by_account]
    if missing:
        known = ", ".join(sorted(a for a in by_account if a is not None)) or "none"
        raise UserError(
            f"no jobs and no allocation of account {', '.join(missing)} in {period} "
            f"(accounts then: {known})"
        )
    notes = method(settings)
    return [
        Statement(
            account=account,
            period=period,
            since=since,
            until=until,
            now=window["now"],
            total=by_account[account],
            users=[row for row in per_user if row["account"] == account],
            method=notes,
        )
        for account in wanted
    ]


def render_html(statement: Statement, site: str) -> str:
    """The statement as a self-contained HTML page."""
    return TEMPLATES.get_template("statement.html").render(
        s=statement,
        site=site,
        title=period_title(statement.period),
        summary=[(c.key, c.heading, cell(statement.total.get(c.key), c)) for c in SUMMARY],
        user_headings=[c.heading for c in USERS],
        user_rows=[[cell(u.get(c.key), c) for c in USERS] for u in statement.users],
        notes=[(METHOD_NOTES.get(k, k), text) for k, text in statement.method.items()],
    )


def period_title(period: str) -> str:
    """'2026-11' as 'November 2026'; other periods as written."""
    if re.fullmatch(r"\d{4}-\d{2}", period):
        return period_window(period)[0].strftime("%B %Y")
    return period


def file_name(account: str, period: str) -> str:
    """A file name for an account's statement: scheduler names may hold any character, so
    everything but letters, digits, dot, dash and underscore becomes '_'."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(account)).lstrip(".") or "_"
    return f"{safe}-{period}.html"


def write_all(found: list[Statement], directory: Path, site: str) -> list[Path]:
    """Every statement into `directory`, one file per account; two accounts whose names make the
    same file name are refused rather than one overwriting the other."""
    names = [file_name(s.account, s.period) for s in found]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise UserError(f"accounts whose statements would share a file name: {', '.join(clashes)}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{directory}: {err.strerror}") from err
    paths = [directory / name for name in names]
    for statement, path in zip(found, paths, strict=True):
        write(statement, path, site)
    return paths


def write(statement: Statement, path: Path, site: str) -> None:
    try:
        path.write_text(render_html(statement, site), encoding="utf-8")
    except OSError as err:
        raise UserError(f"{path}: {err.strerror}") from err
