"""`enable-ingress-timestamp` through a real client (issue 19: no setting without effect;
B-018 (d))."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from proton import Message
from support.client import Capabilities, connect
from support.process import start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_consumer_sees_when_the_broker_took_the_message(tmp_path: Path) -> None:
    """B-018 (d): x-opt-ingress-time (epoch ms) on messages to a stamped address only."""
    broker = start_broker(
        tmp_path, 'address-settings:\n  "stamped.#": {enable-ingress-timestamp: true}\n'
    )
    try:
        conn = connect(broker.url)
        before_ms = int(time.time() * 1000)
        for address in ("stamped.q", "plain"):
            conn.create_sender(address, options=Capabilities("queue")).send(Message(body="x"))
        after_ms = int(time.time() * 1000)
        got = {}
        for address in ("stamped.q", "plain"):
            receiver = conn.create_receiver(address, options=Capabilities("queue"))
            got[address] = (receiver.receive(timeout=5).annotations or {}).get("x-opt-ingress-time")
            receiver.accept()
        conn.close()
    finally:
        assert broker.stop() == 0, broker.log()
    assert before_ms <= got["stamped.q"] <= after_ms
    assert got["plain"] is None
