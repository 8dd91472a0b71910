"""Waste policies (admin): pending warnings, actions taken, messages and failures, per rule.

All of it is the policies' audit trail (`policy_events`): pending warnings as of the end of the
data, the rest over the chosen window. Times are the site's (`[policy] timezone`).
"""

import polars as pl
import streamlit as st

from sing.config import ConfigError
from sing.dashboards import policy_data
from sing.dashboards.policy_view import figures, local_time, site_zone
from sing.dashboards.widgets import JOB_COLUMNS, data_span, job_link_column, visit, window_picker
from sing.policy.settings import PolicySettings

v = visit()
span = data_span(v)
st.title("Waste policies")
try:
    zone = site_zone(v.config)
except ConfigError as err:
    st.error(str(err))
    st.stop()
settings = v.config.section("policy", PolicySettings)
st.caption(
    ("Dry run for every rule ([policy] dry_run = true): " if settings.dry_run else "")
    + "decisions are recorded either way; dry-run ones sent nothing and cancel nothing. "
    + f"Times in {zone.key}."
)


def in_site_time(*columns: str) -> list[pl.Expr]:
    return [pl.col(c).dt.convert_time_zone(zone.key) for c in columns]


MODE = pl.when(pl.col("dry_run")).then(pl.lit("dry run")).otherwise(pl.lit("real")).alias("mode")
COLUMNS = {**JOB_COLUMNS, "ts": "when", "warned_at": "warned at", "outcome": "what"}

pending = policy_data.pending_warnings(v.warehouse, span.last)
st.subheader("Pending warnings")
st.caption(
    f"Warned jobs whose deadline is after {local_time(span.last, zone)} (the end of the data) "
    "and that were neither cancelled, left alone nor recovered since; soonest deadline first."
)
st.dataframe(
    pending.select(
        job_link_column(),
        "cluster",
        "user",
        "rule",
        *in_site_time("warned_at", "deadline"),
        MODE,
        "seen",
        pl.col("evidence").map_elements(figures, return_dtype=pl.String).alias("figures"),
    ),
    hide_index=True,
    column_config=COLUMNS,
    key="pending",
)

since, until = window_picker(span, default_days=7)
trail = policy_data.trail(v.warehouse, since, until).with_columns(*in_site_time("ts"))
actions = trail.filter(pl.col("event") == "action")
messages = trail.filter(pl.col("event") == "message")
failures = trail.filter(~pl.col("ok"))
if pending.is_empty() and trail.is_empty():
    st.info(
        "No policy warned, messaged or acted in this window. Rules are set in [policy.rules] "
        "and evaluated by the collector or `sing policy run` (docs/policy.md)."
    )

a, b, c, d, e = st.columns(5)
a.metric("Pending warnings", f"{pending.height}")
b.metric("Jobs cancelled", f"{actions.filter(pl.col('outcome') == 'cancel', 'ok').height}")
c.metric("Left alone", f"{actions.filter(pl.col('outcome') == 'left_alone').height}")
d.metric("Messages", f"{messages.filter('ok').height}")
e.metric("Failures", f"{failures.height}")

st.subheader("Actions taken")
st.caption("Cancellations (by the executor named) and ladders ended by leaving the job alone.")
st.dataframe(
    actions.select(
        "ts",
        job_link_column(),
        "user",
        "rule",
        "outcome",
        MODE,
        "ok",
        "channel",
        "actor",
        "detail",
    ),
    hide_index=True,
    column_config={**COLUMNS, "channel": "executor"},
    key="actions",
)

st.subheader("Messages")
st.dataframe(
    messages.select(
        "ts", "outcome", job_link_column(), "user", "rule", MODE, "channel", "recipient", "ok"
    ),
    hide_index=True,
    column_config={**COLUMNS, "outcome": "kind"},
    key="messages",
)

st.subheader("Failures")
st.caption("Messages that did not go out and cancellations that did not happen (retried).")
st.dataframe(
    failures.select(
        "ts", "event", "outcome", job_link_column(), "user", "rule", "channel", "detail"
    ),
    hide_index=True,
    column_config=COLUMNS,
    key="failures",
)

st.subheader("Per rule")
st.caption("Jobs per rule in the window (each job once per column); failures count attempts.")
st.dataframe(
    policy_data.counts_per_rule(v.warehouse, since, until).with_columns(MODE).drop("dry_run"),
    hide_index=True,
    column_config={"left_alone": "left alone", "cancel": "cancelled", "notify": "notified"},
    key="per_rule",
)
