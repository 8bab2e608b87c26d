"""A consumer that grants much credit and never reads cannot make the broker buffer the
queue (issue 15: "no single client may exhaust the broker"; B-037 credit)."""

from __future__ import annotations

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.client import QUEUE, receive_bodies, send
from support.metrics import scrape
from support.process import BrokerProcess
from support.raw import RawClient, open_socket
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

COUNT = 300
SIZE = 100 * 1024


# The module's broker: the shared `broker` fixture (tests/integration/conftest.py).


def _delivering(broker: BrokerProcess, queue: str) -> float:
    for (name, labels), value in scrape(broker.ports["http"]).items():
        if name == "amqpbroker_queue_delivering_messages" and ("queue", queue) in labels:
            return value
    return 0.0


def test_a_consumer_that_never_reads_holds_a_bounded_amount(broker: BrokerProcess) -> None:
    """Issue 15, B-037: 100,000 credit on 300 messages of 100 KB and no reading grows the
    broker by a few MiB (its write window), not by the queue; another connection's
    consumer is served meanwhile; once the client reads, all 300 arrive in order."""
    producer = BlockingConnection(broker.url, timeout=10)
    payload = b"x" * SIZE
    send(producer, "hoard", *[b"%03d" % i + payload for i in range(COUNT)], caps=("queue",))
    before = broker.rss_bytes()

    client = RawClient(open_socket(broker.ports["amqp"]))
    receiver = client.anonymous_receiver("hoarder", "hoard", 100_000)
    client.pump(lambda: receiver.state & receiver.REMOTE_ACTIVE != 0)
    # From now on the client reads nothing: what the broker sends stays in its buffers.
    wait_until(lambda: _delivering(broker, "hoard") > 0, message="dispatch began")
    seen: list[float] = []

    def settled_down() -> bool:  # the broker has handed out what it will
        seen.append(_delivering(broker, "hoard"))
        return len(seen) > 3 and seen[-1] == seen[-4]

    wait_until(settled_down, interval=0.1, message="dispatch stopped")
    grown = broker.rss_bytes() - before
    assert grown < 40 * 1024 * 1024, f"grew {grown / 2**20:.1f} MiB; delivering {seen[-1]}"
    assert seen[-1] < COUNT

    send(producer, "other", "served", caps=("queue",))
    other = producer.create_receiver("other", options=QUEUE)
    assert receive_bodies(other, 1, timeout=10) == ["served"]

    bodies: list[bytes] = []

    def read_all() -> bool:
        while (delivery := receiver.current) is not None and not delivery.partial:
            message = Message()
            message.decode(receiver.recv(delivery.pending))
            receiver.advance()
            delivery.update(delivery.ACCEPTED)
            delivery.settle()
            bodies.append(bytes(message.body))
        return len(bodies) == COUNT

    client.pump(read_all, timeout=40)
    assert [body[:3] for body in bodies] == [b"%03d" % i for i in range(COUNT)]
    assert all(body[3:] == payload for body in bodies)
    client.close()
    producer.close()
