"""amqps:// acceptors with Python's ssl, certificates from `amqpbroker certs create`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from proton import ConnectionException, SSLDomain
from proton.utils import BlockingConnection
from support.client import receive_bodies, send
from support.process import create_certs, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


certs = create_certs


def tls_broker(tmp_path: Path, cert_dir: Path, client_auth: str = "none"):  # type: ignore[no-untyped-def]
    return start_broker(
        tmp_path,
        f"""
        acceptors:
          - name: amqp
            url: amqp://127.0.0.1:0
          - name: amqps
            url: amqps://localhost:0
            tls:
              cert-file: {cert_dir / "server.pem"}
              key-file: {cert_dir / "server.key"}
              ca-file: {cert_dir / "ca.pem"}
              client-auth: {client_auth}
        """,
    )


def client_domain(ca: Path, *, cert: Path | None = None, key: Path | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert is not None and key is not None:
        domain.set_credentials(str(cert), str(key), None)
    return domain


def test_tls_round_trip_with_certs_create(tmp_path: Path) -> None:
    """A CA from `certs create`; the client verifies the server name `localhost`."""
    cert_dir = certs(tmp_path / "certs")
    broker = tls_broker(tmp_path, cert_dir)
    try:
        conn = BlockingConnection(
            f"amqps://localhost:{broker.ports['amqps']}",
            timeout=10,
            ssl_domain=client_domain(cert_dir / "ca.pem"),
        )
        send(conn, "secure", "over-tls", caps=("queue",))
        receiver = conn.create_receiver("secure")
        assert receive_bodies(receiver, 1) == ["over-tls"]
        conn.close()
    finally:
        assert broker.stop() == 0


def test_untrusted_ca_is_refused(tmp_path: Path) -> None:
    """A client that trusts another CA cannot connect."""
    cert_dir = certs(tmp_path / "certs")
    other = certs(tmp_path / "other")
    broker = tls_broker(tmp_path, cert_dir)
    try:
        with pytest.raises(ConnectionException):
            BlockingConnection(
                f"amqps://localhost:{broker.ports['amqps']}",
                timeout=5,
                ssl_domain=client_domain(other / "ca.pem"),
            )
    finally:
        assert broker.stop() == 0


def test_client_auth_required_refuses_a_client_without_certificate(tmp_path: Path) -> None:
    """client-auth: required -> a client without a certificate is refused; with one from
    the same CA it is let in."""
    cert_dir = certs(tmp_path / "certs", "--client", "app-1")
    broker = tls_broker(tmp_path, cert_dir, client_auth="required")
    url = f"amqps://localhost:{broker.ports['amqps']}"
    try:
        with pytest.raises(ConnectionException):
            _send_once(url, client_domain(cert_dir / "ca.pem"))
        conn = BlockingConnection(
            url,
            timeout=10,
            ssl_domain=client_domain(
                cert_dir / "ca.pem", cert=cert_dir / "client.pem", key=cert_dir / "client.key"
            ),
        )
        send(conn, "mtls", "ok", caps=("queue",))
        conn.close()
    finally:
        assert broker.stop() == 0


def _send_once(url: str, domain: SSLDomain) -> None:
    conn = BlockingConnection(url, timeout=5, ssl_domain=domain)
    try:
        send(conn, "x", "y", caps=("queue",))
    finally:
        conn.close()


def test_missing_certificate_file_stops_startup_with_one_line(tmp_path: Path) -> None:
    """A TLS file that cannot be loaded: clear error naming it, exit 1, no traceback."""
    config = tmp_path / "tls.yaml"
    config.write_text(
        "acceptors:\n  - name: amqps\n    url: amqps://localhost:0\n"
        f"    tls: {{cert-file: {tmp_path}/nope.pem, key-file: {tmp_path}/nope.key}}\n"
        "http: {enabled: false}\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "amqpbroker",
            "run",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert (  # issue 15 item 3: the file is named
        f"cannot start: acceptor amqps: cannot load TLS certificate/key: {tmp_path}/nope.pem: "
        "No such file or directory\n"
    ) in result.stderr
    assert "Traceback" not in result.stderr
