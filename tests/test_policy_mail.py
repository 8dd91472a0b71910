"""The Postman against real receivers on loopback: an SMTP server (aiosmtpd, with STARTTLS and
login where the site uses them) and a chat-webhook endpoint. Each message is parsed back from
what arrived: recipients, subject, the efficiency table's figures, the exact cancel command."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sing.config import Config, ConfigError
from sing.errors import UserError
from sing.policy.engine import FIGURES, JOB_FIELDS
from sing.policy.messages import CANCELLED, JOB_END, NOTIFY, WARN, Delivery, Message
from sing.policy.postman import make_postman
from sing.policy.settings import PolicySettings
from tests.mailbox import smtp_server, webhook_server
from tests.pki import make_pki
from tests.ports import free_port

ADMIN = "hpc-admin@example.edu"
DEADLINE = datetime(2026, 1, 5, 11, 30, tzinfo=UTC)  # 12:30 in Berlin (CET) that day


def job(**changes: Any) -> dict[str, Any]:
    """A row of sing.warehouse.analytics.job_usage, as the ladder passes it."""
    row = {
        "job_id": "4242",
        "name": "<b>train</b>",
        "user": "alice",
        "account": "alice-lab",
        "partition": "gpu",
        "num_nodes": 2,
        "num_gpus": 8,
        "start_time": datetime(2026, 1, 5, 8, 0, tzinfo=UTC),
        "run_s": 9000.0,
        "mean_util": 0.031,
        "idle_share": 0.9,
        "gpus_never_used": 6,
        "rdma_bytes_per_node_hour": 1.5e9,
    }
    return {**row, **changes}


def message(kind: str = WARN, user: str = "alice", dry_run: bool = False, **job_changes) -> Message:
    context = {
        "job": job(user=user, **job_changes),
        "rule": {
            "name": "idle-gpus",
            "kind": "idle_gpus",
            "description": "GPUs under 5% utilisation for 60 minutes",
            "threshold": 0.05,
            "minutes": 60,
        },
        "evidence": {"mean_util": 0.031, "idle_gpus": 6, "gpus_sampled": 8},
        "deadline": DEADLINE,
        "cancel_command": "scancel 4242",
        "dry_run": dry_run,
        "cluster": "della",
    }
    return Message(kind, user, "della", "4242", "idle-gpus", "alice-lab", context)


def config(tmp_path: Path, **policy: Any) -> Config:
    return Config({"policy": policy}, tmp_path / "sing.toml")


def mail_config(tmp_path: Path, port: int, **policy: Any) -> Config:
    settings = {
        "smtp_host": "127.0.0.1",
        "smtp_port": port,
        "mail_from": "sing@example.edu",
        "mail_domain": "example.edu",
        "admin_emails": [ADMIN],
        "timezone": "Europe/Berlin",
    }
    return config(tmp_path, **{**settings, **policy})


def test_a_warning_reaches_the_user_and_the_admins_with_the_figures_and_the_command(tmp_path):
    with smtp_server() as box:
        sent = make_postman(mail_config(tmp_path, box.port)).send(message(WARN))
    assert sent == [
        Delivery("email", "alice@example.edu", True),
        Delivery("email", ADMIN, True, to_owner=False),  # a copy: not the owner told
    ]
    [mail] = box.received
    assert sorted(mail.rcpt_tos) == sorted(["alice@example.edu", ADMIN])
    got = mail.message
    assert (got["From"], got["To"], got["Cc"]) == ("sing@example.edu", "alice@example.edu", ADMIN)
    assert got["Subject"] == "[sing] Job 4242 on della will be cancelled at 2026-01-05 12:30 CET"
    text = got.get_body(("plain",)).get_content()
    for line in [
        "  GPUs                  8",
        "  Mean GPU utilisation  3%",
        "  Idle share            90%",
        "  Idle GPUs             6 of 8",
        "  RDMA per node-hour    1.50 GB",
        "  Run time              2.50 h",
        "    scancel 4242",
        "it will be cancelled at 2026-01-05 12:30 CET.",
        '"idle-gpus": GPUs under 5% utilisation for 60 minutes.',
    ]:
        assert line in text.splitlines() or line in text
    assert "<b>train</b>" in text  # plain text is not escaped
    assert "DRY RUN" not in text
    html = got.get_body(("html",)).get_content()
    assert "&lt;b&gt;train&lt;/b&gt;" in html and "<b>train</b>" not in html  # escaped
    assert "<td>90%</td>" in html and "<pre>scancel 4242</pre>" in html


@pytest.mark.parametrize("kind", [NOTIFY, WARN, CANCELLED])
def test_the_built_in_templates_render_what_the_engine_passes(tmp_path, kind):
    """The engine's job dict has no idle share: the table leaves that row out."""
    sent = message(kind)
    engine_job = {k: sent.context["job"].get(k) for k in (*JOB_FIELDS, *FIGURES)}
    sent = replace(sent, context={**sent.context, "job": engine_job})
    rendered = make_postman(config(tmp_path)).templates.render(sent)
    assert "scancel 4242" in rendered.text and "Idle GPUs             6 of 8" in rendered.text
    assert "Idle share" not in rendered.text and "<td>3%</td>" in rendered.html


def test_a_notice_goes_to_the_user_only_and_a_dry_run_says_so(tmp_path):
    with smtp_server() as box:
        sent = make_postman(mail_config(tmp_path, box.port)).send(message(NOTIFY, dry_run=True))
    assert sent == [Delivery("email", "alice@example.edu", True)]
    [mail] = box.received
    assert mail.rcpt_tos == ["alice@example.edu"] and mail.message["Cc"] is None
    text = mail.message.get_body(("plain",)).get_content()
    assert text.startswith("DRY RUN:") and "scancel 4242" in text


def test_starttls_and_login_with_the_password_file(tmp_path, monkeypatch):
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "smtp.secret").write_text("s3cret\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # the site's CA, as the system trusts it
    with smtp_server(pki, login=("sing", "s3cret")) as box:
        settings = {"smtp_starttls": True, "smtp_username": "sing"}
        good = mail_config(tmp_path, box.port, smtp_password_file="smtp.secret", **settings)
        assert all(d.ok for d in make_postman(good).send(message(CANCELLED)))
        (tmp_path / "wrong.secret").write_text("guess")
        bad = mail_config(tmp_path, box.port, smtp_password_file="wrong.secret", **settings)
        refused = make_postman(bad).send(message(CANCELLED))
    assert box.logins == ["sing"] and len(box.received) == 1
    assert box.received[0].message["Subject"] == "[sing] Job 4242 on della was cancelled"
    assert [d.ok for d in refused] == [False, False]
    assert "SMTPAuthenticationError" in refused[0].error


def test_a_server_certificate_the_site_does_not_trust_is_a_failed_delivery(tmp_path):
    pki = make_pki(tmp_path / "pki")
    with smtp_server(pki) as box:
        cfg = mail_config(tmp_path, box.port, smtp_starttls=True)
        sent = make_postman(cfg).send(message(NOTIFY))
    assert not sent[0].ok and "CERTIFICATE_VERIFY_FAILED" in sent[0].error
    assert box.received == []


def test_a_relay_that_is_down_is_a_failed_delivery_not_an_exception(tmp_path):
    sent = make_postman(mail_config(tmp_path, free_port())).send(message(WARN))
    assert [(d.recipient, d.ok) for d in sent] == [("alice@example.edu", False), (ADMIN, False)]
    assert "ConnectionRefusedError" in sent[0].error


def test_a_refused_recipient_fails_alone(tmp_path):
    with smtp_server() as box:
        box.refuse.add("alice@example.edu")
        sent = make_postman(mail_config(tmp_path, box.port)).send(message(WARN))
    assert sent[0].recipient == "alice@example.edu" and not sent[0].ok
    assert sent[0].error.startswith("refused: 550")
    assert sent[1] == Delivery("email", ADMIN, True, to_owner=False)
    assert [m.rcpt_tos for m in box.received] == [[ADMIN]]


def test_newlines_in_user_or_job_names_cannot_add_headers(tmp_path):
    overrides = tmp_path / "templates"
    overrides.mkdir()
    (overrides / "warn.txt.j2").write_text('{% set subject = "Job " ~ job.name %}body\n')
    evil = "x\nBcc: evil@attacker.test"
    with smtp_server() as box:
        cfg = mail_config(tmp_path, box.port, templates_dir="templates")
        by_user = make_postman(cfg).send(message(WARN, user=evil))
        assert box.received == []  # EmailMessage refused the whole message
        by_name = make_postman(cfg).send(message(WARN, name=evil))
    assert [d.ok for d in by_user] == [False, False] and "linefeed" in by_user[0].error
    assert all(d.ok for d in by_name)
    [mail] = box.received
    assert "evil@attacker.test" not in mail.rcpt_tos and mail.message["Bcc"] is None
    assert mail.message["Subject"] == "Job x Bcc: evil@attacker.test"


def test_a_site_template_overrides_the_built_in_one_of_the_same_name(tmp_path):
    overrides = tmp_path / "templates"
    overrides.mkdir()
    (overrides / "notify.txt.j2").write_text(
        '{% set subject = "Idle GPUs: " ~ job.job_id %}Dear {{ user }}: {{ cancel_command }}\n'
    )
    (overrides / "_efficiency.txt.j2").write_text("util={{ job.mean_util | pct }}\n")
    with smtp_server() as box:
        postman = make_postman(mail_config(tmp_path, box.port, templates_dir="templates"))
        postman.send(message(NOTIFY))
        postman.send(message(WARN))
    notice, warning = (m.message for m in box.received)
    assert notice["Subject"] == "Idle GPUs: 4242"
    assert notice.get_body(("plain",)).get_content().strip() == "Dear alice: scancel 4242"
    # The built-in warning is still used, with the site's efficiency table inside it.
    assert warning["Subject"].startswith("[sing] Job 4242 on della will be cancelled")
    assert "util=3%" in warning.get_body(("plain",)).get_content()


def test_a_template_cannot_reach_python_internals(tmp_path):
    overrides = tmp_path / "templates"
    overrides.mkdir()
    (overrides / "notify.txt.j2").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}\n")
    with smtp_server() as box, webhook_server() as hook:
        cfg = mail_config(tmp_path, box.port, templates_dir="templates", webhook_url=hook.url)
        sent = make_postman(cfg).send(message(NOTIFY))
    assert [(d.channel, d.ok) for d in sent] == [("email", False), ("webhook", False)]
    assert "SecurityError" in sent[0].error
    assert box.received == [] and hook.posts == []


def test_a_template_naming_a_figure_the_message_lacks_fails_visibly(tmp_path):
    with smtp_server() as box:
        postman = make_postman(mail_config(tmp_path, box.port))
        broken = Message(WARN, "alice", "della", "4242", context={"job": job()})
        sent = postman.send(broken)
    assert not sent[0].ok and "UndefinedError" in sent[0].error and box.received == []


def test_the_webhook_gets_the_ladder_messages_as_chat_json(tmp_path):
    with webhook_server() as hook:
        postman = make_postman(config(tmp_path, webhook_url=hook.url))
        sent = postman.send(message(WARN))
        assert postman.send(message(JOB_END)) == []  # a user's own reports stay out of chat
        hook.status = 500
        failed = postman.send(message(NOTIFY))
    host = hook.url.split("/")[2]
    assert sent == [Delivery("webhook", host, True)]  # the URL's secret path is not recorded
    assert failed == [Delivery("webhook", host, False, "HTTP 500 Internal Server Error")]
    text = hook.posts[0]["text"]
    assert text.startswith("[sing] Job 4242 on della will be cancelled at 2026-01-05 11:30 UTC")
    assert "Mean GPU utilisation  3%" in text and "    scancel 4242" in text


def test_a_webhook_that_is_down_is_a_failed_delivery(tmp_path):
    cfg = config(tmp_path, webhook_url=f"http://127.0.0.1:{free_port()}/hook")
    [sent] = make_postman(cfg).send(message(WARN))
    assert not sent.ok and "Connection refused" in sent.error


def test_with_no_channel_configured_nothing_is_delivered(tmp_path):
    assert make_postman(config(tmp_path)).send(message(WARN)) == []
    # A relay but no mail domain: warnings still reach the admins, notices reach no one.
    postman = make_postman(config(tmp_path, smtp_host="127.0.0.1", admin_emails=[ADMIN]))
    assert postman.addresses(message(WARN)) == ([], [ADMIN])  # (owners, admins)
    assert postman.send(message(NOTIFY)) == []


def test_a_time_zone_that_does_not_exist_stops_at_config_load(tmp_path):
    """Quiet hours, digests, messages and pages all use the zone: it is checked once, at load."""
    with pytest.raises(ConfigError, match="timezone = 'Mars/Olympus' is not a known time zone"):
        config(tmp_path, timezone="Mars/Olympus").section("policy", PolicySettings)


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ({"smtp_host": "relay", "smtp_username": "sing"}, "needs smtp_starttls"),
        ({"webhook_url": "file:///etc/passwd"}, r"not an http\(s\) URL"),
        ({"templates_dir": "missing"}, "is not a directory"),
    ],
)
def test_bad_message_settings_are_clear_errors(tmp_path, policy, error):
    with pytest.raises(UserError, match=error):
        make_postman(config(tmp_path, **policy))
