"""Job: one job's time series (per GPU: util, memory, power; per node: RDMA), from raw samples.

The job comes from `?job=ID` or the input box. A user gets a job's data only when it is theirs:
the owner filter goes into the query, and a job that is missing and one that belongs to someone
else get the same answer, so the page does not even confirm that a job id exists.
"""

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data, policy_data
from sing.dashboards.policy_view import warning_banners
from sing.dashboards.widgets import data_span, job_report_section, visit
from sing.errors import UserError

v = visit()
span = data_span(v)
st.title("Job")
job_id = st.text_input("Job id", value=st.query_params.get("job", ""), key="job_id").strip()
if not job_id:
    st.info("Enter a job id, or open a job from My jobs or Idle jobs.")
    st.stop()
st.query_params["job"] = job_id
cluster = st.query_params.get("cluster")  # only needed where job ids repeat across clusters

try:
    report = data.job_details(
        v.warehouse, job_id, v.viewer.owner_filter(), span.last, v.config, cluster
    )
except UserError as err:  # an id in several clusters: the message names them
    st.error(f"{err}. Add &cluster=NAME to the address.")
    st.stop()
if report is None or not v.viewer.may_see_job(report["user"]):
    st.error(f"No job {job_id} that you may see.")
    st.stop()

warnings = policy_data.pending_warnings(v.warehouse, span.last)
warning_banners(warnings.filter(cluster=report["cluster"], job_id=job_id), v.viewer, v.config)
job_report_section(report)

end = report["end_time"] or span.last
with st.spinner("Loading time series..."):
    gpus, rdma = data.job_series(
        v.warehouse,
        job_id,
        report["cluster"],
        tuple(report["nodes"] or ()),
        report["start_time"],
        end,
    )


def per_gpu_chart(column: str, title: str, fmt: str) -> alt.Chart:
    return (
        alt.Chart(gpus)
        .mark_line(strokeWidth=1)
        .encode(
            x=alt.X("ts:T", title=None),
            y=alt.Y(f"{column}:Q", title=title, axis=alt.Axis(format=fmt)),
            color=alt.Color("gpu:N", title="node:GPU", legend=alt.Legend(columns=2)),
            tooltip=["ts:T", "gpu", alt.Tooltip(f"{column}:Q", format=fmt)],
        )
        .properties(height=220)
    )


if gpus.is_empty():
    st.info("No GPU samples were recorded for this job.")
else:
    gpus = gpus.with_columns(mem_used_gib=pl.col("mem_used_bytes") / 2**30)
    st.subheader("GPU utilization")
    st.altair_chart(per_gpu_chart("util", "utilization", "%"))
    st.subheader("GPU memory used")
    st.altair_chart(per_gpu_chart("mem_used_gib", "GiB", ".1f"))
    st.subheader("GPU power")
    st.altair_chart(per_gpu_chart("power_w", "W", ".0f"))

if not rdma.is_empty():
    st.subheader("RDMA traffic per node")
    traffic = rdma.select(
        "ts", "node", sent=pl.col("tx_bytes_s") / 1e9, received=pl.col("rx_bytes_s") / 1e9
    ).unpivot(index=["ts", "node"], variable_name="direction", value_name="gb_s")
    st.altair_chart(
        alt.Chart(traffic)
        .mark_line(strokeWidth=1)
        .encode(
            x=alt.X("ts:T", title=None),
            y=alt.Y("gb_s:Q", title="GB/s"),
            color=alt.Color("node:N"),
            strokeDash=alt.StrokeDash("direction:N"),
            tooltip=["ts:T", "node", "direction", alt.Tooltip("gb_s:Q", format=".2f")],
        )
        .properties(height=220)
    )
