"""The dashboards in a real browser: headless Debian Chromium, driven by Playwright, against a real
`sing dashboard` process on a generated warehouse.

Screenshots go to $SING_TEST_OUTPUT/dashboards (default build/test-output/dashboards) as
artifacts for CI.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sing.demo.synthetic import generate
from sing.warehouse.store import Warehouse
from tests.debian import BROWSER_PACKAGES, ensure_packages
from tests.ports import free_port

pytestmark = pytest.mark.browser

REPO = Path(__file__).parents[1]
CHROMIUM = "/usr/bin/chromium"
OUTPUT = Path(os.environ.get("SING_TEST_OUTPUT", REPO / "build" / "test-output")) / "dashboards"
END = datetime(2026, 6, 1, tzinfo=UTC)
# URL path of each page -> how many charts it draws on the demo data.
PAGES = {
    "": 3,
    "idle": 1,
    "policy": 0,
    "health": 1,
    "nodes": 1,
    "fairness": 3,
    "my-jobs": 1,
    "job": 4,
    "traces": 0,
    "simulator": 1,
}
CHART = '[data-testid="stVegaLiteChart"]'


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser") / "wh"
    generate(Warehouse(root), days=2, seed=1, end=END)
    return root


def running(
    command: list[str], log_file: Path, ready: Callable[[], object], **popen
) -> Iterator[None]:
    """Run `command` until the generator is closed; yields once `ready()` stops raising OSError."""
    log = open(log_file, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{command} did not start: {log_file}") from None
                time.sleep(0.3)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def serve(warehouse: Path, config: Path, *extra: str) -> Iterator[str]:
    """Run `sing dashboard` until the generator is closed; yields its URL once healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "sing.cli", "--config", str(config)]
    command += ["--warehouse", str(warehouse), "dashboard", "--port", str(port), *extra]
    log = config.with_suffix(f".{port}.log")

    def healthy() -> None:
        urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).close()

    for _ in running(command, log, healthy, cwd=config.parent):
        yield url


@pytest.fixture(scope="module")
def demo_url(warehouse: Path) -> Iterator[str]:
    config = warehouse.parent / "sing.toml"
    config.write_text('[site]\ncluster = "campus"\n')
    yield from serve(warehouse, config, "--demo")


@pytest.fixture(scope="module")
def browser():
    ensure_packages(*BROWSER_PACKAGES)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def settle(page) -> None:
    """Wait until the script run is over: the app shows a title and no running indicator."""
    page.wait_for_selector("h1", timeout=60_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000
    )
    page.wait_for_timeout(500)  # charts draw after the run ends


def metric_values(page) -> dict[str, str]:
    labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
    values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
    return dict(zip(labels, values, strict=True))


def first_job(warehouse: Path) -> str:
    con = Warehouse(warehouse).connect()
    return con.execute(
        "SELECT min(job_id) FROM jobs WHERE job_id IN (SELECT job_id FROM gpu_samples)"
    ).fetchall()[0][0]


def test_every_page_renders_without_error(browser, demo_url: str, warehouse: Path) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    # Streamlit scrolls inside the page, so a tall window stands in for a full-page screenshot.
    page = browser.new_page(viewport={"width": 1400, "height": 3200})
    for path, charts in PAGES.items():
        query = f"?job={first_job(warehouse)}" if path == "job" else ""
        page.goto(f"{demo_url}/{path}{query}")
        page.wait_for_function(
            f"() => document.querySelectorAll('{CHART}').length >= {charts}", timeout=60_000
        )
        settle(page)
        assert page.locator('[data-testid="stException"]').count() == 0, path
        assert "Demo mode" in page.inner_text("body"), path
        page.screenshot(path=str(OUTPUT / f"{path or 'cluster'}.png"))
        if path == "":
            assert metric_values(page)["GPU assignment rate"].endswith("%")
    page.close()


def test_a_filter_changes_the_numbers(browser, demo_url: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{demo_url}/nodes")
    page.wait_for_selector('[data-testid="stMetricValue"]', timeout=60_000)
    settle(page)
    before = metric_values(page)
    assert "1 node" in before and len(before) > 1
    page.get_by_role("combobox", name="Partition").click()
    page.get_by_role("option", name="interactive").click()
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=\"stMetricLabel\"]').length === 1",
        timeout=60_000,
    )
    settle(page)
    after = metric_values(page)
    assert list(after) == ["1 node"] and after["1 node"] != before["1 node"]
    page.close()


def test_the_trace_download_is_a_trace_package(browser, demo_url: str) -> None:
    page = browser.new_page(accept_downloads=True)
    page.goto(f"{demo_url}/traces")
    settle(page)
    with page.expect_download(timeout=60_000) as info:
        page.get_by_role("button", name="Download trace (zip)").click()
    archive = zipfile.ZipFile(io.BytesIO(Path(info.value.path()).read_bytes()))
    names = archive.namelist()
    assert any(n.endswith("datapackage.json") for n in names), names
    assert any(n.endswith("jobs.parquet") for n in names), names
    page.close()


# ---- header mode behind a real nginx -----------------------------------------------------

# The site's part of docs/deploy.md, as a test can run it: nginx signs people in (basic auth
# here; oauth2-proxy through auth_request at a site), sets the user header and adds the secret.
NGINX_CONF = """
user root;
worker_processes 1;
pid {home}/nginx.pid;
error_log {home}/nginx-error.log;
events {{}}
http {{
    access_log {home}/nginx-access.log;
    client_body_temp_path {home}/body;
    proxy_temp_path {home}/proxy;
    map $http_upgrade $connection_upgrade {{ default upgrade; "" close; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            auth_basic "sing";
            auth_basic_user_file {home}/htpasswd;
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 1d;
            proxy_set_header X-Remote-User $remote_user;
            include {home}/sing-proxy-secret.conf;
        }}
    }}
}}
"""
PASSWORDS = {"aturing": "enigma", "ghopper": "cobol"}
SECRET = "5f0c8f3b6a1d4e2f9a7b3c1d0e8f6a4b2c9d7e5f3a1b0c8d"


def nginx_in_front(home: Path, upstream: str) -> Iterator[str]:
    """Run nginx as the sign-in proxy in front of `upstream` until closed; yields its URL."""
    ensure_packages("nginx")
    port = free_port()
    (home / "htpasswd").write_text("".join(f"{u}:{{PLAIN}}{pw}\n" for u, pw in PASSWORDS.items()))
    secret_conf = home / "sing-proxy-secret.conf"
    secret_conf.write_text(f'proxy_set_header X-Sing-Proxy-Secret "{SECRET}";\n')
    secret_conf.chmod(0o600)
    conf = home / "nginx.conf"
    conf.write_text(NGINX_CONF.format(home=home, port=port, upstream=upstream.rsplit(":", 1)[1]))
    command = ["/usr/sbin/nginx", "-p", str(home), "-c", str(conf), "-g", "daemon off;"]

    def listening() -> None:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()

    for _ in running(command, home / "nginx.log", listening):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def proxied(warehouse: Path) -> Iterator[tuple[str, str]]:
    """(nginx's URL, the dashboard's own URL) for a dashboard in header mode behind nginx."""
    home = warehouse.parent / "proxy"
    home.mkdir()
    secret = home / "dashboard.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    config = home / "sing.toml"
    config.write_text(
        '[dashboard]\nauth = "header"\nproxy_secret_file = "dashboard.secret"\n'
        '[roles]\nadmins = ["ghopper"]\n'
    )
    for direct in serve(warehouse, config):
        for url in nginx_in_front(home, direct):
            yield url, direct


REFUSAL = "did not come through the sign-in proxy"


def refused(page) -> bool:
    """The page is the refusal, with no data and no page of any role. A page's own URL makes
    Streamlit run the app again once it finds no such page, so the refusal is awaited (the
    page is judged at rest, not mid-way through that second run)."""
    page.wait_for_function(f"() => document.body.innerText.includes({REFUSAL!r})", timeout=60_000)
    settle(page)
    text = page.inner_text("body")
    return (
        REFUSAL in text
        and page.locator('[data-testid="stMetric"]').count() == 0
        and page.locator(CHART).count() == 0
        and "Signed in as" not in text
        and "Idle jobs" not in text
    )


def test_a_forged_user_header_is_refused_without_the_proxys_secret(browser, proxied) -> None:
    _, direct = proxied
    forgeries = [
        {},
        {"X-Remote-User": "ghopper"},
        {"X-Remote-User": "ghopper", "X-Sing-Proxy-Secret": "0" * len(SECRET)},
        {"X-Remote-User": "ghopper", "X-Sing-Proxy-Secret": SECRET[:-1]},
    ]
    for headers in forgeries:
        page = browser.new_page(extra_http_headers=headers)
        for path in ("", "idle", "cluster"):  # a page's own URL shows the same refusal
            page.goto(f"{direct}/{path}")
            assert refused(page), (headers, path)
        page.close()


def test_through_the_proxy_the_signed_in_user_gets_their_role(
    browser, proxied, warehouse: Path
) -> None:
    via_proxy, _ = proxied
    con = Warehouse(warehouse).connect()
    theirs = con.execute(
        "SELECT min(job_id) FROM jobs WHERE \"user\" <> 'aturing' AND start_time IS NOT NULL"
    ).fetchall()[0][0]
    with pytest.raises(urllib.error.HTTPError, match="401"):  # nginx signs people in first
        urllib.request.urlopen(via_proxy, timeout=10)
    # A user who also sends the headers themselves: nginx replaces them, so it is still them.
    user = browser.new_page(
        http_credentials={"username": "aturing", "password": PASSWORDS["aturing"]},
        extra_http_headers={"X-Remote-User": "ghopper", "X-Sing-Proxy-Secret": "guess"},
    )
    user.goto(f"{via_proxy}/job?job={theirs}")
    settle(user)
    text = user.inner_text("body")
    assert "Signed in as aturing (user)" in text
    assert f"No job {theirs} that you may see." in text
    assert user.locator('[data-testid="stMetric"]').count() == 0
    user.goto(f"{via_proxy}/idle")  # an admin page: not registered for a user
    settle(user)
    assert user.locator("h1").first.inner_text() != "Idle jobs"
    user.close()
    admin = browser.new_page(
        http_credentials={"username": "ghopper", "password": PASSWORDS["ghopper"]}
    )
    admin.goto(f"{via_proxy}/idle")
    settle(admin)
    assert admin.locator("h1").first.inner_text() == "Idle jobs"
    assert "Signed in as ghopper (admin)" in admin.inner_text("body")
    admin.close()
