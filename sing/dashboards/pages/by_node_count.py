"""By node count: the SING paper's figure, GPU utilization by job node count, GPU-hour weighted."""

import altair as alt
import streamlit as st

from sing.dashboards import data
from sing.dashboards.widgets import data_span, hours, percent, visit, window_picker

ALL = "all partitions"

v = visit()
span = data_span(v)
st.title("GPU utilization by job node count")
left, right = st.columns([3, 1])
with left:
    since, until = window_picker(span, default_days=30)
with right:
    partition = st.selectbox("Partition", [ALL, *data.partitions(v.warehouse)], key="partition")

with st.spinner("Computing per-job utilization..."):
    table = data.by_node_count(v.warehouse, since, until, None if partition == ALL else partition)

if table.is_empty():
    st.info("No job with GPU samples in this window.")
    st.stop()

cols = st.columns(min(len(table), 6))
for col, row in zip(cols, table.iter_rows(named=True), strict=False):
    # weighted_util is None for a group without GPU-hours (jobs that held no GPU time).
    col.metric(
        f"{row['nodes']} node{'s' if row['nodes'] > 1 else ''}", percent(row["weighted_util"])
    )
st.caption(
    "GPU-hour-weighted mean utilization of the jobs in each group (node counts rounded up to a "
    "power of two). The SING paper measured ~25% for 8-node jobs on its campus cluster."
)

base = alt.Chart(table).encode(x=alt.X("nodes:O", title="nodes per job"))
bars = base.mark_bar(opacity=0.7).encode(
    y=alt.Y(
        "weighted_util:Q",
        title="GPU utilization",
        axis=alt.Axis(format="%"),
        scale=alt.Scale(domain=[0, 1]),
    ),
    tooltip=[
        "nodes",
        "jobs",
        alt.Tooltip("gpu_hours:Q", format=",.0f"),
        alt.Tooltip("weighted_util:Q", format=".1%"),
        alt.Tooltip("p10_util:Q", format=".1%"),
        alt.Tooltip("p50_util:Q", format=".1%"),
        alt.Tooltip("p90_util:Q", format=".1%"),
    ],
)
spread = base.mark_rule(strokeWidth=2).encode(y="p10_util:Q", y2="p90_util:Q")
median = base.mark_tick(thickness=3, size=24, color="black").encode(y="p50_util:Q")
st.altair_chart(bars + spread + median)
st.caption("Bars: GPU-hour-weighted mean; lines: 10th to 90th percentile of jobs; ticks: median.")

st.dataframe(
    table,
    hide_index=True,
    column_config={
        "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.0f"),
        "idle_gpu_hours": st.column_config.NumberColumn("idle GPU-hours", format="%.0f"),
        **{
            c: st.column_config.NumberColumn(c.replace("_", " "), format="percent")
            for c in ("weighted_util", "mean_job_util", "p10_util", "p50_util", "p90_util")
        },
    },
)
st.caption(f"{hours(table['gpu_hours'].sum())} of GPU time in {table['jobs'].sum()} jobs.")
