"""The in-process broker on a manual clock and the credit-drain helpers (issue 18), checked
end to end: time passes only when the test says so, and "empty" is the broker's answer
to a drain, not a silence (B-015, B-037)."""

from __future__ import annotations

import pytest
from proton import Message, ulong
from proton.utils import BlockingConnection
from support.client import QUEUE, drain, is_empty, nothing_more, send
from support.inproc import ThreadBroker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_IN_THREAD = True  # on a manual clock: broker.advance_clock(ms)


def test_a_scheduled_message_waits_for_the_broker_clock(
    broker: ThreadBroker, conn: BlockingConnection
) -> None:
    """B-015: x-opt-delivery-delay counts from the broker's receipt on the broker's clock:
    5 s of it pass in two steps and no wall-clock time."""
    receiver = conn.create_receiver("later", credit=5, options=QUEUE)
    sender = conn.create_sender("later", options=QUEUE)
    sender.send(Message(body="soon", annotations={"x-opt-delivery-delay": ulong(5000)}))
    broker.advance_clock(4999)
    assert nothing_more(conn, receiver)
    broker.advance_clock(1)
    assert receiver.receive(timeout=5).body == "soon"
    receiver.accept()


def test_drain_takes_a_queue_deeper_than_its_credit(broker: ThreadBroker) -> None:
    """B-037: rounds of drain until one comes back short; an empty queue answers at once."""
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        send(conn, "deep", *range(7), caps=("queue",))
        assert not is_empty(conn, "deep")  # its message went back, uncounted (B-053)
    finally:
        conn.close()
    assert drain(broker.url, "deep", credit=3) == [(i, 0) for i in range(7)]
    assert drain(broker.url, "deep") == []


def test_its_log_is_kept_for_the_fixture_to_check(broker: ThreadBroker) -> None:
    """The shared fixture asserts no traceback in a module broker's log: an in-thread
    broker's log must be real, not empty."""
    assert "broker test-broker started" in broker.log()
