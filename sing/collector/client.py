"""How the collector connects to its targets: TLS trust, client certificate and basic auth.

The settings mirror a Prometheus scrape config's `tls_config` and `basic_auth`, so an exporter
protected with `--web.config.file` is scraped by sing's collector and by Prometheus alike. One
client serves every target (as one Prometheus job does); `https` targets are verified against
`tls_ca_file`, else the system's trust store, and the certificate must name the host the
target is reached by. The password is read from a file once, at start, so it never sits in the
site config. TLS and basic auth settings need `scheme = "https"`: a password sent over plain
HTTP is a password given away, so such a config is refused, and so is (per target) a file_sd
group whose `__scheme__: http` would downgrade a secured site.
"""

from __future__ import annotations

import base64
import functools
import ssl
from dataclasses import dataclass

from sing.collector.settings import CollectorSettings
from sing.config import Config
from sing.errors import UserError


@dataclass(frozen=True)
class ScrapeClient:
    """The TLS context for https targets and the Authorization header, if any."""

    tls: ssl.SSLContext | None = None  # None: the system's trust store, no client certificate
    authorization: str | None = None

    def context(self) -> ssl.SSLContext:
        return self.tls or system_context()

    @property
    def secured(self) -> bool:
        """Whether TLS or basic auth is configured, so plain http targets are refused."""
        return self.tls is not None or self.authorization is not None

    @classmethod
    def from_settings(cls, s: CollectorSettings, config: Config) -> ScrapeClient:
        """The client the [collector] section describes (checked by `CollectorSettings`); a
        file that cannot be read is a UserError."""
        where = "[collector]"
        tls = None
        if s.tls_ca_file or s.tls_cert_file:
            ca = config.resolve_path(s.tls_ca_file) if s.tls_ca_file else None
            try:
                tls = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as err:
                raise UserError(f"{where} tls_ca_file {ca}: {err}") from err
        if tls is not None and s.tls_cert_file:
            cert, key = config.resolve_path(s.tls_cert_file), config.resolve_path(s.tls_key_file)
            try:
                tls.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as err:
                raise UserError(f"{where} cannot load tls_cert_file {cert}: {err}") from err
        authorization = None
        if s.basic_auth_username:
            path = config.resolve_path(s.basic_auth_password_file)
            try:
                password = path.read_text().rstrip("\r\n")
            except OSError as err:
                raise UserError(f"{where} basic_auth_password_file {path}: {err.strerror}") from err
            pair = f"{s.basic_auth_username}:{password}".encode()
            authorization = "Basic " + base64.b64encode(pair).decode()
        return cls(tls, authorization)


@functools.cache
def system_context() -> ssl.SSLContext:
    """One verifying context for every target without settings of its own (loading the
    system's certificates takes milliseconds, too long to repeat per target)."""
    return ssl.create_default_context()


PLAIN = ScrapeClient()
