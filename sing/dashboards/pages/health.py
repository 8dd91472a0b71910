"""Health (admin): open incidents, why jobs failed over time, GPU-hours lost, mean time between
hardware incidents, and the nodes the `[health]` drain limits pick out.

The figures are `sing health report`'s over the chosen window (sing.health.failures), the drain
list `sing health drain`'s as of the end of the data (sing.policy.drain); docs/health.md says how.
"""

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import health_data
from sing.dashboards.widgets import data_span, visit, window_picker
from sing.health.failures import LOST
from sing.health.settings import HealthSettings

v = visit()
span = data_span(v)
settings = v.config.section("health", HealthSettings)
st.title("Health")
since, until = window_picker(span, default_days=30)
found = health_data.metrics(v.warehouse, since, until, span.last)
opened = health_data.open_incidents(v.warehouse, span.last)
candidates = health_data.drain_candidates(v.warehouse, settings, span.last)


def figure(value: float | None, unit: str) -> str:
    return "no incident" if value is None else f"{value:,.0f} {unit}"


per_job = found["service_requests_per_job"]
a, b, c, d, e = st.columns(5)
a.metric("Open incidents", f"{len(opened)}")
b.metric("GPU-hours lost", f"{found['gpu_hours_lost']:,.1f} h")
c.metric("MTBF per node", figure(found["mtbf"]["node_hours_between"], "h"))
d.metric("GPU-hours between incidents", figure(found["mtbf"]["gpu_hours_between"], "GPU-h"))
e.metric("Jobs per service request", "none" if not per_job else f"{1 / per_job:,.0f}")
st.caption(
    f"{found['jobs']} jobs ended in the window; {found['incidents']['hardware']} hardware "
    f"incidents opened (MTBF: node-hours of the inventory / incidents). GPU-hours lost: GPUs x "
    f"run time of jobs ended by {', '.join(LOST)}."
)

st.subheader("Open incidents")
if opened:
    st.dataframe(
        pl.DataFrame(opened, infer_schema_length=None).drop("jobs"),
        hide_index=True,
        column_config={"opened_at": "opened (UTC)", "class": "class"},
        key="open",
    )
else:
    st.success("No incident is open.", icon=":material/check_circle:")

st.subheader("Failure causes over time")
over_time = health_data.causes_over_time(v.warehouse, since, until, span.last)
if over_time.is_empty():
    st.info("No job ended in this window.")
else:
    chart = (
        alt.Chart(over_time.to_pandas())
        .mark_bar()
        .encode(
            x=alt.X("bucket:T", title="day (UTC)"),
            y=alt.Y("jobs:Q", title="jobs ended"),
            color=alt.Color("failure_class:N", title="cause"),
            tooltip=[
                "bucket:T",
                "failure_class:N",
                "jobs:Q",
                alt.Tooltip("gpu_hours:Q", format=",.1f"),
            ],
        )
    )
    st.altair_chart(chart, width="stretch")
st.dataframe(
    pl.DataFrame(found["causes"]),
    hide_index=True,
    column_config={
        "failure_class": "cause",
        "share": st.column_config.NumberColumn("share of jobs", format="percent"),
        "gpu_hours": st.column_config.NumberColumn("GPU-h", format="%.1f"),
    },
    key="causes",
)

st.subheader("Incidents per node")
if found["nodes"]:
    st.dataframe(
        pl.DataFrame(found["nodes"]),
        hide_index=True,
        column_config={"incidents": "opened in window", "open_at_end": "open at end"},
        key="nodes",
    )
else:
    st.info("No hardware incident in this window.")

st.subheader("Drain suggestions")
mode = (
    "sing drains them itself ([health] drain = true, dry_run = false)"
    if settings.drain and not settings.dry_run
    else "sing only suggests: run the command, or allow it with [health] drain = true and "
    "dry_run = false"
)
st.caption(f"Nodes over the [health] drain limits at the end of the data; {mode}.")
if candidates:
    st.dataframe(
        pl.DataFrame(
            [{k: c[k] for k in ("cluster", "node", "reason", "command")} for c in candidates]
        ),
        hide_index=True,
        column_config={"reason": "evidence"},
        key="drain",
    )
else:
    st.success("No node crosses the drain limits.", icon=":material/check_circle:")
done = health_data.drains(v.warehouse, since)
if not done.is_empty():
    st.dataframe(
        done.select("ts", "cluster", "dry_run", "ok", "actor", "detail"),
        hide_index=True,
        column_config={"ts": "when", "dry_run": "dry run"},
        key="drains",
    )
