"""Deep links on a fresh start: every page URL, opened before anybody visits `/` and reloaded,
shows that page through app.py (sign-in, navigation), in headless Chromium against a freshly
started real `sing dashboard`. Streamlit once served sing/dashboards/pages/ as pages of their own
until the first visit of `/`, and gave the default page no URL of its own (`/cluster` was
"Page not found").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sing.dashboards import access
from tests.test_dashboards_browser import browser, first_job, serve, settle, warehouse

pytestmark = pytest.mark.browser
__all__ = ["browser", "warehouse"]  # module fixtures shared with the browser tests

# url_path -> the heading the page shows (where it differs from its title).
HEADINGS = {
    "nodes": "GPU utilization by job node count",
    "my-jobs": "Jobs of",
    "traces": "Anonymized trace",
    "simulator": "Scheduling policies, side by side",
}


@pytest.fixture
def fresh_url(warehouse: Path, tmp_path: Path) -> Iterator[str]:
    """A dashboard started for this test alone, that nobody has visited yet."""
    config = tmp_path / "sing.toml"
    config.write_text('[site]\ncluster = "campus"\n')
    yield from serve(warehouse, config, "--demo")


def assert_shows(page, spec: access.PageSpec) -> None:
    settle(page)
    body = page.inner_text("body")
    assert page.inner_text("h1").startswith(HEADINGS.get(spec.url_path, spec.title)), spec
    assert "Page not found" not in body, spec.url_path
    assert "through its main page" not in body, spec.url_path
    assert "Demo mode" in body, spec.url_path  # app.py ran: the visit has a viewer


def test_every_page_url_works_before_the_root_was_ever_visited(
    browser, fresh_url: str, warehouse: Path
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    specs = access.pages_for(access.ADMIN)
    for spec in specs:
        query = f"?job={first_job(warehouse)}" if spec.url_path == "job" else ""
        page.goto(f"{fresh_url}/{spec.url_path}{query}")
        assert_shows(page, spec)
        page.reload()
        assert_shows(page, spec)
    # The root shows the first page, and the sidebar's link to it is its own URL.
    page.goto(fresh_url)
    assert_shows(page, specs[0])
    link = page.locator('[data-testid="stSidebarNav"] a').first
    assert link.get_attribute("href").rstrip("/").endswith(f"/{specs[0].url_path}")
    page.close()
