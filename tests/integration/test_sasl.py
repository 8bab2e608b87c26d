"""Broker-checked SASL with python-qpid-proton clients (issue 8 scope: authentication)."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import ConnectionException, SSLDomain
from proton.utils import BlockingConnection
from support.client import receive_bodies, send
from support.process import BrokerProcess, create_certs, start_broker

from amqpbroker.security import hash_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_certs(tmp_path_factory.mktemp("certs"), "--client", "app-1")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> BrokerProcess:
    running = start_broker(
        tmp_path_factory.mktemp("sasl"),
        f"""
        acceptors:
          - name: amqp
            url: amqp://127.0.0.1:0
          - name: amqps
            url: amqps://localhost:0
            tls: {{cert-file: {cert_dir}/server.pem, key-file: {cert_dir}/server.key,
                   ca-file: {cert_dir}/ca.pem, client-auth: optional}}
        security:
          enabled: true
          sasl-mechanisms: [PLAIN, EXTERNAL]
          users:
            admin: {{password-hash: "{hash_password("right-pw")}", roles: [admin]}}
            app-1: {{password-hash: "{hash_password("unused")}", roles: [app]}}
            reader: {{password-hash: "{hash_password("read-pw")}", roles: [readers]}}
          security-settings:
            "#":
              send: [admin]
              consume: [admin]
              browse: [admin]
              create-address: [admin]
              create-durable-queue: [admin]
              create-non-durable-queue: [admin]
              manage: [admin]
            "by-cert":
              send: [app]
              create-address: [app]
              create-durable-queue: [app]
            "public.#":  # the most specific match decides alone: admin is listed again
              send: [admin]
              create-address: [admin]
              create-durable-queue: [admin]
              consume: [readers, admin]
              browse: [readers]
        """,
    )
    yield running  # type: ignore[misc]
    assert running.stop() == 0, running.log()


def plain(broker: BrokerProcess, user: str, password: str) -> BlockingConnection:
    return BlockingConnection(
        broker.url,
        timeout=10,
        user=user,
        password=password,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )


def test_plain_with_the_right_password(broker: BrokerProcess) -> None:
    """PLAIN checked by the broker against the scrypt hash."""
    conn = plain(broker, "admin", "right-pw")
    send(conn, "secured", "hello", caps=("queue",))
    assert receive_bodies(conn.create_receiver("secured"), 1) == ["hello"]
    conn.close()


def test_plain_with_a_wrong_password_is_refused(broker: BrokerProcess) -> None:
    """Failed authentication: outcome auth, connection closed, logged without password."""
    with pytest.raises(ConnectionException):
        plain(broker, "admin", "wrong-pw")
    with pytest.raises(ConnectionException):
        plain(broker, "nobody", "right-pw")
    assert "wrong-pw" not in broker.log()
    assert "authentication failed with mechanism PLAIN" in broker.log()


def test_anonymous_is_refused_when_security_is_on(broker: BrokerProcess) -> None:
    """A client must never be let in as anonymous when security is enabled."""
    with pytest.raises(ConnectionException):
        BlockingConnection(broker.url, timeout=10, allowed_mechs="ANONYMOUS")


def test_external_with_a_client_certificate(broker: BrokerProcess, cert_dir: Path) -> None:
    """EXTERNAL: the TLS client certificate's CN (app-1) names the user."""
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(cert_dir / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    domain.set_credentials(str(cert_dir / "client.pem"), str(cert_dir / "client.key"), None)
    conn = BlockingConnection(
        f"amqps://localhost:{broker.ports['amqps']}",
        timeout=10,
        ssl_domain=domain,
        allowed_mechs="EXTERNAL",
    )
    send(conn, "by-cert", "x", caps=("queue",))
    conn.close()


def http_status(broker: BrokerProcess, user: str | None, password: str | None) -> int:
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)


def test_http_api_requires_a_user_with_manage(broker: BrokerProcess) -> None:
    """401 without or with bad credentials, 403 without `manage`, 200 with it."""
    assert http_status(broker, None, None) == 401
    assert http_status(broker, "admin", "nope") == 401
    assert http_status(broker, "reader", "read-pw") == 403
    assert http_status(broker, "admin", "right-pw") == 200


@pytest.mark.parametrize(
    ("user", "password", "action", "address", "allowed"),
    [
        ("admin", "right-pw", "send", "orders.x", True),
        ("admin", "right-pw", "consume", "orders.x", True),
        ("reader", "read-pw", "send", "public.news", False),
        ("reader", "read-pw", "consume", "public.news", True),
        ("reader", "read-pw", "consume", "orders.y", False),
        ("reader", "read-pw", "create", "fresh.address", False),
    ],
)
def test_permissions_are_checked_at_attach(
    broker: BrokerProcess, user: str, password: str, action: str, address: str, allowed: bool
) -> None:
    """B-154: send/consume/create refused with amqp:unauthorized-access naming the
    permission; the most specific security-settings match decides."""
    from proton.utils import LinkDetached
    from support.client import Capabilities

    if action == "consume":  # the queue exists, created by admin
        admin = plain(broker, "admin", "right-pw")
        admin.create_sender(address, options=Capabilities("queue")).close()
        admin.close()
    conn = plain(broker, user, password)

    def attempt() -> None:
        if action in ("send", "create"):
            conn.create_sender(address, options=Capabilities("queue"))
        else:
            conn.create_receiver(address, options=Capabilities("queue"))

    try:
        if allowed:
            attempt()
        else:
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                attempt()
    finally:
        conn.close()
