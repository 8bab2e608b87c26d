"""Expiry end to end with a real client (B-080…B-090)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from proton import Data, Message, Timeout
from proton.utils import BlockingConnection
from support.client import Capabilities, send
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUEUE = Capabilities("queue")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    running = start_broker(
        tmp_path_factory.mktemp("expiry"),
        """
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
        """,
    )
    yield running
    assert running.stop() == 0, running.log()


def test_expired_message_moves_to_exp_queue_with_annotations(conn: BlockingConnection) -> None:
    """B-085/B-086/B-090: EXP.<address> on ExpiryQueue; x-opt-ACTUAL-EXPIRY is a long."""
    sender = conn.create_sender("exp.orders", options=QUEUE)
    sender.send(Message(body="stale", ttl=0.05, properties={"k": "v"}))
    exp = conn.create_receiver("ExpiryQueue::EXP.exp.orders")
    moved = exp.receive(timeout=5)
    exp.accept()
    assert moved.body == "stale"
    assert moved.properties == {"k": "v"}
    assert moved.annotations["x-opt-ORIG-ADDRESS"] == "exp.orders"
    assert moved.annotations["x-opt-ORIG-QUEUE"] == "exp.orders"
    actual = moved.annotations["x-opt-ACTUAL-EXPIRY"]
    assert isinstance(actual, int)
    assert actual > 1_600_000_000_000  # epoch ms
    assert moved.ttl == 0  # B-076: the copy does not expire
    data = Data()
    data.put_object(actual)
    data.rewind()
    data.next()
    assert data.type() == Data.LONG


def test_expired_message_is_never_delivered_even_with_credit(conn: BlockingConnection) -> None:
    """B-084: a consumer attached with credit never gets an expired message."""
    receiver = conn.create_receiver("exp.never", credit=0, options=QUEUE)
    sender = conn.create_sender("exp.never", options=QUEUE)
    sender.send(Message(body="late", ttl=0.05))
    exp = conn.create_receiver("ExpiryQueue::EXP.exp.never")
    assert exp.receive(timeout=5).body == "late"  # expired by the scanner meanwhile
    exp.accept()
    receiver.flow(10)
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)


def test_no_expiry_address_drops(conn: BlockingConnection) -> None:
    """B-085: no expiry address -> dropped, never delivered."""
    send(conn, "noexp.q", caps=("queue",))
    sender = conn.create_sender("noexp.q", options=QUEUE)
    sender.send(Message(body="gone", expiry_time=time.time() - 60))  # arrives expired
    sender.send(Message(body="kept"))
    receiver = conn.create_receiver("noexp.q", options=QUEUE)
    assert receiver.receive(timeout=5).body == "kept"
    receiver.accept()
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.3)
