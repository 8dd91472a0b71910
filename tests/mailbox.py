"""Real receivers on loopback for the policy's messages: an SMTP server (aiosmtpd, optionally
with STARTTLS and login) and a chat-webhook endpoint (http.server), each keeping what arrived."""

from __future__ import annotations

import email
import email.policy
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.pki import Pki
from tests.ports import free_port


@dataclass
class Received:
    """One SMTP transaction: the envelope's recipients and the message parsed back."""

    rcpt_tos: list[str]
    message: EmailMessage


@dataclass
class Mailbox:
    """What an aiosmtpd server on loopback received; addresses in `refuse` get a 550."""

    port: int
    received: list[Received] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    logins: list[str] = field(default_factory=list)

    async def handle_RCPT(self, server, session, envelope, address, options):  # noqa: N802
        if address in self.refuse:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.received.append(Received(list(envelope.rcpt_tos), parsed))
        return "250 Message accepted"


@contextmanager
def smtp_server(
    pki: Pki | None = None, login: tuple[str, str] | None = None, box: Mailbox | None = None
) -> Iterator[Mailbox]:
    """An SMTP server on 127.0.0.1; with `pki` it offers STARTTLS (and requires it), with
    `login` it requires AUTH with that user and password. With `box` it serves on that box's
    port and keeps adding to it (a server that was down, or restarts)."""
    box = box if box is not None else Mailbox(free_port())
    options: dict[str, Any] = {}
    if pki is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(pki.server_cert, pki.server_key)
        options.update(tls_context=tls, require_starttls=True)
    if login is not None:

        def check(server, session, envelope, mechanism, data) -> AuthResult:
            ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode())
            if ok == login:
                box.logins.append(login[0])
            return AuthResult(success=ok == login, handled=False)  # False: the server says 535

        options.update(authenticator=check, auth_required=True)
    controller = Controller(box, hostname="127.0.0.1", port=box.port, **options)
    controller.start()
    try:
        yield box
    finally:
        controller.stop()


@dataclass
class Webhook:
    """A chat-webhook endpoint on loopback: keeps each POSTed JSON body, answers `status`."""

    url: str
    posts: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200


@contextmanager
def webhook_server() -> Iterator[Webhook]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    hook = Webhook(f"http://127.0.0.1:{server.server_address[1]}/hooks/secret-token")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers["Content-Length"])
            hook.posts.append(json.loads(self.rfile.read(length)))
            self.send_response(hook.status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
