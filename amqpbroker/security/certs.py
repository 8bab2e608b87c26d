"""`amqpbroker certs create`: a CA and a server certificate for development and tests.

Made with `cryptography`; never committed to the repository. Host names become DNS
subjectAltNames (and IP addresses IP SANs, which some clients such as Proton ignore:
connect to `localhost`).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "amqpbroker development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def create_certificates(
    out: Path, hosts: list[str], *, client: str | None = None
) -> CertificateFiles:
    """Write ca.pem/ca.key and server.pem/server.key (and client.pem/.key if asked)."""
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("amqpbroker development CA"))
        .issuer_name(_name("amqpbroker development CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, names: list[str], usage: x509.ObjectIdentifier
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(n) for n in names]), critical=False
            )
        return builder.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = leaf(hosts[0], hosts, ExtendedKeyUsageOID.SERVER_AUTH)
    files = CertificateFiles(out / "ca.pem", out / "ca.key", out / "server.pem", out / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.ca_key, ca_key)
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.server_key, server_key)
    if client:
        client_cert, client_key = leaf(client, [], ExtendedKeyUsageOID.CLIENT_AUTH)
        (out / "client.pem").write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
        _write_key(out / "client.key", client_key)
    return files
