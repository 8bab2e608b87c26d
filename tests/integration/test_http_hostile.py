"""The HTTP server against hostile clients, with security enabled (issue 15, issue 16).

Spellings that skipped authentication, bodies without bounds, slowloris, a message that
broke browsing, HEAD. Requests go through `support.http.raw_request`, which sends the
target exactly as spelled.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Delivery, Message
from support import frames as F
from support.client import QUEUE, connect, send
from support.hostile import SPELLINGS, nested_list
from support.http import basic_auth, parse_response, raw_request
from support.process import BrokerProcess, start_broker
from support.waiting import wait_until

from amqpbroker.amqp import sections
from amqpbroker.security import hash_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

READ_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 60
ADMIN = basic_auth("admin", "admin-pw")
APP = basic_auth("app", "app-pw")
OPS_PASSWORD = "p@ss:w/rd%é"  # every character a URL's userinfo must escape


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    running = start_broker(
        tmp_path_factory.mktemp("hostile"),
        f"""
        http:
          bind: 127.0.0.1:0
          read-timeout: {int(READ_TIMEOUT_S * 1000)}
          max-connections: {MAX_CONNECTIONS}
        security:
          enabled: true
          users:
            admin: {{password-hash: "{hash_password("admin-pw")}", roles: [admin]}}
            app: {{password-hash: "{hash_password("app-pw")}", roles: [app]}}
            ops: {{password-hash: "{hash_password(OPS_PASSWORD)}", roles: [admin]}}
            viewer: {{password-hash: "{hash_password("viewer-pw")}", roles: [viewer]}}
          security-settings:
            "#":
              send: [admin, app]
              consume: [admin, app]
              browse: [admin, app]
              create-address: [admin, app]
              create-durable-queue: [admin, app]
              create-non-durable-queue: [admin, app]
              manage: [admin]
            # Issue 24: reading the API needs `browse` here, acting `manage`.
            activemq.management: {{browse: [admin, viewer], manage: [admin]}}
        """,
        log_level="info",
    )
    conn = connect(f"amqp://admin:admin-pw@127.0.0.1:{running.ports['amqp']}")
    for body in ("a", "b", "c"):
        send(conn, "Q", body, caps=("queue",))
    send(conn, "Q2", "z", caps=("queue",))
    conn.close()
    yield running
    assert running.stop() == 0, running.log()


def port(broker: BrokerProcess) -> int:
    return broker.ports["http"]


def messages_in(broker: BrokerProcess, queue: str) -> int:
    status, _, body = raw_request(
        port(broker), "GET", f"/api/v1/queues/{queue}", headers={"Authorization": ADMIN}
    )
    assert status == 200, body
    count: int = json.loads(body)["messages"]
    return count


ROUTES = [
    ("GET", "/api/v1/addresses"),
    ("GET", "/api/v1/queues"),
    ("GET", "/api/v1/queues/Q"),
    ("GET", "/api/v1/queues/Q/messages"),
    ("POST", "/api/v1/queues/Q/purge"),
    ("POST", "/api/v1/queues/Q/move"),
    ("POST", "/api/v1/queues/Q/retry"),
    ("GET", "/api/v1/nothing-here"),
    ("GET", "/nothing-here"),
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_route_and_spelling_needs_manage_credentials(
    broker: BrokerProcess, spelling: str
) -> None:
    """Issue 15: `/%61pi/v1/queues` and friends answer 401 without credentials and 403
    without `manage`, for the route's method and HEAD; nothing is purged or moved."""
    for canonical, path in ROUTES:
        target = SPELLINGS[spelling](path)
        body = b'{"to-queue": "Q2"}' if canonical == "POST" else b""
        for method in (canonical, "HEAD"):
            status, headers, _ = raw_request(port(broker), method, target, body=body)
            assert status == 401, (method, target)
            assert headers["www-authenticate"].startswith("Basic ")
            status, _, _ = raw_request(
                port(broker), method, target, body=body, headers={"Authorization": APP}
            )
            assert status == 403, (method, target)
    assert messages_in(broker, "Q") == 3


def test_wrong_passwords_and_unknown_users_are_401(broker: BrokerProcess) -> None:
    """Issue 15: a bad password on a percent-encoded purge is refused (and purges nothing)."""
    for authorization in (basic_auth("admin", "nope"), basic_auth("ghost", "admin-pw")):
        status, _, _ = raw_request(
            port(broker),
            "POST",
            "/%61%70%69/v1/queues/Q/%70urge",
            body=b"{}",
            headers={"Authorization": authorization},
        )
        assert status == 401
    assert messages_in(broker, "Q") == 3


@pytest.mark.parametrize(
    "target", ["/api/v1/queues/%00", "/api\\v1\\queues", "/api/v1/queues/%C0%AF", "*"]
)
def test_ambiguous_targets_are_400(broker: BrokerProcess, target: str) -> None:
    """Issue 15: NUL, backslashes, overlong UTF-8: refused, never routed."""
    assert raw_request(port(broker), "GET", target, headers={"Authorization": ADMIN})[0] == 400


def test_metrics_and_healthz_need_no_credentials_and_answer_head(broker: BrokerProcess) -> None:
    """docs/decisions.md: open scrapes and probes; issue 16 item 5: HEAD, no body."""
    status, _, body = raw_request(port(broker), "GET", "/metrics")
    assert status == 200
    assert b"amqpbroker_connections" in body
    status, headers, head_body = raw_request(port(broker), "HEAD", "/metrics")
    assert (status, head_body) == (200, b"")
    assert int(headers["content-length"]) > 0
    assert headers["content-type"].startswith("text/plain")
    status, headers, head_body = raw_request(port(broker), "HEAD", "/%68ealthz")
    assert (status, head_body) == (200, b"")
    assert headers["content-length"] == str(len(b'{"status": "ok"}'))


def send_head(broker: BrokerProcess, head: str, body: bytes = b"") -> tuple[int, bytes, float]:
    """Send a request head (and maybe part of a body); the status, the answer and how
    long it took, without ever sending what the head promises."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as sock:
        sock.sendall(head.encode("latin-1") + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    status, _, answer = parse_response(b"".join(chunks))
    return status, answer, time.monotonic() - started


def post_head(content_length: str, *, authorization: str = ADMIN, extra: str = "") -> str:
    return (
        "POST /api/v1/queues/Q/purge HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {authorization}\r\nContent-Length: {content_length}\r\n"
        f"X-Requested-By: test\r\n{extra}\r\n"
    )


@pytest.mark.timing  # bounds the wall-clock time of an answer
def test_a_300_mb_body_is_refused_without_reading_it(broker: BrokerProcess) -> None:
    """Issue 15: 413 at once; the broker does not grow; nothing purged."""
    before = broker.rss_bytes()
    status, answer, took = send_head(broker, post_head("300000000"), b"{" * 65536)
    assert status == 413
    assert "limited to 1048576 bytes" in json.loads(answer)["error"]
    assert took < READ_TIMEOUT_S  # answered, not waited for
    assert broker.rss_bytes() - before < 16 * 1024 * 1024
    assert messages_in(broker, "Q") == 3


@pytest.mark.timing  # bounds the wall-clock time of an answer
@pytest.mark.parametrize(
    ("content_length", "extra", "status"),
    [
        ("-1", "", 400),
        ("abc", "", 400),
        ("+5", "", 400),
        ("1e3", "", 400),
        ("5", "Content-Length: 6\r\n", 400),
        ("5", "Transfer-Encoding: chunked\r\n", 411),
    ],
)
def test_bad_content_lengths_are_answered_at_once(
    broker: BrokerProcess, content_length: str, extra: str, status: int
) -> None:
    """Issue 15: `Content-Length: -1` used to hang and `abc` to answer 500."""
    answered, answer, took = send_head(broker, post_head(content_length, extra=extra))
    assert answered == status
    assert "error" in json.loads(answer)
    assert took < READ_TIMEOUT_S


@pytest.mark.timing  # bounds the wall-clock time of an answer
def test_a_body_shorter_than_announced_times_out_with_408(broker: BrokerProcess) -> None:
    """Issue 15: the body, too, must arrive within read-timeout."""
    status, _, took = send_head(broker, post_head("100"), b'{"filter"')
    assert status == 408
    assert READ_TIMEOUT_S * 0.8 < took < READ_TIMEOUT_S * 5
    assert messages_in(broker, "Q") == 3


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (it sends nothing before)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def half_open(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port(broker)), timeout=5)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    return sock


@pytest.mark.timing  # bounds the wall-clock time of an answer
def test_a_half_sent_request_is_closed_after_read_timeout(broker: BrokerProcess) -> None:
    """Issue 15 slowloris: 200 half-sent requests used to stay open for ever."""
    started = time.monotonic()
    with half_open(broker) as sock:
        assert closed_within(sock, READ_TIMEOUT_S * 5)
    assert READ_TIMEOUT_S * 0.8 < time.monotonic() - started < READ_TIMEOUT_S * 5


@pytest.mark.timing  # bounds the wall-clock time of an answer
def test_a_trickling_client_is_cut_off_at_the_deadline(broker: BrokerProcess) -> None:
    """Issue 15: one byte every 100 ms never completes a head; the timeout is for the
    whole head, not for each read."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port(broker)), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        try:
            while time.monotonic() - started < READ_TIMEOUT_S * 3:
                sock.sendall(b"a")
                time.sleep(0.1)  # the pace of the attack, not a wait for the server
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_within(sock, READ_TIMEOUT_S * 5)
    assert time.monotonic() - started < READ_TIMEOUT_S * 3


@pytest.mark.timing  # bounds the wall-clock time of an answer
def test_requests_are_served_while_50_half_open_ones_wait(broker: BrokerProcess) -> None:
    """Issue 15: one slow client never blocks others; the slow ones are closed later."""
    sockets = [half_open(broker) for _ in range(50)]
    try:
        started = time.monotonic()
        status, _, body = raw_request(port(broker), "GET", "/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        assert time.monotonic() - started < READ_TIMEOUT_S  # before any was closed
        assert all(closed_within(s, READ_TIMEOUT_S * 5) for s in sockets)
    finally:
        for s in sockets:
            s.close()


def test_connections_beyond_max_connections_get_503(tmp_path: Path) -> None:
    """Issue 15: a thread per connection, at most `http.max-connections` of them."""
    running = start_broker(tmp_path, "http: {bind: 127.0.0.1:0, max-connections: 3}")
    try:
        http_port = running.ports["http"]
        sockets = [socket.create_connection(("127.0.0.1", http_port), timeout=5) for _ in range(3)]
        # The accept thread takes connections in order: once the three hold their slots,
        # the next one is refused at once.
        wait_until(
            lambda: raw_request(http_port, "GET", "/healthz")[0] == 503,
            message="a 503 at max-connections",
        )
        for s in sockets:
            s.close()
        wait_until(
            lambda: raw_request(http_port, "GET", "/healthz")[0] == 200, message="slots freed"
        )
    finally:
        assert running.stop() == 0


@pytest.mark.timing  # bounds the wall-clock time of an answer
def test_a_request_head_over_64_kib_is_refused_with_431(broker: BrokerProcess) -> None:
    """Issue 15 attack pass: the standard library alone took 99 header lines of 64 KB
    (6.4 MB held per request, times http.max-connections). Now the request line and
    headers together may be 64 KiB (MAX_HEAD_BYTES); a longer head is answered 431, and
    100,000 headers or a 10 MB header line do not grow the broker."""
    big = "".join(f"X-Pad-{n}: {'a' * 40_000}\r\n" for n in range(2))
    status, _, _ = raw_request(port(broker), "GET", "/healthz", headers={"X-Pad": "a" * 60_000})
    assert status == 200
    assert send_head(broker, f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{big}\r\n")[0] == 431
    before = broker.rss_bytes()
    for _ in range(20):
        status, _, took = send_head(broker, "GET /healthz HTTP/1.1\r\n" + "X-a: b\r\n" * 100_000)
        assert status == 431
        assert took < 2.0
        with (
            socket.create_connection(("127.0.0.1", port(broker)), timeout=10) as sock,
            contextlib.suppress(OSError),  # refused before all of it is sent
        ):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nX-a: " + b"a" * 10_000_000)
    assert broker.rss_bytes() - before < 20 * 1024 * 1024


def test_a_message_nested_10000_deep_is_refused_and_its_queue_stays_browsable(
    broker: BrokerProcess,
) -> None:
    """Issue 15: a message whose application-properties and body nest 10,000 deep is
    refused at the door (`amqp:decode-error`, nesting above sections.MAX_DEPTH); browsing
    its queue answers 200 with the other messages, and one nesting exactly MAX_DEPTH deep
    is kept and shown decoded. (A stored message that cannot be decoded is shown with
    `decode_error`: tests/unit/management/test_browse.py.)"""
    deep = nested_list(10_000)
    key = sections.encode_value("k")
    app_props = b"\x00\x53\x74\xd1" + struct.pack(">II", len(key + deep) + 4, 2) + key + deep
    at_limit = sections.encode_value(F.nested_lists(sections.MAX_DEPTH))
    conn = connect(f"amqp://admin:admin-pw@127.0.0.1:{port_amqp(broker)}")
    try:
        sender = conn.create_sender("deep", options=QUEUE)
        outcomes = []
        for tag, data in (
            (b"d1", app_props + b"\x00\x53\x77" + deep),
            (b"d2", b"\x00\x53\x77" + at_limit),
        ):
            delivery = sender.link.delivery(tag)
            sender.link.send(data)
            sender.link.advance()
            conn.wait(lambda d=delivery: d.remote_state != 0, msg="an outcome")
            condition = delivery.remote.condition
            outcomes.append((delivery.remote_state, condition.name if condition else None))
        assert outcomes == [
            (Delivery.REJECTED, "amqp:decode-error"),
            (Delivery.ACCEPTED, None),
        ]
        sender.send(Message(body="fine"))
    finally:
        conn.close()
    status, _, body = raw_request(
        port(broker), "GET", "/api/v1/queues/deep/messages", headers={"Authorization": ADMIN}
    )
    assert status == 200, body
    limit, fine = json.loads(body)
    assert "decode_error" not in limit
    assert fine["body_preview"] == "fine"
    assert "decode_error" not in fine


def port_amqp(broker: BrokerProcess) -> int:
    return broker.ports["amqp"]


def cli(
    broker: BrokerProcess,
    *args: str,
    url: str | None = None,
    env: dict[str, str] | None = None,
    stdin: str = "",
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AMQPBROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "amqpbroker", *args, "--url", url or base_url(broker)],
        capture_output=True,
        text=True,
        input=stdin,
        env={**clean, **(env or {})},
        timeout=30,
    )


def base_url(broker: BrokerProcess) -> str:
    return f"http://127.0.0.1:{port(broker)}"


def test_cli_takes_percent_encoded_credentials_in_the_url(broker: BrokerProcess) -> None:
    """Issue 15 item 7: `--url http://user:pass@host` used to fail to resolve a host."""
    secret = urllib.parse.quote(OPS_PASSWORD, safe="")
    result = cli(broker, "queues", "--json", url=f"http://ops:{secret}@127.0.0.1:{port(broker)}")
    assert result.returncode == 0, result.stderr
    assert "Q2" in {q["name"] for q in json.loads(result.stdout)}


def test_cli_takes_credentials_from_the_environment(broker: BrokerProcess) -> None:
    env = {"AMQPBROKER_USER": "ops", "AMQPBROKER_PASSWORD": OPS_PASSWORD}
    result = cli(broker, "messages", "Q2", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert [m["body_preview"] for m in json.loads(result.stdout)] == ["z"]


def test_cli_reads_the_password_from_stdin(broker: BrokerProcess) -> None:
    result = cli(broker, "queues", "--user", "ops", "--password-stdin", stdin=OPS_PASSWORD + "\n")
    assert result.returncode == 0, result.stderr
    assert "Q2" in result.stdout


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        (
            {},
            "amqpbroker: authentication required: use --user or AMQPBROKER_USER, or "
            "user:password@ in --url (HTTP 401)",
        ),
        (
            {"env": {"AMQPBROKER_USER": "admin", "AMQPBROKER_PASSWORD": "wrong-secret"}},
            "amqpbroker: authentication failed for user admin (HTTP 401)",
        ),
        (
            {"env": {"AMQPBROKER_USER": "app", "AMQPBROKER_PASSWORD": "app-pw"}},
            "amqpbroker: the 'manage' permission is required (HTTP 403)",
        ),
        (
            {"env": {"AMQPBROKER_USER": "ops"}},
            "amqpbroker: no password for user ops: set AMQPBROKER_PASSWORD or use --password-stdin",
        ),
        (
            {"url": "ftp://ops:wrong-secret@127.0.0.1:1"},
            "amqpbroker: --url must look like http://HOST:PORT, not 'ftp://127.0.0.1:1'",
        ),
        (
            {"url": "http://ops:wrong-secret@127.0.0.1:9"},
            "amqpbroker: cannot reach the broker at http://127.0.0.1:9: [Errno 111] "
            "Connection refused",
        ),
    ],
)
def test_cli_auth_failures_are_one_line_without_the_password(
    broker: BrokerProcess, how: dict[str, object], expected: str
) -> None:
    """Issue 15 item 7: a 401/403 is one line and exit 1; no password is ever echoed."""
    result = cli(broker, "purge", "Q2", **how)  # type: ignore[arg-type]
    assert result.returncode == 1
    assert result.stderr.strip() == expected
    assert "Traceback" not in result.stderr
    assert "wrong-secret" not in result.stderr + result.stdout
    assert messages_in(broker, "Q2") == 1
