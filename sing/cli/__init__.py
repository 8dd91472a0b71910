"""The `sing` command: a table of subcommands, each registered by its own module.

A command module exposes `register(subparsers)`; the parsers it adds set `func`, which is called
as `func(args, config) -> int`. The table below names each command's module and one-line help,
so `sing --help` lists every command without importing any, and a command imports only its own
module: `sing exporter` on a GPU node (installed without the head node's engines) never loads
DuckDB, polars or Streamlit, and a head-node command there says which install it needs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from sing.config import CONFIG_HELP, Config, ConfigError
from sing.errors import UsageError, UserError


@dataclass(frozen=True)
class Command:
    module: str  # registers the command: `register(subparsers)`
    help: str  # its line in `sing --help`


# Every subcommand, in the order `sing --help` lists them.
COMMANDS = {
    "warehouse": Command("sing.cli.warehouse", "import data, query, maintain the warehouse"),
    "report": Command("sing.cli.reports", "cluster, fairness and efficiency reports"),
    "job": Command("sing.cli.reports", "one job's efficiency report with notes"),
    "demo-data": Command("sing.demo.cli", "write a synthetic campus history"),
    "simulate": Command(
        "sing.cli.simulate", "replay a job trace under scheduling policies and compare them"
    ),
    "submit": Command("sing.cli.jobs", "submit a job profile to the configured executor"),
    "run": Command("sing.cli.jobs", "run a job profile here, in the foreground"),
    "jobs": Command("sing.cli.jobs", "job records: sync from the executor, list, cancel"),
    "exporter": Command(
        "sing.exporters.cli", "serve this node's GPU, RDMA and job metrics to Prometheus"
    ),
    "collector": Command("sing.cli.collector", "scrape exporters into the warehouse on a schedule"),
    "dashboard": Command(
        "sing.dashboards.cli", "serve the web dashboards (Streamlit) over the warehouse"
    ),
    "trace": Command("sing.cli.trace", "anonymized job traces: export, import, validate"),
    "demo": Command("sing.demo.cli", "run a live simulated campus cluster end to end"),
    "policy": Command("sing.cli.policy", "waste policies: check, run a round, the log"),
    "incident": Command("sing.cli.incident", "hardware and service incidents"),
    "health": Command("sing.cli.health", "failure metrics and nodes to drain"),
    "doctor": Command("sing.cli.doctor", "check a GPU node or the head node's setup"),
}
GLOBAL_OPTIONS_WITH_VALUE = ("--config", "--warehouse")


class Parser(argparse.ArgumentParser):
    """A parser whose subcommands also take the global options, so `sing report cluster
    --warehouse DIR` means `sing --warehouse DIR report cluster`.

    `add_subparsers` makes every subcommand's parser of this class. There the options default to
    SUPPRESS: one given before the command stays unless the same option follows it (the later
    one wins, as with any repeated option)."""

    def __init__(self, *args, global_defaults: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        unset = {} if global_defaults else {"default": argparse.SUPPRESS}
        self.add_argument("--config", help=CONFIG_HELP, **unset)
        self.add_argument(
            "--warehouse",
            help="warehouse directory (default: $SING_WAREHOUSE, then [site] warehouse)",
            **unset,
        )
        self.add_argument(
            "-v", "--verbose", action="store_true", help="log debug messages", **unset
        )


# What DuckDB raises when Ctrl-C stops a query: it takes Python's KeyboardInterrupt and raises
# this plain RuntimeError instead (DuckDB 2.0; tests/test_interrupts.py sees it so).
DUCKDB_INTERRUPTED = "Query interrupted"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s module, or (no known command) the list of every command."""
    parser = Parser(
        prog="sing",
        description="Telemetry, accounting and trace analytics for shared campus GPU clusters.",
        global_defaults=True,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command in COMMANDS:
        _command_module(command).register(subparsers)
    else:  # the list alone: each command's options come with its module
        for name, known in COMMANDS.items():
            subparsers.add_parser(name, help=known.help, add_help=False)
    return parser


def _command_module(command: str) -> ModuleType:
    """The module that registers `command`. A library it needs that is not installed is a
    UserError naming the install that brings it: a GPU node's (`pip install sing`) has only the
    exporter's, and a head-node command there would otherwise end in a traceback."""
    try:
        return importlib.import_module(COMMANDS[command].module)
    except ModuleNotFoundError as err:
        if not err.name or err.name.split(".")[0] == "sing":
            raise
        raise UserError(
            f"`sing {command}` needs {err.name.split('.')[0]}, which this install lacks: a GPU "
            f"node's install has only the exporter; the head node's is pip install 'sing[head]'"
        ) from None


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as err:
        if not _interrupted_in_duckdb(err):
            raise
        return _interrupted()


def _interrupted_in_duckdb(err: Exception) -> bool:
    """DuckDB takes Python's KeyboardInterrupt and raises its own error instead: a RuntimeError
    ("Query interrupted") from a query, or one of its errors naming the KeyboardInterrupt when
    the Ctrl-C came while it read a registered Arrow table."""
    if isinstance(err, RuntimeError) and str(err) == DUCKDB_INTERRUPTED:
        return True
    return type(err).__module__.lstrip("_") == "duckdb" and "KeyboardInterrupt" in str(err)


def _interrupted() -> int:
    """Every warehouse write commits whole or not at all (docs/warehouse.md), so what the
    interrupt cut short (loading the command's modules, or the command) left no trace, and
    running the command again finishes it."""
    print(
        "sing: interrupted; what was not finished was not written (run it again)", file=sys.stderr
    )
    return 128 + signal.SIGINT


def _run(argv: list[str]) -> int:
    try:
        parser = build_parser(_command_in(argv))
        args = parser.parse_args(argv)
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        config = Config.load(args.config)
        with _missing_warehouse_is_an_error():
            code = int(args.func(args, config) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except ConfigError as err:
        print(f"sing: configuration error: {err}", file=sys.stderr)
        return 2
    except UserError as err:
        print(f"sing: {err}", file=sys.stderr)
        return 2 if isinstance(err, UsageError) else 1
    except PermissionError as err:
        print(
            f"sing: {_os_error(err)}; ask for access, or give another --warehouse", file=sys.stderr
        )
        return 1
    except (FileExistsError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
        print(f"sing: {_os_error(err)}; check the path", file=sys.stderr)
        return 1


def _os_error(err: OSError) -> str:
    """`permission denied: PATH`, the words a person reads, without Python's errno repr."""
    where = f": {err.filename}" if err.filename else ""
    return f"{(err.strerror or str(err)).lower()}{where}"


@contextmanager
def _missing_warehouse_is_an_error() -> Iterator[None]:
    """A read command on a warehouse that does not exist is an error, not an empty answer;
    the first write creates it. Only a command whose module loaded the warehouse needs the
    switch (importing it here would load DuckDB for `sing exporter` too), and it is undone
    after the command, for callers of `main` in a longer-lived process (tests)."""
    store = sys.modules.get("sing.warehouse.store")
    if store is None:
        yield
        return
    store.Warehouse.opening_creates = False
    try:
        yield
    finally:
        store.Warehouse.opening_creates = True


def _reader_gone() -> int:
    """The reader of stdout went away (`sing report jobs | head -1`): stop without a traceback
    and exit as a tool killed by SIGPIPE does (141), the shells' convention. What is still
    buffered goes to /dev/null, so Python's own flush at exit finds no broken pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named in `argv` (the first word that is no global option or its value)."""
    words = iter(argv)
    for word in words:
        if word in GLOBAL_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None
