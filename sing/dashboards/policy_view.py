"""How the waste policies' warnings look on the dashboards: in the site's time, as banners.

Times of the policy trail are shown in `[policy] timezone`, the zone the site's messages and
quiet hours use, so a deadline on screen reads like the one in the warning the user received.
"""

from __future__ import annotations

import json
from datetime import datetime
from zoneinfo import ZoneInfo

import polars as pl
import streamlit as st

from sing.config import Config, ConfigError
from sing.dashboards.access import ADMIN, Viewer
from sing.policy.settings import PolicySettings

ICON = ":material/timer:"  # the warning banners' (the job report's notes have another)


def site_zone(config: Config) -> ZoneInfo:
    """The zone of `[policy] timezone`; a ConfigError names a zone that does not exist."""
    return config.section("policy", PolicySettings).zone


def local_time(moment: datetime, zone: ZoneInfo) -> str:
    return f"{moment.astimezone(zone):%Y-%m-%d %H:%M %Z}"


def figures(evidence: str | None) -> str:
    """A verdict's figures (its detail JSON) as 'mean util 0.012, idle gpus 8'."""
    shown = []
    for key, value in json.loads(evidence or "{}").items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # the job's start time and other bookkeeping
        shown.append(f"{key.replace('_', ' ')} {value:.3g}")
    return ", ".join(shown)


def warning_banners(warnings: pl.DataFrame, viewer: Viewer, config: Config) -> None:
    """One banner per pending warning (`policy_data.pending_warnings` rows) the viewer may
    see: users their jobs' real warnings, admins also the dry-run ones, marked as such."""
    try:
        zone = site_zone(config)
    except ConfigError as err:
        st.error(str(err))
        return
    if viewer.role != ADMIN:
        warnings = warnings.filter(~pl.col("dry_run") & (pl.col("user") == viewer.name))
    for w in warnings.iter_rows(named=True):
        lines = [f"**Job {w['job_id']}** ({w['cluster']}), rule **{w['rule']}**"]
        if w["dry_run"]:
            lines[0] = "Dry run, not sent and nothing will be cancelled: " + lines[0]
        if w["seen"]:
            lines.append(f"Seen: {w['seen']}.")
        if seen := figures(w["evidence"]):
            lines.append(f"Figures: {seen}.")
        warned = local_time(w["warned_at"], zone)
        if w["deadline"] is None:  # the rule warns without cancelling
            lines.append(f"Warned {warned}; no cancellation follows.")
        else:
            lines.append(f"Deadline: {local_time(w['deadline'], zone)} (warned {warned}).")
        if w["cancel_command"]:
            lines.append(f"If the job is no longer needed, cancel it: `{w['cancel_command']}`")
        st.warning("  \n".join(lines), icon=ICON)
