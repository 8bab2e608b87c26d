"""What one client can hold: handshake-timeout, idle-timeout, connections-allowed (issue 15
items 6 and 7; B-054)."""

from __future__ import annotations

import select
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Endpoint
from proton.utils import BlockingConnection
from support import frames as F
from support.client import QUEUE, receive_bodies, send
from support.process import BrokerProcess
from support.raw import RawClient, closed_by_peer, open_socket
from support.waiting import wait_until

from amqpbroker.server import FD_RESERVE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_CONFIG = """
acceptors:
  - name: amqp
    url: amqp://127.0.0.1:0
    handshake-timeout: 1
    amqp-idle-timeout: 2000
  - name: capped
    url: amqp://127.0.0.1:0
    connections-allowed: 2
  - name: per-source
    url: amqp://127.0.0.1:0
    handshakes-per-source: 3
"""


def test_silent_sockets_are_closed_after_the_handshake_timeout(broker: BrokerProcess) -> None:
    """Issue 15 item 6: sockets that never send a protocol header, or stop before the AMQP
    open, are closed; a connection that opened in time is kept."""
    conn = BlockingConnection(broker.url, timeout=10)
    silent = [open_socket(broker.ports["amqp"]) for _ in range(20)]
    header_only = open_socket(broker.ports["amqp"])
    header_only.sendall(b"AMQP\x03\x01\x00\x00")
    started = time.monotonic()
    for sock in [*silent, header_only]:
        wait_until(lambda s=sock: closed_by_peer(s), timeout=10, message="handshake timeout")  # type: ignore[misc]
        sock.close()
    assert time.monotonic() - started >= 0.9
    send(conn, "still-open", "x", caps=("queue",))
    assert receive_bodies(conn.create_receiver("still-open", options=QUEUE), 1)
    conn.close()


def test_a_silent_consumer_is_dropped_and_its_deliveries_return(broker: BrokerProcess) -> None:
    """Issue 15 item 6, B-054: the broker advertises half its amqp-idle-timeout; a consumer
    that takes 200 deliveries and then goes silent is dropped once the idle-timeout
    expires, and its unsettled deliveries go to another consumer (count + 1)."""
    producer = BlockingConnection(broker.url, timeout=10)
    send(producer, "frozen", *[f"m{i}" for i in range(200)], caps=("queue",))

    client = RawClient(open_socket(broker.ports["amqp"]), idle_timeout_s=2.0)
    receiver = client.anonymous_receiver("frozen-consumer", "frozen", 200)
    client.pump(lambda: receiver.queued >= 200)
    assert client.transport.remote_idle_timeout == 1.0  # half of amqp-idle-timeout
    # From now on the client neither reads nor writes (as if stopped by SIGSTOP).

    consumer = producer.create_receiver("frozen", options=QUEUE, credit=200)
    first = consumer.receive(timeout=15)
    consumer.accept()
    assert first.delivery_count == 1  # B-054: the loss counts as a failed attempt
    received = [first.body, *receive_bodies(consumer, 199, timeout=15)]
    assert sorted(received) == sorted(f"m{i}" for i in range(200))
    assert "local-idle-timeout expired" in broker.log()
    producer.close()
    wait_until(lambda: closed_by_peer(client.sock), message="the broker closed the socket")
    client.close()


@pytest.mark.timing  # heartbeats against a wall-clock deadline
def test_a_connection_that_heartbeats_outlives_the_idle_timeout(broker: BrokerProcess) -> None:
    """Issue 15 item 6: only silence is punished; empty frames keep a connection alive."""
    client = RawClient(open_socket(broker.ports["amqp"]))
    client.transport.sasl().allowed_mechs("ANONYMOUS")
    client.connection.open()
    client.pump(lambda: bool(client.connection.state & Endpoint.REMOTE_ACTIVE))
    deadline = time.monotonic() + 3.0  # 1.5 x the broker's idle-timeout
    while time.monotonic() < deadline:
        client.transport.tick(time.monotonic())  # heartbeats at the broker's request
        out = client.pending_output()
        if out:
            client.sock.sendall(out)
        readable, _, _ = select.select([client.sock], [], [], 0.1)
        if readable:
            data = client.sock.recv(65536)
            assert data, "the broker closed a connection that sent heartbeats"
            client.push(data)
    assert not client.connection.state & Endpoint.REMOTE_CLOSED
    client.close()


def test_connections_beyond_connections_allowed_are_closed_at_once(
    broker: BrokerProcess,
) -> None:
    """Issue 15 item 7: Artemis connectionsAllowed; counted and logged, and a slot is free
    again once a connection ends."""
    url = f"amqp://127.0.0.1:{broker.ports['capped']}"
    first = BlockingConnection(url, timeout=10)
    second = BlockingConnection(url, timeout=10)
    extra = open_socket(broker.ports["capped"])
    wait_until(lambda: closed_by_peer(extra), message="the extra connection closed")
    extra.close()
    first.close()

    def third_connects() -> bool:
        try:
            BlockingConnection(url, timeout=2).close()
        except Exception:
            return False
        return True

    wait_until(third_connects, timeout=10, message="a free slot")
    second.close()
    wait_until(lambda: "connections-allowed limit reached" in broker.log())
    metric = 'amqpbroker_connections_refused_total{reason="connections-allowed"} 1.0'
    assert metric in _metrics(broker)


def _metrics(broker: BrokerProcess) -> str:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.timing  # heartbeats against a wall-clock deadline
def test_heartbeats_go_out_as_often_as_the_peer_asks(broker: BrokerProcess) -> None:
    """Issue 15 item 6: the engines are ticked at proton's deadline, not once a second: a
    client with a 0.4 s idle-timeout (heartbeats due every 0.2 s) that only reads is
    never timed out by its own engine."""
    client = RawClient(open_socket(broker.ports["amqp"]), idle_timeout_s=0.4)
    client.transport.sasl().allowed_mechs("ANONYMOUS")
    client.connection.open()
    client.pump(lambda: bool(client.connection.state & Endpoint.REMOTE_ACTIVE))
    deadline = time.monotonic() + 1.5  # the broker drops a silent client after 2 s
    while time.monotonic() < deadline:
        readable, _, _ = select.select([client.sock], [], [], 0.05)
        if readable:
            data = client.sock.recv(65536)
            assert data, "the broker closed the connection"
            client.push(data)
        client.transport.tick(time.monotonic())  # would expire without broker heartbeats
        assert client.transport.condition is None, client.transport.condition
        client.pending_output()  # the client's own heartbeats are dropped: it only reads
    client.close()


LOW_DESCRIPTOR_LIMIT = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (100, 160))
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


def _open_files(broker: BrokerProcess) -> tuple[int, int]:
    """(descriptors open, soft limit) of the broker process, from /proc."""
    limits = Path(f"/proc/{broker.proc.pid}/limits").read_text()
    line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    return len(list(Path(f"/proc/{broker.proc.pid}/fd").iterdir())), int(line.split()[3])


def test_sockets_cannot_take_the_last_descriptors(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """Issue 15 item 7: `amqpbroker run` raises the soft open-files limit to the hard one,
    and once fewer than FD_RESERVE (a quarter of a small limit) would remain a new socket
    is closed at once, so the journal (persistence on here) can still open files; freed,
    it serves."""
    broker = spawn(tmp_path, "persistence:\n  enabled: true\n", python=("-c", LOW_DESCRIPTOR_LIMIT))
    assert _open_files(broker)[1] == 160  # raised from 100
    held = [open_socket(broker.ports["amqp"]) for _ in range(140)]
    wait_until(lambda: closed_by_peer(held[-1]), message="the last socket refused")
    in_use, limit = _open_files(broker)
    assert limit - in_use >= min(FD_RESERVE, limit // 4) - 2, (in_use, limit)
    for sock in held:
        sock.close()
    assert "file-descriptors limit reached" in broker.log()

    def serves() -> bool:
        try:
            conn = BlockingConnection(broker.url, timeout=2)
        except Exception:
            return False
        send(conn, "after", "x", caps=("queue",), durable=True)
        conn.close()
        return True

    wait_until(serves, timeout=15, message="a connection once the sockets are gone")


FAULTY_FEED = """
import runpy, sys
from amqpbroker.protocol import AmqpConnection
real = AmqpConnection.feed
def feed(self, data):
    if data.startswith(b"BOOM"):
        raise RuntimeError("injected fault")
    real(self, data)
AmqpConnection.feed = feed
sys.argv[0] = "amqpbroker"
runpy.run_module("amqpbroker", run_name="__main__")
"""


def test_an_unexpected_error_closes_only_that_connection(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """Issue 15 item 2: the last-resort boundary in data_received logs the error with the
    connection and closes that connection only; asyncio never sees it."""
    broker = spawn(tmp_path, python=("-c", FAULTY_FEED))
    bystander = BlockingConnection(broker.url, timeout=10)
    victim = open_socket(broker.ports["amqp"])
    victim.sendall(b"BOOM")
    wait_until(lambda: closed_by_peer(victim), message="the faulty connection closed")
    victim.close()
    send(bystander, "survivor", "x", caps=("queue",))
    assert receive_bodies(bystander.create_receiver("survivor"), 1) == ["x"]
    bystander.close()
    log = broker.log()
    assert "internal error reading from connection" in log
    assert "RuntimeError: injected fault" in log
    assert "Fatal error" not in log


def test_frames_before_the_open_are_small(broker: BrokerProcess) -> None:
    """Issue 15 item 5: before the AMQP open (security off: Proton's SASL), a frame that
    claims more than 8 KiB is a framing error at once; the broker does not wait for (and
    buffer) the 100 KB it announces. The open then advertises 131072 (B-021)."""
    for header in (b"AMQP\x03\x01\x00\x00", b"AMQP\x00\x01\x00\x00"):
        sock = open_socket(broker.ports["amqp"])
        sock.sendall(header + struct.pack(">IBBH", 100_000, 2, 0, 0) + b"\x00" * 100)
        wait_until(lambda s=sock: closed_by_peer(s), timeout=0.8, message="framing error")  # type: ignore[misc]
        sock.close()
    conn = BlockingConnection(broker.url, timeout=10)
    assert conn.conn.transport.remote_max_frame_size == 131072
    conn.close()


def _opened(sock: Any) -> bool:
    """Send the AMQP header and an open; whether the broker's open came back."""
    sock.sendall(F.AMQP_HEADER + F.frame(F.open_()))
    got = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got += sock.recv(65536)
        if any(F.performative_code(p) == F.OPEN for _, _, p in F.read_frames(got)):
            return True
    return False


def test_a_source_may_hold_only_so_many_sockets_before_the_open(broker: BrokerProcess) -> None:
    """Fourth attack pass: one address could open sockets and say nothing until
    connections-allowed (-1 by default) or the descriptors ran out (10,000 stalled
    sockets: 193 MB), shutting every other client out for handshake-timeout at a time.
    Now each source may hold handshakes-per-source sockets that have not finished the
    AMQP open; the next is closed at once (counted), while other sources are served and
    connections that have opened do not count."""
    port = broker.ports["per-source"]
    stalled = [open_socket(port, source="127.0.0.2") for _ in range(3)]
    extra = open_socket(port, source="127.0.0.2")
    wait_until(lambda: closed_by_peer(extra), timeout=10, message="the 4th socket closed")
    extra.close()
    other = open_socket(port, source="127.0.0.3")
    assert _opened(other)  # another source is served
    assert _opened(stalled[0])  # an open ends the handshake: a place for another socket
    more = [open_socket(port, source="127.0.0.2") for _ in range(1)]
    assert _opened(more[0])
    stalled[1].close()  # a socket closed before its open gives its place back too
    late = open_socket(port, source="127.0.0.2")
    wait_until(lambda: _opened(late), timeout=10, message="a freed place")
    for sock in [*stalled, *more, other, late]:
        sock.close()
    metric = 'amqpbroker_connections_refused_total{reason="handshakes-per-source"} 1.0'
    assert metric in _metrics(broker)
