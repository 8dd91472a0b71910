"""`sing simulate`: replay a trace under several policies and compare them side by side."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from scheduler.metrics import summarize
from scheduler.settings import POLICIES, SchedulerSettings
from scheduler.simulate import Replay, replay
from scheduler.workload import read_trace
from sing.config import Config
from sing.errors import UserError
from sing.progress import Progress
from sing.tables import Column, hours, percent, render

# The printed comparison table: waits and job completion times (JCT) in hours.
TABLE = (
    Column("policy", "policy"),
    percent("gpu_assignment", "assigned"),
    percent("busy_assignment", "busy"),
    hours("mean_wait_s", "wait mean"),
    hours("p50_wait_s", "p50"),
    hours("p95_wait_s", "p95", digits=1),
    hours("p99_wait_s", "p99", digits=1),
    hours("max_wait_s", "max", digits=1),
    hours("mean_jct_s", "JCT"),
    Column("mean_bounded_slowdown", "bsld", digits=1),
    Column("jain_fairness", "Jain", digits=3),
    hours("worst_user_mean_wait_s", "worst user wait"),
    Column("starved_jobs", "starved"),
    Column("jobs_per_s", "jobs/s", digits=0),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a job trace under scheduling policies and compare them",
        description="Replay a trace (simple CSV or the Philly jobs file) on NODES x GPUS_PER_NODE "
        "GPUs under each policy; [scheduler] settings of the config apply.",
    )
    p.add_argument("--trace", required=True, help="trace file (simple CSV or Philly jobs CSV)")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--policy", default=",".join(POLICIES), help="comma-separated (default: all)")
    p.add_argument("--since", help="only jobs submitted at or after this ISO time (UTC)")
    p.add_argument("--until", help="only jobs submitted before this ISO time (UTC)")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    p.add_argument("--starts-out", metavar="FILE", help="write every job's start and placement")
    p.add_argument("--store", action="store_true", help="store the summaries in the warehouse")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("scheduler", SchedulerSettings)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise UserError(f"--policy {args.policy!r}: choose from {', '.join(POLICIES)}")
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise UserError("--nodes and --gpus-per-node must be >= 1")
    workload = read_trace(args.trace).window(
        _when(args.since, "--since"), _when(args.until, "--until")
    )
    if not len(workload):
        raise UserError(f"{args.trace}: no jobs submitted between --since and --until")
    runs = []
    with Progress("simulate", total=len(policies), unit="policies") as progress:
        for policy in policies:
            progress.update(len(runs), note=f"{policy}, {len(workload):,} jobs")
            try:
                runs.append(replay(workload, args.nodes, args.gpus_per_node, settings, policy))
            except ValueError as err:
                raise UserError(f"{args.trace}: {err}") from err
        progress.update(len(runs))
    rows = [summarize(r, settings.starvation_s) for r in runs]
    if args.starts_out:
        write_starts(runs, Path(args.starts_out))
    if args.store:
        run_id = _store(config.warehouse_dir(args.warehouse), args, settings, rows)
        print(f"stored run {run_id} in table sim_runs", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render(rows, TABLE))
    return 0


def write_starts(runs: list[Replay], path: Path) -> None:
    """One row per policy and job: times in epoch seconds, placement as `node:0,1;node2:0`."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            ["policy", "job_id", "submit_time", "start_time", "end_time", "num_gpus", "placement"]
        )
        for r in runs:
            jobs = r.workload
            for k in range(len(jobs)):
                where = ";".join(
                    f"{node}:{','.join(map(str, g))}" for node, g in r.placement(k).items()
                )
                writer.writerow(
                    [
                        r.policy,
                        jobs.job_id[k],
                        repr(jobs.submit[k]),
                        repr(r.start[k]),
                        repr(r.start[k] + jobs.duration[k]),
                        r.gpus[k],
                        where,
                    ]
                )


def _store(
    directory: Path, args: argparse.Namespace, settings: SchedulerSettings, rows: list[dict]
) -> str:
    import pyarrow as pa

    from warehouse.store import Warehouse

    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    extra = {
        "run_id": run_id,
        "trace": str(args.trace),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "settings": json.dumps(dataclasses.asdict(settings), sort_keys=True),
    }
    Warehouse(directory).append(
        "sim_runs", pa.Table.from_pylist([{**extra, **row} for row in rows])
    )
    return run_id


def _when(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"{option} {text!r} is not an ISO 8601 time, e.g. 2017-10-02") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
