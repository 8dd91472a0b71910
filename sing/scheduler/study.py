"""Does backfill keep far more GPUs assigned than FCFS on Philly? The measurements behind the
"paper's shape" tables of docs/scheduler.md, reproducible with `python -m sing.scheduler.study` (a
few minutes; prints markdown).

The SING paper reports ~96% GPU assignment with backfill against ~75% with FCFS on its campus
cluster. The settings here are the ones where FCFS head-of-line blocking should hurt most on
Philly: the whole cluster in a busy week, weeks where large jobs hold most GPU-time, each virtual
cluster (VC) on its own nodes, GPUs-anywhere placement, and power-of-two requests. Nothing is tuned
per setting: every row uses the default settings of its policy, or of the sing rule it names (the
other sing rules without the default's age window, as they were measured before it).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from sing.scheduler.metrics import busy_window
from sing.scheduler.settings import SchedulerSettings
from sing.scheduler.simulate import Replay, replay
from sing.scheduler.workload import Workload, read_trace

TRACES = Path(__file__).resolve().parents[3] / "shared/traces/philly"  # beside the checkout
POLICIES = {
    "fcfs": SchedulerSettings(policy="fcfs"),
    "sing (default: reserve at once, age window 120 h)": SchedulerSettings(policy="sing"),
    "sing (reserve 72 h, no age window)": SchedulerSettings(
        policy="sing", max_head_wait_s=72 * 3600, age_window_after_s=0
    ),
    "sing (reserve 6 h, no age window)": SchedulerSettings(
        policy="sing", max_head_wait_s=6 * 3600, age_window_after_s=0
    ),
    "sing (wait 6 h, no age window)": SchedulerSettings(
        policy="sing", backfill_rule="wait", max_head_wait_s=6 * 3600, age_window_after_s=0
    ),
    "sing (budget 1x, no age window)": SchedulerSettings(
        policy="sing", backfill_rule="budget", age_window_after_s=0
    ),
    "easy": SchedulerSettings(policy="easy"),
    "sjf": SchedulerSettings(policy="sjf"),
}
GPUS_PER_NODE = 8
WEEK_S = 7 * 86400


def week(jobs: Workload, day: str) -> Workload:
    since = datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()
    return jobs.window(since, since + WEEK_S)


def measure(parts: Iterable[tuple[Workload, int]], **options) -> dict[str, dict[str, float]]:
    """Per policy, metrics summed over separately replayed clusters `(jobs, nodes)`."""
    parts = list(parts)
    rows = {}
    for name, base in POLICIES.items():
        settings = SchedulerSettings(**{**base.__dict__, **options})
        busy_gpu_s = busy_s = queued_s = assigned_gpu_s = capacity_s = 0.0
        waits, head_waits = [], []
        for jobs, nodes in parts:
            run = replay(jobs, nodes, GPUS_PER_NODE, settings)
            submit, start, end, gpus = _columns(run)
            allocated, seconds = busy_window(submit, start, end, gpus)
            busy_gpu_s += allocated
            busy_s += seconds * nodes * GPUS_PER_NODE
            queued_s += seconds
            lo, hi = submit.min(), submit.max()
            assigned_gpu_s += (
                gpus * np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None)
            ).sum()
            capacity_s += (hi - lo) * nodes * GPUS_PER_NODE
            waits.append(start - submit)
            head_waits.append(start - head_since(submit, start))
        wait = np.concatenate(waits) / 3600
        rows[name] = {
            "busy": busy_gpu_s / busy_s if busy_s else float("nan"),
            "assigned": assigned_gpu_s / capacity_s,
            "queued_h": queued_s / 3600,
            "mean_wait_h": wait.mean(),
            "p99_wait_h": np.percentile(wait, 99),
            "max_wait_h": wait.max(),
            "head_wait_h": np.concatenate(head_waits).max() / 3600,
            "starved": int((wait > settings.starvation_s / 3600).sum()),
        }
    return rows


def fcfs_idle_by_head(jobs: Workload, nodes: int) -> dict[str, tuple[float, float]]:
    """Under fcfs, while jobs wait: {head size: (share of that time, mean idle GPUs share)}.

    FCFS starts jobs in submit order, so the head at time t is the first job not yet started.
    """
    run = replay(jobs, nodes, GPUS_PER_NODE, POLICIES["fcfs"])
    submit, start, end, gpus = _columns(run)
    total = nodes * GPUS_PER_NODE
    times = np.unique(np.concatenate([submit, start, end]))
    allocated = np.zeros(len(times))
    np.add.at(allocated, np.searchsorted(times, start), gpus)
    np.add.at(allocated, np.searchsorted(times, end), -gpus)
    allocated = np.cumsum(allocated)[:-1]
    length = np.diff(times)
    head = np.searchsorted(np.sort(start), times[:-1], side="right")  # jobs started by then
    head_gpus = np.where(head < len(gpus), gpus[np.minimum(head, len(gpus) - 1)], 0)
    waiting = (head < len(gpus)) & (submit[np.minimum(head, len(gpus) - 1)] <= times[:-1])
    out = {}
    busy = length[waiting].sum()
    for label, lo, hi in (
        ("1 GPU", 1, 1),
        ("2-4 GPUs", 2, 4),
        ("8 GPUs", 5, 8),
        (">8 GPUs", 9, 1e9),
    ):
        sel = waiting & (head_gpus >= lo) & (head_gpus <= hi)
        t = length[sel].sum()
        idle = ((total - allocated[sel]) * length[sel]).sum() / (t * total) if t else 0.0
        out[label] = (t / busy if busy else 0.0, idle)
    return out


def head_since(submit: np.ndarray, start: np.ndarray) -> np.ndarray:
    """When each job (in submit order) became the oldest waiting one: its submit, or the latest
    start of an older job if later. Its start minus this is how long it waited at the head."""
    older_started = np.maximum.accumulate(np.concatenate([[-np.inf], start[:-1]]))
    return np.maximum(submit, older_started)


def _columns(run: Replay) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    submit = np.asarray(run.workload.submit)
    start = np.asarray(run.start)
    return submit, start, start + np.asarray(run.workload.duration), np.asarray(run.gpus, float)


def table(title: str, rows: dict[str, dict[str, float]]) -> str:
    lines = [
        f"**{title}**",
        "",
        "| policy | busy | assigned | queue h | mean wait h | p99 h | max h | head h | starved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {100 * r['busy']:.1f}% | {100 * r['assigned']:.1f}% | "
            f"{r['queued_h']:,.0f} | {r['mean_wait_h']:.2f} | {r['p99_wait_h']:.1f} | "
            f"{r['max_wait_h']:.1f} | {r['head_wait_h']:.1f} | {r['starved']:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    jobs = read_trace(TRACES / "philly_pollux_jobs.csv")
    with (TRACES / "philly_vc_nodes_helios.csv").open(newline="") as f:
        vc_nodes = {row["vc"]: int(row["node num"]) for row in csv.DictReader(f)}
    settings = [
        (
            "Busy week 2017-10-17 (the paper's gap), 28x8, pack",
            [(week(jobs, "2017-10-17"), 28)],
            {},
        ),
        (
            "Whole cluster, week of 2017-10-23 (7,748 jobs), 64x8, pack",
            [(week(jobs, "2017-10-23"), 64)],
            {},
        ),
        (
            "Same, placement any (GPUs anywhere)",
            [(week(jobs, "2017-10-23"), 64)],
            {"placement": "any"},
        ),
        ("Same, power-of-two requests", [(week(jobs, "2017-10-23"), 64)], {"power_of_two": True}),
        (
            "Large-job week 2017-11-20 (76% of GPU-time in >= 8-GPU jobs), 32x8",
            [(week(jobs, "2017-11-20"), 32)],
            {},
        ),
        ("Same week, 24x8", [(week(jobs, "2017-11-20"), 24)], {}),
        ("Large-job week 2017-11-27 (68%), 40x8", [(week(jobs, "2017-11-27"), 40)], {}),
    ]
    per_vc = [(_only(jobs, vc), n) for vc, n in vc_nodes.items()]
    half_vc = [(_only(jobs, vc), max(1, n // 2)) for vc, n in vc_nodes.items()]
    settings += [
        ("Each VC on its own nodes (Helios sizes, 11 VCs), summed", per_vc, {}),
        (
            "Each VC on half its nodes (the file holds ~51% of Philly's GPU-time), summed",
            half_vc,
            {},
        ),
    ]
    for title, parts, options in settings:
        parts = [(_fitting(j, n), n) for j, n in parts]
        print(table(title, measure(parts, **options)))
    print("**Under fcfs, while jobs wait: the head's size, share of that time, idle GPUs then**\n")
    print("| setting | head | share of waiting time | idle GPUs |")
    print("|---|---|---|---|")
    for title, day, nodes in (
        ("week 2017-10-23, 64x8", "2017-10-23", 64),
        ("week 2017-11-20, 24x8", "2017-11-20", 24),
    ):
        for label, (share, idle) in fcfs_idle_by_head(week(jobs, day), nodes).items():
            print(f"| {title} | {label} | {100 * share:.0f}% | {100 * idle:.1f}% |")


def _only(jobs: Workload, vc: str) -> Workload:
    return jobs.select([k for k, user in enumerate(jobs.user) if user == vc])


def _fitting(jobs: Workload, nodes: int) -> Workload:
    """Jobs the cluster can hold at all (a few VCs got jobs larger than the VC)."""
    return jobs.select([k for k, g in enumerate(jobs.num_gpus) if g <= nodes * GPUS_PER_NODE])


if __name__ == "__main__":
    main()
