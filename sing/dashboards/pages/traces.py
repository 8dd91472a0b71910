"""Traces (researcher): preview and download the anonymized trace of a chosen window."""

import streamlit as st

from sing.dashboards import data
from sing.dashboards.widgets import data_span, visit, window_picker
from sing.traces.settings import TraceSettings

PREVIEW_ROWS = 200

v = visit()
span = data_span(v)
settings = v.config.section("trace", TraceSettings)
st.title("Anonymized trace")
st.caption(
    "Jobs submitted in the window, with per-job GPU and RDMA summaries, in the open trace format "
    "(Parquet and CSV with datapackage.json and a datasheet). Users, groups and job ids are "
    f"keyed pseudonyms; groups with fewer than {settings.k} users are merged; names, paths and "
    "hosts never leave the warehouse."
)
since, until = window_picker(span, default_days=7)

with st.spinner("Building the anonymized release..."):
    release = data.trace_release(v.warehouse, since, until, settings)

a, b = st.columns(2)
a.metric("Jobs in the release", f"{release.jobs.height:,}")
b.metric("Jobs left out (rare shapes)", f"{release.suppressed_jobs:,}")
if release.refused:
    st.error(f"No download: {release.refused}.")
    st.stop()
st.download_button(
    "Download trace (zip)",
    data=release.zip_bytes,
    file_name=f"sing-trace-{since:%Y%m%d}-{until:%Y%m%d}.zip",
    mime="application/zip",
    icon=":material/download:",
    type="primary",
    key="download",
)
st.caption(f"{len(release.zip_bytes) / 1e6:.1f} MB. Preview of the first {PREVIEW_ROWS} jobs:")
st.dataframe(release.jobs.head(PREVIEW_ROWS), hide_index=True)
