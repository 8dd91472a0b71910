"""Cluster: GPUs assigned vs used over time, the assignment rate, and who holds what right now."""

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data
from sing.dashboards.access import RESEARCHER, holder_label
from sing.dashboards.widgets import data_span, percent, visit, window_picker

v = visit()
span = data_span(v)
st.title("Cluster")
left, right = st.columns([3, 1])
with left:
    since, until = window_picker(span)
with right:
    days = (until - since).total_seconds() / 86_400
    bucket = st.selectbox(
        "Resolution", ("hour", "day", "week"), index=0 if days <= 14 else 1, key="bucket"
    )

with st.spinner("Loading cluster usage..."):
    overview = data.cluster_overview(v.warehouse, since, until, bucket, span.last)
usage, by_nodes, grid = overview.usage, overview.by_nodes, overview.grid
nodes, gpus = overview.nodes, overview.gpus

# Rates only over buckets whose capacity and allocations are both known: an unknown bucket is
# left out and said, never counted as empty or full.
known = usage.filter(
    pl.col("capacity_gpu_hours").is_not_null() & pl.col("allocated_gpu_hours").is_not_null()
)
allocated = known["allocated_gpu_hours"].sum()
capacity = known["capacity_gpu_hours"].sum()
# Utilisation only over buckets that have samples: a bucket without any is unknown, not idle.
measured = known.filter(pl.col("util").is_not_null())
used = (measured["util"] * measured["capacity_gpu_hours"]).sum()
measured_capacity = measured["capacity_gpu_hours"].sum()
measured_allocated = measured["allocated_gpu_hours"].sum()
eight = by_nodes.filter(pl.col("nodes") == 8)["weighted_util"]
a, b, c, d = st.columns(4)
a.metric("GPU assignment rate", percent(allocated / capacity) if capacity else "unknown")
b.metric(
    "GPU utilization (all GPUs)",
    percent(used / measured_capacity) if measured_capacity else "unknown",
)
c.metric(
    "Utilization of assigned GPUs",
    percent(used / measured_allocated) if measured_allocated else "unknown",
)
d.metric("8-node jobs' utilization", percent(eight[0] if len(eight) else None))
unknown = usage.height - known.height
if unknown:
    st.warning(
        f"Capacity or allocations unknown for {unknown} of {usage.height} {bucket}s: no node "
        "inventory covers them, or the warehouse has no job records. Those are left out of the "
        "rates above and show as gaps below.",
        icon=":material/help:",
    )
inventory = f"{nodes} nodes, {gpus} GPUs" if gpus else "No node inventory (capacity unknown)"
st.caption(
    f"{inventory}. For comparison, the SING paper (ASPLOS 2025) measured ~96% GPU "
    "assignment with backfill against ~75% under plain FCFS, and ~25% utilization for 8-node "
    "jobs: being assigned is not being used."
)

st.subheader("GPUs assigned vs used")
per_hour = 1 / pl.col("bucket_hours")  # GPU-hours of a bucket -> GPUs on average over it
series = usage.select(
    "bucket",
    capacity=pl.col("capacity_gpu_hours") * per_hour,
    assigned=pl.col("allocated_gpu_hours") * per_hour,
    used=pl.col("util") * pl.col("capacity_gpu_hours") * per_hour,
).unpivot(index="bucket", variable_name="series", value_name="gpus")
st.altair_chart(
    alt.Chart(series)
    .mark_line(interpolate="step-after")
    .encode(
        x=alt.X("bucket:T", title=None),
        y=alt.Y("gpus:Q", title="GPUs (mean over the bucket)"),
        color=alt.Color("series:N", title=None),
        tooltip=["bucket:T", "series:N", alt.Tooltip("gpus:Q", format=".1f")],
    ),
)

st.subheader("GPU assignment rate")
st.altair_chart(
    alt.Chart(usage)
    .mark_area(opacity=0.6, interpolate="step-after")
    .encode(
        x=alt.X("bucket:T", title=None),
        y=alt.Y(
            "assignment_rate:Q",
            title="assigned",
            axis=alt.Axis(format="%"),
            scale=alt.Scale(domain=[0, 1]),
        ),
        tooltip=["bucket:T", alt.Tooltip("assignment_rate:Q", format=".1%")],
    ),
)

st.subheader(f"Now: every GPU in the last minutes before {span.last:%Y-%m-%d %H:%M} UTC")
grid = grid.with_columns(
    holder=pl.Series([holder_label(u, v.viewer) for u in grid["user"]], dtype=pl.String),
    job=pl.col("job_id") if v.viewer.role != RESEARCHER else pl.lit(None, pl.String),
).drop("user", "job_id")
base = alt.Chart(grid).encode(x=alt.X("gpu_index:O", title="GPU"), y=alt.Y("node:O", title=None))
heat = base.mark_rect().encode(
    color=alt.Color(
        "util:Q", title="utilization", scale=alt.Scale(domain=[0, 1], scheme="viridis")
    ),
    tooltip=["node", "gpu_index", alt.Tooltip("util:Q", format=".0%"), "holder", "job"],
)
labels = base.mark_text(fontSize=9, color="white").encode(text="holder:N")
st.altair_chart((heat + labels).properties(height=22 * max(nodes, 1) + 40))
idle_util = v.config.thresholds.idle_util
idle = grid.filter((pl.col("holder") != "") & (pl.col("util").fill_null(0) < idle_util)).height
st.caption(f"{idle} assigned GPUs are idle (under {idle_util:.0%} utilization) in this interval.")
