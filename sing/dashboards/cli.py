"""`sing dashboard`: serve the Streamlit app over the warehouse.

Streamlit owns its server and event loop, so the app runs as `streamlit run` in a child process;
the config file and warehouse reach it through the environment (SING_CONFIG, SING_WAREHOUSE),
which `Config.load` reads there as it does here. Demo mode (no sign-in, a role chooser) does not:
an environment is inherited unseen from a shell or a unit file, so demo mode would switch on
where nobody asked for it. It is passed as the script's own argument (`streamlit run app.py --
--demo`), which only this command writes; a SING_DASHBOARD_DEMO found in the environment is
ignored, and said to be.

The server runs through `serve` (`python -m sing.dashboards.cli run ...`), not `streamlit` itself:
Streamlit treats an entry script with a `pages/` folder beside it as an old-style multipage app
until some session's run calls `st.navigation`, so a page URL opened first after a start ran the
page file alone (no sign-in, Streamlit's raw page list). `serve` turns that mode off before the
server starts, so every URL goes through app.py from the first request.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sing.config import Config, ConfigError
from sing.dashboards.identity import read_proxy_secret
from sing.dashboards.settings import DashboardSettings

APP = Path(__file__).with_name("app.py")
# The app's argument that turns demo mode on (sing.dashboards.app reads it from its sys.argv).
DEMO_ARG = "--demo"
# The environment variable that once switched demo mode on: now only reported as ignored.
DEMO_ENV = "SING_DASHBOARD_DEMO"
# What the start-up line and every page's banner say while demo mode is on.
DEMO_WORDS = "Demo mode: no sign-in, anyone may choose any role"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard",
        description="Serve the dashboards. Identity comes from [dashboard] auth (OIDC sign-in, or "
        "a reverse proxy's header with the proxy's secret); --demo lets visitors in without "
        "signing in, and says so.",
    )
    p.add_argument("--port", type=int, help="TCP port (default: [dashboard] port, 8501)")
    p.add_argument("--address", help="address to listen on (default: [dashboard] address)")
    p.add_argument(
        "--demo", action="store_true", help="no sign-in: visitors pick a role (for demos only)"
    )
    p.set_defaults(func=run)


def streamlit_command(
    args: argparse.Namespace, settings: DashboardSettings, demo: bool = False
) -> list[str]:
    """`streamlit run` of the app; `demo` passes DEMO_ARG to the app, after `--`."""
    return [
        sys.executable,
        "-m",
        "sing.dashboards.cli",
        "run",
        str(APP),
        "--server.headless=true",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=viewer",
        f"--server.port={args.port or settings.port}",
        f"--server.address={args.address or settings.address}",
        *(["--", DEMO_ARG] if demo else []),
    ]


def run(args: argparse.Namespace, config: Config) -> int:
    settings = config.section("dashboard", DashboardSettings)
    if settings.auth == "header":
        if args.demo:
            raise ConfigError('--demo needs [dashboard] auth = "oidc"; "header" has no demo')
        read_proxy_secret(config.resolve_path(settings.proxy_secret_file))  # fail here, not later
    root = config.warehouse_dir(args.warehouse)  # absolute: the server's directory may differ
    env = {**os.environ, "SING_WAREHOUSE": str(root.resolve() if isinstance(root, Path) else root)}
    if config.path is not None:
        env["SING_CONFIG"] = str(config.path)
    if env.pop(DEMO_ENV, None) is not None:
        print(
            f"sing dashboard: {DEMO_ENV} is set in the environment and IGNORED: demo mode comes "
            "only from `sing dashboard --demo`",
            file=sys.stderr,
        )
    demo = args.demo or settings.demo
    print(
        f"sing dashboard on http://{args.address or settings.address}:{args.port or settings.port}"
        f" (warehouse {env['SING_WAREHOUSE']})" + (f"; {DEMO_WORDS.upper()}" if demo else ""),
        file=sys.stderr,
    )
    sys.stderr.flush()
    # Become the Streamlit server (same PID), so whoever started `sing dashboard` stops the
    # server itself with a signal and no orphaned process is left behind.
    command = streamlit_command(args, settings, demo)
    os.execve(command[0], command, env)


def serve() -> None:
    """`streamlit` with the `pages/`-folder mode off (see the module docstring), so the first
    request after a start is routed by app.py's `st.navigation` like every later one."""
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web.cli import main

    PagesManager.uses_pages_directory = False
    main(prog_name="streamlit")


if __name__ == "__main__":
    serve()
