"""Issue 16 item 1: a consumer that sends nothing back gets its messages without waiting
for the broker's one-second engine tick.

The consumer here is a Proton engine over a plain socket that grants credit once and then
only reads: no flow, disposition or heartbeat ever reaches the broker again, so nothing but
the broker's own flush can move the rest of the bytes.
"""

from __future__ import annotations

import socket
import time

import pytest
from proton import Collector, Connection, Endpoint, Event, Message, Transport
from support.client import QUEUE, connect
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60), pytest.mark.timing]  # < 1 s

CLIENT_MAX_FRAME = 32 * 1024  # as in the field report's proton-python consumer
READ_TIMEOUT_S = 5.0  # long enough to see a stall without waiting minutes for it


# The module's broker: the shared `broker` fixture (tests/integration/conftest.py).


class ReadOnlyConsumer:
    """Attaches a receiver, grants `credit` once, then only reads from the socket."""

    def __init__(self, port: int, address: str, credit: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.transport = Transport()
        self.transport.max_frame_size = CLIENT_MAX_FRAME
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection.container = "read-only"
        self.connection.open()
        session = self.connection.session()
        session.open()
        link = session.receiver("read-only")
        link.source.address = address
        link.open()
        link.flow(credit)
        self.bodies: list[bytes] = []
        # SASL, open, begin, attach and flow go out; once the broker's attach is back, the
        # client writes nothing more.
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not link.state & Endpoint.REMOTE_ACTIVE and time.monotonic() < deadline:
            self._write_all()
            self._push(self.sock.recv(1 << 16))
        self._write_all()
        assert link.state & Endpoint.REMOTE_ACTIVE

    def _write_all(self) -> None:
        while (pending := self.transport.pending()) > 0:
            self.sock.sendall(bytes(self.transport.peek(pending)))
            self.transport.pop(pending)

    def read_until(self, count: int) -> float:
        """Read until `count` complete messages arrived; the seconds that took."""
        started = time.monotonic()
        while len(self.bodies) < count:
            if time.monotonic() - started > READ_TIMEOUT_S:
                break
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            if not data:
                break
            self._push(data)
        return time.monotonic() - started

    def _push(self, data: bytes) -> None:
        while data:
            capacity = self.transport.capacity()
            self.transport.push(data[:capacity])
            data = data[capacity:]
            self._collect()

    def _collect(self) -> None:
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                delivery = event.delivery
                if delivery.readable and not delivery.partial:
                    link = delivery.link
                    message = Message()
                    message.decode(link.recv(delivery.pending))
                    link.advance()
                    self.bodies.append(bytes(message.body))  # a view of proton's buffer
            self.collector.pop()

    def close(self) -> None:
        self.sock.close()


def _fill(broker: BrokerProcess, address: str, bodies: list[bytes]) -> None:
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=[QUEUE])
        for body in bodies:
            sender.send(Message(body=body))
        sender.close()
    finally:
        conn.close()


def test_one_large_message_arrives_without_waiting_for_the_tick(broker: BrokerProcess) -> None:
    """Issue 16 item 1: one 5 MiB message in well under a second (was 160 s)."""
    body = bytes(range(256)) * (5 * 1024 * 4)
    _fill(broker, "flush.large", [body])
    consumer = ReadOnlyConsumer(broker.ports["amqp"], "flush.large", credit=1)
    try:
        elapsed = consumer.read_until(1)
    finally:
        consumer.close()
    assert consumer.bodies == [body]
    assert elapsed < 1.0


def test_a_backlog_arrives_without_waiting_for_the_tick(broker: BrokerProcess) -> None:
    """Issue 16 item 1: 5,000 x 1 KiB with credit 5,000 in a few seconds at most (was 15 s,
    waiting for the 1 s tick between output buffers; ~0.3 s on an idle machine, 1.6 s seen
    on a loaded 2-core one: the bound tells a tick-paced drain from a CPU-bound one)."""
    bodies = [b"%05d" % n + b"x" * 1019 for n in range(5000)]
    _fill(broker, "flush.backlog", bodies)
    consumer = ReadOnlyConsumer(broker.ports["amqp"], "flush.backlog", credit=5000)
    try:
        elapsed = consumer.read_until(5000)
    finally:
        consumer.close()
    assert len(consumer.bodies) == len(bodies), elapsed
    assert consumer.bodies == bodies
    assert elapsed < 4.0
