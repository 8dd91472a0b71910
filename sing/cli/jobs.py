"""`sing submit`, `sing run --local`, `sing jobs sync|list|cancel`."""

from __future__ import annotations

import argparse
import sys

from sing.config import Config
from sing.errors import UserError
from sing.executors.base import executor_settings, make_executor
from sing.executors.local import LocalExecutor
from sing.executors.profile import JobProfile, load_profile
from sing.executors.records import COMPLETED
from sing.executors.sync import sync
from sing.jobids import job_order_sql
from sing.tables import Column, hours, print_json, render
from sing.times import time_option
from sing.warehouse.store import Warehouse

LIST_SQL = f"""
SELECT job_id, "user", partition, name, state, exit_code, num_nodes, num_gpus,
       nodes, submit_time,
       date_diff('second', start_time, coalesce(end_time, now())) AS run_s
FROM jobs
WHERE cluster = $cluster AND ($state IS NULL OR state = $state)
  AND ($user IS NULL OR "user" = $user) AND ($since IS NULL OR submit_time >= $since)
ORDER BY submit_time DESC NULLS LAST, {job_order_sql(descending=True)}
LIMIT $limit
"""
LIST_COLUMNS = (
    Column("job_id", "job"),
    Column("user", "user", missing="-"),
    Column("partition", "partition", missing="-"),
    Column("name", "name", missing="-", width=24),
    Column("state", "state"),
    Column("exit_code", "exit", missing="-"),
    Column("num_nodes", "nodes", missing="-"),  # a count, as in every report
    Column("num_gpus", "GPUs", missing="-"),
    Column("nodes", "node list", missing="-", width=32),
    Column("submit_time", "submitted (UTC)", missing="-"),
    hours("run_s", "run", missing="-"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    submit = subparsers.add_parser("submit")
    submit.add_argument("profile", help="job profile YAML file")
    submit.add_argument("--executor", choices=("local", "slurm"), help="override [executor] kind")
    submit.set_defaults(func=cmd_submit)

    run = subparsers.add_parser("run")
    run.add_argument("--local", action="store_true", required=True, help="on this machine's GPUs")
    run.add_argument("profile", help="job profile YAML file")
    run.set_defaults(func=cmd_run)

    jobs = subparsers.add_parser("jobs")
    sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    sync_p = sub.add_parser("sync", help="pull running and finished jobs into the warehouse")
    sync_p.add_argument("--executor", choices=("local", "slurm"), help="override [executor] kind")
    sync_p.set_defaults(func=cmd_sync)
    list_p = sub.add_parser("list", help="jobs in the warehouse, newest first")
    list_p.add_argument("--state", default="all", help="only this state, e.g. RUNNING, FAILED")
    list_p.add_argument("--user", help="only this user's jobs")
    list_p.add_argument(
        "--since", type=time_option, help="only jobs submitted from (ISO 8601, UTC)"
    )
    list_p.add_argument("--limit", type=int, default=50)
    list_p.add_argument("--json", action="store_true", help="machine-readable output")
    list_p.set_defaults(func=cmd_list)
    cancel = sub.add_parser("cancel", help="cancel a job")
    cancel.add_argument("job_id")
    cancel.add_argument("--executor", choices=("local", "slurm"), help="override [executor] kind")
    cancel.set_defaults(func=cmd_cancel)


def _profile(args: argparse.Namespace, config: Config) -> JobProfile:
    profile = load_profile(args.profile, executor_settings(config))
    for note in profile.notes:
        print(f"sing: note: {note}", file=sys.stderr)
    return profile


def cmd_submit(args: argparse.Namespace, config: Config) -> int:
    profile = _profile(args, config)
    executor = make_executor(config, args.executor)
    print(executor.submit(profile))
    return 0


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    profile = _profile(args, config)
    settings = executor_settings(config)
    executor = LocalExecutor.from_settings(config.site.cluster, settings, config)
    job_id = executor.enqueue(profile)
    print(f"sing: local job {job_id}", file=sys.stderr)
    record = executor.supervise(job_id, output=None)  # the job writes to this terminal
    gpus = ",".join(map(str, record.gpus.get(executor.node, ()))) or "none"
    print(
        f"sing: job {job_id} {record.state} exit {record.exit_code} (GPUs {gpus})", file=sys.stderr
    )
    if record.state == COMPLETED:
        return 0
    return min(record.exit_code, 255) if record.exit_code else 1


def cmd_sync(args: argparse.Namespace, config: Config) -> int:
    wh = Warehouse(config.warehouse_dir(args.warehouse))
    wh.require_writable()  # the first sync creates a new site's warehouse
    result = sync(make_executor(config, args.executor), wh, executor_settings(config))
    print(
        f"synced {result.finished} finished and {result.running} running jobs "
        f"({result.gpu_rows} GPU rows) since {result.since:%Y-%m-%d %H:%M:%S} UTC"
    )
    return 0


def cmd_list(args: argparse.Namespace, config: Config) -> int:
    if args.limit < 1:
        raise UserError(f"--limit {args.limit}: give how many jobs to list, 1 or more")
    con = Warehouse(config.warehouse_dir(args.warehouse)).connect({"jobs": None})
    state = None if args.state.upper() == "ALL" else args.state.upper()
    cluster = config.site.cluster
    params = {"cluster": cluster, "state": state, "user": args.user, "since": args.since}
    cursor = con.execute(LIST_SQL, params | {"limit": args.limit})
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    if args.json:
        print_json(rows)
    elif rows:
        print(render(rows, LIST_COLUMNS))
    else:
        which = [f"state {state}"] if state else []
        which += [f"user {args.user}"] if args.user else []
        which += [f"submitted since {args.since:%Y-%m-%d %H:%M} UTC"] if args.since else []
        held = con.execute("SELECT count(*) FROM jobs WHERE cluster = ?", [cluster]).fetchone()[0]
        print(
            f"no jobs of cluster {cluster}"
            + (f" with {', '.join(which)}" if which else "")
            + f" in the warehouse (it holds {held:,} of that cluster's)"
        )
    return 0


def cmd_cancel(args: argparse.Namespace, config: Config) -> int:
    make_executor(config, args.executor).cancel(args.job_id)
    print(f"cancelled {args.job_id}")
    return 0
