"""`enable-ingress-timestamp` through a real client (issue 19: no setting without effect;
B-018 (d))."""

from __future__ import annotations

import time

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.client import QUEUE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_CONFIG = 'address-settings:\n  "stamped.#": {enable-ingress-timestamp: true}\n'


def test_consumer_sees_when_the_broker_took_the_message(conn: BlockingConnection) -> None:
    """B-018 (d): x-opt-ingress-time (epoch ms) on messages to a stamped address only."""
    before_ms = int(time.time() * 1000)
    for address in ("stamped.q", "plain"):
        conn.create_sender(address, options=QUEUE).send(Message(body="x"))
    after_ms = int(time.time() * 1000)
    got = {}
    for address in ("stamped.q", "plain"):
        receiver = conn.create_receiver(address, options=QUEUE)
        annotations = receiver.receive(timeout=5).annotations or {}
        receiver.accept()
        got[address] = annotations.get("x-opt-ingress-time")
    assert before_ms <= got["stamped.q"] <= after_ms
    assert got["plain"] is None
