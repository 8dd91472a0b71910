"""The dashboard app under Streamlit's AppTest, signed in through OIDC, for the page tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).parents[1] / "sing" / "dashboards" / "app.py")


def open_app(
    user: str | None = None, page: str | None = None, query: dict | None = None
) -> AppTest:
    """Run the app as `user` (signed in through OIDC; None: nobody), optionally on `page`;
    fails on any exception in it."""
    at = AppTest.from_file(APP, default_timeout=120)
    signed_in = {"is_logged_in": True, "email": f"{user}@campus.edu", "email_verified": True}
    at.user = signed_in if user else {}
    at.query_params.update(query or {})
    at.run()
    if page:
        at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    """The page's metrics, label to shown value."""
    return {m.label: m.value for m in at.metric}


@contextlib.contextmanager
def serving(warehouse: Path, config: Path) -> Iterator[None]:
    """The app reads this warehouse and config (not demo mode) inside the block: for a
    module-scoped fixture, where pytest's function-scoped monkeypatch is not at hand."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SING_WAREHOUSE", str(warehouse))
        mp.setenv("SING_CONFIG", str(config))
        mp.delenv("SING_DASHBOARD_DEMO", raising=False)
        yield
