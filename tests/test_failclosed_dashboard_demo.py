"""Demo mode only from `sing dashboard --demo` (issue 27, item 7.5). SING_DASHBOARD_DEMO=1
inherited from a shell or a unit file turned an OIDC dashboard into one where anyone may pick
the admin role, and the start-up line did not say so. Now the environment variable switches
nothing (and `sing dashboard` says it is ignored); the flag reaches the app as the script's own
argument, the start-up line names demo mode, and every page shows the banner."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from sing.config import Config
from sing.dashboards import access, cli
from sing.demo.synthetic import generate
from sing.warehouse.store import Warehouse
from tests.dashboard_app import APP, serving

BANNER = "Demo mode: no sign-in, anyone may choose any role"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small warehouse and an OIDC site config (sign-in not configured)."""
    root = tmp_path_factory.mktemp("demo") / "wh"
    generate(Warehouse(root), days=1, seed=2)
    config = root.parent / "sing.toml"
    config.write_text('[dashboard]\nauth = "oidc"\nallowed_domains = ["campus.edu"]\n')
    return root, config


def visit(argv: list[str]) -> AppTest:
    """The app, nobody signed in, started with the script arguments `argv`."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.user = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [APP, *argv])
        at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_the_environment_variable_alone_gives_no_demo_mode(site, monkeypatch) -> None:
    with serving(*site):
        monkeypatch.setenv("SING_DASHBOARD_DEMO", "1")
        at = visit([])
    assert "demo_role" not in at.session_state  # no role chooser
    assert "Sign-in is not configured" in at.error[0].value
    assert not any(BANNER in w.value for w in at.warning)
    assert not at.metric and not at.dataframe


def test_the_flag_gives_the_banner_on_every_page(site, monkeypatch) -> None:
    with serving(*site):
        monkeypatch.setattr(sys, "argv", [APP, cli.DEMO_ARG])
        at = visit([cli.DEMO_ARG])
        assert at.selectbox(key="demo_role").value == "admin"
        for spec in access.PAGES:
            at.switch_page(spec.file).run()
            assert not at.exception, (spec.file, [e.message for e in at.exception])
            assert any(BANNER in w.value for w in at.warning), spec.file


def start(monkeypatch, config: Path, *flags: str) -> tuple[list[str], dict]:
    """`sing dashboard` up to the exec of Streamlit: (its command, its environment)."""
    started: dict = {}

    def execve(path: str, command: list[str], env: dict) -> None:
        started.update(command=command, env=env)

    monkeypatch.setattr(os, "execve", execve)
    parser = argparse.ArgumentParser()
    parser.add_argument("--warehouse")
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["dashboard", *flags])
    args.func(args, Config.load(config))
    return started["command"], started["env"]


def test_sing_dashboard_ignores_the_variable_and_says_demo_mode(site, monkeypatch, capsys):
    root, config = site
    monkeypatch.setenv("SING_WAREHOUSE", str(root))
    monkeypatch.setenv("SING_DASHBOARD_DEMO", "1")
    command, env = start(monkeypatch, config)
    err = capsys.readouterr().err
    assert "SING_DASHBOARD_DEMO is set in the environment and IGNORED" in err
    assert "DEMO MODE" not in err
    assert cli.DEMO_ARG not in command and "SING_DASHBOARD_DEMO" not in env

    command, _ = start(monkeypatch, config, "--demo")
    err = capsys.readouterr().err
    assert f"; {BANNER.upper()}" in err.splitlines()[-1]
    assert command[-2:] == ["--", cli.DEMO_ARG]  # the app's own argument, after Streamlit's
