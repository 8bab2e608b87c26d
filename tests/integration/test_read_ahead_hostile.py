"""Hostile peers against read-ahead (issue 20 attack, `_AmqpProtocol.data_received`):
after a read of 16 KiB or more the broker reads the same socket up to 3 more times in
the loop turn. A bad frame, a reset or a half-close inside such a burst, or a peer that
never reads while it sends, must close (or pause) that connection only, with the right
error (B-095 hostile input), and route nothing that came after a framing error."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest
from proton import Message
from support import frames as F
from support import raw
from support.client import QUEUE, connect
from support.inproc import ThreadBroker

from amqpbroker import server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_IN_THREAD = True  # read-ahead's reads are counted (`read_aheads`)
BODY = "x" * 2000  # ~2 KiB a message: a 1 MiB burst is ~500 transfers


@pytest.fixture
def read_aheads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the reads read-ahead made (non-empty ones): the attack reached it."""
    sizes: list[int] = []
    read_ahead = server._AmqpProtocol._read_ahead

    def counted(self: server._AmqpProtocol) -> bytes:
        data = read_ahead(self)
        if data:
            sizes.append(len(data))
        return data

    monkeypatch.setattr(server._AmqpProtocol, "_read_ahead", counted)
    return sizes


def _consume(sock: socket.socket, address: str, credit: int = 100_000) -> None:
    """A raw consumer on `address` on the producer's connection: what it sends goes out
    at once (read-ahead reads on only while output flows)."""
    source = F.source(address, "queue")
    sock.sendall(
        F.frame(F.attach("c", handle=1, role_receiver=True, source=source))
        + F.frame(F.flow(handle=1, credit=credit))
    )
    time.sleep(0.2)


def _producer(broker: ThreadBroker, address: str) -> tuple[socket.socket, bytes]:
    """A raw producer on `address`: open, begin, attach; waits for the broker's credit."""
    sock = socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5)
    sock.sendall(
        F.AMQP_HEADER
        + F.frame(F.open_())
        + F.frame(F.begin(incoming_window=65535))
        + F.frame(F.attach("p", role_receiver=False, target=F.target(address, "queue")))
    )
    got = b""
    while not any(F.performative_code(p) == F.FLOW for _, _, p in F.read_frames(got)):
        chunk = sock.recv(65536)
        assert chunk, f"closed before credit: {got!r}"
        got += chunk
    return sock, got


def _transfers(first: int, n: int, tag: str) -> bytes:
    """`n` pre-settled transfers, delivery ids from `first`, bodies `tag-<i>`."""
    return b"".join(
        F.frame(
            F.transfer(delivery_id=i, tag=str(i).encode(), settled=True),
            payload=F.message(f"{tag}-{i}-{BODY}"),
        )
        for i in range(first, first + n)
    )


def _count(broker: ThreadBroker, queue: str) -> int:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/{queue}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return int(json.loads(response.read())["messages"])


def _drain_bodies(broker: ThreadBroker, queue: str) -> list[str]:
    conn = connect(broker.url)
    try:
        receiver = conn.create_receiver(queue, options=QUEUE, credit=1000)
        bodies = []
        while True:
            try:
                message = receiver.receive(timeout=1)
            except Exception:
                return bodies
            bodies.append(str(message.body))
            receiver.accept()
    finally:
        conn.close()


@pytest.mark.parametrize("at", [300, 900])
def test_a_bad_frame_inside_a_burst_closes_with_framing_error_and_routes_nothing_after(
    broker: ThreadBroker, at: int, read_aheads: list[int]
) -> None:
    """A frame whose declared size is below the 8-byte header, `at` transfers into a
    1,000-transfer burst (read 1 or a later read of the turn): the broker answers close
    with amqp:connection:framing-error and hangs up; nothing after it is routed."""
    queue = f"burst-bad-{at}"
    sock, _ = _producer(broker, queue)
    _consume(sock, queue)
    with sock:
        garbage = struct.pack(">IBBH", 3, 2, 0, 0)
        burst = _transfers(0, at, "ok") + garbage + _transfers(at, 1000 - at, "late")
        sock.sendall(burst)
        got, closed = raw.read_until_closed(sock)
    assert closed
    assert F.close_condition(got) == "amqp:connection:framing-error"
    bodies = _drain_bodies(broker, queue)
    assert len(bodies) == at
    assert not [b for b in bodies if b.startswith("late")]
    assert read_aheads  # the burst was read ahead


@pytest.mark.parametrize("how", ["reset", "half-close"])
def test_a_burst_ended_by_a_reset_or_a_half_close_leaves_the_broker_whole(
    broker: ThreadBroker, how: str, read_aheads: list[int]
) -> None:
    """A 1 MiB burst then an RST (SO_LINGER 0) or a SHUT_WR: the broker routes at most
    the whole transfers it read, closes that connection, and serves others at once."""
    queue = f"burst-{how}"
    sock, _ = _producer(broker, queue)
    _consume(sock, queue)
    burst = _transfers(0, 500, "ok")
    sock.sendall(burst[: len(burst) - 1000])  # the last transfer cut short
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    else:
        sock.shutdown(socket.SHUT_WR)
        _, closed = raw.read_until_closed(sock)
        sock.close()
        assert closed
    conn = connect(broker.url)  # another peer is served
    conn.close()
    bodies = _drain_bodies(broker, queue)
    assert len(bodies) <= 499
    assert bodies == [f"ok-{i}-{BODY}" for i in range(len(bodies))]
    if how == "half-close":  # (a reset may discard what the kernel held unread)
        assert read_aheads
        assert len(bodies) == 499  # every whole transfer before the end of file


def test_a_peer_that_never_reads_while_it_bursts_is_paused_and_others_are_served(
    broker: ThreadBroker,
) -> None:
    """A peer consumes its own burst (credit 10,000 on the queue it sends to) but never
    reads its socket: the broker's writes to it reach the high-water mark, it stops
    reading from it (read-ahead too), and another client's round trip and the HTTP API
    still answer promptly."""
    queue = "burst-never-reads"
    sock, _ = _producer(broker, queue)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    source = F.source(queue, "queue")
    sock.sendall(
        F.frame(F.attach("c", handle=1, role_receiver=True, source=source))
        + F.frame(F.flow(handle=1, credit=100_000))
    )
    stop = threading.Event()
    sent = [0]

    def burst() -> None:
        first = 0
        sock.settimeout(0.2)
        while not stop.is_set() and first < 60_000:
            data = _transfers(first, 200, "ok")
            try:
                sock.sendall(data)
            except (TimeoutError, OSError):
                break  # the broker stopped reading: the kernel buffers are full
            first += 200
            sent[0] = first

    thread = threading.Thread(target=burst, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        started = time.monotonic()
        assert _count(broker, queue) >= 0
        conn = connect(broker.url)
        sender = conn.create_sender("burst-other", options=QUEUE)
        sender.send(Message(body="others"))
        conn.close()
        waited = time.monotonic() - started
        assert waited < 5, f"others waited {waited:.1f} s"
        assert 0 < sent[0] < 60_000  # the broker stopped reading the peer that never reads
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def _secure_config() -> str:
    from amqpbroker.security import hash_password

    return f"""
security:
  enabled: true
  users:
    admin: {{password-hash: "{hash_password("right-pw")}", roles: [admin]}}
  security-settings:
    "#": {{send: [admin], consume: [admin], browse: [admin], manage: [admin],
          create-address: [admin], create-durable-queue: [admin],
          create-non-durable-queue: [admin]}}
"""


@pytest.mark.parametrize("password", ["right-pw", "wrong-pw"])
def test_a_burst_behind_a_sasl_init_waits_for_the_credentials_check(
    broker_in_thread: Callable[[str], ThreadBroker], read_aheads: list[int], password: str
) -> None:
    """B-095 with security on: SASL PLAIN, the AMQP header, open, begin and attach, and
    with a wrong password 1 MiB of transfers too, in one write. Read-ahead takes nothing
    while the password is checked; a wrong password routes nothing and closes; with the
    right one the pipelined frames are handled after the check (credit comes back)."""
    running = broker_in_thread(_secure_config())
    sock = raw.open_socket(running.ports["amqp"])
    target = F.target("burst-sasl", "queue")
    pipelined = (
        raw.plain_sasl("admin", password)
        + F.AMQP_HEADER
        + F.frame(F.open_())
        + F.frame(F.begin(incoming_window=65535))
        + F.frame(F.attach("p", role_receiver=False, target=target))
    )
    with sock:
        if password == "wrong-pw":
            sock.sendall(pipelined + _transfers(0, 500, "ok"))
            code, _ = raw.read_sasl_outcome(sock)
            assert code == 1
            assert raw.read_until_closed(sock)[1]
        else:
            sock.sendall(pipelined)
            code, rest = raw.read_sasl_outcome(sock)
            assert code == 0
            while not any(F.performative_code(p) == F.FLOW for _, _, p in F.read_frames(rest)):
                chunk = sock.recv(65536)
                assert chunk, f"closed: {rest!r}"
                rest += chunk
    assert not read_aheads  # nothing read past the paused socket
    assert ("burst-sasl" in running.server.broker.queues) == (password == "right-pw")
