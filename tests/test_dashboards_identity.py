"""Who the dashboard believes: the proxy's secret in header mode, the mapped claim under OIDC.

The browser tests (test_dashboards_browser.py) show the same refusals through a real nginx and
Chromium; here every case of the rules, and the checks on the secret file and the settings.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.access import Viewer
from dashboards.identity import PROXY_SECRET_HEADER, Refusal, identify, read_proxy_secret
from dashboards.settings import DashboardSettings, RoleSettings
from sing.config import Config, ConfigError

ROLES = RoleSettings(admins=("ghopper",), researchers=("rsearch",))
OIDC = DashboardSettings(auth="oidc", allowed_domains=("campus.edu",))
HEADER = DashboardSettings(auth="header", proxy_secret_file="proxy.secret")
SECRET = b"0123456789abcdef0123456789abcdef"


def oidc(claims: dict, settings: DashboardSettings = OIDC) -> Viewer | Refusal | None:
    return identify(settings, ROLES, {"is_logged_in": True, **claims}, {}, None)


def proxied(secrets: list[str], users: list[str]) -> Viewer | Refusal | None:
    headers = {PROXY_SECRET_HEADER: secrets, "X-Remote-User": users}
    return identify(HEADER, ROLES, {}, headers, SECRET)


def refused(answer: object, why: str) -> bool:
    return isinstance(answer, Refusal) and why in answer.reason


# ---- OIDC --------------------------------------------------------------------------------


def test_a_verified_address_of_an_allowed_domain_is_its_user() -> None:
    assert oidc({"email": "ghopper@campus.edu", "email_verified": True}) == Viewer(
        "ghopper", "admin"
    )
    assert oidc({"email": " rsearch@CAMPUS.edu ", "email_verified": "true"}) == Viewer(
        "rsearch", "researcher"
    )
    assert oidc({"email": "nsingh@campus.edu", "email_verified": True}).role == "user"


def test_another_domains_alice_is_not_ours() -> None:
    answer = oidc({"email": "ghopper@elsewhere.org", "email_verified": True})
    assert refused(answer, "accounts of elsewhere.org are not users of this cluster")
    # A sub-domain or a domain hidden in the local part is foreign as well.
    assert refused(oidc({"email": "ghopper@mail.campus.edu", "email_verified": True}), "not users")
    answer = oidc({"email": "ghopper@campus.edu@evil.org", "email_verified": True})
    assert refused(answer, "accounts of evil.org")
    answer = oidc({"email": "x@evil.org@campus.edu", "email_verified": True})
    assert refused(answer, "is not a cluster user name")
    # No allowed domain configured: no address is anybody's.
    bare = DashboardSettings(auth="oidc")
    answer = oidc({"email": "ghopper@campus.edu", "email_verified": True}, bare)
    assert refused(answer, "allowed_domains: none")


@pytest.mark.parametrize("verified", [None, False, "false", 1, "yes"])
def test_an_unverified_address_is_refused(verified: object) -> None:
    claims = {"email": "ghopper@campus.edu"}
    if verified is not None:
        claims["email_verified"] = verified
    assert refused(oidc(claims), "has not verified the address ghopper@campus.edu")


@pytest.mark.parametrize("value", [None, "", "  ", 42, ["ghopper"]])
def test_a_missing_claim_is_refused(value: object) -> None:
    claims = {"email_verified": True} if value is None else {"email": value, "email_verified": True}
    assert refused(oidc(claims), "carries no 'email'")


def test_a_username_claim_names_the_user_and_an_address_in_it_needs_the_domain() -> None:
    by_name = DashboardSettings(
        auth="oidc", user_claim="preferred_username", allowed_domains=("campus.edu",)
    )
    # email_verified is about the email claim; the provider asserts its own user names.
    assert oidc({"preferred_username": "ghopper"}, by_name) == Viewer("ghopper", "admin")
    assert oidc({"preferred_username": "rsearch@campus.edu"}, by_name).role == "researcher"
    assert refused(oidc({"preferred_username": "ghopper@evil.org"}, by_name), "evil.org")
    answer = oidc({"email": "ghopper@campus.edu", "email_verified": True}, by_name)
    assert refused(answer, "carries no 'preferred_username'")
    assert refused(oidc({"preferred_username": "../root"}, by_name), "not a cluster user name")


def test_nobody_before_sign_in_and_headers_mean_nothing_under_oidc() -> None:
    forged = {PROXY_SECRET_HEADER: [SECRET.decode()], "X-Remote-User": ["ghopper"]}
    assert identify(OIDC, ROLES, {"is_logged_in": False}, forged, SECRET) is None
    assert identify(OIDC, ROLES, {}, forged, SECRET) is None


# ---- header mode -------------------------------------------------------------------------


def test_the_proxy_with_its_secret_names_the_user() -> None:
    assert proxied([SECRET.decode()], ["ghopper"]) == Viewer("ghopper", "admin")
    assert proxied([SECRET.decode()], [" nsingh "]) == Viewer("nsingh", "user")


def test_a_name_without_the_proxys_secret_is_refused() -> None:
    came_round = "did not come through the sign-in proxy"
    assert refused(proxied([], ["ghopper"]), came_round)
    assert refused(proxied([], []), came_round)  # never a default user
    assert refused(proxied([SECRET.decode()[:-1] + "0"], ["ghopper"]), came_round)
    assert refused(proxied([SECRET.decode() + " "], ["ghopper"]), came_round)
    assert refused(proxied(["wrong", SECRET.decode()], ["ghopper"]), came_round)
    assert refused(proxied([SECRET.decode(), SECRET.decode()], ["ghopper"]), came_round)
    assert refused(proxied(["välue"], ["ghopper"]), came_round)
    headers = {PROXY_SECRET_HEADER: [SECRET.decode()], "X-Remote-User": ["ghopper"]}
    assert refused(identify(HEADER, ROLES, {}, headers, None), came_round)
    # Claims mean nothing under "header", even a signed-in admin's.
    claims = {"is_logged_in": True, "email": "ghopper@campus.edu", "email_verified": True}
    assert refused(identify(HEADER, ROLES, claims, {}, SECRET), came_round)


def test_the_proxy_must_send_exactly_one_user_name() -> None:
    one = "did not name exactly one user in X-Remote-User"
    assert refused(proxied([SECRET.decode()], []), f"{one} (got 0)")
    assert refused(proxied([SECRET.decode()], [" "]), f"{one} (got 1)")
    assert refused(proxied([SECRET.decode()], ["aturing", "ghopper"]), f"{one} (got 2)")
    assert refused(proxied([SECRET.decode()], ["ghopper@campus.edu"]), "not a cluster user")


# ---- the secret file and the settings ----------------------------------------------------


def test_the_secret_file_must_be_private_and_strong(tmp_path: Path) -> None:
    file = tmp_path / "proxy.secret"
    file.write_bytes(SECRET + b"\n")
    file.chmod(0o600)
    assert read_proxy_secret(file) == SECRET
    file.chmod(0o640)
    with pytest.raises(ConfigError, match=r"-rw-r----- .* readable by nobody else \(chmod 600\)"):
        read_proxy_secret(file)
    file.chmod(0o600)
    for weak in (b"short\n", b"", SECRET[:16] + b" " + SECRET[16:], "é".encode() * 40):
        file.write_bytes(weak)
        with pytest.raises(ConfigError, match="at least 32 printable characters"):
            read_proxy_secret(file)
    with pytest.raises(ConfigError, match="proxy_secret_file .*missing: No such file"):
        read_proxy_secret(tmp_path / "missing")


def test_header_mode_needs_a_secret_file_and_has_no_demo(tmp_path: Path) -> None:
    file = tmp_path / "sing.toml"
    file.write_text('[dashboard]\nauth = "header"\n')
    with pytest.raises(ConfigError, match="needs proxy_secret_file"):
        Config.load(file).section("dashboard", DashboardSettings)
    file.write_text('[dashboard]\nauth = "header"\nproxy_secret_file = "s"\ndemo = true\n')
    with pytest.raises(ConfigError, match='demo = true needs auth = "oidc"'):
        Config.load(file).section("dashboard", DashboardSettings)


def sing_dashboard(config: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sing.cli", "--config", str(config), "dashboard", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_sing_dashboard_will_not_start_with_a_readable_secret(tmp_path: Path) -> None:
    config = tmp_path / "sing.toml"
    config.write_text('[dashboard]\nauth = "header"\nproxy_secret_file = "proxy.secret"\n')
    secret = tmp_path / "proxy.secret"  # relative to the config file
    secret.write_bytes(SECRET)
    secret.chmod(0o644)
    result = sing_dashboard(config)
    assert result.returncode == 2
    assert "configuration error" in result.stderr and "chmod 600" in result.stderr
    secret.chmod(0o600)
    result = sing_dashboard(config, "--demo")
    assert result.returncode == 2 and '--demo needs [dashboard] auth = "oidc"' in result.stderr
