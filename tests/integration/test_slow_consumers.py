"""Slow consumers through the real server and python-qpid-proton clients (issue 19:
slow-consumer-threshold / -policy / -check-period), on the in-thread broker with a manual
clock, so a check period passes when the test says so, not on the wall clock."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from proton import Message
from proton.utils import ConnectionClosed
from support.client import QUEUE, connect, receive_bodies, send
from support.inproc import ThreadBroker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CONFIG = """
address-settings:
  "slow.kill.#":
    {slow-consumer-threshold: 1, slow-consumer-policy: KILL, slow-consumer-check-period: 1}
  "slow.notify.#":
    {slow-consumer-threshold: 1, slow-consumer-policy: NOTIFY, slow-consumer-check-period: 1}
"""


def test_kill_closes_the_connection_of_a_consumer_that_does_not_acknowledge(
    broker_in_thread: Callable[[str], ThreadBroker],
) -> None:
    """Issue 19 KILL: a receiver that holds a message unacknowledged for a check period
    (rate 0 < 1/s, 10 messages queued) has its connection closed with
    amqp:resource-limit-exceeded; the message it held goes back to the queue."""
    broker = broker_in_thread(CONFIG)
    producer = connect(broker.url)
    send(producer, "slow.kill", *range(10), caps=("queue",))
    slow = connect(broker.url)
    receiver = slow.create_receiver("slow.kill", credit=1, options=QUEUE)
    assert receiver.receive(timeout=5).body == 0  # held, never accepted
    broker.advance_clock(1_000)
    with pytest.raises(ConnectionClosed, match="resource-limit-exceeded"):
        slow.wait(lambda: False, timeout=5, msg="the broker never closed the connection")
    assert "slow consumer on queue slow.kill" in broker.log()
    other = producer.create_receiver("slow.kill", options=QUEUE)
    assert sorted(receive_bodies(other, 10)) == list(range(10))
    producer.close()


def test_notify_logs_and_counts_but_keeps_the_connection(
    broker_in_thread: Callable[[str], ThreadBroker],
) -> None:
    """Issue 19 NOTIFY: the same slow receiver gets a WARN log line naming queue, consumer
    and connection, and `amqpbroker_slow_consumers_total{policy="NOTIFY"}`; it goes on
    receiving."""
    broker = broker_in_thread(CONFIG)
    conn = connect(broker.url)
    send(conn, "slow.notify", *range(10), caps=("queue",))
    receiver = conn.create_receiver("slow.notify", credit=1, options=QUEUE)
    assert receiver.receive(timeout=5).body == 0
    broker.advance_clock(1_000)
    wait_until(lambda: "slow consumer on queue slow.notify" in broker.log())
    [line] = [line for line in broker.log().splitlines() if "slow consumer on" in line]
    assert line.startswith("WARNING ")
    assert "connection " in line
    assert "0.00 messages/s" in line
    snapshot = broker.call(broker.server.snapshot)
    assert snapshot.slow_consumers == (("NOTIFY", 1),)
    receiver.accept()
    assert receive_bodies(receiver, 9) == list(range(1, 10))  # still connected
    conn.close()


def test_a_threshold_added_by_management_takes_effect_on_a_running_consumer(
    broker_in_thread: Callable[[str], ThreadBroker],
) -> None:
    """Issue 19 with B-162 addAddressSettings: the setting, added while the slow receiver
    is attached, is checked from then on (no new consumer needed)."""
    broker = broker_in_thread("")
    conn = connect(broker.url)
    send(conn, "late", *range(5), caps=("queue",))
    receiver = conn.create_receiver("late", credit=1, options=QUEUE)
    assert receiver.receive(timeout=5).body == 0
    replies = conn.create_receiver(None, dynamic=True)
    settings = {"slowConsumerThreshold": 1, "slowConsumerCheckPeriod": 1}
    request = Message(
        body=json.dumps(["late", json.dumps(settings)]),
        reply_to=replies.remote_source.address,
        properties={"_AMQ_ResourceName": "broker", "_AMQ_OperationName": "addAddressSettings"},
    )
    conn.create_sender("activemq.management").send(request)
    reply = replies.receive(timeout=10)
    assert reply.properties["_AMQ_OperationSucceeded"] is True, reply.body
    broker.advance_clock(1_000)
    wait_until(lambda: "slow consumer on queue late" in broker.log())
    conn.close()
