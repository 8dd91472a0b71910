"""`sing demo`: start the live simulated campus cluster (see sing.demo.run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sing.config import Config
from sing.demo.run import Demo, DemoOptions, default_home
from sing.warehouse.synthetic import SAMPLE_S


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run a live simulated campus cluster end to end")
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
