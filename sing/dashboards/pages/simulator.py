"""Simulator: replay a window of jobs under each scheduling policy and compare what they did."""

from datetime import UTC, datetime
from pathlib import Path

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data
from sing.dashboards.settings import DashboardSettings
from sing.dashboards.widgets import data_span, percent, visit, window_picker
from sing.scheduler.settings import POLICIES, SchedulerSettings

# The busy Philly week on which docs/scheduler.md measures the paper's gap, and its cluster.
BUSY_PHILLY_WEEK_END = datetime(2017, 10, 23, tzinfo=UTC)  # its last day
BUSY_PHILLY_NODES = 28

v = visit()
settings = v.config.section("scheduler", SchedulerSettings)
files = [
    str(v.config.resolve_path(f))
    for f in v.config.section("dashboard", DashboardSettings).trace_files
    if v.config.resolve_path(f).is_file()
]
st.title("Scheduling policies, side by side")
st.caption(
    "Replays the jobs submitted in the window through the same scheduler a live dispatcher uses "
    "(docs/scheduler.md), once per policy. The SING paper reports ~96% GPU assignment with "
    "backfill against ~75% under FCFS on its campus cluster; on Philly's busy week of "
    "2017-10-17 on 28 x 8 GPUs (the default for a trace file) sing keeps ~96% assigned against "
    "FCFS's 78%. Jain fairness: 1 when every user is served the same share of the GPU-time they "
    "asked for."
)
source = st.radio(
    "Jobs",
    [data.WAREHOUSE_SOURCE, *files],
    format_func=lambda s: "this cluster's jobs" if s == data.WAREHOUSE_SOURCE else Path(s).name,
    horizontal=True,
    key="source",
)
if source == data.WAREHOUSE_SOURCE:
    span = data_span(v)
    nodes_default, gpus_default = data.capacity(v.warehouse)
    gpus_per_node_default = max(1, gpus_default // max(1, nodes_default))
    since, until = window_picker(span, default_days=7)
else:
    span = data.trace_file_span(source)
    nodes_default, gpus_per_node_default = BUSY_PHILLY_NODES, 8
    since, until = window_picker(span, default_days=7, default_end=BUSY_PHILLY_WEEK_END)

a, b, c = st.columns([1, 1, 2])
nodes = a.number_input("Nodes", 1, 10_000, nodes_default, key="nodes")
gpus_per_node = b.number_input("GPUs per node", 1, 64, gpus_per_node_default, key="gpus")
policies = c.multiselect("Policies", POLICIES, default=list(POLICIES), key="policies")

if not policies:
    st.info("Pick at least one policy.")
    st.stop()
with st.spinner(f"Replaying under {len(policies)} policies..."):
    try:
        runs = data.compare_policies(
            v.warehouse, source, since, until, nodes, gpus_per_node, tuple(policies), settings
        )
    except ValueError as err:  # a job larger than the simulated cluster
        st.error(f"Cannot replay on {nodes} x {gpus_per_node} GPUs: {err}")
        st.stop()
if runs.is_empty():
    st.info("No finished job was submitted in this window.")
    st.stop()

st.caption(f"{runs['jobs'][0]:,} jobs replayed on {nodes * gpus_per_node:,} GPUs.")
cols = st.columns(len(runs))
for col, row in zip(cols, runs.iter_rows(named=True), strict=True):
    col.metric(f"{row['policy']}: GPUs assigned", percent(row["gpu_assignment"]))
    col.metric(f"{row['policy']}: mean wait", f"{row['mean_wait_s'] / 3600:.2f} h")

hours = runs.select(
    "policy",
    *(
        (pl.col(c) / 3600).alias(c.removesuffix("_s"))
        for c in ("mean_wait_s", "p95_wait_s", "max_wait_s")
    ),
).unpivot(index="policy", variable_name="statistic", value_name="hours")
st.altair_chart(
    alt.Chart(hours)
    .mark_bar()
    .encode(
        x=alt.X("policy:N", title=None),
        xOffset="statistic:N",
        y=alt.Y("hours:Q", title="queueing delay (h)"),
        color=alt.Color("statistic:N", title=None),
        tooltip=["policy", "statistic", alt.Tooltip("hours:Q", format=".2f")],
    )
)
st.dataframe(
    runs,
    hide_index=True,
    column_config={
        c: st.column_config.NumberColumn(c.replace("_", " "), format="percent")
        for c in runs.columns
        if "assignment" in c
    },
)
