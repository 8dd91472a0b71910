"""Who the dashboard believes: the proxy's secret in header mode, the mapped claim under OIDC.

The browser tests (test_dashboards_browser.py) show the same refusals through a real nginx and
Chromium; here every case of the rules, and the checks on the secret file and the settings.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sing.config import Config, ConfigError
from sing.dashboards.access import Viewer
from sing.dashboards.identity import PROXY_SECRET_HEADER, Refusal, identify, read_proxy_secret
from sing.dashboards.settings import DashboardSettings, RoleSettings

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


def by_name(assigned: bool, claim: str = "preferred_username") -> DashboardSettings:
    return DashboardSettings(
        auth="oidc",
        user_claim=claim,
        user_claim_is_assigned=assigned,
        allowed_domains=("campus.edu",),
    )


@pytest.mark.parametrize("claim", ["preferred_username", "sub"])
def test_a_bare_name_counts_only_where_the_site_says_admins_assign_it(claim: str) -> None:
    # OIDC Core 5.7: users may pick preferred_username, so by default "ghopper" proves nothing,
    # with or without allowed_domains.
    not_assigned = "is no address, and this site has not declared the names in that claim"
    assert refused(oidc({claim: "ghopper"}, by_name(False, claim)), not_assigned)
    no_domains = DashboardSettings(auth="oidc", user_claim=claim)
    assert refused(oidc({claim: "ghopper"}, no_domains), "user_claim_is_assigned")
    assert refused(oidc({"email": "ghopper", "email_verified": True}), not_assigned)
    # The site's word that its provider's admins assign these names: the name is the user.
    assert oidc({claim: "ghopper"}, by_name(True, claim)) == Viewer("ghopper", "admin")
    assert refused(oidc({claim: "../root"}, by_name(True, claim)), "not a cluster user name")
    answer = oidc({"email": "ghopper@campus.edu", "email_verified": True}, by_name(True, claim))
    assert refused(answer, f"carries no {claim!r}")


@pytest.mark.parametrize("assigned", [False, True])
def test_an_address_in_another_claim_counts_only_as_the_verified_email(assigned: bool) -> None:
    settings = by_name(assigned)
    unverified = "has not verified the address rsearch@campus.edu"
    # email_verified vouches for the email claim only, not for an address a user typed elsewhere.
    assert refused(oidc({"preferred_username": "rsearch@campus.edu"}, settings), unverified)
    claims = {"preferred_username": "rsearch@campus.edu", "email_verified": False}
    assert refused(oidc(claims, settings), unverified)
    claims = {
        "preferred_username": "rsearch@campus.edu",
        "email": "mallory@gmail.com",
        "email_verified": True,
    }
    assert refused(oidc(claims, settings), unverified)
    claims = {**claims, "email": "RSearch@campus.edu"}
    assert oidc(claims, settings) == Viewer("rsearch", "researcher")
    claims = {"preferred_username": "ghopper@evil.org", "email": "ghopper@evil.org"}
    assert refused(oidc({**claims, "email_verified": True}, settings), "accounts of evil.org")


def test_only_ascii_addresses_compare() -> None:
    # str.lower() turns the Kelvin sign into "k": "campus.edu" must not match a look-alike.
    kelvin = DashboardSettings(auth="oidc", allowed_domains=("kth.se",))
    answer = oidc({"email": "ghopper@\u212ath.se", "email_verified": True}, kelvin)
    assert refused(answer, "is not an ASCII address")
    assert oidc({"email": "ghopper@KTH.se", "email_verified": True}, kelvin).role == "admin"
    answer = oidc({"email": "ghopper@campus.\u0435du", "email_verified": True})  # Cyrillic e
    assert refused(answer, "is not an ASCII address")
    answer = oidc({"email": "gh\u043epper@campus.edu", "email_verified": True})  # Cyrillic o
    assert refused(answer, "is not an ASCII address")
    # A verified look-alike email does not vouch for an ASCII address in another claim either.
    claims = {
        "preferred_username": "ghopper@kth.se",
        "email": "ghopper@\u212ath.se",
        "email_verified": True,
    }
    answer = oidc(claims, replace(kelvin, user_claim="preferred_username"))
    assert refused(answer, "has not verified the address ghopper@kth.se")


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


def dashboard_section(tmp_path: Path, text: str) -> DashboardSettings:
    file = tmp_path / "sing.toml"
    file.write_text(f"[dashboard]\n{text}\n")
    return Config.load(file).section("dashboard", DashboardSettings)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('auth = "header"', "needs proxy_secret_file"),
        (
            'auth = "header"\nproxy_secret_file = "s"\ndemo = true',
            'demo = true needs auth = "oidc"',
        ),
        ("user_claim_is_assigned = true", 'the "email" claim is checked as an address'),
        ('allowed_domains = ["campus.edu", "\u212ath.se"]', "is not ASCII; write an internation"),
    ],
)
def test_the_dashboard_settings_refuse_unsafe_combinations(
    tmp_path: Path, text: str, error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        dashboard_section(tmp_path, text)


def test_a_claim_of_assigned_names_is_a_setting(tmp_path: Path) -> None:
    text = 'user_claim = "preferred_username"\nuser_claim_is_assigned = true'
    assert dashboard_section(tmp_path, text).user_claim_is_assigned


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
