"""Replay speed per policy on the full Philly jobs file (82,247 jobs), one core: on today's
uniform 64 x 8 GPUs, and on a mixed cluster with fractional GPUs and model constraints; as pure
Python and compiled (`make native`, sing/scheduler/native.py), side by side in one run.

Targets (issues 9 and 14): >= 200,000 jobs/s for fcfs, sjf and sing; >= 100,000 for easy, on every
path. The mixed runs: 32 nodes of 8 "V100" + 64 nodes of 4 "P100" (the same 512 GPUs); every
third 1-GPU job asks for half a GPU; "mixed" also sends every fifth job to "V100" only (jobs that
can never fit there are skipped, as `sing simulate` does), which makes the queue much deeper,
"shares" does not (the cost of mixed nodes and shares alone). Prints, per policy and path, the
best of REPEATS runs by CPU time (on a shared machine other processes steal wall time; CPU time is
what the replay itself costs), and its ratio to the target. The two builds run alternately, one
policy at a time, in child processes (a process runs one or the other), so that both see the same
machine. Without a current build (and a C compiler to make one) the compiled columns say n/a.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sing import scheduler
from sing.scheduler.cluster import Node
from sing.scheduler.settings import POLICIES, SchedulerSettings
from sing.scheduler.simulate import fitting, make_cluster, replay
from sing.scheduler.workload import Workload, read_trace

PHILLY = Path(__file__).resolve().parents[2] / "shared/traces/philly/philly_pollux_jobs.csv"
TARGETS = {"fcfs": 200_000, "sjf": 200_000, "sing": 200_000, "easy": 100_000}
NODES, GPUS_PER_NODE, REPEATS = 64, 8, 5
MIXED = [Node(f"v{i:02d}", 8, "V100") for i in range(32)] + [
    Node(f"p{i:02d}", 4, "P100") for i in range(64)
]
PATHS = ("uniform", "shares", "mixed")


def mixed_workload(jobs: Workload, models: bool = True) -> Workload:
    """Philly with every third 1-GPU job at half a GPU and (`models`) every fifth job on V100
    only."""
    share = [500 if g == 1 and k % 3 == 0 else 0 for k, g in enumerate(jobs.num_gpus)]
    model = ["V100" if models and k % 5 == 0 else "" for k in range(len(jobs))]
    return dataclasses.replace(jobs, share=share, model=model)


def workloads() -> dict[str, tuple[Workload, int | list[Node]]]:
    uniform = read_trace(PHILLY)
    settings = SchedulerSettings()
    mixed, _ = fitting(mixed_workload(uniform), make_cluster(MIXED, 0, settings), settings)
    shared = mixed_workload(uniform, models=False)
    return {"uniform": (uniform, NODES), "shares": (shared, MIXED), "mixed": (mixed, MIXED)}


def cpu_rate(workload: Workload, nodes: int | list[Node], policy: str) -> float:
    runs = [
        replay(workload, nodes, GPUS_PER_NODE, SchedulerSettings(), policy) for _ in range(REPEATS)
    ]
    return len(workload) / min(r.cpu_s for r in runs)


def child(policy: str) -> None:
    """One build's rates for `policy` on every path, as JSON (SING_NATIVE picks the build)."""
    paths = workloads()
    rates = {name: cpu_rate(*paths[name], policy) for name in PATHS}
    print(json.dumps({"native": scheduler.NATIVE, "rates": rates}))


def rates_of(policy: str, native: str) -> dict[str, float] | None:
    env = {**os.environ, "SING_NATIVE": native}
    run = subprocess.run(
        [sys.executable, __file__, "--child", policy], env=env, capture_output=True, text=True
    )
    if run.returncode:
        sys.exit(f"the {policy} child failed:\n{run.stderr}")
    out = json.loads(run.stdout)
    return out["rates"] if out["native"] == (native != "0") else None


def compiled_build(scratch: Path) -> str | None:
    """A current compiled build: the checkout's, else one made in `scratch`; None if none can be
    made here (no C compiler or headers)."""
    if scheduler.NATIVE:
        return str(scheduler.build_dir())
    from sing.scheduler.native import build

    try:
        build(scratch)
    except Exception as error:  # any build failure: report it and go on with pure Python
        print(f"no compiled build ({type(error).__name__}: {error}); compiled columns n/a")
        return None
    return str(scratch)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-native-") as scratch:
        native = compiled_build(Path(scratch))
        paths = workloads()
        mixed = paths["mixed"][0]
        print(
            f"{len(paths['uniform'][0]):,} Philly jobs, best of {REPEATS}, jobs/s of CPU time "
            f"(one core)\nuniform: {NODES}x{GPUS_PER_NODE} GPUs; mixed: 32x8 V100 + 64x4 P100, "
            f"{len(mixed):,} jobs ({sum(1 for s in mixed.share if s):,} half-GPU shares, "
            f"{sum(1 for m in mixed.model if m):,} on V100 only)"
        )
        columns = " ".join(f"{p:>9}" for p in PATHS)
        print(f"{'':>6} {'pure Python':^29} | {'compiled':^29} |")
        ratios = "compiled/target  compiled/pure"
        print(f"{'policy':>6} {columns} | {columns} | {'target':>7}  {ratios}")
        for policy in POLICIES:
            pure = rates_of(policy, "0")
            fast = rates_of(policy, native) if native else None
            target = TARGETS[policy]
            line = f"{policy:>6} " + " ".join(f"{pure[p]:>9,.0f}" for p in PATHS) + " | "
            if fast is None:
                line += f"{'n/a':>29} | {target:>7,}"
            else:
                line += (
                    " ".join(f"{fast[p]:>9,.0f}" for p in PATHS)
                    + f" | {target:>7,}  "
                    + " ".join(f"{fast[p] / target:.2f}" for p in PATHS)
                    + "  "
                    + " ".join(f"{fast[p] / pure[p]:.2f}" for p in PATHS)
                )
            print(line, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main()
