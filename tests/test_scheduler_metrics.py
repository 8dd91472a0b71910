"""The summary metrics on hand-computed replays: above all, that the fairness index sees
starvation."""

from __future__ import annotations

import numpy as np
import pytest

from sing.scheduler.metrics import jain, summarize
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import replay
from sing.scheduler.workload import Workload

# One GPU. bo submits a 10 s job every 10 s (t = 0..200), enough to keep the GPU busy alone; ana
# submits one 50 s job at t = 1.
STARVING = Workload(
    job_id=["long", *(f"b{k}" for k in range(21))],
    user=["ana", *["bo"] * 21],
    submit=[1.0, *(10.0 * k for k in range(21))],
    duration=[50.0, *[10.0] * 21],
    num_gpus=[1] * 22,
    num_nodes=[0] * 22,
    time_limit=[None] * 22,
)


def fairness(policy: str) -> float:
    run = replay(STARVING, 1, 1, SchedulerSettings(policy=policy))
    return summarize(run, starvation_s=3600)["jain_fairness"]


def test_jain_index_scores_starvation_below_fcfs() -> None:
    # sjf always has a 10 s job of bo's to run first: ana's job waits past the window [0, 200],
    # so ana is served 0 of what she asked for and bo all of it: Jain (0, 1) = 0.5.
    assert fairness("sjf") == pytest.approx(0.5)
    # fcfs runs ana's job at 10-60 (served 50 of the 59 s asked in the window) and bo's jobs
    # wait 50 s each (served 150 of 1,000 GPU-s asked): Jain (50/59, 0.15) = 0.672.
    assert fairness("fcfs") == pytest.approx(jain_of(50 / 59, 0.15))
    assert fairness("fcfs") > fairness("sjf") + 0.15


def jain_of(*shares: float) -> float:
    return sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))


def test_jain_bounds() -> None:
    assert jain(np.array([0.3, 0.3, 0.3])) == pytest.approx(1.0)
    assert jain(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert jain(np.array([0.0, 0.0])) == 1.0  # nobody served: nothing to be unfair about
