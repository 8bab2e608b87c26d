"""Broker-checked SASL with python-qpid-proton clients (issue 8 scope: authentication),
and hostile SASL input against it (issue 15 items 1-5; B-154)."""

from __future__ import annotations

import os
import select
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import ConnectionException, Endpoint, SSLDomain
from proton.utils import BlockingConnection
from support.client import QUEUE, receive_bodies, send
from support.process import BrokerProcess, create_certs, sign_client_cert, start_broker
from support.raw import RawClient, open_socket, plain_sasl, read_sasl_outcome, sasl_init
from support.waiting import wait_until

from amqpbroker.protocol.sasl import SASL_HEADER
from amqpbroker.security import hash_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


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
            nobody: {{password-hash: "{hash_password("nobody-pw")}", roles: []}}
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
              consume: [admin]
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


def external(broker: BrokerProcess, certs: Path) -> BlockingConnection:
    """A TLS connection that authenticates with SASL EXTERNAL and `certs`' client.pem."""
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(certs / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    domain.set_credentials(str(certs / "client.pem"), str(certs / "client.key"), None)
    return BlockingConnection(
        f"amqps://localhost:{broker.ports['amqps']}",
        timeout=10,
        ssl_domain=domain,
        allowed_mechs="EXTERNAL",
    )


def test_external_with_a_client_certificate(broker: BrokerProcess, cert_dir: Path) -> None:
    """EXTERNAL (B-154): the TLS client certificate's CN, app-1, is the user, with its
    roles: it may send to `by-cert` (role app), and the refusal to consume there (admin
    only) names it; admin gets what it sent."""
    from proton.utils import LinkDetached

    conn = external(broker, cert_dir)
    try:
        send(conn, "by-cert", "from app-1", caps=("queue",))
        with pytest.raises(LinkDetached, match="user app-1 does not have permission 'consume'"):
            conn.create_receiver("by-cert", options=QUEUE)
    finally:
        conn.close()
    admin = plain(broker, "admin", "right-pw")
    try:
        receiver = admin.create_receiver("by-cert", options=QUEUE)
        assert receive_bodies(receiver, 1) == ["from app-1"]
    finally:
        admin.close()


def test_external_with_a_certificate_of_no_user_is_refused(
    broker: BrokerProcess, cert_dir: Path, tmp_path: Path
) -> None:
    """EXTERNAL (B-154): a certificate the broker's CA signed, whose CN names no configured
    user, is refused (outcome auth), and so is EXTERNAL without a client certificate."""
    refused = "authentication failed with mechanism EXTERNAL"
    before = broker.log().count(refused)
    stranger = sign_client_cert(cert_dir, "stranger", tmp_path / "stranger")
    with pytest.raises(ConnectionException):
        external(broker, stranger)
    wait_until(lambda: broker.log().count(refused) == before + 1, message="the refusal logged")
    domain = SSLDomain(SSLDomain.MODE_CLIENT)  # no client certificate
    domain.set_trusted_ca_db(str(cert_dir / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    with pytest.raises(ConnectionException):
        BlockingConnection(
            f"amqps://localhost:{broker.ports['amqps']}",
            timeout=10,
            ssl_domain=domain,
            allowed_mechs="EXTERNAL",
        )


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

    if action == "consume":  # the queue exists, created by admin
        admin = plain(broker, "admin", "right-pw")
        admin.create_sender(address, options=QUEUE).close()
        admin.close()
    conn = plain(broker, user, password)

    def attempt() -> None:
        if action in ("send", "create"):
            conn.create_sender(address, options=QUEUE)
        else:
            conn.create_receiver(address, options=QUEUE)

    try:
        if allowed:
            attempt()
        else:
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                attempt()
    finally:
        conn.close()


# -- hostile input (issue 15 items 1-5) ------------------------------------------------


def test_frames_pipelined_behind_sasl_init_are_authorized_as_the_user(
    broker: BrokerProcess,
) -> None:
    """Issue 15 item 1, B-154: SASL header, sasl-init (a user with no roles, right
    password), AMQP header, open, begin, attach and flow in one write: the attaches are
    refused with amqp:unauthorized-access and no message is delivered."""
    conn = plain(broker, "admin", "right-pw")
    send(conn, "secret", "s1", "s2", "s3", caps=("queue",))
    conn.close()

    client = RawClient(open_socket(broker.ports["amqp"]))
    client.connection.open()
    session = client.connection.session()
    session.open()
    receivers = []
    for name, address in (("r1", "secret"), ("r2", "anything.else")):
        receiver = session.receiver(name)
        receiver.source.address = address
        receiver.open()
        receiver.flow(10)
        receivers.append(receiver)
    client.sock.sendall(plain_sasl("nobody", "nobody-pw") + client.pending_output())
    code, rest = read_sasl_outcome(client.sock)
    assert code == 0
    client.push(rest)
    client.pump(lambda: all(r.state & Endpoint.REMOTE_CLOSED for r in receivers))
    for receiver in receivers:
        assert receiver.remote_condition is not None
        assert receiver.remote_condition.name == "amqp:unauthorized-access"
        assert receiver.queued == 0
    client.close()

    conn = plain(broker, "admin", "right-pw")
    receiver = conn.create_receiver("secret", options=QUEUE)
    assert receive_bodies(receiver, 3) == ["s1", "s2", "s3"]
    conn.close()


def test_plain_authzid_other_than_the_user_is_refused(broker: BrokerProcess) -> None:
    """Issue 15 item 1: no proxy authorization, even with the user's right password."""
    sock = open_socket(broker.ports["amqp"])
    sock.sendall(plain_sasl("nobody", "nobody-pw", authzid="admin"))
    code, _ = read_sasl_outcome(sock)
    assert code == 1  # auth
    wait_until(lambda: sock.recv(1) == b"", message="the broker closes the connection")
    sock.close()


def _failed_login_s(broker: BrokerProcess, user: str, source: str) -> float:
    sock = open_socket(broker.ports["amqp"], source=source)
    started = time.perf_counter()
    sock.sendall(plain_sasl(user, "wrong-pw"))
    code, _ = read_sasl_outcome(sock)
    elapsed = time.perf_counter() - started
    sock.close()
    assert code == 1
    return elapsed


@pytest.mark.timing  # compares wall-clock medians
def test_failed_login_takes_as_long_for_an_unknown_user(broker: BrokerProcess) -> None:
    """Issue 15 item 3: no user enumeration by timing: medians within 2x. Each try comes
    from its own loopback address, so the per-source throttle stays out of it."""
    known, unknown = [], []
    for i in range(7):
        known.append(_failed_login_s(broker, "admin", f"127.0.1.{2 * i + 1}"))
        unknown.append(_failed_login_s(broker, "ghost", f"127.0.1.{2 * i + 2}"))
    k, u = statistics.median(known), statistics.median(unknown)
    assert max(k, u) < 2 * min(k, u), (known, unknown)


def test_repeated_failures_from_one_source_are_slowed_down(broker: BrokerProcess) -> None:
    """Issue 15 item 4: after three free failures from one address, each attempt waits
    0.25 s, 0.5 s, 1 s after the last failure (security/logins.py; that other sources
    are not affected is a unit test: a check's own time varies too much under load)."""
    times = [_failed_login_s(broker, "admin", "127.0.3.1") for _ in range(6)]
    for wait_s, took_s in zip((0.25, 0.5, 1.0), times[3:], strict=True):
        assert took_s >= wait_s, times


def _round_trip_s(conn: BlockingConnection, sender: object, receiver: object) -> float:
    from proton import Message

    started = time.perf_counter()
    sender.send(Message(body="ping"))  # type: ignore[attr-defined]
    receiver.receive(timeout=10)  # type: ignore[attr-defined]
    receiver.accept()  # type: ignore[attr-defined]
    return time.perf_counter() - started


GUESSERS = """
import sys, threading
from support.raw import open_socket, plain_sasl, read_sasl_outcome
port, done = int(sys.argv[1]), [0]
def guess(source):
    while True:
        try:
            sock = open_socket(port, source=source)
            sock.sendall(plain_sasl("admin", "wrong-pw"))
            read_sasl_outcome(sock)
            sock.close()
        except OSError:
            return
        done[0] += 1
        if done[0] == 16:
            print("guessing", flush=True)
for i in range(16):
    threading.Thread(target=guess, args=(f"127.0.2.{i + 1}",), daemon=True).start()
sys.stdin.read()  # until the test closes stdin
"""


# The guessers' first 16 answers are 16 scrypt checks on the broker's nice-10 check thread:
# ~1 s quiet, 27 s at load 14 (two cores), past the 30 s wait this had, and near the
# default 60 s bound for the whole test. Waits, not what is measured.
@pytest.mark.timing  # compares wall-clock medians
@pytest.mark.timeout(300)
def test_guessing_clients_do_not_slow_down_the_others(broker: BrokerProcess) -> None:
    """Issue 15 item 4: 16 clients guessing passwords (each from its own address, in a
    child process so they do not share this process's GIL with the measuring client)
    while a logged-in client's round trip stays within 2x of what it is when idle. Idle
    is measured before the guessers start and again once they are gone, so that load
    from elsewhere on the machine that comes or goes meanwhile is on both sides."""
    conn = plain(broker, "admin", "right-pw")
    sender = conn.create_sender("rtt", options=QUEUE)
    receiver = conn.create_receiver("rtt", options=QUEUE)
    for _ in range(5):
        _round_trip_s(conn, sender, receiver)  # warm up
    idle = [_round_trip_s(conn, sender, receiver) for _ in range(21)]

    tests_dir = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests_dir), *sys.path]))
    with subprocess.Popen(
        [sys.executable, "-c", GUESSERS, str(broker.ports["amqp"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    ) as guessers:
        try:
            assert guessers.stdout is not None
            ready, _, _ = select.select([guessers.stdout], [], [], 120)
            assert ready, "the guessing clients did not get going"
            assert guessers.stdout.readline() == b"guessing\n"
            loaded = statistics.median(_round_trip_s(conn, sender, receiver) for _ in range(21))
        finally:
            guessers.kill()
    guessers.wait()  # gone, their connections with them
    idle += [_round_trip_s(conn, sender, receiver) for _ in range(21)]
    conn.close()
    assert loaded < 2 * statistics.median(idle), (idle, loaded)


def _peak_rss_kib(broker: BrokerProcess) -> int:
    status = Path(f"/proc/{broker.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])


_ULONG_40MB = b"\x00\x53\x41\xc0\x11\x02\xa3\x05PLAIN\x80" + struct.pack(">Q", 40_000_000)
LYING_INITS = [
    struct.pack(">IBBH", 8 + len(_ULONG_40MB), 2, 1, 0) + _ULONG_40MB,
    sasl_init("PLAIN", None)[:-1] + b"\xb0" + struct.pack(">I", 0xFFFFFFF0),
    struct.pack(">IBBH", 0xFFFFFFF0, 2, 1, 0) + b"\x00\x53\x41",
]


def _send_lying_inits(broker: BrokerProcess) -> None:
    for init in LYING_INITS:
        sock = open_socket(broker.ports["amqp"])
        sock.sendall(SASL_HEADER + init)
        wait_until(lambda s=sock: s.recv(65536) == b"", message="the broker closes it")  # type: ignore[misc]
        sock.close()


def test_declared_sizes_allocate_nothing(
    broker: BrokerProcess, tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """Issue 15 items 2 and 5: sasl-inits that claim 40 MB or 4 GB (a ulong where binary
    belongs, a vbin32 size, a frame size) leave the broker's peak RSS where it was, both
    with the broker's SASL (security on) and Proton's (security off); the broker serves on
    and never lets an exception escape data_received."""
    before = _peak_rss_kib(broker)
    _send_lying_inits(broker)
    assert _peak_rss_kib(broker) - before < 16 * 1024
    conn = plain(broker, "admin", "right-pw")
    conn.close()
    assert "Fatal error" not in broker.log()
    assert "Traceback" not in broker.log()

    open_broker = spawn(tmp_path)
    before = _peak_rss_kib(open_broker)
    _send_lying_inits(open_broker)
    assert _peak_rss_kib(open_broker) - before < 16 * 1024
    BlockingConnection(open_broker.url, timeout=10).close()
    assert "Traceback" not in open_broker.log()


def test_one_source_cannot_fill_the_queue_of_password_checks(broker: BrokerProcess) -> None:
    """Issue 15 item 4: beyond 4 checks waiting per source, a login from that source is
    answered sys-temp at once; another source is still checked (auth)."""
    socks = [open_socket(broker.ports["amqp"], source="127.0.4.1") for _ in range(10)]
    for sock in socks:
        sock.sendall(plain_sasl("admin", "wrong-pw"))
    codes = [read_sasl_outcome(sock)[0] for sock in socks]
    for sock in socks:
        sock.close()
    assert 4 in codes, codes  # sys-temp
    assert set(codes) <= {1, 4}, codes
    _failed_login_s(broker, "admin", "127.0.4.2")  # answered auth, not sys-temp
