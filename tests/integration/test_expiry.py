"""Expiry end to end with a real client (B-080…B-090).

The real asyncio server in a thread on a manual clock (`support.inproc`, issue 18): a
message expires when the test advances the broker's clock, not after a wall-clock wait.
"""

from __future__ import annotations

import time

import pytest
from proton import Data, Message
from proton.utils import BlockingConnection
from support.client import QUEUE, nothing_more, send
from support.inproc import ThreadBroker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_CONFIG = """
message-expiry-scan-period: 100
address-settings:
  "#":
    expiry-address: ExpiryQueue
    auto-create-expiry-resources: true
  "noexp.#":
    expiry-address: ""
addresses:
  - name: ExpiryQueue
    anycast:
      - name: ExpiryQueue
"""
BROKER_IN_THREAD = True  # on a manual clock: broker.advance_clock(ms)


def test_expired_message_moves_to_exp_queue_with_annotations(
    broker: ThreadBroker, conn: BlockingConnection
) -> None:
    """B-085/B-086/B-090: EXP.<address> on ExpiryQueue; x-opt-ACTUAL-EXPIRY is a long, the
    broker's time of the scan that expired it."""
    sender = conn.create_sender("exp.orders", options=QUEUE)
    sender.send(Message(body="stale", ttl=0.05, properties={"k": "v"}))  # waits: accepted
    broker.advance_clock(100)  # past the ttl, and a scan period: the scan runs
    exp = conn.create_receiver("ExpiryQueue::EXP.exp.orders")
    moved = exp.receive(timeout=5)
    exp.accept()
    assert moved.body == "stale"
    assert moved.properties == {"k": "v"}
    assert moved.annotations["x-opt-ORIG-ADDRESS"] == "exp.orders"
    assert moved.annotations["x-opt-ORIG-QUEUE"] == "exp.orders"
    actual = moved.annotations["x-opt-ACTUAL-EXPIRY"]
    assert actual == broker.clock.now_ms()  # epoch ms
    assert moved.ttl == 0  # B-076: the copy does not expire
    data = Data()
    data.put_object(actual)
    data.rewind()
    data.next()
    assert data.type() == Data.LONG


def test_expired_message_is_never_delivered_even_with_credit(
    broker: ThreadBroker, conn: BlockingConnection
) -> None:
    """B-084: a consumer given credit after a message's expiration never gets it, whether
    the scan or dispatch finds it first: it goes to the expiry address."""
    receiver = conn.create_receiver("exp.never", credit=0, options=QUEUE)
    sender = conn.create_sender("exp.never", options=QUEUE)
    sender.send(Message(body="late", ttl=0.05))
    broker.advance_clock(60)
    receiver.flow(10)
    exp = conn.create_receiver("ExpiryQueue::EXP.exp.never")
    assert exp.receive(timeout=5).body == "late"
    exp.accept()
    assert nothing_more(conn, receiver)


def test_no_expiry_address_drops(conn: BlockingConnection) -> None:
    """B-085: no expiry address -> dropped, never delivered."""
    send(conn, "noexp.q", caps=("queue",))
    sender = conn.create_sender("noexp.q", options=QUEUE)
    sender.send(Message(body="gone", expiry_time=time.time() - 60))  # arrives expired
    sender.send(Message(body="kept"))
    receiver = conn.create_receiver("noexp.q", options=QUEUE)
    assert receiver.receive(timeout=5).body == "kept"
    receiver.accept()
    assert nothing_more(conn, receiver)
