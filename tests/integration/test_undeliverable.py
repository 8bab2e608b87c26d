"""Undeliverable messages end to end: redelivery delay, DLQs per address, killed consumers.

The real asyncio server on port 0, in a thread on a manual clock (`support.inproc`: the
redelivery delay passes when the test advances the clock, issue 18), and
python-qpid-proton clients over loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from proton.utils import BlockingConnection
from support.client import (
    QUEUE,
    connect,
    is_empty,
    nothing_more,
    reject_with,
    send,
    settle_modified,
)
from support.inproc import ThreadBroker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


BROKER_CONFIG = """
address-settings:
  "#":
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
    max-delivery-attempts: 2
  "slow.#":
    redelivery-delay: 600
"""
BROKER_IN_THREAD = True  # on a manual clock: broker.advance_clock(ms)


def test_redelivery_delay_holds_only_the_failed_message(
    broker: ThreadBroker, conn: BlockingConnection
) -> None:
    """B-065: the failed message waits exactly redelivery-delay (600 ms of the broker's
    clock); the next one flows at once, while the clock stands still."""
    send(conn, "slow.jobs", "bad", "good", caps=("queue",))
    receiver = conn.create_receiver("slow.jobs", credit=10, options=QUEUE)
    first = receiver.receive(timeout=5)
    assert first.body == "bad"
    settle_modified(receiver)
    second = receiver.receive(timeout=5)  # no time passes: it did not wait behind "bad"
    receiver.accept()
    assert second.body == "good"
    assert is_empty(conn, "slow.jobs")  # a round trip: the broker has the outcome
    broker.advance_clock(599)
    assert nothing_more(conn, receiver)
    broker.advance_clock(1)
    again = receiver.receive(timeout=5)
    receiver.accept()
    assert again.body == "bad"
    assert again.delivery_count == 1


def test_two_source_addresses_get_two_dlqs(conn: BlockingConnection) -> None:
    """B-074: DLQ.<address> per source address, each with only its own dead letters."""
    for address in ("two.a", "two.b"):
        send(conn, address, f"dead-{address}", caps=("queue",))
        receiver = conn.create_receiver(address, options=QUEUE)
        receiver.receive(timeout=5)
        receiver.reject()
        receiver.close()
    for address in ("two.a", "two.b"):
        dlq = conn.create_receiver(f"DLA::DLQ.{address}")
        assert dlq.receive(timeout=5).body == f"dead-{address}"
        dlq.accept()
        dlq.close()
        assert is_empty(conn, f"DLA::DLQ.{address}")


def test_rejected_error_condition_is_in_the_dlq_copy(conn: BlockingConnection) -> None:
    """B-079: x-opt-DLQ-REASON / -ERROR-CONDITION / -ERROR-DESCRIPTION on the copy."""
    send(conn, "reasons", "r", caps=("queue",))
    receiver = conn.create_receiver("reasons", options=QUEUE)
    receiver.receive(timeout=5)
    reject_with(receiver, "app:schema", "field 'id' missing")
    dlq = conn.create_receiver("DLA::DLQ.reasons")
    dead = dlq.receive(timeout=5)
    dlq.accept()
    assert dead.annotations["x-opt-DLQ-REASON"] == "rejected"
    assert dead.annotations["x-opt-DLQ-ERROR-CONDITION"] == "app:schema"
    assert dead.annotations["x-opt-DLQ-ERROR-DESCRIPTION"] == "field 'id' missing"


CONSUMER = textwrap.dedent(
    """
    import sys
    from proton.utils import BlockingConnection
    from support.client import QUEUE

    conn = BlockingConnection(sys.argv[1], timeout=10)
    receiver = conn.create_receiver(sys.argv[2], options=QUEUE)
    message = receiver.receive(timeout=10)
    print("GOT", message.delivery_count, flush=True)
    sys.stdin.read()  # hold the delivery unsettled until killed
    """
)
TESTS_DIR = Path(__file__).resolve().parents[1]  # where `support` is, for the child


def test_killed_consumer_process_counts_the_attempt(broker: ThreadBroker) -> None:
    """B-054: kill -9 of a consumer with an unsettled delivery counts the attempt."""
    producer = connect(broker.url)
    send(producer, "killed", "k", caps=("queue",))
    with subprocess.Popen(
        [sys.executable, "-c", CONSUMER, broker.url, "killed"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS_DIR), *sys.path])),
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "GOT 0"
        finally:
            child.kill()  # SIGKILL: no AMQP close, the socket just dies
            child.wait(timeout=10)
    receiver = producer.create_receiver("killed", options=QUEUE)
    again = receiver.receive(timeout=5)
    receiver.accept()
    assert again.delivery_count == 1
    producer.close()


def test_closed_link_returns_uncounted(conn: BlockingConnection) -> None:
    """B-053: a consumer link closed with an unsettled delivery: not counted, no delay
    (the broker's clock stands still, and the message comes back)."""
    send(conn, "slow.closed", "c", caps=("queue",))  # slow.# has a redelivery delay
    receiver = conn.create_receiver("slow.closed", options=QUEUE)
    assert receiver.receive(timeout=5).delivery_count == 0
    receiver.close()
    again = conn.create_receiver("slow.closed", options=QUEUE)
    message = again.receive(timeout=5)
    again.accept()
    assert message.delivery_count == 0
