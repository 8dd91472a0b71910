"""The [dashboard] and [roles] sections of the site config.

Defaults run the embedded demo with no config file: `sing dashboard --demo` on localhost. A real
deployment picks where identity comes from (`auth`) and lists its admins and researchers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sing.config import ConfigError

AUTH_MODES = ("oidc", "header")


@dataclass(frozen=True)
class DashboardSettings:
    """How `sing dashboard` serves and whom it believes."""

    address: str = "127.0.0.1"
    port: int = 8501
    # "oidc": Streamlit's st.login against the [auth] provider in .streamlit/secrets.toml;
    # "header": a reverse proxy signs people in, puts the user name in `user_header` and proves
    # it is the proxy with the secret of `proxy_secret_file` (see sing/dashboards/identity.py).
    auth: str = "oidc"
    user_header: str = "X-Remote-User"
    # auth = "header": a file holding the secret the proxy sends in X-Sing-Proxy-Secret, owned
    # by the dashboard's user, mode 600. Relative paths: from the config file's directory.
    proxy_secret_file: str = ""
    # auth = "oidc": the claim naming the user. A value with "@" counts only under
    # `allowed_domains` (the part before "@" is the user name) and only as the verified email
    # (email_verified). A bare name (e.g. "preferred_username", "sub") counts only with
    # `user_claim_is_assigned`: the site's word that its single-tenant provider's
    # administrators assign those names and users cannot pick or change them.
    user_claim: str = "email"
    user_claim_is_assigned: bool = False
    allowed_domains: tuple[str, ...] = ()
    # Job traces the Simulator page offers besides the warehouse's own jobs (simple CSV or the
    # Philly jobs file; see docs/scheduler.md). Relative paths: from the config file's directory.
    trace_files: tuple[str, ...] = ("../shared/traces/philly/philly_pollux_jobs.csv",)
    # Trace releases the Workload page offers beside the cluster: every directory right under
    # this one that holds a datapackage.json (`sing trace import --out` or `sing trace export
    # --out` into it). Relative paths: from the config file's directory. Empty: none.
    trace_releases: str = ""
    # Demo mode: anyone may look without signing in, choosing a role; every page says so.
    demo: bool = False
    # Seconds a cached query result is reused; the collector writes every 15 s or so.
    cache_ttl_s: int = 60
    # Time series are downsampled to at most this many points per line.
    max_points: int = 400

    def __post_init__(self) -> None:
        if self.auth not in AUTH_MODES:
            raise ConfigError(
                f"[dashboard] auth = {self.auth!r}; use one of {', '.join(AUTH_MODES)}"
            )
        if self.auth == "header" and not self.proxy_secret_file:
            raise ConfigError(
                '[dashboard] auth = "header" needs proxy_secret_file: without the secret, '
                "anybody who reaches the dashboard's port could name themselves in the header"
            )
        if self.auth == "header" and self.demo:
            raise ConfigError('[dashboard] demo = true needs auth = "oidc"; "header" has no demo')
        if self.user_claim_is_assigned and self.user_claim == "email":
            raise ConfigError(
                "[dashboard] user_claim_is_assigned = true is for a claim of assigned user "
                'names (e.g. "preferred_username"); the "email" claim is checked as an address'
            )
        for domain in self.allowed_domains:
            if not domain.isascii():
                raise ConfigError(
                    f"[dashboard] allowed_domains: {domain!r} is not ASCII; write an "
                    "internationalized domain in its xn-- form"
                )
        if not 0 < self.port < 65536:
            raise ConfigError(f"[dashboard] port = {self.port} is not a TCP port")


@dataclass(frozen=True)
class RoleSettings:
    """Cluster user names with more than the default role; every other signed-in user is a user.

    `pis` names each account's principal investigators (or whoever answers for its use): users
    who see the whole account on the Accounting page, its users included, as its statement
    shows them."""

    admins: tuple[str, ...] = ()
    researchers: tuple[str, ...] = ()
    pis: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def accounts_led_by(self, name: str) -> list[str]:
        """The accounts `name` is a PI of."""
        return sorted(account for account, people in self.pis.items() if name in people)
