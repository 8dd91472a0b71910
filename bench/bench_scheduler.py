"""Replay speed per policy on the full Philly jobs file (82,247 jobs) on 64 x 8 GPUs, one core.

Targets (issue 9): >= 200,000 jobs/s for fcfs, sjf and sing; >= 100,000 for easy. Prints the
figures, each policy's ratio to its target, and the best of three runs.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.settings import POLICIES, SchedulerSettings
from scheduler.simulate import replay
from scheduler.workload import read_trace

PHILLY = Path(__file__).resolve().parents[2] / "shared/traces/philly/philly_pollux_jobs.csv"
TARGETS = {"fcfs": 200_000, "sjf": 200_000, "sing": 200_000, "easy": 100_000}
NODES, GPUS_PER_NODE, REPEATS = 64, 8, 3


def main() -> None:
    workload = read_trace(PHILLY)
    print(f"{len(workload):,} Philly jobs on {NODES}x{GPUS_PER_NODE} GPUs, best of {REPEATS}")
    print(f"{'policy':>6} {'jobs/s':>10} {'target':>9} {'ratio':>6}")
    for policy in POLICIES:
        best = min(
            replay(workload, NODES, GPUS_PER_NODE, SchedulerSettings(), policy).wall_s
            for _ in range(REPEATS)
        )
        rate = len(workload) / best
        print(f"{policy:>6} {rate:>10,.0f} {TARGETS[policy]:>9,} {rate / TARGETS[policy]:>6.2f}")


if __name__ == "__main__":
    main()
