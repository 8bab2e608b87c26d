"""Consumer features through the real broker and python-qpid-proton clients (issue 19):
exclusive queues (B-122), max-consumers (B-125), purge-on-no-consumers (B-126, with a
restart), message groups (B-127), consumers-before-dispatch / delay-before-dispatch
(B-128) and consumer priority (B-035), on configured queues and on auto-created ones
through the `default-*` settings, as the management API and /metrics show them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached
from support.client import Capabilities, ConsumerPriority, connect, receive_bodies
from support.event_files import read_events
from support.http import get_json
from support.metrics import scrape
from support.process import BrokerProcess, start_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUEUE = Capabilities("queue")
FIRST = "JMSXGroupFirstForConsumer"

CONFIG = f"""
address-settings:
  "auto.exclusive.#": {{default-exclusive-queue: true}}
  "auto.single.#": {{default-max-consumers: 1}}
  "auto.groups.#": {{default-group-first-key: {FIRST}, default-group-buckets: 64}}
  "auto.gate.#": {{default-consumers-before-dispatch: 2}}
addresses:
  - name: exclusive
    anycast: [{{name: exclusive, exclusive: true}}]
  - name: single
    anycast: [{{name: single, max-consumers: 1}}]
  - name: purged
    anycast: [{{name: purged, purge-on-no-consumers: true}}]
  - name: groups
    anycast: [{{name: groups, group-first-key: {FIRST}}}]
  - name: gate
    anycast: [{{name: gate, consumers-before-dispatch: 2}}]
  - name: delayed
    anycast: [{{name: delayed, consumers-before-dispatch: 5, delay-before-dispatch: 200}}]
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    running = start_broker(tmp_path_factory.mktemp("features"), CONFIG)
    yield running
    assert running.stop() == 0, running.log()


def _queue(broker: BrokerProcess, name: str) -> dict[str, Any]:
    answer: dict[str, Any] = get_json(broker.ports["http"], f"/api/v1/queues/{name}")
    return answer


def _send(conn: BlockingConnection, address: str, *messages: Message) -> None:
    sender = conn.create_sender(address, options=QUEUE)
    for message in messages:
        sender.send(message)
    sender.close()


def _bodies(*bodies: str, **fields: Any) -> list[Message]:
    return [Message(body=body, **fields) for body in bodies]


def _consumers_are(broker: BrokerProcess, queue: str, count: int) -> None:
    wait_until(lambda: _queue(broker, queue)["consumers"] == count, timeout=5)


# -- B-122 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["exclusive", "auto.exclusive.orders"])
def test_exclusive_queue_serves_one_consumer_until_it_leaves(
    broker: BrokerProcess, address: str
) -> None:
    """B-122: every message goes to the first consumer; when it detaches, its unsettled
    messages go, in order, to the next consumer, which is exclusive from then on."""
    first_conn, second_conn = connect(broker.url), connect(broker.url)
    try:
        first = first_conn.create_receiver(address, credit=10, options=QUEUE)
        second = second_conn.create_receiver(address, credit=10, options=QUEUE)
        _consumers_are(broker, address, 2)
        _send(first_conn, address, *_bodies("1", "2", "3", "4"))
        assert [first.receive(timeout=5).body for _ in range(4)] == ["1", "2", "3", "4"]
        view = _queue(broker, address)
        assert (view["exclusive"], view["delivering"]) == (True, 4)
        first.close()  # unsettled: the four are returned, then `second` is selected
        assert receive_bodies(second, 4) == ["1", "2", "3", "4"]
    finally:
        first_conn.close()
        second_conn.close()


# -- B-125 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["single", "auto.single.orders"])
def test_max_consumers_refuses_the_next_attach_with_internal_error(
    broker: BrokerProcess, conn: BlockingConnection, address: str
) -> None:
    """B-125/B-038: the second consumer of a max-consumers 1 queue is refused with
    amqp:internal-error naming the queue and the limit; the first keeps working."""
    first = conn.create_receiver(address, name="first", options=QUEUE)
    with pytest.raises(LinkDetached, match="internal-error") as refused:
        conn.create_receiver(address, name="second", options=QUEUE)
    assert f"queue {address} has reached max-consumers=1" in str(refused.value)
    assert _queue(broker, address)["max_consumers"] == 1
    _send(conn, address, *_bodies("still served"))
    assert receive_bodies(first, 1) == ["still served"]


# -- B-126 ---------------------------------------------------------------------------------


def test_purge_on_no_consumers_skips_routing_and_purges_when_the_last_leaves(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-126: without consumers nothing is added; when the last consumer leaves every
    message, the unsettled ones too, is killed with reason purge-on-no-consumers."""
    _send(conn, "purged", *_bodies("nobody listens"))
    view = _queue(broker, "purged")
    assert (view["messages"], view["added"], view["purge_on_no_consumers"]) == (0, 0, True)
    receiver = conn.create_receiver("purged", credit=1, options=QUEUE)
    _send(conn, "purged", *_bodies("1", "2", "3"))
    assert receiver.receive(timeout=5).body == "1"
    receiver.close()
    wait_until(lambda: _queue(broker, "purged")["killed"] == 3, timeout=5)
    assert _queue(broker, "purged")["messages"] == 0
    metrics = scrape(broker.ports["http"])
    labels = frozenset(
        {("address", "purged"), ("queue", "purged"), ("reason", "purge-on-no-consumers")}
    )
    assert metrics["amqpbroker_queue_messages_killed_total", labels] == 3


PERSISTENT = """
persistence: {enabled: true, sync: true}
event-log: {enabled: true, level: lifecycle}
address-settings:
  "auto.purged.#": {default-purge-on-no-consumers: true}
addresses:
  - name: purged
    anycast: [{name: purged, purge-on-no-consumers: true}]
"""


def test_purge_on_no_consumers_survives_a_restart(
    tmp_path: Path, spawn: Callable[..., BrokerProcess]
) -> None:
    """B-126: the purge is journaled (the messages do not come back after a restart), the
    auto-created queue keeps its purge-on-no-consumers, and the event log says why."""
    broker = spawn(tmp_path, PERSISTENT)
    conn = connect(broker.url)
    for address in ("purged", "auto.purged.orders"):
        receiver = conn.create_receiver(address, credit=5, options=QUEUE)
        _send(conn, address, *_bodies("1", "2", "3", "4", "5", durable=True))
        for _ in range(4):
            receiver.receive(timeout=5)
            receiver.accept()
        receiver.close()
        wait_until(lambda a=address: _queue(broker, a)["messages"] == 0, timeout=5)
    conn.close()
    assert broker.stop() == 0, broker.log()
    events = read_events(broker.data_dir / "events")
    killed = [(e["queue"], e["reason"]) for e in events if e["event"] == "killed"]
    assert killed == [
        ("purged", "purge-on-no-consumers"),
        ("auto.purged.orders", "purge-on-no-consumers"),
    ]

    broker = spawn(tmp_path, PERSISTENT)
    try:
        for address in ("purged", "auto.purged.orders"):
            view = _queue(broker, address)
            assert (view["messages"], view["purge_on_no_consumers"]) == (0, True)
        conn = connect(broker.url)
        _send(conn, "auto.purged.orders", *_bodies("nobody listens", durable=True))
        conn.close()
        assert _queue(broker, "auto.purged.orders")["messages"] == 0
    finally:
        assert broker.stop() == 0, broker.log()


# -- B-127 ---------------------------------------------------------------------------------


def _received(receiver: BlockingReceiver, count: int) -> list[tuple[str, bool]]:
    """(body, carries group-first-key) of `count` messages, accepted."""
    got = []
    for _ in range(count):
        message = receiver.receive(timeout=5)
        got.append((message.body, bool((message.properties or {}).get(FIRST))))
        receiver.accept()
    return got


@pytest.mark.parametrize("address", ["groups", "auto.groups.orders"])
def test_message_groups_stay_with_their_owner_and_move_when_it_leaves(
    broker: BrokerProcess, address: str
) -> None:
    """B-127: each group goes to one consumer, whose first message of it carries the
    group-first-key; when the owner detaches, the group moves to the other consumer."""
    conn_a, conn_b = connect(broker.url), connect(broker.url)
    try:
        a = conn_a.create_receiver(address, credit=10, options=QUEUE)
        b = conn_b.create_receiver(address, credit=10, options=QUEUE)
        _consumers_are(broker, address, 2)
        _send(
            conn_a,
            address,
            *[Message(body=f"{g}{i}", group_id=g) for i in (1, 2, 3) for g in ("A", "B")],
        )
        got = {"a": _received(a, 3), "b": _received(b, 3)}
        assert sorted(got.values()) == [
            [("A1", True), ("A2", False), ("A3", False)],
            [("B1", True), ("B2", False), ("B3", False)],
        ]
        assert _queue(broker, address)["groups"] == 2
        owner_of_a, other = (a, b) if got["a"][0][0] == "A1" else (b, a)
        owner_of_a.close()
        _send(conn_b if owner_of_a is a else conn_a, address, Message(body="A4", group_id="A"))
        assert _received(other, 1) == [("A4", True)]
    finally:
        conn_a.close()
        conn_b.close()


def test_group_count_is_a_metric(broker: BrokerProcess, conn: BlockingConnection) -> None:
    """B-127: /metrics shows how many groups have an owner."""
    receiver = conn.create_receiver("groups", credit=10, options=QUEUE)
    _send(conn, "groups", Message(body="g", group_id="metric-group"))
    receive_bodies(receiver, 1)
    labels = frozenset({("address", "groups"), ("queue", "groups")})
    assert scrape(broker.ports["http"])["amqpbroker_queue_groups", labels] == 1
    receiver.close()


# -- B-128 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["gate", "auto.gate.orders"])
def test_consumers_before_dispatch_waits_for_the_second_consumer(
    broker: BrokerProcess, conn: BlockingConnection, address: str
) -> None:
    """B-128: with consumers-before-dispatch 2, one consumer gets nothing; the second
    attaching opens the queue."""
    first = conn.create_receiver(address, name="first", credit=10, options=QUEUE)
    _send(conn, address, *_bodies("1", "2"))
    view = _queue(broker, address)
    assert (view["messages"], view["delivering"], view["dispatching"]) == (2, 0, False)
    second = conn.create_receiver(address, name="second", credit=10, options=QUEUE)
    wait_until(lambda: _queue(broker, address)["delivering"] == 2, timeout=5)
    assert _queue(broker, address)["dispatching"] is True
    first.close()
    second.close()


def test_delay_before_dispatch_opens_the_queue_after_the_delay(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-128: consumers-before-dispatch 5 is not reached, but 200 ms after the first
    consumer attached the queue dispatches anyway."""
    receiver = conn.create_receiver("delayed", credit=10, options=QUEUE)
    _send(conn, "delayed", *_bodies("late"))
    assert receive_bodies(receiver, 1, timeout=5) == ["late"]
    assert _queue(broker, "delayed")["delay_before_dispatch"] == 200


# -- B-035 ---------------------------------------------------------------------------------


def test_consumer_priority_serves_the_highest_first(
    broker: BrokerProcess, conn: BlockingConnection
) -> None:
    """B-035: while the higher-priority consumer can take messages it gets all of them;
    the lower one gets messages once it cannot (here: it left)."""
    low = conn.create_receiver("prio", name="low", credit=10, options=[QUEUE, ConsumerPriority(1)])
    high = conn.create_receiver(
        "prio", name="high", credit=10, options=[QUEUE, ConsumerPriority(9)]
    )
    _send(conn, "prio", *_bodies("1", "2", "3", "4"))
    assert receive_bodies(high, 4) == ["1", "2", "3", "4"]
    high.close()
    _send(conn, "prio", *_bodies("5"))
    assert receive_bodies(low, 1) == ["5"]
