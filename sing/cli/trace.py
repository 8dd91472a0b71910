"""`sing trace ...`: export, import, validate, summarise and convert job traces."""

from __future__ import annotations

import argparse
import json

import pyarrow.compute as pc

from sing.config import Config
from sing.progress import Progress
from sing.tables import print_json
from sing.times import time_option
from sing.traces import aggregates, compare, linkage
from sing.traces.export import export_trace
from sing.traces.importers import FORMATS, import_trace
from sing.traces.importers.swf import SLOT_NOTE
from sing.traces.read import read_nodes, read_package, read_table
from sing.traces.settings import TraceSettings, load_key
from sing.traces.swf import write_swf
from sing.traces.validate import validate
from sing.warehouse.store import Warehouse


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace")
    sub = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    p = sub.add_parser("export", help="export an anonymized trace of a time window")
    p.add_argument(
        "--since", required=True, type=time_option, help="window start (UTC), e.g. 2025-01-01"
    )
    p.add_argument("--until", required=True, type=time_option, help="window end (UTC, exclusive)")
    p.add_argument("--out", required=True, help="new directory to write the trace to")
    p.add_argument("--key-file", help="secret HMAC key (hex), created if missing")
    p.add_argument("--timeseries", action="store_true", help="add per-minute job_timeseries")
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "attack", help="try to re-identify users in the release each policy would give"
    )
    p.add_argument(
        "--since", required=True, type=time_option, help="window start (UTC), e.g. 2025-01-01"
    )
    p.add_argument("--until", required=True, type=time_option, help="window end (UTC, exclusive)")
    p.add_argument("--only-configured", action="store_true", help="attack the [trace] policy only")
    p.add_argument("--json", action="store_true", help="one JSON object per policy")
    p.set_defaults(func=_attack)

    p = sub.add_parser("import", help="import a public trace into the open format")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument(
        "file", help="the source file (Philly: .csv jobs file or .json job log; SWF: .swf log)"
    )
    p.add_argument("--out", required=True, help="new directory to write the trace to")
    p.add_argument("--timezone", help="zone of naive times in the source (default per format)")
    p.add_argument(
        "--nodes",
        metavar="NODE_LIST",
        help="CSV of the cluster's nodes (sn,gpu,model or node,gpus,gpu_model): the nodes table",
    )
    p.set_defaults(func=_import)

    p = sub.add_parser("validate", help="check a trace against its datapackage.json")
    p.add_argument("dir")
    p.set_defaults(func=_validate)

    p = sub.add_parser("summary", help="print a trace's aggregates")
    p.add_argument("dir")
    p.set_defaults(func=_summary)

    p = sub.add_parser("swf", help="write a trace as Standard Workload Format")
    p.add_argument("dir")
    p.add_argument("--out", required=True, help="SWF file to write")
    p.set_defaults(func=_swf)


def _export(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("trace", TraceSettings)
    key_file = args.key_file or (
        str(config.resolve_path(settings.key_file)) if settings.key_file else ""
    )
    warehouse = Warehouse.existing(config.warehouse_dir(args.warehouse))
    with Progress("trace export"):
        result = export_trace(
            warehouse,
            args.since,
            args.until,
            args.out,
            key=load_key(key_file),
            settings=settings,
            timeseries=args.timeseries,
        )
    print(
        f"wrote {result.path}: {result.jobs} jobs, {result.aggregates['gpu_hours']:.1f} GPU-hours; "
        f"{result.suppressed_jobs} jobs left out by the k={settings.k} policy"
    )
    return 0


def _attack(args: argparse.Namespace, config: Config) -> int:
    """Each policy's release, built in memory with a fresh key and attacked with what
    `sacct -a` shows; nothing is written."""
    settings = config.section("trace", TraceSettings)
    wh = Warehouse.existing(config.warehouse_dir(args.warehouse))
    public = linkage.public_view(wh, args.since, args.until)
    chosen = (
        compare.scenarios(settings)[:1] if args.only_configured else compare.scenarios(settings)
    )
    key = load_key(None)
    results = []
    with Progress("trace attack", total=len(chosen), unit="policies") as progress:
        for name, option in chosen:
            progress.update(len(results), note=name)
            results.append(compare.evaluate(wh, args.since, args.until, option, key, name, public))
        progress.update(len(results))
    if args.json:
        print_json(result.as_dict() for result in results)
        return 0
    print(
        f"{'policy':<28} {'jobs':>7} {'left out':>8} {'GPU-h kept':>10} {'users':>5} "
        f"{'users linked':>14} {'jobs linked':>14} {'wrong':>6} {'run KS':>6} {'queue KS':>8}"
        "  export"
    )
    for r in results:
        print(
            f"{r.scenario:<28} {r.jobs:>7,} {r.left_out:>8,} {r.gpu_hours_pct:>8.1f} % "
            f"{r.users:>5,} {r.users_linked:>5,} ({r.users_pct:5.1f} %) "
            f"{r.jobs_linked:>5,} ({r.jobs_pct:5.1f} %) "
            f"{r.wrong_claims:>6,} {_ratio(r.run_ks):>6} {_ratio(r.queue_ks):>8}  "
            + ("refused" if r.refused else "writes")
        )
    print(
        "users/jobs linked: named correctly by the strongest of the attacks; wrong: jobs named "
        "wrongly; KS: 0-1"
    )
    for r in results:
        if r.refused:
            print(f"{r.scenario}: `sing trace export` would write nothing: {r.refused}")
    configured = results[0]
    if configured.privacy is not None:
        print(f"\nPrivacy report of the configured policy ({configured.scenario}):")
        print("\n".join(configured.privacy.lines()))
    return 0


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _import(args: argparse.Namespace, config: Config) -> int:
    path = import_trace(args.format, args.file, args.out, args.timezone, args.nodes)
    figures = json.loads((path / "aggregates.json").read_text())
    nodes = read_nodes(path)
    gpus = 0 if nodes is None else pc.sum(nodes["gpus"]).as_py() or 0
    cluster = "" if nodes is None else f"; {nodes.num_rows} nodes, {gpus} GPUs"
    print(f"wrote {path}: {figures['jobs']} jobs, {figures['gpu_hours']:.1f} GPU-hours{cluster}")
    if args.format == "swf":
        print(f"note: {SLOT_NOTE}: its GPU figures are the log's processor figures")
    return 0


def _validate(args: argparse.Namespace, config: Config) -> int:
    problems = validate(args.dir)
    for problem in problems:
        print(f"{args.dir}: {problem}")
    if problems:
        print(f"{args.dir}: INVALID ({len(problems)} problem(s))")
        return 1
    print(f"{args.dir}: valid")
    return 0


def _summary(args: argparse.Namespace, config: Config) -> int:
    package = read_package(args.dir)
    jobs = read_table(args.dir)
    series = (
        read_table(args.dir, "job_timeseries")
        if (any(r.get("name") == "job_timeseries" for r in package.get("resources", [])))
        else None
    )
    figures = aggregates.compute(jobs, series)
    print(f"{package.get('title')}  (format {package['sing_format']['version']})")
    print(f"release start {package['release_start']}  end {package.get('release_end') or '-'}")
    for key, value in figures.items():
        shown = f"{value:,.1f}" if isinstance(value, float) else value
        print(f"  {key:<16} {shown}")
    return 0


def _swf(args: argparse.Namespace, config: Config) -> int:
    jobs = write_swf(args.dir, args.out)
    print(f"wrote {args.out}: {jobs} jobs")
    return 0
