"""What a replay did for the cluster and its users, as one flat row per policy.

- GPU assignment: allocated GPU-time / capacity over the *arrival window*, [first submit, last
  submit] of the replayed jobs (the drain after the last arrival is left out: every policy idles
  the same way there). Mostly set by the offered load.
- Busy assignment: the same ratio over only the time when some job is waiting (the *busy window*):
  how much of the cluster a policy leaves idle while there is work it could run. This is the
  figure that separates the policies (the SING paper's ~96% backfill vs ~75% FCFS).
- Queueing delay (start - submit): mean, p50, p95, p99, max; mean JCT (end - submit); mean bounded
  slowdown max(1, JCT / max(runtime, 10 s)).
- Fairness: Jain's index over each user's *served share* in the window: the GPU-seconds their
  jobs ran / the GPU-seconds their jobs asked for, counted from each job's submit to its end
  (waiting or running), both clipped to the window. 1 when every user is served the same share
  of what they asked for (everyone slowed down alike), 1/users when one user gets all the service.
  And the worst user's mean wait.
- Starved jobs: waited longer than the starvation bound; waited share: the jobs that waited at
  all (started later than submitted), the measured sign of queueing.
- Offered load: the GPU-seconds the jobs ask for / (cluster GPUs x window). It does not tell
  whether queues formed: one long job holding a node can queue a lightly loaded trace for days
  (on 3 x 8 GPUs, a load of 0.009 with a mean fcfs wait of 183 h in tests/test_scheduler_trace.py),
  so `sing simulate` judges that by the waited share and the waits the replay measured.

A figure that is undefined (no jobs; a zero-length window; no time with a waiting job) is None,
never 0: the table shows "n/a", --json null.
"""

from __future__ import annotations

import numpy as np

from sing.scheduler.cluster import WHOLE
from sing.scheduler.simulate import Replay
from sing.scheduler.workload import Workload

BOUNDED_SLOWDOWN_FLOOR_S = 10.0
NA = "n/a"  # how tables show an undefined figure (None)
# The figures of a summary that need jobs (None without any).
FIGURES = (
    "window_s",
    "gpu_assignment",
    "busy_assignment",
    "mean_wait_s",
    "p50_wait_s",
    "p95_wait_s",
    "p99_wait_s",
    "max_wait_s",
    "waited_share",
    "mean_jct_s",
    "mean_bounded_slowdown",
    "jain_fairness",
    "worst_user_mean_wait_s",
    "jobs_per_s",
)


def summarize(run: Replay, starvation_s: float) -> dict[str, float | int | str | None]:
    jobs = run.workload
    if not len(jobs):
        return {"policy": run.policy, "jobs": 0, **dict.fromkeys(FIGURES), "starved_jobs": 0}
    submit = np.asarray(jobs.submit, dtype=float)
    duration = np.asarray(jobs.duration, dtype=float)
    gpus = np.asarray(run.gpus, dtype=float)
    start = np.asarray(run.start, dtype=float)
    wait = start - submit
    jct = wait + duration
    lo, hi = float(submit.min()), float(submit.max())
    span = hi - lo
    end = start + duration
    received = gpus * _overlap(start, end, lo, hi)
    users, user_of = np.unique(np.asarray(jobs.user, dtype=object), return_inverse=True)
    asked = np.bincount(user_of, gpus * _overlap(submit, end, lo, hi), len(users))
    share = np.bincount(user_of, received, len(users))[asked > 0] / asked[asked > 0]
    per_user_wait = np.bincount(user_of, wait, len(users)) / np.bincount(user_of, None, len(users))
    p50, p95, p99 = np.percentile(wait, [50, 95, 99])
    return {
        "policy": run.policy,
        "jobs": len(jobs),
        "window_s": span,
        "gpu_assignment": _ratio(float(received.sum()), run.cluster.total_gpus * span),
        "busy_assignment": _ratio(*busy_window(submit, start, end, gpus), run.cluster.total_gpus),
        "mean_wait_s": float(wait.mean()),
        "p50_wait_s": float(p50),
        "p95_wait_s": float(p95),
        "p99_wait_s": float(p99),
        "max_wait_s": float(wait.max()),
        "waited_share": float((wait > 0).mean()),
        "mean_jct_s": float(jct.mean()),
        "mean_bounded_slowdown": float(
            np.maximum(1.0, jct / np.maximum(duration, BOUNDED_SLOWDOWN_FLOOR_S)).mean()
        ),
        "jain_fairness": jain(share),
        "worst_user_mean_wait_s": float(per_user_wait.max()),
        "starved_jobs": int((wait > starvation_s).sum()),
        "jobs_per_s": _ratio(len(jobs), run.wall_s),
    }


def jain(x: np.ndarray) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has all; 1 for
    nothing to share (no user asked for GPU-time, or none was served)."""
    return float(x.sum() ** 2 / (len(x) * (x**2).sum())) if x.any() else 1.0


def _overlap(begin: np.ndarray, end: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip(np.minimum(end, hi) - np.maximum(begin, lo), 0.0, None)


def _ratio(part: float, whole: float, per: float = 1.0) -> float | None:
    """part / whole / per; None (undefined, not 0) when whole is 0."""
    return part / whole / per if whole else None


def offered_load(
    jobs: Workload, total_gpus: int, since: float | None = None, until: float | None = None
) -> float | None:
    """GPU-seconds asked / (GPUs x window); the window is [since, until), each end defaulting
    to the first or last submit. None for no jobs or a zero-length window."""
    if not len(jobs):
        return None
    gpus = np.where(np.asarray(jobs.share) > 0, np.asarray(jobs.share) / WHOLE, jobs.num_gpus)
    lo = min(jobs.submit) if since is None else since
    hi = max(jobs.submit) if until is None else until
    return _ratio(
        float((gpus * np.asarray(jobs.duration, dtype=float)).sum()), total_gpus * (hi - lo)
    )


def busy_window(submit, start, end, gpus) -> tuple[float, float]:
    """(allocated GPU-seconds, seconds) over the time at least one job waits (a sweep).

    Returned as a pair so that replays of separate clusters (one per VC) can be summed.
    """
    waited = start > submit
    times = np.concatenate([submit[waited], start[waited], start, end])
    waiting = np.concatenate([np.ones(waited.sum()), -np.ones(waited.sum()), 0 * start, 0 * end])
    allocated = np.concatenate([0 * submit[waited], 0 * start[waited], gpus, -gpus])
    order = np.argsort(times, kind="stable")
    times, waiting, allocated = times[order], np.cumsum(waiting[order]), np.cumsum(allocated[order])
    length = np.diff(times)
    busy = waiting[:-1] > 0
    return float((allocated[:-1][busy] * length[busy]).sum()), float(length[busy].sum())
