"""Last-value (B-120), ring (B-121) and non-destructive (B-123) queues and retroactive
addresses (B-124) through a real client, the HTTP API and /metrics (issue 19)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver
from support.client import QUEUE, TOPIC, Browse, connect, drain_round, send
from support.event_files import read_events
from support.metrics import scrape
from support.process import BrokerProcess, start_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


CONFIG = """
address-settings:
  "auto.lvq.#": {default-last-value-queue: true}
  "auto.ring.#": {default-ring-size: 2}
  "auto.nd.#": {default-non-destructive: true}
  "retro.#": {retroactive-message-count: 2}
addresses:
  - name: prices
    anycast: [{name: prices, last-value-key: sym}]
  - name: inflight
    anycast: [{name: inflight, last-value-key: sym}]
  - name: readings
    anycast: [{name: readings, ring-size: 3}]
  - name: replay
    anycast: [{name: replay, non-destructive: true}]
  - name: ticker
    anycast: [{name: ticker, last-value: true, non-destructive: true}]
"""


BROKER_CONFIG = CONFIG  # the module broker (tests/integration/conftest.py)
PERSISTENT = "persistence: {enabled: true, sync: true}\n" + CONFIG


def _queue(broker: BrokerProcess, name: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/{name}"
    with urllib.request.urlopen(url, timeout=10) as response:
        view: dict[str, Any] = json.loads(response.read())
    return view


def _listed(broker: BrokerProcess, name: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues"
    with urllib.request.urlopen(url, timeout=10) as response:
        rows: list[dict[str, Any]] = json.loads(response.read())
    return next(row for row in rows if row["name"] == name)


def _replaced(broker: BrokerProcess, queue: str, reason: str) -> float:
    labels = frozenset({("address", queue), ("queue", queue), ("reason", reason)})
    return scrape(broker.ports["http"])[("amqpbroker_queue_messages_replaced_total", labels)]


def _receive_all(receiver: BlockingReceiver) -> list[Any]:
    """Accept everything the queue has for this receiver now (a credit drain, B-037)."""
    got = []
    for message in drain_round(receiver.connection, receiver, 100):
        got.append(message.body)
        receiver.accept()
    return got


def _props(conn: BlockingConnection, address: str, *items: tuple[str, dict[str, Any]]) -> None:
    sender = conn.create_sender(address, options=QUEUE)
    for body, props in items:
        sender.send(Message(body=body, properties=props, durable=True))
    sender.close()


# -- B-120 ------------------------------------------------------------------------------
def test_a_last_value_queue_keeps_the_latest_value_per_key(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-120: A1 is replaced by A2; B1 and a message without the key stay; the HTTP API
    and /metrics show the replacement."""
    _props(conn, "prices", ("A1", {"sym": "A"}), ("B1", {"sym": "B"}), ("none", {}))
    _props(conn, "prices", ("A2", {"sym": "A"}))
    assert _listed(broker, "prices")["messages"] == 3
    view = _queue(broker, "prices")
    assert (view["replaced"], view["last_value_key"]) == (1, "sym")
    assert _replaced(broker, "prices", "last-value") == 1
    receiver = conn.create_receiver("prices", credit=0, options=QUEUE)
    assert _receive_all(receiver) == ["B1", "none", "A2"]
    conn.wait(lambda: _listed(broker, "prices")["acknowledged"] == 3, timeout=5)


def test_the_message_count_excludes_messages_in_delivery_and_a_returned_one_is_dropped(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-120: A1 in delivery stays when A2 arrives and is not counted; released, A1 goes
    because a newer value exists."""
    _props(conn, "inflight", ("A1", {"sym": "A"}))
    receiver = conn.create_receiver("inflight", credit=0, options=QUEUE)
    receiver.link.flow(1)
    fetcher = receiver.fetcher
    assert fetcher is not None
    receiver.connection.wait(lambda: fetcher.has_message, timeout=5)
    _props(conn, "inflight", ("A2", {"sym": "A"}))
    row = _listed(broker, "inflight")
    assert (row["messages"], row["delivering"]) == (1, 1)
    assert fetcher.pop().body == "A1"
    receiver.release()
    conn.wait(lambda: _queue(broker, "inflight")["replaced"] == 1, timeout=5)
    assert _receive_all(receiver) == ["A2"]


def test_auto_created_queues_are_last_value_queues_by_default_last_value_queue(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-120, B-110: `default-last-value-queue: true` keys on _AMQ_LVQ_NAME."""
    _props(
        conn, "auto.lvq.fx", ("1", {"_AMQ_LVQ_NAME": "EURUSD"}), ("2", {"_AMQ_LVQ_NAME": "EURUSD"})
    )
    assert _queue(broker, "auto.lvq.fx")["last_value_key"] == "_AMQ_LVQ_NAME"
    receiver = conn.create_receiver("auto.lvq.fx", credit=0, options=QUEUE)
    assert _receive_all(receiver) == ["2"]


# -- B-121 ------------------------------------------------------------------------------
def test_a_ring_queue_keeps_the_last_n(broker: BrokerProcess, conn: BlockingConnection) -> None:
    """B-121: ring-size 3; five readings leave the last three; replaced, reason ring."""
    send(conn, "readings", *range(5), caps=("queue",))
    assert _listed(broker, "readings")["messages"] == 3
    assert _replaced(broker, "readings", "ring") == 2
    receiver = conn.create_receiver("readings", credit=0, options=QUEUE)
    assert _receive_all(receiver) == [2, 3, 4]


def test_auto_created_queues_take_default_ring_size(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-121, B-110: `default-ring-size: 2`."""
    send(conn, "auto.ring.t", "a", "b", "c", caps=("queue",))
    assert _queue(broker, "auto.ring.t")["ring_size"] == 2
    receiver = conn.create_receiver("auto.ring.t", credit=0, options=QUEUE)
    assert _receive_all(receiver) == ["b", "c"]


# -- B-123 ------------------------------------------------------------------------------
def test_every_consumer_of_a_non_destructive_queue_gets_every_message(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-123: accepted does not remove; two consumers each get both; the count stays."""
    send(conn, "replay", "x", "y", caps=("queue",))
    first = conn.create_receiver("replay", name="first", credit=0, options=QUEUE)
    second = conn.create_receiver("replay", name="second", credit=0, options=QUEUE)
    assert _receive_all(first) == ["x", "y"]
    assert _receive_all(second) == ["x", "y"]
    row = _listed(broker, "replay")
    assert (row["messages"], row["acknowledged"]) == (2, 0)
    assert _queue(broker, "replay")["non_destructive"] is True


def test_auto_created_queues_take_default_non_destructive(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-123, B-110: `default-non-destructive: true`."""
    send(conn, "auto.nd.log", "1", caps=("queue",))
    receiver = conn.create_receiver("auto.nd.log", credit=0, options=QUEUE)
    assert _receive_all(receiver) == ["1"]
    assert _listed(broker, "auto.nd.log")["messages"] == 1


def test_last_value_and_non_destructive_together(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-123 with B-120: a consumer gets each new value; a later one only the latest."""
    _props(conn, "ticker", ("A1", {"_AMQ_LVQ_NAME": "A"}))
    watcher = conn.create_receiver("ticker", name="watcher", credit=0, options=QUEUE)
    assert _receive_all(watcher) == ["A1"]
    _props(conn, "ticker", ("A2", {"_AMQ_LVQ_NAME": "A"}))
    assert _receive_all(watcher) == ["A2"]
    late = conn.create_receiver("ticker", name="late", credit=0, options=QUEUE)
    assert _receive_all(late) == ["A2"]
    assert _listed(broker, "ticker")["messages"] == 1


# -- B-124 ------------------------------------------------------------------------------
def test_a_new_subscription_gets_the_last_r_messages(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-124: retroactive-message-count 2; a subscriber attaching after three messages
    gets the last two; the internal ring queue is visible and nobody may consume it."""
    send(conn, "retro.news", "n1", "n2", "n3", caps=("topic",))
    internal = "$.artemis.internal.retro.news.queue.multicast.retro"
    assert _listed(broker, internal)["messages"] == 2
    subscriber = conn.create_receiver("retro.news", credit=0, options=TOPIC)
    assert _receive_all(subscriber) == ["n2", "n3"]
    refused = connect(broker.url)
    try:
        with pytest.raises(Exception, match="max-consumers"):
            refused.create_receiver(f"$.artemis.internal.retro.news.address.retro::{internal}")
    finally:
        refused.close()


# -- the event log (B-171) --------------------------------------------------------------
def test_replacements_and_retroactive_copies_are_in_the_event_log(tmp_path: Path) -> None:
    """B-171: `replaced` with reasons last-value and ring; `enqueued`, reason retroactive."""
    broker = start_broker(tmp_path, "event-log: {enabled: true, level: lifecycle}\n" + CONFIG)
    try:
        conn = connect(broker.url)
        _props(conn, "prices", ("A1", {"sym": "A"}), ("A2", {"sym": "A"}))
        send(conn, "readings", 1, 2, 3, 4, caps=("queue",))
        send(conn, "retro.events", "e1", caps=("topic",))
        conn.create_receiver("retro.events", name="late", credit=0, options=TOPIC)
        conn.close()
    finally:
        assert broker.stop() == 0, broker.log()
    events = read_events(broker.data_dir / "events")
    replaced = sorted((e["queue"], e["reason"]) for e in events if e["event"] == "replaced")
    assert replaced == [("prices", "last-value"), ("readings", "ring")]
    copies = [e for e in events if e["event"] == "enqueued" and e["reason"] == "retroactive"]
    assert [(e["address"], e["routing_type"]) for e in copies] == [("retro.events", "MULTICAST")]


# -- restarts ---------------------------------------------------------------------------
def test_last_value_and_ring_queues_come_back_after_a_restart(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-120, B-121 across a restart: the index and the ring still apply."""
    broker = spawn(tmp_path, PERSISTENT)
    conn = connect(broker.url)
    _props(conn, "prices", ("A1", {"sym": "A"}), ("B1", {"sym": "B"}), ("A2", {"sym": "A"}))
    send(conn, "readings", 1, 2, 3, 4, durable=True, caps=("queue",))
    conn.close()
    assert broker.stop() == 0, broker.log()
    broker = spawn(tmp_path, PERSISTENT)
    try:
        conn = connect(broker.url)
        _props(conn, "prices", ("B2", {"sym": "B"}))
        send(conn, "readings", 5, durable=True, caps=("queue",))
        prices = conn.create_receiver("prices", credit=0, options=QUEUE)
        assert _receive_all(prices) == ["A2", "B2"]
        readings = conn.create_receiver("readings", credit=0, options=QUEUE)
        assert _receive_all(readings) == [3, 4, 5]
        conn.close()
    finally:
        assert broker.stop() == 0, broker.log()


def test_non_destructive_queues_and_retained_messages_come_back_after_a_restart(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-123, B-124 across a restart: accepted messages of a non-destructive queue are
    still there; the retained messages still reach a new subscriber."""
    broker = spawn(tmp_path, PERSISTENT)
    conn = connect(broker.url)
    send(conn, "replay", "x", durable=True, caps=("queue",))
    assert _receive_all(conn.create_receiver("replay", credit=0, options=QUEUE)) == ["x"]
    conn.wait(lambda: _queue(broker, "replay")["delivering"] == 0, timeout=5)
    send(conn, "retro.kept", "k1", "k2", "k3", durable=True, caps=("topic",))
    conn.close()
    assert broker.stop() == 0, broker.log()
    broker = spawn(tmp_path, PERSISTENT)
    try:
        conn = connect(broker.url)
        assert _receive_all(conn.create_receiver("replay", credit=0, options=QUEUE)) == ["x"]
        subscriber = conn.create_receiver("retro.kept", credit=0, options=TOPIC)
        assert _receive_all(subscriber) == ["k2", "k3"]
        conn.close()
    finally:
        assert broker.stop() == 0, broker.log()


def test_a_value_in_delivery_at_a_crash_gives_way_to_the_newer_one(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-120 across kill -9: A1 was in delivery when A2 came, so both are journaled;
    recovery keeps A2, and a second restart has only A2 too (the removal is journaled:
    tests/unit/store/test_recovery_queue_kinds.py)."""
    broker = spawn(tmp_path, PERSISTENT)
    conn = connect(broker.url)
    _props(conn, "inflight", ("A1", {"sym": "A"}))
    receiver = conn.create_receiver("inflight", credit=0, options=QUEUE)
    assert [m.body for m in drain_round(conn, receiver, 1)] == ["A1"]  # unsettled
    _props(conn, "inflight", ("A2", {"sym": "A"}))  # accepted once on disk (sync: true)
    broker.kill()
    for _ in range(2):
        broker = spawn(tmp_path, PERSISTENT)
        try:
            assert _listed(broker, "inflight")["messages"] == 1
            conn = connect(broker.url)
            browse = conn.create_receiver("inflight", credit=0, options=[QUEUE, Browse()])
            assert [m.body for m in drain_round(conn, browse, 10)] == ["A2"]
            conn.close()
        finally:
            assert broker.stop() == 0, broker.log()
