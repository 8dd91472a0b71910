"""My jobs: the signed-in user's own jobs, their efficiency, tips, and the trend over time."""

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data, policy_data
from sing.dashboards.access import ADMIN
from sing.dashboards.policy_view import warning_banners
from sing.dashboards.widgets import (
    JOB_COLUMNS,
    data_span,
    hours,
    job_link_column,
    job_report_section,
    percent,
    visit,
    window_picker,
)
from sing.policy.settings import site_coverage

v = visit()
span = data_span(v)
needs = site_coverage(v.config)
user = v.viewer.name
if v.viewer.role == ADMIN:  # admins may look at anybody's jobs, their own by default
    names = data.users(v.warehouse)
    user = st.selectbox("User", names, index=names.index(user) if user in names else 0, key="user")
st.title(f"Jobs of {user}")
warnings = policy_data.pending_warnings(v.warehouse, span.last)
warning_banners(warnings.filter(user=user), v.viewer, v.config)
since, until = window_picker(span, default_days=30)

with st.spinner("Loading jobs..."):
    jobs = data.job_usage(v.warehouse, since, until, user, needs).sort(
        "start_time", descending=True
    )
    host = data.job_host(v.warehouse, until).select(
        "cluster", "job_id", "cpu_efficiency", "host_mem_ratio"
    )
    jobs = jobs.join(host, on=["cluster", "job_id"], how="left", maintain_order="left")

if jobs.is_empty():
    st.info(f"{user} has no job that ran in this window.")
    st.stop()

gpu_hours = jobs["gpu_hours"].sum()
# CPU-only jobs are synced too: a window of only those has no GPU-hours to weight by.
weighted = (
    (jobs["mean_util"].fill_null(0) * jobs["gpu_hours"]).sum() / gpu_hours if gpu_hours else None
)
a, b, c, d = st.columns(4)
a.metric("Jobs", f"{jobs.height}")
b.metric("GPU-hours", hours(gpu_hours))
c.metric("GPU utilization (GPU-hour weighted)", percent(weighted))
d.metric("Idle GPU-hours", hours(jobs["idle_gpu_hours"].sum()))

st.subheader("Efficiency over time")
trend = data.efficiency_trend(jobs, every="1d" if (until - since).days <= 31 else "1w")
st.altair_chart(
    alt.Chart(trend)
    .mark_bar()
    .encode(
        x=alt.X("start_time:T", title="jobs started"),
        y=alt.Y(
            "util:Q",
            title="GPU utilization",
            axis=alt.Axis(format="%"),
            scale=alt.Scale(domain=[0, 1]),
        ),
        tooltip=[
            "start_time:T",
            alt.Tooltip("util:Q", format=".0%"),
            "jobs",
            alt.Tooltip("gpu_hours:Q", format=".1f"),
        ],
    )
)

st.subheader("Jobs")
st.dataframe(
    jobs.select(
        job_link_column(),
        "name",
        "state",
        "num_nodes",
        "num_gpus",
        "start_time",
        (pl.col("run_s") / 3600).alias("hours"),
        "gpu_hours",
        "mean_util",
        "coverage",
        "idle_gpu_hours",
        "cpu_efficiency",
        "host_mem_ratio",
    ),
    hide_index=True,
    column_config=JOB_COLUMNS,
)

st.subheader("One job in detail")
job_id = st.selectbox("Job", jobs["job_id"].to_list(), key="detail_job")
# The owner filter is the job's user here, so even a crafted selection shows only their jobs.
report = data.job_details(v.warehouse, job_id, user, span.last, v.config)
if report is not None:
    job_report_section(report)
    st.page_link(
        "pages/job.py",
        label="Time series of this job",
        query_params={"job": job_id},
        icon=":material/monitoring:",
    )
