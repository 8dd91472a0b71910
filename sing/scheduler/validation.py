"""How far a replay's waits are from the waits a trace recorded: the simulator checked against
reality (`sing simulate --validate`).

Only jobs with a recorded start count. Figures: mean and median absolute error of the wait,
Pearson correlation of simulated and recorded waits (None when either is constant), and the share
of jobs whose simulated wait is within 10 minutes of the recorded one.
"""

from __future__ import annotations

import numpy as np

from sing.scheduler.metrics import NA
from sing.scheduler.simulate import Replay
from sing.tables import Column, hours, percent

CLOSE_S = 600.0  # "within 10 min"
VALIDATION = (
    Column("policy", "policy"),
    Column("jobs", "jobs"),
    hours("recorded_mean_wait_s", "recorded wait", missing=NA),
    hours("simulated_mean_wait_s", "simulated wait", missing=NA),
    hours("mean_abs_error_s", "MAE", missing=NA),
    hours("median_abs_error_s", "median AE", missing=NA),
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
        "correlation": None if constant else float(np.corrcoef(simulated, recorded)[0, 1]),
        "within_10_min": float((error <= CLOSE_S).mean()),
    }
