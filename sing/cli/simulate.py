"""`sing simulate`: replay a trace under several policies and compare them side by side."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from sing import scheduler
from sing.config import Config
from sing.digits import ascii_digits
from sing.errors import UserError
from sing.progress import Progress
from sing.scheduler.cluster import Cluster, Node
from sing.scheduler.metrics import NA, offered_load, summarize
from sing.scheduler.nodelist import read_cluster
from sing.scheduler.settings import POLICIES, SchedulerSettings
from sing.scheduler.simulate import Replay, fitting, make_cluster, replay
from sing.scheduler.validation import VALIDATION, compare_waits
from sing.scheduler.workload import Trace, load_site, load_trace
from sing.tables import Column, hours, percent, print_json, render
from sing.times import parse_time, parse_time_or_ago
from sing.traces.read import CensoredLoad
from sing.warehouse.store import Warehouse

SKIP_KEYS = {
    "cpu-only": "skipped_cpu_only",
    "never ran": "skipped_never_ran",
    "censored": "skipped_censored",
    "cannot fit": "skipped_cannot_fit",
}

# The printed comparison table: waits and job completion times (JCT) in hours; "n/a" where a
# figure is undefined (no jobs, a zero-length window), null in --json.
TABLE = (
    Column("policy", "policy"),
    Column("jobs", "jobs"),
    percent("offered_load", "offered", missing=NA),  # GPU-hours asked / GPU-hours there
    percent("gpu_assignment", "assigned", missing=NA),
    percent("busy_assignment", "busy", missing=NA),
    hours("mean_wait_s", "wait mean", missing=NA),
    hours("p50_wait_s", "p50", missing=NA),
    hours("p95_wait_s", "p95", digits=1, missing=NA),
    hours("p99_wait_s", "p99", digits=1, missing=NA),
    hours("max_wait_s", "max", digits=1, missing=NA),
    hours("mean_jct_s", "JCT", missing=NA),
    Column("mean_bounded_slowdown", "bsld", digits=1, missing=NA),
    Column("jain_fairness", "Jain", digits=3, missing=NA),
    hours("worst_user_mean_wait_s", "worst user wait", missing=NA),
    Column("starved_jobs", "starved"),
    Column("jobs_per_s", "jobs/s", digits=0, missing=NA),
)
# "Queues rarely formed" only when the replay measured it: under every policy replayed, at most
# this share of the jobs waited at all, and the mean wait was at most this long. (An offered-load
# formula said so on 3 x 8 GPUs while fcfs's mean wait was 102 h: one long job can block a lightly
# loaded cluster for days.)
QUIET_WAITED_SHARE = 0.05
QUIET_MEAN_WAIT_S = 3600.0
# From this many jobs a replay in pure Python takes long enough to point at the compiled build.
NATIVE_HINT_JOBS = 10_000
# The policy `--validate` replays a site's own record under by default: Slurm's default
# scheduler, sched/backfill, is EASY backfill (the blocked head reserved by the running jobs'
# time limits). A site on sched/builtin (strict FIFO) gives --policy fcfs.
SITE_POLICY = "easy"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        description="Replay a trace (a release of the open format, an SWF log, simple CSV or the "
        "Philly jobs file), or the site's own jobs recorded in the warehouse, on a cluster under "
        "each policy; [scheduler] settings of the config apply. The cluster: the release's node "
        "list (an SWF log's MaxNodes and MaxProcs; the warehouse's node inventory), "
        "--cluster FILE, or --nodes x --gpus-per-node.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace",
        help="release directory (or its jobs.parquet / jobs.csv), SWF log (.swf; one processor "
        "= one GPU), simple CSV or Philly jobs CSV",
    )
    source.add_argument(
        "--from-warehouse",
        action="store_true",
        help="replay the jobs the warehouse recorded (table jobs, synced from the scheduler) on "
        "its node inventory (--warehouse DIR or [site] warehouse)",
    )
    p.add_argument(
        "--include-censored",
        action="store_true",
        help="replay jobs still running at the release end (--until), cut there (default: left "
        "out)",
    )
    p.add_argument("--cluster", metavar="FILE", help="node list CSV: node,gpus,gpu_model")
    p.add_argument("--nodes", type=int, help="nodes of a uniform cluster")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node of a uniform cluster")
    p.add_argument(
        "--policy",
        help="comma-separated (default: all; with --validate fcfs, or easy --from-warehouse)",
    )
    p.add_argument(
        "--since",
        help="only jobs submitted at or after this time: ISO 8601 (UTC), or seconds from the "
        "trace start with an s, e.g. 86400s (--from-warehouse: a time ago instead, e.g. 7d)",
    )
    p.add_argument("--until", help="only jobs submitted before this time (as --since)")
    p.add_argument(
        "--validate",
        action="store_true",
        help="compare simulated waits and starts with those recorded (default policy fcfs; "
        "--from-warehouse easy, the closest to Slurm's backfill)",
    )
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    p.add_argument("--starts-out", metavar="FILE", help="write every job's start and placement")
    p.add_argument("--store", action="store_true", help="store the summaries in the warehouse")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("scheduler", SchedulerSettings)
    validated = SITE_POLICY if args.from_warehouse else "fcfs"
    chosen = args.policy or (validated if args.validate else ",".join(POLICIES))
    policies = [p.strip() for p in chosen.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise UserError(f"--policy {args.policy!r}: choose from {', '.join(POLICIES)}")
    if args.from_warehouse:
        root = config.warehouse_dir(args.warehouse)
        source = str(root)
        trace, since, until = _site(args, Warehouse.existing(root))
    else:
        source = args.trace
        trace = load_trace(args.trace, args.include_censored)
        since, until = when(args.since, "--since", trace), when(args.until, "--until", trace)
    nodes = cluster_of(args, trace, source)
    windowed = trace.workload.window(since, until)
    try:
        cluster = make_cluster(nodes, args.gpus_per_node or 0, settings)
    except ValueError as err:
        raise UserError(f"cluster: {err}") from err
    workload, unfit = fitting(windowed, cluster, settings)
    skipped = {**trace.skipped, "cannot fit": sum(unfit.values())}
    load = offered_load(workload, cluster.total_gpus, since, until)
    _notes(source, skipped, unfit, len(workload))
    if trace.censored is not None and trace.censored.jobs:
        print(censored_line(trace.censored, args.include_censored), file=sys.stderr)
    runs = []
    with Progress("simulate", total=len(policies), unit="policies") as progress:
        for policy in policies:
            progress.update(len(runs), note=f"{policy}, {len(workload):,} jobs")
            runs.append(replay(workload, nodes, args.gpus_per_node or 0, settings, policy))
        progress.update(len(runs))
    extra = {
        **{SKIP_KEYS[k]: n for k, n in skipped.items()},
        **_censored_fields(trace.censored, args.include_censored),
    }
    if args.starts_out:
        write_starts(runs, Path(args.starts_out))
    if args.validate:
        return _report_validation(args, source, runs, extra)
    extra = {"offered_load": load, **extra}
    rows = [{**summarize(r, settings.starvation_s), **extra} for r in runs]
    quiet = quiet_note(rows)
    if quiet:
        print(quiet, file=sys.stderr)
    if args.store:
        run_id = _store(config.warehouse_dir(args.warehouse), source, settings, rows, cluster)
        print(f"stored run {run_id} in table sim_runs", file=sys.stderr)
    if args.json:
        print_json(rows)
    else:
        print(render(rows, TABLE))
    return 0


def _notes(trace: str, skipped: dict[str, int], unfit: Counter[str], jobs: int) -> None:
    """What a reader of the table should know before it: jobs left out, none to replay."""
    if any(skipped.values()):
        print(skip_line(skipped, unfit), file=sys.stderr)
    if not jobs:
        print(f"warning: {trace}: no jobs to replay in this window", file=sys.stderr)
    if jobs >= NATIVE_HINT_JOBS and not scheduler.NATIVE:
        print(
            "note: the replay runs as pure Python; `make native` compiles it (2-4x faster, the "
            "same results: docs/scheduler.md)",
            file=sys.stderr,
        )


def quiet_note(rows: list[dict]) -> str | None:
    """`note: queues rarely formed ...` when the replays measured little queueing: under every
    policy at most QUIET_WAITED_SHARE of the jobs waited at all, for a mean wait of at most
    QUIET_MEAN_WAIT_S. Then the policies can hardly
    differ, whatever the table's small differences. None otherwise, or without jobs."""
    measured = [r for r in rows if r.get("waited_share") is not None]
    if not measured or any(
        r["waited_share"] > QUIET_WAITED_SHARE or r["mean_wait_s"] > QUIET_MEAN_WAIT_S
        for r in measured
    ):
        return None
    shares = [r["waited_share"] for r in measured]
    worst = max(measured, key=lambda r: (r["waited_share"] or 0.0, r["mean_wait_s"] or 0.0))
    return (
        f"note: queues rarely formed: at most {max(shares):.1%} of the jobs waited under any "
        f"policy ({worst['policy']}: mean wait {worst['mean_wait_s'] / 3600:.2f} h), so the "
        "policies can hardly differ here"
    ).replace("%", " %")


def _site(args: argparse.Namespace, warehouse: Warehouse) -> tuple[Trace, float, float]:
    """The warehouse's record of [--since, --until) (default: from its first job to its last
    job sync) and that window in epoch seconds."""
    since, until = _site_time(args.since, "--since"), _site_time(args.until, "--until")
    trace, record = load_site(warehouse, since, until, args.include_censored)
    if record.in_flight:
        print(
            f"note: {record.in_flight:,} GPU jobs submitted before the window held or waited "
            "for GPUs at its start; the replay starts without them, so its first waits may come "
            "out short",
            file=sys.stderr,
        )
    return trace, record.since.timestamp(), record.until.timestamp()


def _site_time(text: str | None, option: str) -> datetime | None:
    """--since/--until of a warehouse replay: ISO 8601 (naive = UTC) or a time ago (7d)."""
    if text is None:
        return None
    try:
        return parse_time_or_ago(text, option)
    except ValueError as err:
        raise UserError(f"{err} (with --from-warehouse, times are absolute or ago)") from None


def cluster_of(args: argparse.Namespace, trace: Trace, source: str) -> int | list[Node]:
    """The node list (--cluster, else the release's or the warehouse's) or the node count of a
    uniform cluster."""
    uniform = args.nodes is not None or args.gpus_per_node is not None
    if args.cluster and uniform:
        raise UserError("give either --cluster FILE or --nodes/--gpus-per-node, not both")
    if args.cluster:
        return read_cluster(args.cluster)
    if uniform:
        if args.nodes is None or args.gpus_per_node is None:
            raise UserError("a uniform cluster needs both --nodes and --gpus-per-node")
        if args.nodes < 1 or args.gpus_per_node < 1:
            raise UserError("--nodes and --gpus-per-node must be >= 1")
        return args.nodes
    if trace.nodes:
        return trace.nodes
    what = (
        "has no node inventory for this window" if args.from_warehouse else "carries no node list"
    )
    raise UserError(
        f"{source} {what}: give the cluster with --cluster FILE (node,gpus,gpu_model) or --nodes "
        "and --gpus-per-node"
    )


def when(text: str | None, option: str, trace: Trace) -> float | None:
    """An ISO 8601 time (naive = UTC), or `<seconds>s` from the trace start, as epoch seconds."""
    if text is None:
        return None
    if text.endswith("s") and ascii_digits(text[:-1].replace(".", "", 1)):
        return trace.origin + float(text[:-1])
    try:
        return parse_time(text).timestamp()
    except ValueError:
        raise UserError(
            f"{option} {text!r} is neither an ISO 8601 time (e.g. 2017-10-02) nor seconds from "
            "the trace start (e.g. 86400s)"
        ) from None


def skip_line(skipped: dict[str, int], unfit: Counter[str]) -> str:
    """`skipped: 2 cpu-only, 1 never ran, 3 cannot fit (model A100 missing: 3)`."""
    why = ", ".join(f"{reason}: {n}" for reason, n in sorted(unfit.items()))
    return "skipped: " + ", ".join(
        f"{n} {reason}" + (f" ({why})" if reason == "cannot fit" and why else "")
        for reason, n in skipped.items()
    )


def censored_line(censored: CensoredLoad, included: bool) -> str:
    """`censored: 32 jobs still running at the end hold 56.0 % of the GPU-time (...)`: a
    release whose long jobs are cut may hold much of its load in them."""
    share = "n/a" if censored.share is None else f"{censored.share:.1%}".replace("%", " %")
    what = (
        "replayed cut at the end (--include-censored)"
        if included
        else "left out; --include-censored replays them cut at the end"
    )
    return (
        f"censored: {censored.jobs:,} jobs still running at the end hold {share} of the "
        f"GPU-time ({censored.gpu_seconds / 3600:,.1f} GPU-hours so far): {what}"
    )


def _censored_fields(censored: CensoredLoad | None, included: bool) -> dict:
    """--json's censored figures: jobs, their share of the GPU-time, whether replayed."""
    if censored is None:
        return {}
    return {
        "censored_jobs": censored.jobs,
        "censored_gpu_share": censored.share,
        "censored_replayed": included,
    }


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
    directory: Path | str,
    source: str,
    settings: SchedulerSettings,
    rows: list[dict],
    cluster: Cluster,
) -> str:
    import pyarrow as pa

    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    from sing.schema import table

    extra = {
        "run_id": run_id,
        "trace": source,
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,  # a mixed cluster's largest node
        "settings": json.dumps(dataclasses.asdict(settings), sort_keys=True),
    }
    stored = set(table("sim_runs").schema.names)  # the table's columns; the rest is printed only
    records = [{k: v for k, v in {**extra, **row}.items() if k in stored} for row in rows]
    Warehouse(directory).append("sim_runs", pa.Table.from_pylist(records))
    return run_id


def _report_validation(
    args: argparse.Namespace, source: str, runs: list[Replay], extra: dict
) -> int:
    rows = [{**compare_waits(r), **extra} for r in runs]
    if not any(r["jobs"] for r in rows):
        raise UserError(f"{source}: no job with a recorded start time to validate against")
    if args.json:
        print_json(rows)
    else:
        print(render(rows, VALIDATION))
    return 0
