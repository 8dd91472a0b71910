"""Test certificates made at test time: a CA, a server certificate for 127.0.0.1 and localhost,
and client certificates (one from the CA, one from a stranger CA). EC P-256, valid for a day;
no private key is ever committed."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    """A test CA, a server certificate for 127.0.0.1/localhost and client certificates."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by `ca`, SAN DNS:collector.test
    client_key: Path
    stranger_cert: Path  # a client certificate from another CA
    stranger_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    sans: list[x509.GeneralName] = (),  # type: ignore[assignment]
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, signer = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def make_pki(base: Path) -> Pki:
    """Write a CA, server and client certificates (EC P-256, valid for a day) under `base`."""
    base.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = _key(), _key()
    ca = _cert("sing test CA", ca_key, None)
    other = _cert("another CA", other_key, None)
    _write(base / "ca", ca, ca_key)
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    for name, issuer, sans in [
        ("server", (ca.subject, ca_key), local),
        ("client", (ca.subject, ca_key), [x509.DNSName("collector.test")]),
        ("stranger", (other.subject, other_key), [x509.DNSName("collector.test")]),
    ]:
        key = _key()
        _write(base / name, _cert(name, key, issuer, sans), key)
    return Pki(
        base, base / "ca.pem", base / "server.pem", base / "server.key",
        base / "client.pem", base / "client.key", base / "stranger.pem", base / "stranger.key",
    )  # fmt: skip
