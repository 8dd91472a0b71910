"""Idle jobs (admin): jobs holding GPUs they barely use, multi-node first, by wasted GPU-hours."""

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data
from sing.dashboards.widgets import (
    JOB_COLUMNS,
    data_span,
    hours,
    job_link_column,
    visit,
    window_picker,
)

v = visit()
span = data_span(v)
thresholds = v.config.thresholds
st.title("Idle jobs")
st.caption(
    "Jobs whose GPUs stayed under the utilization threshold, multi-node jobs first (they block "
    "the most), each group ranked by wasted GPU-hours (allocated GPU-hours x unused share)."
)
left, mid, right = st.columns([2, 1, 1])
with left:
    since, until = window_picker(span, default_days=7)
with mid:
    util_below = st.slider(
        "Mean GPU utilization under", 0.0, 0.5, float(thresholds.idle_util), 0.01, key="util"
    )
with right:
    running = st.toggle("Only jobs running now", key="running")

with st.spinner("Finding idle jobs..."):
    jobs = data.idle_jobs(v.warehouse, since, until, util_below, thresholds, running)
# Stable: equal waste keeps the report's order (lowest numeric job id first).
jobs = jobs.sort(
    [pl.col("num_nodes") > 1, "wasted_gpu_hours"], descending=True, maintain_order=True
)

multi = jobs.filter(pl.col("num_nodes") > 1)
a, b, c = st.columns(3)
a.metric("Idle jobs", f"{jobs.height}")
b.metric("Of them multi-node", f"{multi.height}")
c.metric("Wasted GPU-hours", hours(jobs["wasted_gpu_hours"].sum()))
st.caption(f"Jobs shorter than {thresholds.idle_job_min_hours:g} h are not listed.")

table = jobs.select(
    job_link_column(),
    "user",
    "num_nodes",
    "num_gpus",
    "state",
    (pl.col("run_s") / 3600).alias("hours"),
    "mean_util",
    "wasted_gpu_hours",
    (pl.col("rdma_bytes_per_node_hour") / 1e9).alias("rdma_gb_per_node_hour"),
    "start_time",
)
st.dataframe(
    table,
    hide_index=True,
    column_config=JOB_COLUMNS,
)

if jobs.height:
    st.subheader("Wasted GPU-hours by user")
    per_user = jobs.group_by("user").agg(pl.col("wasted_gpu_hours").sum())
    st.altair_chart(
        alt.Chart(per_user)
        .mark_bar()
        .encode(
            x=alt.X("wasted_gpu_hours:Q", title="wasted GPU-hours"),
            y=alt.Y("user:N", sort="-x", title=None),
            tooltip=["user", alt.Tooltip("wasted_gpu_hours:Q", format=".1f")],
        )
    )
