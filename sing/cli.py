"""The `sing` command. Each part of the system registers its own subcommands.

A part's `cli` module exposes `register(subparsers)`; the parsers it adds set `func`, which is
called as `func(args, config) -> int`. Keeping the wiring here and the commands beside their code
means adding a subcommand never touches another part.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from sing.config import Config, ConfigError
from sing.errors import UserError

# Modules that contribute subcommands, in the order `sing --help` lists them.
COMMAND_MODULES = (
    "warehouse.cli",
    "warehouse.reports_cli",
    "scheduler.cli",
    "executors.cli",
    "exporters.cli",
    "collector.cli",
    "dashboards.cli",
    "traces.cli",
    "demo.cli",
    "sing.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sing",
        description="Telemetry, accounting and trace analytics for shared campus GPU clusters.",
    )
    parser.add_argument("--config", help="site config file (default: $SING_CONFIG, ./sing.toml)")
    parser.add_argument(
        "--warehouse", help="warehouse directory (default: $SING_WAREHOUSE, then [site] warehouse)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        config = Config.load(args.config)
        return int(args.func(args, config) or 0)
    except ConfigError as err:
        print(f"sing: configuration error: {err}", file=sys.stderr)
        return 2
    except UserError as err:
        print(f"sing: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
