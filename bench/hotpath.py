"""The broker's hot path in memory, for instruction counts (no sockets, no load noise).

    PYTHONPATH=$PWD .venv/bin/python bench/hotpath.py 3000      # wall time per message
    PYTHONHASHSEED=0 PYTHONPATH=$PWD valgrind --tool=callgrind \
        --callgrind-out-file=/tmp/cg.3000 .venv/bin/python bench/hotpath.py 3000

One `AmqpConnection` over an in-memory proton client: a producer sends N 1 KiB messages
to queue `q` in batches of 100 and a consumer (credit 1000) on the same connection
receives and accepts them; with FANOUT=k, k subscribers of the multicast address `f`
each get every message. Instructions per message: run N and 3N under callgrind and
divide the difference of the `Collected` totals by 2N (start-up cancels out; the client's
share is included, the same on both sides of a comparison). Used for issue 18's split.
"""

from __future__ import annotations

import os
import sys
import time
from random import Random

from proton import Collector, Connection, Delivery, Event, Link, Message, Transport

from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.protocol import AmqpConnection, Shell, moves

BATCH = 100


class Client:
    """A proton client engine wired to one broker-side connection."""

    def __init__(self) -> None:
        broker = Broker(
            settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
        )
        self.shell: Shell[AmqpConnection] = Shell(broker)
        self.server = AmqpConnection(self.shell, peer="memory")
        self.transport = Transport()
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection.container = "bench"
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self.received = 0

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            pending = self.transport.pending()
            if pending > 0:
                data = bytes(self.transport.peek(pending))
                self.transport.pop(pending)
                self.server.feed(data)
                moved = True
            self.shell.dirty.clear()
            out = self.server.output()
            while out:
                capacity = self.transport.capacity()
                self.transport.push(out[:capacity])
                out = out[capacity:]
                moved = True
                if out:
                    self._collect()
            self._collect()
            if not moved:
                break

    def _collect(self) -> None:
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                delivery = event.delivery
                link = delivery.link
                if link.is_receiver and delivery.readable and not delivery.partial:
                    link.recv(delivery.pending)
                    link.advance()
                    delivery.update(Delivery.ACCEPTED)
                    delivery.settle()
                    self.received += 1
                elif link.is_sender and delivery.remote_state:
                    delivery.settle()
            self.collector.pop()

    def receiver(self, name: str, address: str) -> Link:
        link = self.session.receiver(name)
        link.source.address = address
        link.open()
        link.flow(1000)
        return link


def run(count: int, fanout: int) -> float:
    """Seconds to send and consume `count` messages (each to `fanout` subscribers)."""
    client = Client()
    address = "f" if fanout else "q"
    receivers = [client.receiver(f"c{i}", address) for i in range(max(fanout, 1))]
    client.pump()
    sender = client.session.sender("p")
    sender.target.address = address
    sender.open()
    client.pump()
    message = Message(body="x" * 1000, durable=False)
    message.properties = {"k": "v"}
    raw = message.encode()
    start = time.perf_counter()
    sent = 0
    while sent < count:
        for _ in range(min(BATCH, count - sent)):
            sender.delivery(b"%d" % sent)
            sender.send(raw)
            sender.advance()
            sent += 1
        client.pump()
        for receiver in receivers:
            if receiver.credit < 500:
                receiver.flow(1000 - receiver.credit)
    client.pump()
    elapsed = time.perf_counter() - start
    assert client.received == count * len(receivers), (client.received, count)
    return elapsed


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    fan = int(os.environ.get("FANOUT", "0"))
    seconds = run(n, fan)
    print(f"N={n} FANOUT={fan}: {seconds * 1e6 / n:.1f} us/message", file=sys.stderr)
