"""Pieces every page uses: the visit (who, which warehouse), the window picker, number formats."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import polars as pl
import streamlit as st

from sing.config import Config
from sing.dashboards import data
from sing.dashboards.access import Viewer
from sing.dashboards.cli import DEMO_WORDS
from sing.tables import scaled_bytes
from sing.warehouse.coverage import coverage_words
from sing.warehouse.job_report import slurm_figures

VISIT_KEY = "_sing_visit"


@dataclass(frozen=True)
class Visit:
    """Set by the app before a page runs: the checked viewer and where the data is."""

    viewer: Viewer
    warehouse: str
    config: Config
    demo: bool = False


def visit() -> Visit:
    """The current visit, which every page asks for first; a page opened without going through
    the app shows nothing. In demo mode it puts the banner on top of the page."""
    current = st.session_state.get(VISIT_KEY)
    if not isinstance(current, Visit):
        st.error("Open the dashboard through its main page.")
        st.stop()
    if current.demo:
        st.warning(
            f"{DEMO_WORDS}: whoever reaches this dashboard sees it in the role picked in the "
            "sidebar.",
            icon=":material/visibility:",
        )
    return current


def data_span(v: Visit) -> data.Span:
    """The warehouse's time span; stops the page with a hint when there is no data yet."""
    span = data.span(v.warehouse)
    if span is None:
        st.info(
            "The warehouse has no jobs yet. Start the collector and executors, or write a "
            "synthetic history with `sing demo-data`."
        )
        st.stop()
    return span


def window_picker(
    span: data.Span, default_days: int = 7, key: str = "window", default_end: datetime | None = None
) -> tuple[datetime, datetime]:
    """A date range (UTC days) inside the data, by default the last `default_days` (before
    `default_end`); returns [since, until) as UTC datetimes."""
    last_day = min(default_end or span.last, span.last).date()
    first_day = max(span.first.date(), last_day - timedelta(days=default_days - 1))
    picked = st.date_input(
        "Window (UTC days)",
        value=(first_day, last_day),
        min_value=span.first.date(),
        max_value=span.last.date(),
        key=key,
    )
    first, last = (picked[0], picked[-1]) if picked else (first_day, last_day)
    since = max(span.first, _midnight(first))
    until = min(span.last, _midnight(last) + timedelta(days=1))
    st.caption(f"{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC")
    return since, until


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def job_link_column() -> pl.Expr:
    """A `job` column of relative links to the Job page (show it with a LinkColumn)."""
    return ("job?job=" + pl.col("job_id")).alias("job")


# Column formats of the job tables (Idle jobs, My jobs); columns a table lacks are ignored.
JOB_COLUMNS = {
    "job": st.column_config.LinkColumn("job", display_text=r"job=(.*)"),
    "num_nodes": "nodes",
    "num_gpus": "GPUs",
    "hours": st.column_config.NumberColumn("run time h", format="%.1f"),
    "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.1f"),
    "mean_util": st.column_config.NumberColumn("mean util", format="percent"),
    "coverage": st.column_config.NumberColumn(
        "coverage", format="percent", help="share of the expected samples the figures rest on"
    ),
    "idle_gpu_hours": st.column_config.NumberColumn("idle GPU-hours", format="%.1f"),
    "cpu_efficiency": st.column_config.NumberColumn(
        "CPU efficiency", format="percent", help="core-seconds used / allocated (cgroups)"
    ),
    "host_mem_ratio": st.column_config.NumberColumn(
        "host memory peak / requested", format="percent"
    ),
    "wasted_gpu_hours": st.column_config.NumberColumn("wasted GPU-h", format="%.1f"),
    "rdma_gb_per_node_hour": st.column_config.NumberColumn("RDMA GB/node-h", format="%.2f"),
}


def percent(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.0%}"


def hours(h: float | None) -> str:
    return "n/a" if h is None else f"{h:,.0f} h" if h >= 100 else f"{h:,.1f} h"


def _host_figures(report: dict) -> None:
    """The job's CPU efficiency, host memory and disk I/O, as `sing job` shows them."""
    a, b, c, d = st.columns(4)
    a.metric("CPU efficiency", percent(report["cpu_efficiency"]))
    cores, alloc = report["mean_cores_used"], report["alloc_cores"]
    b.metric("CPU cores in use", "n/a" if cores is None else f"{cores:.1f} of {alloc or '?'}")
    c.metric("Peak host memory", scaled_bytes(report["host_mem_peak_bytes"], binary=True))
    if report["host_mem_req_bytes"]:
        c.caption(f"of {scaled_bytes(report['host_mem_req_bytes'], binary=True)} requested")
    read, written = (scaled_bytes(report[k]) for k in ("io_read_bytes", "io_write_bytes"))
    d.metric("Disk read / written", f"{read} / {written}")
    if slurm := slurm_figures(report):  # as `sing job` says it: seff's, or sstat's so far
        st.caption(f"{slurm[0]}: {slurm[1]}")


def job_report_section(report: dict) -> None:
    """One job's efficiency on screen: headline figures, plain-language notes, per-GPU and
    per-node tables (the `sing job` report)."""
    a, b, c, d = st.columns(4)
    a.metric("Mean GPU utilization", percent(report["mean_util"]))
    if words := coverage_words(report["coverage"]):
        a.caption(words)  # beside the figure: it rests on part of the job's samples
    b.metric("GPU-hours", hours(report["gpu_hours"]))
    c.metric("Idle GPU-hours", hours(report["idle_gpu_hours"]))
    d.metric("Peak GPU memory", f"{(report['peak_mem_bytes'] or 0) / 2**30:.1f} GiB")
    if report["per_node_host"]:  # the job's cgroups were read (docs/exporter.md)
        _host_figures(report)
    st.caption(
        f"Job {report['job_id']} of {report['user']} ({report['account']}), {report['state']}, "
        f"{report['num_nodes']} node(s), {report['num_gpus']} GPU(s), "
        f"run time {hours((report['run_s'] or 0) / 3600)}, "
        f"queued {hours((report['queue_s'] or 0) / 3600)}."
    )
    for note in report["notes"]:
        st.warning(note, icon=":material/lightbulb:")
    if not report["notes"]:
        st.success("No efficiency concerns for this job.", icon=":material/check_circle:")
    left, right = st.columns(2)
    if report["per_gpu"]:  # a CPU-only job has none
        left.dataframe(
            pl.DataFrame(report["per_gpu"])
            .with_columns(
                peak_mem_gib=pl.col("peak_mem_bytes") / 2**30,
                energy_kwh=pl.col("energy_j") / 3.6e6,
            )
            .drop("peak_mem_bytes", "energy_j"),
            hide_index=True,
            column_config={
                "mean_util": st.column_config.NumberColumn("mean util", format="percent"),
                "max_util": st.column_config.NumberColumn("max util", format="percent"),
                "mean_sm_active": st.column_config.NumberColumn("SM active", format="percent"),
                "peak_mem_gib": st.column_config.NumberColumn("peak mem GiB", format="%.1f"),
                "energy_kwh": st.column_config.NumberColumn("energy kWh", format="%.2f"),
            },
        )
    if report["per_node_host"]:
        left.dataframe(
            pl.DataFrame(report["per_node_host"]).select(
                "node",
                cores=pl.col("cpu_s") / (report["run_s"] or None),
                cpus=pl.col("cpuset_cpus"),
                peak_gib=pl.col("mem_peak_bytes") / 2**30,
                limit_gib=pl.col("mem_limit_bytes") / 2**30,
            ),
            hide_index=True,
            column_config={
                "cores": st.column_config.NumberColumn("cores in use", format="%.1f"),
                "cpus": "cores allocated",
                "peak_gib": st.column_config.NumberColumn("peak memory GiB", format="%.1f"),
                "limit_gib": st.column_config.NumberColumn("memory limit GiB", format="%.0f"),
            },
        )
    if report["per_node_rdma"]:
        right.dataframe(
            pl.DataFrame(report["per_node_rdma"]).select(
                "node", tx_gb=pl.col("tx_bytes") / 1e9, rx_gb=pl.col("rx_bytes") / 1e9
            ),
            hide_index=True,
            column_config={
                "tx_gb": st.column_config.NumberColumn("RDMA sent GB", format="%.2f"),
                "rx_gb": st.column_config.NumberColumn("RDMA received GB", format="%.2f"),
            },
        )
