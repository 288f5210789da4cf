"""A throwaway certificate authority for the TLS tests (the ``cryptography`` package).

``make_ca(dir, "ca")`` writes ``ca.pem``; ``issue(ca, dir, "node")`` writes
``node.pem`` / ``node.key`` signed by it (SANs: localhost and 127.0.0.1, valid
one day), and returns a :class:`netcoll.TlsConfig`-ready dict of paths.
EC P-256 keys: quick to make.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Ca:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    path: str


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _window() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)


def make_ca(directory: Path, name: str = "ca") -> Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _window()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"netcoll test {name}"))
        .issuer_name(_name(f"netcoll test {name}"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Ca(cert, key, str(path))


def issue(ca: Ca, directory: Path, name: str) -> dict[str, str]:
    """A certificate for ``name`` signed by ``ca``; returns ``{"cert", "key", "ca"}`` paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _window()
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return {"cert": str(cert_path), "key": str(key_path), "ca": ca.path}
