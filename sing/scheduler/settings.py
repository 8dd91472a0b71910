"""The `[scheduler]` section of the site config: policy and its options.

Every option defaults to the behaviour the docs describe (docs/scheduler.md), so the embedded demo
needs no config file.
"""

from __future__ import annotations

import dataclasses

from sing.config import ConfigError

POLICIES = ("fcfs", "sing", "easy", "sjf")
BACKFILL_RULES = ("reserve", "wait", "budget")
PLACEMENTS = ("pack", "any")


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    policy: str = "sing"
    # How `sing` bounds backfill behind a blocked head job (docs/scheduler.md compares them):
    # "reserve": backfill freely until the head has been blocked for max_head_wait_s (default 0:
    # at once), then reserve it the nodes where it fits soonest (the freest) and backfill only
    # elsewhere;
    # "wait": the same, but then stop backfill altogether until the head starts;
    # "budget": backfilled GPUs while the head is blocked <= backfill_budget x the head's GPUs.
    backfill_rule: str = "reserve"
    max_head_wait_s: float = 0.0
    backfill_budget: float = 1.0
    # The age window (any rule): once the head has waited age_window_after_s since its submit
    # (0 = never), only jobs submitted at most age_window_s after it may backfill past it, so
    # old jobs are no longer passed over by a stream of new ones. The defaults (reserve at once,
    # window after 120 h, 48 h wide) keep the maximum wait at most fcfs's on Philly at a price in
    # mean wait; age_window_after_s = 0 and max_head_wait_s = 72 h is the older, higher-throughput
    # default (docs/scheduler.md measures both).
    age_window_after_s: float = 120 * 3600.0
    age_window_s: float = 48 * 3600.0
    # EASY looks this deep into each job-size class for a job short enough to end before the
    # head's reservation (like Slurm's bf_max_job_test); 0 = only each class's oldest job.
    easy_depth: int = 64
    # "pack": a job of <= one node's GPUs on one node, larger jobs on whole nodes;
    # "any": GPUs anywhere (what GPU-count-only simulators model).
    placement: str = "pack"
    power_of_two: bool = False  # round every request up to a power of two GPUs
    small_pool_nodes: int = 0  # the last N nodes only take jobs of <= small_job_max_gpus GPUs
    small_job_max_gpus: int = 1
    max_jobs_per_user: int = 0  # running jobs per user; 0 = no limit
    starvation_s: float = 24 * 3600.0  # metrics: a job waiting longer than this counts as starved

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("policy", self.policy, POLICIES),
            ("backfill_rule", self.backfill_rule, BACKFILL_RULES),
            ("placement", self.placement, PLACEMENTS),
        ):
            if value not in allowed:
                raise ConfigError(
                    f"[scheduler] {name} = {value!r}; choose one of {', '.join(allowed)}"
                )
        for name in (
            "max_head_wait_s",
            "backfill_budget",
            "age_window_after_s",
            "age_window_s",
            "easy_depth",
            "small_pool_nodes",
            "max_jobs_per_user",
            "starvation_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"[scheduler] {name} must be >= 0, got {getattr(self, name)}")
        if self.small_job_max_gpus < 1:
            raise ConfigError(
                f"[scheduler] small_job_max_gpus must be >= 1, got {self.small_job_max_gpus}"
            )
