"""Who is signed in: the user name a request proves, from the one configured source.

The two sources never mix: a header means nothing under OIDC, claims nothing under "header".

- "header": a reverse proxy signs people in and names them in `user_header`. Anybody on the
  host can reach the dashboard's port and send that header too, so the proxy also sends a
  secret (`PROXY_SECRET_HEADER`) that only it and the dashboard's service user can read; a
  request without exactly that secret is refused, whatever name it carries.
- "oidc": Streamlit's st.login; the claims of the identity token come back in a cookie signed
  with the [auth] cookie_secret (`st.user`). `user_claim` names the user. An address counts
  only when its domain is in `allowed_domains` (another domain's alice is not our alice, and
  only ASCII domains compare: "K" (Kelvin sign) must not pass for "k"), and when the provider
  verified it: it is the `email` claim with `email_verified`. A bare name counts only when the
  site declares that the provider's administrators assign the claim's values
  (`user_claim_is_assigned`): OIDC Core 5.7 lets users pick `preferred_username`, so on most
  providers a bare name proves nothing.

`identify` answers a `Viewer`, a `Refusal` (an identity was claimed but not proved: the app
shows why and grants no role), or None (nobody claimed one: the OIDC sign-in screen, or the
demo's role picker).
"""

from __future__ import annotations

import hmac
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sing.config import ConfigError
from sing.dashboards.access import Viewer, role_of
from sing.dashboards.settings import DashboardSettings, RoleSettings

PROXY_SECRET_HEADER = "X-Sing-Proxy-Secret"
# Printable ASCII without spaces, so it fits in a header line as is; 32 hex digits = 128 bits.
SECRET_FORM = re.compile(r"[!-~]{32,1024}")
# What a cluster (POSIX) user name may look like; anything else is refused, not mangled.
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Refusal:
    """A request that claimed an identity without proving it; `reason` is shown as is."""

    reason: str


def read_proxy_secret(path: Path) -> bytes:
    """The secret the proxy sends, from a file nobody but the dashboard's user may read.

    A file that others can read would let them send the secret themselves, so it is refused
    (as ssh refuses a readable private key) instead of weakening the check.
    """
    where = f"[dashboard] proxy_secret_file {path}"
    try:
        with path.open("rb") as file:
            info = os.fstat(file.fileno())
            data = file.read(4096)
    except OSError as err:
        raise ConfigError(f"{where}: {err.strerror}") from err
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ConfigError(
            f"{where} is {stat.filemode(info.st_mode)} owned by uid {info.st_uid}: it must "
            f"belong to the dashboard's user (uid {os.geteuid()}) and be readable by nobody "
            "else (chmod 600)"
        )
    secret = data.strip()
    if not SECRET_FORM.fullmatch(secret.decode("ascii", "replace")):
        raise ConfigError(
            f"{where} must hold one line of at least 32 printable characters without spaces "
            "(make one with `openssl rand -hex 32`)"
        )
    return secret


def identify(
    settings: DashboardSettings,
    roles: RoleSettings,
    claims: Mapping[str, Any],
    headers: Mapping[str, Sequence[str]],
    secret: bytes | None,
) -> Viewer | Refusal | None:
    """The viewer a request proves from the configured source (see the module docstring).

    `claims` is what `st.user` holds; `headers` every value received of the user header and of
    `PROXY_SECRET_HEADER`, by those names; `secret` the proxy's secret (auth = "header").
    """
    if settings.auth == "header":
        name = proxy_user(settings.user_header, headers, secret)
    else:
        name = oidc_user(settings, claims)
    if not isinstance(name, str):
        return name
    if not USER_NAME.fullmatch(name):
        return Refusal(f"{name!r} is not a cluster user name, so it names nobody here.")
    return Viewer(name, role_of(name, roles))


def proxy_user(
    user_header: str, headers: Mapping[str, Sequence[str]], secret: bytes | None
) -> str | Refusal:
    """The name the proxy sent, when the request carries the proxy's secret exactly once."""
    sent = headers.get(PROXY_SECRET_HEADER, ())
    proved = (
        secret is not None
        and len(sent) == 1
        and hmac.compare_digest(sent[0].encode("utf-8", "replace"), secret)
    )
    if not proved:
        return Refusal(
            "This request did not come through the sign-in proxy, so it proves nobody's "
            "identity. Open the dashboard at the address your site publishes."
        )
    names = headers.get(user_header, ())
    if len(names) != 1 or not names[0].strip():
        return Refusal(
            f"The sign-in proxy did not name exactly one user in {user_header} "
            f"(got {len(names)}); ask the cluster's admins to check its configuration."
        )
    return names[0].strip()


def oidc_user(settings: DashboardSettings, claims: Mapping[str, Any]) -> str | Refusal | None:
    """The name the identity provider vouches for in `user_claim`, or None before sign-in."""
    if not claims.get("is_logged_in"):
        return None
    claim = settings.user_claim
    value = claims.get(claim)
    if not isinstance(value, str) or not value.strip():
        return Refusal(
            f"Your sign-in carries no {claim!r}, which names users here; ask the cluster's "
            "admins to have the identity provider release it."
        )
    value = value.strip()
    if "@" not in value:
        if settings.user_claim_is_assigned:
            return value
        return Refusal(
            f"Your sign-in's {claim} {value!r} is no address, and this site has not declared "
            "the names in that claim assigned by the identity provider's administrators "
            "([dashboard] user_claim_is_assigned), so it names nobody here."
        )
    if not value.isascii():  # str.lower() folds look-alikes such as the Kelvin sign to "k"
        return Refusal(f"{value!r} is not an ASCII address, so it names nobody here.")
    if not verified_address(value, claims):
        return Refusal(f"Your identity provider has not verified the address {value}.")
    return address_user(value, settings.allowed_domains)


def verified_address(value: str, claims: Mapping[str, Any]) -> bool:
    """Whether `value` is the address the provider verified: `email_verified` vouches only
    for the `email` claim, so an address in another claim must be that one."""
    verified = claims.get("email_verified")
    email = claims.get("email")
    return (
        (verified is True or verified == "true")  # some providers send a string
        and isinstance(email, str)
        and email.isascii()
        and email.strip().lower() == value.lower()
    )


def address_user(value: str, allowed_domains: Sequence[str]) -> str | Refusal:
    """The user name of an ASCII address in an allowed domain: the part before the last "@"."""
    name, _, domain = value.rpartition("@")
    allowed = {d.lower() for d in allowed_domains}
    if domain.lower() not in allowed:
        return Refusal(
            f"{value}: accounts of {domain} are not users of this cluster "
            f"([dashboard] allowed_domains: {', '.join(sorted(allowed)) or 'none'})."
        )
    return name
