"""The real Postman: messages rendered from admin-editable templates, sent by email and webhook.

Templates are Jinja2 files, `<kind>.txt.j2` (and optionally `<kind>.html.j2`, sent as the HTML
alternative), looked up first in [policy] templates_dir and then among the built-in ones in
sing/policy/templates/. A template sets its subject with `{% set subject = ... %}`. Templates are
data an admin edits, so they run in Jinja's sandbox: they format figures, they cannot reach
Python's internals. Every failure (a template error, the SMTP relay down, the webhook answering
500) comes back as a `Delivery` with ok=False, so the audit trail records it and the round goes on.
"""

from __future__ import annotations

import json
import smtplib
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from sing.config import Config
from sing.errors import UserError
from sing.policy.messages import (
    BREAKER,
    CANCELLED,
    MONTHLY_DIGEST,
    NOTIFY,
    WARN,
    Delivery,
    Message,
)
from sing.policy.rules import load_rules
from sing.policy.settings import PolicySettings

BUILTIN_TEMPLATES = Path(__file__).with_name("templates")
SMTP_TIMEOUT_S = 30.0
WEBHOOK_TIMEOUT_S = 10.0
# Admins are copied on these; the chat webhook gets only these (never a user's own reports).
ADMIN_KINDS = frozenset({WARN, CANCELLED, BREAKER})
WEBHOOK_KINDS = frozenset({NOTIFY, WARN, CANCELLED, BREAKER})


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str
    html: str | None


class Templates:
    """The site's message templates (overrides first, then the built-in ones), sandboxed."""

    def __init__(self, overrides: Path | None, tz: ZoneInfo) -> None:
        dirs = [str(overrides)] if overrides else []
        self.env = SandboxedEnvironment(
            loader=jinja2.FileSystemLoader([*dirs, str(BUILTIN_TEMPLATES)]),
            autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default=False),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            pct=_pct, hours=_hours, gb=_gb, gib=_gib, local=lambda t: _local(t, tz)
        )

    def render(self, message: Message) -> Rendered:
        """Subject, text and (where a template exists) HTML of `message`; raises Jinja's errors."""
        variables = {
            "kind": message.kind,
            "user": message.user,
            "cluster": message.cluster,
            "job_id": message.job_id,
            "account": message.account,
            "rule_name": message.rule,
            **message.context,
        }
        text = self.env.get_template(f"{message.kind}.txt.j2").make_module(variables)
        # A subject is one line whatever a job name holds: newlines cannot start a header.
        subject = " ".join(str(getattr(text, "subject", f"sing: {message.kind}")).split())
        try:
            html = self.env.get_template(f"{message.kind}.html.j2").render(variables)
        except jinja2.TemplateNotFound:
            html = None
        return Rendered(subject, str(text).strip() + "\n", html)


class SitePostman:
    """Sends each message by email (SMTP relay) and webhook, as [policy] configures them."""

    def __init__(self, settings: PolicySettings, templates: Templates, password_file: Path | None):
        self.settings = settings
        self.templates = templates
        self.password_file = password_file

    def send(self, message: Message) -> list[Delivery]:
        owners, admins = self.addresses(message)
        addresses = [a for a in owners + admins if a not in message.delivered]
        hook = self.settings.webhook_url if message.kind in WEBHOOK_KINDS else ""
        hook = hook if _host(hook) not in message.delivered else ""
        targets = [("email", a) for a in addresses] + ([("webhook", _host(hook))] if hook else [])
        if not targets:
            return []
        try:
            rendered = self.templates.render(message)
        except Exception as err:  # a template is data: whatever it gets wrong fails delivery
            error = f"template {message.kind}: {type(err).__name__}: {err}"
            return [
                Delivery(channel, to, False, error, to_owner=to not in admins)
                for channel, to in targets
            ]
        out = self.email(addresses, rendered) if addresses else []
        out = [replace(x, to_owner=x.recipient not in admins) for x in out]
        if hook:
            out.append(self.webhook(hook, rendered))
        return out

    def addresses(self, message: Message) -> tuple[list[str], list[str]]:
        """Who gets the email: the owners (the user, or the account's contact for monthly
        digests) and, apart, the admins copied on warnings and cancellations."""
        s = self.settings
        if not s.smtp_host:
            return [], []
        if message.kind == MONTHLY_DIGEST:
            contact = s.account_contacts.get(message.account or "")
            to = [contact] if contact else []
        else:
            to = [f"{message.user}@{s.mail_domain}"] if s.mail_domain and message.user else []
        admins = [a for a in s.admin_emails if a not in to] if message.kind in ADMIN_KINDS else []
        return to, admins

    def email(self, addresses: list[str], rendered: Rendered) -> list[Delivery]:
        """One SMTP transaction; a Delivery per address (the relay may refuse some)."""
        try:
            mail = EmailMessage()
            mail["From"] = self.settings.mail_from
            mail["To"] = addresses[0]
            if addresses[1:]:
                mail["Cc"] = ", ".join(addresses[1:])
            mail["Subject"] = rendered.subject
            mail.set_content(rendered.text)
            if rendered.html is not None:
                mail.add_alternative(rendered.html, subtype="html")
            refused = self._submit(mail)
        except (ValueError, OSError, smtplib.SMTPException) as err:
            error = f"{type(err).__name__}: {err}"
            return [Delivery("email", a, False, error) for a in addresses]
        return [Delivery("email", a, a not in refused, _refusal(refused.get(a))) for a in addresses]

    def _submit(self, mail: EmailMessage) -> dict[str, Any]:
        s = self.settings
        with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=SMTP_TIMEOUT_S) as smtp:
            if s.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
            if s.smtp_username:
                smtp.login(s.smtp_username, self._password())
            return smtp.send_message(mail)

    def _password(self) -> str:
        if self.password_file is None:
            raise OSError("smtp_username is set but smtp_password_file is not")
        return self.password_file.read_text(encoding="utf-8").strip()

    def webhook(self, url: str, rendered: Rendered) -> Delivery:
        """POST {"text": ...} (what Slack and Mattermost incoming webhooks take)."""
        body = json.dumps({"text": f"{rendered.subject}\n\n{rendered.text}"}).encode()
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as answer:
                answer.read()
        except urllib.error.HTTPError as err:
            return Delivery("webhook", _host(url), False, f"HTTP {err.code} {err.reason}")
        except (urllib.error.URLError, OSError) as err:
            return Delivery("webhook", _host(url), False, f"{type(err).__name__}: {err}")
        return Delivery("webhook", _host(url), True)


def unreached_owners(settings: PolicySettings) -> str | None:
    """Why a real ladder could act on a job whose owner was never told, or None when every
    step of every acting rule has a channel to the owner (their email, or the chat webhook).
    A real ladder refuses to start on this: a cancel needs a warning the owner received."""
    acting = [r.name for r in load_rules(settings) if r.acts(settings)]
    if not acting or settings.webhook_url or (settings.smtp_host and settings.mail_domain):
        return None
    missing = [k for k in ("smtp_host", "mail_domain") if not getattr(settings, k)]
    return (
        f"[policy.rules] {', '.join(acting)} act for real (dry_run = false) but no channel "
        f"reaches a job's owner ([policy] {' and '.join(missing)} unset, no webhook_url): set "
        "[policy] smtp_host and mail_domain (mail goes to USER@mail_domain) or webhook_url, "
        "or keep the rules in dry run"
    )


def make_postman(config: Config) -> SitePostman:
    """The site's postman from [policy]; with no SMTP relay and no webhook it sends nothing."""
    settings = config.section("policy", PolicySettings)
    tz = settings.zone
    if settings.smtp_username and not settings.smtp_starttls:
        raise UserError(
            "[policy] smtp_username needs smtp_starttls = true (the password would cross the "
            "network in clear)"
        )
    if settings.webhook_url and urlsplit(settings.webhook_url).scheme not in ("http", "https"):
        raise UserError(f"[policy] webhook_url {settings.webhook_url!r} is not an http(s) URL")
    overrides = config.resolve_path(settings.templates_dir) if settings.templates_dir else None
    if overrides is not None and not overrides.is_dir():
        raise UserError(f"[policy] templates_dir {overrides} is not a directory")
    password = settings.smtp_password_file
    return SitePostman(
        settings, Templates(overrides, tz), config.resolve_path(password) if password else None
    )


def _host(url: str) -> str:
    """The webhook's host, as its recipient in the audit trail (the URL's path is a secret)."""
    return urlsplit(url).netloc


def _refusal(answer: tuple[int, bytes] | None) -> str:
    return "" if answer is None else f"refused: {answer[0]} {answer[1].decode(errors='replace')}"


# Template filters: figures in the units people read.
def _pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.0%}"


def _hours(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds / 3600:.2f} h"


def _gb(value: float | None) -> str:
    return "unknown" if value is None else f"{value / 1e9:.2f} GB"


def _gib(value: float | None) -> str:
    """Host memory as `sing job` and `--mem` count it (binary units)."""
    return "unknown" if value is None else f"{value / 2**30:.1f} GiB"


def _local(moment: datetime | None, tz: ZoneInfo) -> str:
    """A time in the site's zone, e.g. '2026-01-05 11:00 CET' (naive times are UTC)."""
    if moment is None:
        return "n/a"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z")
