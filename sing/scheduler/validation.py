"""How far a replay's waits are from the waits a trace recorded: the simulator checked against
reality (`sing simulate --validate`).

Only jobs with a recorded start count (a job that never started has no wait to compare). A
replay keeps each job's recorded submit time, so a job's start error is its wait error: one
set of figures says both. Figures: mean, median and 99th percentile absolute error, the mean
signed error (simulated minus recorded: > 0, the replay starts jobs later than the site did),
Pearson correlation of simulated and recorded waits (None when either is constant), and the
share of jobs whose simulated wait is within 10 minutes of the recorded one.
"""

from __future__ import annotations

import numpy as np

from sing.scheduler.metrics import NA
from sing.scheduler.simulate import Replay
from sing.tables import Column, hours, percent

CLOSE_S = 600.0  # "within 10 min"


def _minutes(key: str, heading: str) -> Column:
    """Errors in minutes: on a small site they are seconds to minutes, hours would show 0.00."""
    return Column(key, f"{heading} min", digits=1, per=60, missing=NA)


VALIDATION = (
    Column("policy", "policy"),
    Column("jobs", "jobs"),
    hours("recorded_mean_wait_s", "recorded wait", missing=NA),
    hours("simulated_mean_wait_s", "simulated wait", missing=NA),
    _minutes("mean_abs_error_s", "MAE"),
    _minutes("median_abs_error_s", "p50 AE"),
    _minutes("p99_abs_error_s", "p99 AE"),
    _minutes("mean_error_s", "bias"),
    Column("correlation", "corr", digits=3, missing=NA),
    percent("within_10_min", "within 10 min", missing=NA),
)


def compare_waits(run: Replay) -> dict[str, float | int | str | None]:
    jobs = run.workload
    known = [k for k, t in enumerate(jobs.recorded_start) if t is not None]
    row: dict[str, float | int | str | None] = {"policy": run.policy, "jobs": len(known)}
    if not known:
        return row | dict.fromkeys(key for key in (c.key for c in VALIDATION[2:]))
    submit = np.asarray([jobs.submit[k] for k in known])
    recorded = np.asarray([jobs.recorded_start[k] for k in known]) - submit
    simulated = np.asarray([run.start[k] for k in known]) - submit
    error = np.abs(simulated - recorded)
    constant = recorded.std() == 0 or simulated.std() == 0
    return row | {
        "recorded_mean_wait_s": float(recorded.mean()),
        "simulated_mean_wait_s": float(simulated.mean()),
        "mean_abs_error_s": float(error.mean()),
        "median_abs_error_s": float(np.median(error)),
        "p99_abs_error_s": float(np.percentile(error, 99)),
        "mean_error_s": float((simulated - recorded).mean()),
        "correlation": None if constant else float(np.corrcoef(simulated, recorded)[0, 1]),
        "within_10_min": float((error <= CLOSE_S).mean()),
    }
