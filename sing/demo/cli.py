"""`sing demo`: start the live simulated campus cluster (see sing.demo.run); `sing demo-data`: a
synthetic history into the warehouse (sing.demo.synthetic)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sing.config import Config
from sing.demo.run import Demo, DemoOptions, default_home
from sing.demo.synthetic import SAMPLE_S, check_size, generate_whole
from sing.errors import UserError
from sing.progress import Progress
from sing.times import time_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo")
    p.add_argument("--home", type=Path, help="demo files (default: $SING_DEMO_HOME or var/demo)")
    p.add_argument("--reset", action="store_true", help="start over with a new warehouse")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--speed", type=float, default=120.0, help="simulated seconds per second")
    p.add_argument(
        "--interval",
        type=float,
        default=SAMPLE_S,
        help="scrape interval, seconds (default: the history's step)",
    )
    p.add_argument("--history-days", type=float, default=7.0, help="history seeded on first run")
    p.add_argument("--port-base", type=int, default=9500, help="exporter ports start here")
    p.add_argument("--dashboard-port", type=int, default=8501)
    p.add_argument("--collector-metrics-port", type=int, default=9499)
    p.add_argument("--no-dashboard", action="store_true", help="run without the dashboard")
    p.set_defaults(func=cmd_demo)

    demo = subparsers.add_parser("demo-data")
    demo.add_argument("--nodes", type=int, default=16)
    demo.add_argument("--gpus-per-node", type=int, default=8)
    demo.add_argument("--days", type=float, default=14)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--end", type=time_option, help="end of the history (default: now)")
    demo.set_defaults(func=cmd_demo_data)


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    options = DemoOptions(
        home=(args.home or default_home()).resolve(),
        port_base=args.port_base,
        dashboard_port=args.dashboard_port,
        collector_metrics_port=args.collector_metrics_port,
        interval_s=args.interval,
        speed=args.speed,
        history_days=args.history_days,
        duration_s=args.duration,
        reset=args.reset,
        dashboard=not args.no_dashboard,
    )
    return Demo(options).run()


def cmd_demo_data(args: argparse.Namespace, config: Config) -> int:
    root = config.warehouse_dir(args.warehouse)
    if not isinstance(root, Path):  # the generator writes Parquet files straight into days
        raise UserError(f"demo-data writes a local directory, not {root}: give --warehouse DIR")
    check_size(args.nodes, args.gpus_per_node, args.days)  # before the directory is created
    with Progress("demo-data", total=round(args.days * 24), unit="h of history") as progress:
        counts = generate_whole(
            root,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            days=args.days,
            seed=args.seed,
            end=args.end,
            cluster=config.site.cluster,
            on_progress=lambda seconds: progress.update(round(seconds / 3600)),
        )
    print(f"wrote {counts} into {root}")
    return 0
