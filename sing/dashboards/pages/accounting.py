"""Accounting: GPU-hours, charge units, allocations, energy and carbon per account and month.

Admins see every account; a PI (`[roles] pis`) sees the accounts they answer for, with their
users; everybody else sees only their own use, per account they charged. The figures are those
of `sing report statement`, whose HTML an admin or PI can download here.
"""

from datetime import datetime

import polars as pl
import streamlit as st

from sing.accounting.settings import accounting_settings
from sing.accounting.statement import METHOD_NOTES, file_name, period_title, render_html
from sing.accounting.usage import method
from sing.dashboards import data
from sing.dashboards.access import ADMIN
from sing.dashboards.settings import RoleSettings
from sing.dashboards.widgets import data_span, visit

FIGURES = {
    "jobs": "jobs",
    "allocated_gpu_hours": st.column_config.NumberColumn("allocated GPU-h", format="%.1f"),
    "used_gpu_hours": st.column_config.NumberColumn("used GPU-h", format="%.1f"),
    "idle_gpu_hours": st.column_config.NumberColumn("idle GPU-h", format="%.1f"),
    "charge_units": st.column_config.NumberColumn("charge units", format="%.1f"),
    "allocation_units": st.column_config.NumberColumn("allocation units", format="%.1f"),
    "remaining_units": st.column_config.NumberColumn("balance units", format="%.1f"),
    "energy_kwh": st.column_config.NumberColumn("energy kWh", format="%.2f"),
    "carbon_kg": st.column_config.NumberColumn("carbon kg CO2e", format="%.2f"),
}


def months(first: datetime, last: datetime) -> list[str]:
    """The months the data covers, newest first, as periods ("2026-11")."""
    span = (last.year - first.year) * 12 + last.month - first.month
    numbers = (first.year * 12 + first.month - 1 + k for k in range(span, -1, -1))
    return [f"{n // 12:04d}-{n % 12 + 1:02d}" for n in numbers]


def figure(value: float | None, unit: str, digits: int = 1) -> str:
    return "unknown" if value is None else f"{value:,.{digits}f} {unit}"


def table(rows: list[dict], first: str) -> None:
    """Rows of usage figures, `first` (account or user) leading."""
    frame = pl.DataFrame(rows, infer_schema_length=None)
    shown = [first, *(c for c in FIGURES if c in frame.columns)]
    st.dataframe(frame.select(shown), hide_index=True, column_config=FIGURES)


v = visit()
span = data_span(v)
roles = v.config.section("roles", RoleSettings)
settings = accounting_settings(v.config)
st.title("Accounting")
period = st.selectbox(
    "Month", months(span.first, span.last), format_func=period_title, key="period"
)
with st.spinner("Adding up the month..."):
    found = {s.account: s for s in data.statements(v.warehouse, period, settings, span.last)}

me = v.viewer.name
led = sorted(found) if v.viewer.role == ADMIN else roles.accounts_led_by(me)
visible = [account for account in led if account in found]

if v.viewer.role == ADMIN:
    st.subheader("All accounts")
    if not found:
        st.info(f"No account used GPUs in {period_title(period)}.")
    else:
        table([s.total for s in found.values()], "account")

if visible:
    account = st.selectbox("Account", visible, key="account")
    s = found[account]
    total = s.total
    a, b, c, d = st.columns(4)
    a.metric("GPU-hours allocated", figure(total["allocated_gpu_hours"], "h"))
    b.metric("GPU-hours used", figure(total["used_gpu_hours"], "h"))
    c.metric("GPU-hours idle", figure(total["idle_gpu_hours"], "h"))
    d.metric("Charge units", figure(total["charge_units"], "units"))
    a, b, c, d = st.columns(4)
    a.metric("Allocation", figure(total.get("allocation_units"), "units"))
    b.metric("Balance", figure(total.get("remaining_units"), "units"))
    c.metric("Energy", figure(total["energy_kwh"], "kWh", 2))
    d.metric("Carbon", figure(total["carbon_kg"], "kg CO2e", 2))
    if s.overdrawn:
        st.error("This account has used more charge units than its allocation for the month.")
    st.subheader(f"Users of {account}")
    table(s.users, "user")
    st.download_button(
        "Statement (HTML)",
        render_html(s, v.config.site.cluster),
        file_name=file_name(account, period),
        mime="text/html",
        key="statement",
    )
elif v.viewer.role != ADMIN and led:
    st.info(f"None of your accounts ({', '.join(led)}) used GPUs in {period_title(period)}.")

if v.viewer.role != ADMIN:
    own = [{"account": s.account, **u} for s in found.values() for u in s.users if u["user"] == me]
    st.subheader("Your use")
    if own:
        table(own, "account")
    else:
        st.info(f"You used no GPUs in {period_title(period)}.")

with st.expander("How the figures are made"):
    for key, text in method(settings).items():
        st.text(f"{METHOD_NOTES.get(key, key)}: {text}")
