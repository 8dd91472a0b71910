"""`--web.config.file`: TLS and basic authentication for `/metrics`, in Prometheus's format.

The file is the exporter-toolkit's (node_exporter's `--web.config.file`), so a site that already
protects node_exporter protects sing's exporter with the same file and the same bcrypt hashes.
What the file asks for is enforced or the exporter does not start: an unknown key, an unreadable
certificate, a string that is not a bcrypt hash, or a setting Python's `ssl` cannot honour (a
client certificate requested but not verified, cipher or curve lists, rate limits) is a
WebConfigError that names the file and the key. Never a silently weaker server.

Relative paths in the file are relative to the file's own directory, as in exporter-toolkit.
The file is read once at start-up: restart the exporter to pick up renewed certificates.
"""

from __future__ import annotations

import logging
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sing.errors import UserError
from sing.exporters import basicauth

log = logging.getLogger(__name__)

TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
TLS_KEYS = {
    "cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
    "client_allowed_sans", "min_version", "max_version", "cipher_suites",
    "prefer_server_cipher_suites", "curve_preferences",
}  # fmt: skip
LIST_KEYS = {"cipher_suites", "curve_preferences", "client_allowed_sans"}
BOOL_KEYS = {"prefer_server_cipher_suites"}
HTTP_KEYS = {"http2", "headers"}
# The response headers exporter-toolkit lets a site set, with the values it accepts (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's client auth policies that Python's ssl can enforce; the other two (RequestClientCert,
# RequireAnyClientCert) accept a certificate without verifying it, which ssl cannot do.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNVERIFIED_CLIENT_AUTH = {"RequestClientCert", "RequireAnyClientCert", "RequireClientCert"}
# $2a$/$2b$/$2y$ (htpasswd -B writes 2y), two-digit cost, 22 salt + 31 hash characters.
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


class WebConfigError(UserError):
    """The web config file is missing, malformed or asks for something that cannot be served."""


@dataclass(frozen=True)
class WebConfig:
    """What the exporter's HTTP server enforces; the default enforces nothing (plain HTTP)."""

    tls: ssl.SSLContext | None = None
    # Client certificate SANs (DNS, IP, email, URI) allowed in; empty: any verified certificate.
    allowed_sans: frozenset[str] = frozenset()
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """A one-line summary for the start-up log."""
        parts = ["TLS" if self.tls else "plain HTTP"]
        if self.tls and self.tls.verify_mode == ssl.CERT_REQUIRED:
            parts.append("client certificates required")
        parts.append(f"basic auth ({len(self.users)} users)" if self.users else "no basic auth")
        return ", ".join(parts)


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check a web config file; every problem is a WebConfigError."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise WebConfigError(f"web config {path}: cannot read it: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise WebConfigError(f"web config {path}: not valid YAML: {err}") from err
    where = f"web config {path}"
    top = _mapping(data, where, TOP_KEYS)
    if top.get("rate_limit"):
        raise WebConfigError(f"{where}: rate_limit is not supported by sing's exporter")
    http = _mapping(top.get("http_server_config") or {}, f"{where}: http_server_config", HTTP_KEYS)
    _optional(http, "http2", bool, f"{where}: http_server_config")  # always HTTP/1.1 here
    tls_section = _mapping(
        top.get("tls_server_config") or {}, f"{where}: tls_server_config", TLS_KEYS
    )
    tls, sans = _tls(tls_section, path.parent, f"{where}: tls_server_config")
    return WebConfig(
        tls=tls,
        allowed_sans=sans,
        users=_users(top.get("basic_auth_users") or {}, f"{where}: basic_auth_users"),
        headers=_headers(http.get("headers") or {}, f"{where}: http_server_config.headers"),
    )


def _mapping(value: Any, where: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in known:
            raise WebConfigError(f"{where}: unknown key {key!r}; known: {', '.join(sorted(known))}")
    return value


def _optional(section: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = section.get(key)
    if value is not None and not isinstance(value, kind):
        raise WebConfigError(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    return value


def _tls(
    section: dict[str, Any], base: Path, where: str
) -> tuple[ssl.SSLContext | None, frozenset[str]]:
    """An SSLContext for the section, or None when it sets nothing (plain HTTP)."""
    text = {k: _optional(section, k, str, where) or "" for k in TLS_KEYS - LIST_KEYS - BOOL_KEYS}
    for key in LIST_KEYS:
        if section.get(key) is not None and not isinstance(section[key], list):
            raise WebConfigError(f"{where}: {key} must be a list")
    if not any(section.get(k) for k in TLS_KEYS - BOOL_KEYS):
        return None, frozenset()
    for key in ("cipher_suites", "curve_preferences"):
        if section.get(key):
            raise WebConfigError(
                f"{where}: {key} is not supported by sing's exporter (Python's ssl names them "
                "differently); remove it to use OpenSSL's defaults, or set min_version: TLS13"
            )
    for inline in ("cert", "key"):
        if text.get(inline):
            raise WebConfigError(f"{where}: inline {inline} is not supported; use {inline}_file")
    if not text.get("cert_file") or not text.get("key_file"):
        raise WebConfigError(f"{where}: TLS needs both cert_file and key_file")
    auth = text.get("client_auth_type") or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError(
            f"{where}: client_auth_type {auth} accepts unverified certificates, which sing's "
            "exporter does not do; use RequireAndVerifyClientCert with client_ca_file"
        )
    if auth not in CLIENT_AUTH:
        raise WebConfigError(
            f"{where}: client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH)}"
        )
    has_ca = bool(text.get("client_ca_file") or text.get("client_ca"))
    if has_ca and auth == "NoClientCert":
        raise WebConfigError(f"{where}: a client CA is set but client_auth_type is NoClientCert")
    if auth != "NoClientCert" and not has_ca:
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
    sans = frozenset(str(s) for s in section.get("client_allowed_sans") or ())
    if sans and auth != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{where}: client_allowed_sans needs RequireAndVerifyClientCert")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(text.get("min_version") or "TLS12", where, "min_version")
    context.maximum_version = _version(text.get("max_version") or "TLS13", where, "max_version")
    if _optional(section, "prefer_server_cipher_suites", bool, where) is not False:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    cert, key = base / text["cert_file"], base / text["key_file"]
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise WebConfigError(
            f"{where}: cannot load cert_file {cert} with key_file {key}: {err}"
        ) from err
    context.verify_mode = CLIENT_AUTH[auth]
    if has_ca:
        try:
            if text.get("client_ca_file"):
                context.load_verify_locations(cafile=base / text["client_ca_file"])
            else:
                context.load_verify_locations(cadata=text["client_ca"])
        except (OSError, ssl.SSLError) as err:
            raise WebConfigError(f"{where}: cannot load the client CA: {err}") from err
    return context, sans


def _version(name: str, where: str, key: str) -> ssl.TLSVersion:
    if name not in TLS_VERSIONS:
        raise WebConfigError(f"{where}: {key} {name!r} is not one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[name]


def _users(section: Any, where: str) -> dict[str, bytes]:
    if not isinstance(section, dict):
        raise WebConfigError(f"{where}: expected a mapping of user: bcrypt hash")
    users = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{where}: user name {user!r} must be a string without ':'")
        if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(
                f"{where}: the password of {user!r} is not a bcrypt hash "
                "(make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"
            )
        users[user] = hashed.encode()
    costs = {user: basicauth.cost(hashed) for user, hashed in users.items()}
    if len(set(costs.values())) > 1:
        log.warning(
            "%s: the bcrypt costs differ (%s); unknown users are checked at the highest cost, "
            "so a user with a lower one answers faster and its name shows; use one cost for all",
            where, ", ".join(f"{user} {cost}" for user, cost in costs.items()),
        )  # fmt: skip
    return users


def _headers(section: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(section, dict):
        raise WebConfigError(f"{where}: expected a mapping of header: value")
    headers = []
    for name, value in section.items():
        if name not in HEADERS:
            raise WebConfigError(f"{where}: header {name!r} can not be configured")
        allowed = HEADERS[name]
        if not isinstance(value, str) or (allowed and value not in allowed):
            expected = f"one of {', '.join(allowed)}" if allowed else "a string"
            raise WebConfigError(f"{where}: {name} must be {expected}, got {value!r}")
        if value:  # blank: unset, as in exporter-toolkit
            headers.append((name, value))
    return tuple(headers)
