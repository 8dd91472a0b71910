"""Workload (admin, researcher): how long jobs run and wait, how many GPUs and nodes they take,
and when the load comes, for the cluster beside trace releases (the SING paper's usage analysis).
Aggregates only: no user, job or node appears on this page."""

from pathlib import Path

import altair as alt
import polars as pl
import streamlit as st

from sing.dashboards import data
from sing.dashboards.settings import DashboardSettings
from sing.dashboards.widgets import data_span, visit, window_picker
from sing.errors import UserError
from sing.traces import workload

v = visit()
span = data_span(v)
releases_dir = v.config.section("dashboard", DashboardSettings).trace_releases
found = data.trace_releases(str(v.config.resolve_path(releases_dir)) if releases_dir else "")
st.title("Workload")
st.caption(
    "GPU jobs submitted in the window: run time (finished jobs), queue time, GPUs and nodes "
    "per job (started jobs) as cumulative distributions, and the GPU-hours by hour of day and "
    "weekday (UTC): offered by submit time, running as held. Trace releases are whole."
)
left, right = st.columns([2, 3])
with left:
    since, until = window_picker(span, default_days=30)
with right:
    chosen = st.multiselect(
        "Trace releases beside the cluster",
        found,
        format_func=lambda p: Path(p).name,
        key="releases",
        help="The releases under [dashboard] trace_releases (docs/dashboards.md).",
    )

with st.spinner("Computing the workload..."):
    profiles = [data.cluster_workload(v.warehouse, since, until, span.last, v.config.site.cluster)]
    for path in chosen:
        try:
            profiles.append(data.trace_workload(path))
        except UserError as err:  # a damaged release: say which, show the others
            st.error(str(err))
    profiles = workload.unique_names(profiles)
for column, p in zip(st.columns(len(profiles)), profiles, strict=True):
    column.metric(f"{p.name}: GPU jobs", f"{p.counts['gpu_jobs']:,}")
    column.caption(
        f"{p.counts['never_started']:,} never started, {p.counts['cpu_only']:,} CPU-only "
        "jobs left out. " + (p.note[0].upper() + p.note[1:] + "." if p.note else "")
    )

for m in workload.METRICS:
    st.subheader(f"{m.title} ({m.unit})")
    curve = pl.concat(
        p.curve.filter(pl.col("metric") == m.key).select(
            source=pl.lit(p.name), value=pl.col("value") / m.per, share="share"
        )
        for p in profiles
    )
    if curve.is_empty():
        st.info(f"No source records the {m.title}.")
        continue
    positive = curve.filter(pl.col("value") > 0)  # a log axis has no 0 (e.g. no queue at all)
    st.altair_chart(
        alt.Chart(positive if m.key != "nodes" else curve)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X(
                "value:Q",
                title=f"{m.title} ({m.unit})",
                scale=alt.Scale(type="log") if m.key != "nodes" else alt.Scale(),
            ),
            y=alt.Y("share:Q", title="share of jobs at or below", axis=alt.Axis(format="%")),
            color=alt.Color("source:N", title=None),
            tooltip=[
                "source",
                alt.Tooltip("value:Q", format=",.2f"),
                alt.Tooltip("share:Q", format=".0%"),
            ],
        )
    )
    table = pl.concat(
        p.stats.filter(pl.col("metric") == m.key).select(
            pl.lit(p.name).alias("source"),
            "jobs",
            *(
                (pl.col(c) / m.per).alias(f"{c} {m.unit}")
                for c in ("mean", *map(workload.quantile_name, workload.QUANTILES))
            ),
        )
        for p in profiles
    )
    st.dataframe(table, hide_index=True)

st.subheader("Load by hour of day and weekday (UTC)")
timed = [p for p in profiles if p.load is not None]
if not timed:
    st.info("No source has a real clock (releases from a secret time origin have none).")
    st.stop()
load = (
    pl.concat(p.load.with_columns(source=pl.lit(p.name)) for p in timed)
    .unpivot(
        ["offered_share", "running_share"],
        index=["source", "scale", "slot"],
        variable_name="load",
        value_name="share",
    )
    .with_columns(pl.col("load").str.replace("_share", ""))
    .drop_nulls("share")  # running load of a trace without start times: unknown
)
hour, weekday = st.columns([3, 2])
for column, scale in ((hour, "hour"), (weekday, "weekday")):
    labels = {s: workload.slot_label(scale, s) for s in workload.slots(scale)}
    column.altair_chart(
        alt.Chart(
            load.filter(pl.col("scale") == scale).with_columns(
                pl.col("slot").replace_strict(labels, return_dtype=pl.String)
            )
        )
        .mark_line(point=True)
        .encode(
            x=alt.X("slot:O", title=f"{scale} (UTC)", sort=list(labels.values())),
            y=alt.Y("share:Q", title="share of GPU-hours", axis=alt.Axis(format="%")),
            color=alt.Color("source:N", title=None),
            strokeDash=alt.StrokeDash("load:N", title=None),
            tooltip=["source", "load", "slot", alt.Tooltip("share:Q", format=".1%")],
        )
    )
