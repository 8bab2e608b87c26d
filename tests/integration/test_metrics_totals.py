"""Prometheus counters that do not undercount (issue 16 item 4).

An auto-created queue that is auto-deleted and created again started its counters over,
and a burst it took before its first scrape was lost to increase(); a dead-letter series
appeared only at its first dead letter; there was no broker-wide dead-letter or expiry
total.

The broker runs in a thread on a manual clock (`support.inproc`): the reaper's passes
(B-111: a queue goes on the second pass that finds it idle) happen when the test
advances the clock, not after a wall-clock wait (issue 18).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from support.client import QUEUE, connect, receive_bodies
from support.inproc import ThreadBroker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Sample = tuple[str, frozenset[tuple[str, str]]]


BROKER_IN_THREAD = True  # on a manual clock: broker.advance_clock(ms)
BROKER_CONFIG = """
address-queue-scan-period: 50
address-settings:
  "#":
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
    auto-delete-queues: true
    auto-delete-addresses: true
"""


def metrics(broker: ThreadBroker) -> dict[Sample, float]:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def queue_exists(broker: ThreadBroker, name: str) -> bool:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/{name}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return bool(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 404:
            return False
        raise


def reap(broker: ThreadBroker) -> None:
    """Two reaper passes (B-111): what was idle at the first goes at the second."""
    broker.advance_clock(50)
    broker.advance_clock(50)


def feed_and_drain(broker: ThreadBroker, address: str, count: int) -> None:
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        for n in range(count):
            sender.send(Message(body=n))
        receiver = conn.create_receiver(address, credit=count, options=QUEUE)
        assert len(receive_bodies(receiver, count)) == count
    finally:
        conn.close()


def test_an_address_counts_across_queue_incarnations(broker: ThreadBroker) -> None:
    """Issue 16 item 4: 80, auto-delete, 40 more: the address counter says 120."""
    feed_and_drain(broker, "burst", 80)
    reap(broker)
    assert not queue_exists(broker, "burst")
    feed_and_drain(broker, "burst", 40)
    values = metrics(broker)
    address = frozenset({("address", "burst")})
    assert values["amqpbroker_address_messages_added_total", address] == 120
    assert values["amqpbroker_address_messages_acknowledged_total", address] == 120
    assert values["amqpbroker_address_routed_messages_total", address] == 120
    queue = frozenset({("address", "burst"), ("queue", "burst")})
    assert values["amqpbroker_queue_messages_added_total", queue] == 40  # Artemis: its own


def test_dead_letter_series_exist_at_zero_and_broker_wide(broker: ThreadBroker) -> None:
    """Issue 16 item 4: every reason is a series from the start, per queue, per address
    and broker-wide, so the first dead letter is an increase."""
    conn = connect(broker.url)
    try:
        conn.create_sender("fresh", options=QUEUE).send(Message(body="x"))
        values = metrics(broker)
        queue = {("address", "fresh"), ("queue", "fresh")}
        rejected = frozenset({*queue, ("reason", "rejected")})
        assert values["amqpbroker_queue_messages_dead_lettered_total", rejected] == 0
        address = frozenset({("address", "fresh"), ("reason", "rejected")})
        assert values["amqpbroker_address_messages_dead_lettered_total", address] == 0
        before = values[
            "amqpbroker_messages_dead_lettered_total", frozenset({("reason", "rejected")})
        ]
        assert values["amqpbroker_messages_expired_total", frozenset()] >= 0
        receiver = conn.create_receiver("fresh", options=QUEUE)
        receiver.receive(timeout=5)
        receiver.reject()
    finally:
        conn.close()
    reap(broker)
    assert not queue_exists(broker, "fresh")
    after = metrics(broker)
    assert after[
        "amqpbroker_messages_dead_lettered_total", frozenset({("reason", "rejected")})
    ] == (before + 1)
