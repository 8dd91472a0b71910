"""What the policies say to people, and the one interface every channel is sent through.

The ladder and the reports decide *that* a message goes out and record it in the audit trail;
a `Postman` renders it from the site's templates and delivers it (email, webhook), returning
one `Delivery` per channel and recipient so a failed send is recorded, never lost silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# Message kinds: a template each (sing/policy/templates/<kind>.txt.j2 and <kind>.html.j2).
NOTIFY, WARN, CANCELLED = "notify", "warn", "cancelled"
JOB_END, WEEKLY_DIGEST, MONTHLY_DIGEST = "job_end", "weekly_digest", "monthly_digest"
BREAKER = "breaker"  # to the admins: sing stopped acting (sing/policy/breaker.py)

# A message that no configured channel reaches (no relay, no `mail_domain`, no account contact)
# is recorded the same way for every kind: not delivered (ok false), with this error.
NO_CHANNEL = "no channel reaches the recipient"


@dataclass(frozen=True)
class Message:
    kind: str
    user: str  # the cluster user it is about (and for, unless `to_account`)
    cluster: str
    job_id: str | None = None
    rule: str | None = None
    account: str | None = None  # monthly digests go to the account's contact
    # Template variables: the job's efficiency table, the evidence, the deadline, the exact
    # cancel command, the digest's figures.
    context: dict[str, Any] = field(default_factory=dict)
    # Recipients that already have it (an earlier round's partial delivery): not sent again.
    delivered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Delivery:
    channel: str  # "email" or "webhook"
    recipient: str
    ok: bool
    error: str = ""
    # False for the admins' copy: only a delivery to the owner (their address, the chat channel
    # users read) counts as the owner told, which a warning's deadline and a cancel need.
    to_owner: bool = True

    def audit_fields(self, detail: dict[str, Any] | None = None) -> dict[str, Any]:
        """How the trail records this delivery: channel, recipient, outcome, any error."""
        error = {"error": self.error} if self.error else {}
        return {
            "channel": self.channel,
            "recipient": self.recipient,
            "ok": self.ok,
            "detail": {**(detail or {}), **error},
        }


class Postman(Protocol):
    def send(self, message: Message) -> list[Delivery]:
        """Render and deliver `message` on every configured channel; never raises for a
        channel's failure (it comes back as a Delivery with ok=False)."""
