"""Fairness: GPU-hours per user against an equal share, Jain's index over time, queueing delay."""

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data
from sing.dashboards.access import user_labels
from sing.dashboards.widgets import data_span, percent, visit, window_picker

v = visit()
span = data_span(v)
st.title("Fairness")
left, right = st.columns([3, 1])
with left:
    since, until = window_picker(span, default_days=30)
with right:
    bucket = st.selectbox("Jain's index per", ("day", "week"), key="bucket")

with st.spinner("Computing shares..."):
    users, jain = data.fairness(v.warehouse, since, until)
    over_time = data.jain_over_time(v.warehouse, since, until, bucket)

if users.is_empty():
    st.info("No job ran in this window.")
    st.stop()
users = users.with_columns(who=pl.Series(user_labels(users["user"].to_list(), v.viewer))).drop(
    "user"
)

a, b, c = st.columns(3)
a.metric("Jain's index (GPU-hours per user)", f"{jain:.2f}")
b.metric("Active users", f"{users.height}")
c.metric("Top user's share", percent(users["share"].max()))  # None: no GPU-hours at all
st.caption("Jain's index is 1 when every active user got the same GPU-hours, 1/n when one got all.")

st.subheader("Share of GPU-hours vs an equal share")
share = alt.Chart(users).encode(y=alt.Y("who:N", sort="-x", title=None))
st.altair_chart(
    share.mark_bar().encode(
        x=alt.X("share:Q", title="share of GPU-hours", axis=alt.Axis(format="%")),
        tooltip=[
            "who",
            "jobs",
            alt.Tooltip("gpu_hours:Q", format=",.0f"),
            alt.Tooltip("share:Q", format=".1%"),
        ],
    )
    + share.mark_tick(color="red", thickness=2).encode(x="equal_share:Q")
)
st.caption("Red ticks: the equal share (1 / active users).")

st.subheader("Jain's index over time")
st.altair_chart(
    alt.Chart(over_time)
    .mark_line(point=True)
    .encode(
        x=alt.X("bucket:T", title=None),
        y=alt.Y("jain:Q", title="Jain's index", scale=alt.Scale(domain=[0, 1])),
        tooltip=["bucket:T", alt.Tooltip("jain:Q", format=".2f"), "users"],
    )
)

st.subheader("Queueing delay by user")
delays = users.select("who", mean=pl.col("mean_queue_h"), p95=pl.col("p95_queue_h")).unpivot(
    index="who", variable_name="statistic", value_name="hours"
)
st.altair_chart(
    alt.Chart(delays)
    .mark_bar()
    .encode(
        x=alt.X("hours:Q", title="hours from submit to start"),
        y=alt.Y("who:N", title=None),
        yOffset="statistic:N",
        color=alt.Color("statistic:N", title=None),
        tooltip=["who", "statistic", alt.Tooltip("hours:Q", format=".2f")],
    )
)
st.dataframe(
    users.select("who", "jobs", "gpu_hours", "share", "equal_share", "mean_queue_h", "p95_queue_h"),
    hide_index=True,
    column_config={
        "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.0f"),
        "share": st.column_config.NumberColumn(format="percent"),
        "equal_share": st.column_config.NumberColumn("equal share", format="percent"),
        "mean_queue_h": st.column_config.NumberColumn("mean queue h", format="%.2f"),
        "p95_queue_h": st.column_config.NumberColumn("p95 queue h", format="%.2f"),
    },
)
