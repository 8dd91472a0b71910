"""Replay speed per policy on the full Philly jobs file (82,247 jobs) on 64 x 8 GPUs, one core.

Targets (issue 9): >= 200,000 jobs/s for fcfs, sjf and sing; >= 100,000 for easy. Prints, per
policy, the best of five runs by wall time and by this process's CPU time (on a shared machine
other processes steal wall time; CPU time is what the replay itself costs), and the CPU rate's
ratio to the target.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.settings import POLICIES, SchedulerSettings
from scheduler.simulate import replay
from scheduler.workload import read_trace

PHILLY = Path(__file__).resolve().parents[2] / "shared/traces/philly/philly_pollux_jobs.csv"
TARGETS = {"fcfs": 200_000, "sjf": 200_000, "sing": 200_000, "easy": 100_000}
NODES, GPUS_PER_NODE, REPEATS = 64, 8, 5


def main() -> None:
    workload = read_trace(PHILLY)
    print(f"{len(workload):,} Philly jobs on {NODES}x{GPUS_PER_NODE} GPUs, best of {REPEATS}")
    print(f"{'policy':>6} {'jobs/s wall':>12} {'jobs/s cpu':>11} {'target':>9} {'ratio':>6}")
    for policy in POLICIES:
        runs = [
            replay(workload, NODES, GPUS_PER_NODE, SchedulerSettings(), policy)
            for _ in range(REPEATS)
        ]
        wall = len(workload) / min(r.wall_s for r in runs)
        cpu = len(workload) / min(r.cpu_s for r in runs)
        target = TARGETS[policy]
        print(f"{policy:>6} {wall:>12,.0f} {cpu:>11,.0f} {target:>9,} {cpu / target:>6.2f}")


if __name__ == "__main__":
    main()
