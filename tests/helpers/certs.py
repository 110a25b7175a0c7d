"""Test certificates made on the spot: a CA, a server certificate for 127.0.0.1/localhost and
client certificates (one from the CA, one from a stranger's CA)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate signed by another CA
    stranger_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key, issuer: str, issuer_key, *, ca: bool, server: bool = False):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert=None, key=None) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


def make_certs(out: Path) -> CertFiles:
    out.mkdir(parents=True, exist_ok=True)
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in
            ("ca", "server", "client", "other-ca", "stranger")}
    ca = _issue("splitspec test CA", keys["ca"], "splitspec test CA", keys["ca"], ca=True)
    other = _issue("other CA", keys["other-ca"], "other CA", keys["other-ca"], ca=True)
    server = _issue("localhost", keys["server"], "splitspec test CA", keys["ca"],
                    ca=False, server=True)
    client = _issue("router", keys["client"], "splitspec test CA", keys["ca"], ca=False)
    stranger = _issue("stranger", keys["stranger"], "other CA", keys["other-ca"], ca=False)
    del other  # only its key signed the stranger
    return CertFiles(
        ca=_write(out / "ca.pem", cert=ca),
        server_cert=_write(out / "server.pem", cert=server),
        server_key=_write(out / "server.key", key=keys["server"]),
        client_cert=_write(out / "client.pem", cert=client),
        client_key=_write(out / "client.key", key=keys["client"]),
        stranger_cert=_write(out / "stranger.pem", cert=stranger),
        stranger_key=_write(out / "stranger.key", key=keys["stranger"]),
    )


@pytest.fixture(scope="module", name="certs")
def certs_fixture(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A CA, a server and a client certificate of it, and a stranger's, for one test module."""
    return make_certs(tmp_path_factory.mktemp("certs"))
