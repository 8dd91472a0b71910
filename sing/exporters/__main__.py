"""`python -m sing.exporters`: the exporter alone, for GPU nodes that install only what it needs.

It takes the same options as `sing exporter` but imports no other part of sing, so a node needs
just prometheus-client, nvidia-ml-py, PyYAML and bcrypt (the systemd unit runs it this way).
"""

from __future__ import annotations

import argparse
import logging
import sys

from sing.config import CONFIG_HELP, Config, ConfigError
from sing.errors import UserError
from sing.exporters.cli import DESCRIPTION, add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sing.exporters", description=DESCRIPTION)
    parser.add_argument("--config", help=CONFIG_HELP)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(args, Config.load(args.config))
    except (ConfigError, UserError) as err:
        print(f"python -m sing.exporters: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
