"""The Health page's data: failure metrics, failures over time, open incidents and drain
candidates, read like `sing.dashboards.data` reads the other tables (cached, a fresh warehouse
snapshot per call; the page builds no SQL)."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from sing.dashboards.data import cached
from sing.health import failures
from sing.health.settings import HealthSettings
from sing.policy import drain
from sing.warehouse.audit import ACTION, events
from sing.warehouse.store import Warehouse


@cached
def metrics(root: str, since: datetime, until: datetime, now: datetime) -> dict:
    """`sing.health.failures.report` of [since, until)."""
    return failures.report(failures.snapshot(Warehouse(root)), since, until, now)


@cached
def causes_over_time(root: str, since: datetime, until: datetime, now: datetime) -> pl.DataFrame:
    """Per day of end time and failure class: jobs and GPU-hours."""
    rows = failures.over_time(failures.snapshot(Warehouse(root)), since, until, now, bucket="day")
    schema = {"bucket": pl.Datetime("us", "UTC"), "failure_class": pl.String,
              "jobs": pl.Int64, "gpu_hours": pl.Float64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


@cached
def open_incidents(root: str, now: datetime) -> list[dict]:
    return failures.open_incidents(Warehouse(root).connect({"incidents": None}), now)


@cached
def drain_candidates(root: str, settings: HealthSettings, now: datetime) -> list[dict]:
    """Nodes over the [health] drain limits as of `now` (`sing.policy.drain.candidates`)."""
    con = Warehouse(root).connect({"health_samples": None})
    return drain.candidates(con, settings, now)


@cached
def drains(root: str, since: datetime) -> pl.DataFrame:
    """Drains sing did or decided (dry run) since `since`, newest first."""
    trail = events(Warehouse(root).connect({"policy_events": since.date()}), since, kinds=(ACTION,))
    return trail.filter(pl.col("outcome") == drain.DRAIN)
