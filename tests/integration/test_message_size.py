"""max-message-size both ways (B-152, AMQP 1.0 section 2.7.3; issue 16 item 3)."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from proton.reactor import LinkOption
from proton.utils import LinkDetached
from support.client import QUEUE, connect
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class MaxMessageSize(LinkOption):
    """The attach field max-message-size of the client's end of the link."""

    def __init__(self, size: int) -> None:
        self.size = size

    def apply(self, link: Any) -> None:
        link.max_message_size = self.size


BROKER_CONFIG = """
acceptors:
  - name: amqp
    url: amqp://127.0.0.1:0
    max-message-size: 50000
"""


def test_a_consumer_gets_nothing_over_its_max_message_size(broker: BrokerProcess) -> None:
    """Issue 16 item 3: a receiver that advertised 10,000 got a 20,000-byte message. Now
    the message waits for a consumer that can take it, its delivery count untouched."""
    conn = connect(broker.url)
    try:
        sender = conn.create_sender("sized", options=QUEUE)
        sender.send(Message(body=b"x" * 20_000))
        sender.send(Message(body=b"y" * 1_000))
        limited = conn.create_receiver("sized", options=[QUEUE, MaxMessageSize(10_000)])
        assert bytes(limited.receive(timeout=5).body) == b"y" * 1_000
        limited.accept()
        limited.close()
        anyone = conn.create_receiver("sized", options=QUEUE)
        big = anyone.receive(timeout=5)
        anyone.accept()
        assert (len(big.body), big.delivery_count) == (20_000, 0)
    finally:
        conn.close()


def test_the_acceptor_limit_is_advertised_and_enforced(broker: BrokerProcess) -> None:
    """B-152: a producer link carries the acceptor's max-message-size; a bigger message
    detaches it with amqp:link:message-size-exceeded; the connection goes on."""
    conn = connect(broker.url)
    try:
        sender = conn.create_sender("limited", options=QUEUE)
        assert sender.link.remote_max_message_size == 50_000
        sender.send(Message(body=b"a" * 40_000))
        with pytest.raises(LinkDetached) as detached:
            sender.send(Message(body=b"b" * 60_000))
        assert "amqp:link:message-size-exceeded" in str(detached.value)
        receiver = conn.create_receiver("limited", options=QUEUE)
        assert len(receiver.receive(timeout=5).body) == 40_000
        receiver.accept()
    finally:
        conn.close()
