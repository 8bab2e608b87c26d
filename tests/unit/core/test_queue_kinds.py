"""Last-value (B-120), ring (B-121) and non-destructive (B-123) queues, and retroactive
addresses (B-124), in the core: no sockets, a ManualClock (issue 19)."""

from __future__ import annotations

from typing import Any

import pytest
from support.core_harness import Harness, bodies

from amqpbroker.core import (
    ACCEPTED,
    RELEASED,
    AddressSettings,
    MaxConsumersReached,
    Message,
    QueueConfig,
    RoutingType,
)
from amqpbroker.core.queue import Queue

ANYCAST = RoutingType.ANYCAST
MULTICAST = RoutingType.MULTICAST


def _queue(h: Harness, name: str = "q", **config: Any) -> Queue:
    if name not in h.broker.post_office.addresses:
        h.broker.create_address(name, {ANYCAST})
    return h.broker.create_queue(
        QueueConfig(name=name, address=name, routing_type=ANYCAST, **config)
    )


def _send(h: Harness, *items: tuple[bytes, dict[str, Any]], address: str = "q", **kw: Any) -> None:
    target = h.producer(address, "queue")
    for body, props in items:
        h.send(target, body, props=props, **kw)


def _events(h: Harness, kind: str) -> list[tuple[str | None, str | None, int]]:
    return [(e.queue, e.reason, e.msg_id) for e in h.broker.emitter.take() if e.event == kind]


# -- B-120 last-value queues ------------------------------------------------------------
def test_a_newer_value_replaces_the_waiting_one() -> None:
    """B-120: the last message per key value stays; the older one is `replaced`, counted as
    neither acknowledged nor killed; other values and messages without the key stay."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}), (b"b1", {"sym": "B"}), (b"x", {}), (b"a2", {"sym": "A"}))
    assert queue.message_count == 3
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"b1", b"x", b"a2"]
    counters = queue.counters
    assert (counters.replaced, counters.acknowledged, counters.killed) == (1, 0, 0)
    assert counters.replaced_by_reason == {"ring": 0, "last-value": 1}


def test_the_replaced_message_has_its_event() -> None:
    """B-120, B-171: event `replaced`, reason `last-value`, for the older message."""
    h = Harness()
    _queue(h, last_value_key="sym")
    h.broker.emitter.take()
    _send(h, (b"a1", {"sym": "A"}), (b"a2", {"sym": "A"}))
    [(queue, reason, msg_id)] = _events(h, "replaced")
    assert (queue, reason) == ("q", "last-value")
    [a2] = h.queue("q").refs()
    assert msg_id == a2.message.msg_id - 1  # a1's


@pytest.mark.parametrize("value", [7, None, b"A"])
def test_a_key_that_is_not_a_string_never_replaces(value: object) -> None:
    """B-120: the key must be a string application-property; others are plain messages."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"1", {"sym": value}), (b"2", {"sym": value}))
    assert queue.message_count == 2
    assert queue.counters.replaced == 0


def test_a_message_in_delivery_is_not_replaced_and_not_counted() -> None:
    """B-120: a newer value does not remove the message in delivery; the message count
    excludes messages in delivery."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}))
    c = h.consumer("q", "queue", credit=1)
    [d1] = h.take(c)
    _send(h, (b"a2", {"sym": "A"}))
    assert queue.counters.replaced == 0
    assert (queue.message_count, queue.delivering) == (1, 1)
    h.settle(c, d1, ACCEPTED)
    assert queue.counters.acknowledged == 1


def test_a_returned_message_is_dropped_when_a_newer_value_exists() -> None:
    """B-120: returned, with a newer value in the queue: replaced; the newer one is sent."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}))
    c = h.consumer("q", "queue", credit=1)
    [d1] = h.take(c)
    _send(h, (b"a2", {"sym": "A"}))
    h.settle(c, d1, RELEASED)
    assert queue.counters.replaced_by_reason["last-value"] == 1
    h.broker.set_credit(c, 1)
    assert bodies(h.take(c)) == [b"a2"]
    assert queue.message_count == 0


def test_a_returned_message_is_current_again_without_a_newer_value() -> None:
    """B-120: returned with no newer value, it becomes current again (and is replaced by
    the next one)."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}))
    c = h.consumer("q", "queue", credit=1)
    assert len(h.take(c)) == 1
    h.broker.detach_consumer(c, closed=True)
    assert queue.message_count == 1
    _send(h, (b"a2", {"sym": "A"}))
    assert queue.message_count == 1
    c2 = h.consumer("q", "queue")
    assert bodies(h.take(c2)) == [b"a2"]


def test_the_older_of_two_returned_values_is_dropped() -> None:
    """B-120 (Decision): arrival order decides; a newer value that comes back after an
    older one keeps its place, the older goes."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}))
    c = h.consumer("q", "queue", credit=1)
    assert len(h.take(c)) == 1
    _send(h, (b"a2", {"sym": "A"}))
    c2 = h.consumer("q", "queue", credit=1)
    assert bodies(h.take(c2)) == [b"a2"]
    h.broker.detach_consumer(c, closed=True)  # a1 back first: a2 is in delivery
    h.broker.detach_consumer(c2, closed=True)  # a2 back: a1 goes
    assert queue.message_count == 1
    c3 = h.consumer("q", "queue")
    assert bodies(h.take(c3)) == [b"a2"]


def test_a_scheduled_message_takes_part_once_due() -> None:
    """B-120 with B-015: a message scheduled at send replaces the older value when due."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}))
    target = h.producer("q", "queue")
    due = h.clock.now_ms() + 1_000
    later = Message(b"a2", application_properties={"sym": "A"}, deliver_at_ms=due)
    h.broker.publish(later, target)
    assert (queue.ready_count, queue.scheduled_count) == (1, 1)
    h.advance(1_000)
    assert (queue.ready_count, queue.scheduled_count) == (1, 0)
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"a2"]


def test_auto_created_queues_take_default_last_value_queue() -> None:
    """B-120, B-110: `default-last-value-queue` keys auto-created queues on _AMQ_LVQ_NAME."""
    h = Harness({"prices.#": AddressSettings.of(default_last_value_queue=True)})
    _send(h, (b"1", {"_AMQ_LVQ_NAME": "A"}), (b"2", {"_AMQ_LVQ_NAME": "A"}), address="prices.x")
    queue = h.queue("prices.x")
    assert queue.config.last_value_key == "_AMQ_LVQ_NAME"
    assert queue.message_count == 1


def test_auto_created_queues_take_default_last_value_key() -> None:
    """B-120, B-110: `default-last-value-key` names the key of auto-created queues."""
    h = Harness({"#": AddressSettings.of(default_last_value_key="sym")})
    _send(h, (b"1", {"sym": "A"}), (b"2", {"sym": "A"}), (b"3", {"sym": "B"}))
    assert h.queue("q").message_count == 2


def test_a_plain_queue_keeps_every_value() -> None:
    """B-120: without a key the property means nothing (the plain queue has no kind)."""
    h = Harness()
    queue = _queue(h)
    assert queue.kind is None
    _send(h, (b"1", {"_AMQ_LVQ_NAME": "A"}), (b"2", {"_AMQ_LVQ_NAME": "A"}))
    assert queue.message_count == 2


def test_replaced_messages_do_not_pile_up_in_memory() -> None:
    """B-120: a last-value queue without consumers holds about one reference per key,
    not one per update (gone references are compacted away)."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    _send(h, *[(str(i).encode(), {"sym": "A"}) for i in range(2_000)])
    assert queue.message_count == 1
    held = sum(len(level) for level in queue._fresh)
    assert held < 200
    assert queue.size_bytes == 4  # b"1999"


# -- B-121 ring queues ------------------------------------------------------------------
def test_a_ring_queue_keeps_the_last_n() -> None:
    """B-121: over N pending messages, the head is removed (replaced, reason ring)."""
    h = Harness()
    queue = _queue(h, ring_size=3)
    h.broker.emitter.take()
    _send(h, *[(str(i).encode(), {}) for i in range(5)])
    assert queue.message_count == 3
    assert [reason for _, reason, _ in _events(h, "replaced")] == ["ring", "ring"]
    assert queue.counters.replaced_by_reason == {"ring": 2, "last-value": 0}
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"2", b"3", b"4"]


def test_messages_in_delivery_are_not_counted_by_the_ring() -> None:
    """B-121: in delivery they are neither counted nor removed; the total exceeds N."""
    h = Harness()
    queue = _queue(h, ring_size=2)
    _send(h, (b"1", {}), (b"2", {}))
    c = h.consumer("q", "queue", credit=2)
    assert len(h.take(c)) == 2
    _send(h, (b"3", {}), (b"4", {}), (b"5", {}))
    assert (queue.ready_count, queue.delivering, queue.message_count) == (2, 2, 4)
    assert queue.counters.replaced == 1


def test_returned_messages_are_trimmed_oldest_first() -> None:
    """B-121: when messages return the queue trims from the head, so the oldest returned
    ones go."""
    h = Harness()
    queue = _queue(h, ring_size=2)
    _send(h, (b"1", {}), (b"2", {}))
    c = h.consumer("q", "queue", credit=2)
    d1, d2 = h.take(c)
    _send(h, (b"3", {}), (b"4", {}))
    h.settle(c, d1, RELEASED)
    h.settle(c, d2, RELEASED)
    assert queue.ready_count == 2
    assert queue.counters.replaced == 2
    h.broker.set_credit(c, 10)
    assert bodies(h.take(c)) == [b"3", b"4"]


def test_scheduled_messages_are_not_counted_by_the_ring() -> None:
    """B-121: scheduled messages (here a redelivery delay, B-065) are not removed."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=1_000)})
    queue = _queue(h, ring_size=1)
    _send(h, (b"1", {}))
    c = h.consumer("q", "queue", credit=1)
    [d1] = h.take(c)
    h.settle(c, d1, RELEASED)
    assert queue.scheduled_count == 1
    _send(h, (b"2", {}))
    assert (queue.ready_count, queue.scheduled_count, queue.counters.replaced) == (1, 1, 0)
    assert queue.message_count == 2


def test_ring_size_zero_delivers_to_a_waiting_consumer_and_keeps_nothing() -> None:
    """B-121: N = 0 keeps no pending message, but a consumer with credit still gets it."""
    h = Harness()
    queue = _queue(h, ring_size=0)
    _send(h, (b"lost", {}))
    assert queue.message_count == 0
    c = h.consumer("q", "queue")
    _send(h, (b"kept", {}))
    assert bodies(h.take(c)) == [b"kept"]


def test_auto_created_queues_take_default_ring_size() -> None:
    """B-121, B-110: `default-ring-size`."""
    h = Harness({"#": AddressSettings.of(default_ring_size=2)})
    _send(h, (b"1", {}), (b"2", {}), (b"3", {}))
    assert h.queue("q").message_count == 2


# -- B-123 non-destructive queues -------------------------------------------------------
def test_every_consumer_receives_every_message_once() -> None:
    """B-123: accepted does not remove; each consumer walks the queue on its own."""
    h = Harness()
    queue = _queue(h, non_destructive=True)
    _send(h, (b"1", {}), (b"2", {}))
    c1 = h.consumer("q", "queue")
    c2 = h.consumer("q", "queue")
    got1, got2 = h.take(c1), h.take(c2)
    assert bodies(got1) == bodies(got2) == [b"1", b"2"]
    for d in got1:
        h.settle(c1, d, ACCEPTED)
    assert queue.message_count == 2
    assert queue.counters.acknowledged == 0
    _send(h, (b"3", {}))
    assert bodies(h.take(c1)) == bodies(h.take(c2)) == [b"3"]
    c3 = h.consumer("q", "queue")
    assert bodies(h.take(c3)) == [b"1", b"2", b"3"]


def test_a_released_message_stays_and_is_not_sent_again_to_the_same_consumer() -> None:
    """B-123: any outcome only ends the delivery; the message stays for others."""
    h = Harness()
    queue = _queue(h, non_destructive=True)
    _send(h, (b"1", {}))
    c1 = h.consumer("q", "queue")
    [d] = h.take(c1)
    assert (queue.delivering, queue.message_count) == (1, 1)
    h.settle(c1, d, RELEASED)
    assert h.take(c1) == []
    assert (queue.delivering, queue.message_count) == (0, 1)
    h.broker.detach_consumer(c1, closed=True)
    assert queue.message_count == 1


def test_a_rolled_back_transactional_accept_leaves_the_delivery_count_alone() -> None:
    """B-123 (docs/decisions.md: the reference's delivery count does not change) with
    B-142: a rolled-back transactional accept of a non-destructive delivery counts no
    attempt on the message every other consumer shares: the next consumer gets it as a
    first delivery."""
    h = Harness()
    _queue(h, non_destructive=True)
    _send(h, (b"1", {}))
    c1 = h.consumer("q", "queue")
    [d] = h.take(c1)
    for _ in range(3):
        h.broker.hold(c1, d.delivery)  # the transaction of its accept rolled back
    h.settle(c1, d, ACCEPTED)
    c2 = h.consumer("q", "queue")
    [again] = h.take(c2)
    assert (d.wire_count, again.wire_count) == (0, 0)


def test_messages_leave_a_non_destructive_queue_by_expiry() -> None:
    """B-123: expiry (B-084) removes them."""
    h = Harness({"#": AddressSettings.of(expiry_delay=1_000)})
    queue = _queue(h, non_destructive=True)
    _send(h, (b"1", {}))
    h.advance(1_000)
    c = h.consumer("q", "queue")
    assert h.take(c) == []
    assert queue.message_count == 0
    assert queue.counters.expired == 1


def test_non_destructive_and_ring() -> None:
    """B-123 with B-121: the ring trims a non-destructive queue."""
    h = Harness()
    queue = _queue(h, non_destructive=True, ring_size=2)
    _send(h, (b"1", {}), (b"2", {}), (b"3", {}))
    assert queue.message_count == 2
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"2", b"3"]


def test_last_value_and_non_destructive_together() -> None:
    """B-123 with B-120: each consumer gets each new value; a new consumer the latest."""
    h = Harness()
    queue = _queue(h, non_destructive=True, last_value_key="sym")
    _send(h, (b"a1", {"sym": "A"}), (b"b1", {"sym": "B"}))
    c1 = h.consumer("q", "queue")
    for d in h.take(c1):
        h.settle(c1, d, ACCEPTED)
    _send(h, (b"a2", {"sym": "A"}))
    assert bodies(h.take(c1)) == [b"a2"]
    assert queue.message_count == 2
    c2 = h.consumer("q", "queue")
    assert bodies(h.take(c2)) == [b"b1", b"a2"]
    assert queue.counters.replaced_by_reason["last-value"] == 1


def test_a_selector_consumer_skips_what_it_does_not_take() -> None:
    """B-123: a consumer's walk passes messages its selector refuses."""
    h = Harness()
    _queue(h, non_destructive=True)
    _send(h, (b"1", {"c": "red"}), (b"2", {"c": "blue"}))
    c = h.consumer("q", "queue", selector="c = 'blue'")
    assert bodies(h.take(c)) == [b"2"]


def test_auto_created_queues_take_default_non_destructive() -> None:
    """B-123, B-110: `default-non-destructive`."""
    h = Harness({"#": AddressSettings.of(default_non_destructive=True)})
    _send(h, (b"1", {}))
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, ACCEPTED)
    assert h.queue("q").message_count == 1


def test_browsing_a_non_destructive_queue_shows_each_message_once() -> None:
    """B-123: management and browsers see a delivered message once, not twice."""
    h = Harness()
    queue = _queue(h, non_destructive=True)
    _send(h, (b"1", {}))
    c = h.consumer("q", "queue")
    assert len(h.take(c)) == 1
    assert [r.message.data for r in queue.refs()] == [b"1"]


# -- B-124 retroactive addresses --------------------------------------------------------
RETRO = {"news.#": AddressSettings.of(retroactive_message_count=2)}


def test_a_retroactive_address_has_its_internal_resources() -> None:
    """B-124: internal address and two ring queues of size R with max-consumers 0."""
    h = Harness(RETRO)
    h.broker.create_address("news.a", {MULTICAST})
    internal = "$.artemis.internal.news.a.address.retro"
    assert h.broker.post_office.addresses[internal].routing_types == {ANYCAST, MULTICAST}
    for rt in ("anycast", "multicast"):
        queue = h.queue(f"$.artemis.internal.news.a.queue.{rt}.retro")
        assert queue.config.ring_size == 2
        assert queue.config.max_consumers == 0
        assert queue.durable


def test_nobody_consumes_the_internal_queues() -> None:
    """B-124, B-125: max-consumers 0 refuses every consumer."""
    h = Harness(RETRO)
    h.broker.create_address("news.a", {MULTICAST})
    with pytest.raises(MaxConsumersReached):
        h.consumer(
            "$.artemis.internal.news.a.address.retro::"
            "$.artemis.internal.news.a.queue.multicast.retro"
        )


def test_a_new_subscription_gets_the_last_r_messages() -> None:
    """B-124: a queue created later gets the kept messages (enqueued, reason retroactive)."""
    h = Harness(RETRO)
    target = h.producer("news.a", "topic")
    for body in (b"1", b"2", b"3"):
        h.send(target, body)
    h.broker.emitter.take()
    c = h.consumer("news.a", "topic")
    assert bodies(h.take(c)) == [b"2", b"3"]
    enqueued = [r for q, r, _ in _events(h, "enqueued") if not q or not q.startswith("$.")]
    assert enqueued == ["retroactive", "retroactive"]


def test_only_the_matching_routing_type_and_filter_is_copied() -> None:
    """B-124: copies per routing type, through the new queue's filter."""
    h = Harness({"orders": AddressSettings.of(retroactive_message_count=5)})
    h.broker.create_address("orders", {ANYCAST, MULTICAST})
    h.broker.create_queue(QueueConfig(name="sub", address="orders", routing_type=MULTICAST))
    topic = h.producer("orders", "topic")
    h.send(topic, b"m-red", props={"c": "red"})
    h.send(topic, b"m-blue", props={"c": "blue"})
    anycast = h.broker.create_queue(
        QueueConfig(name="work", address="orders", routing_type=ANYCAST)
    )
    assert anycast.message_count == 0
    blue = h.broker.create_queue(
        QueueConfig(name="blue", address="orders", routing_type=MULTICAST, filter="c = 'blue'")
    )
    assert [r.message.data for r in blue.refs()] == [b"m-blue"]


def test_a_plain_address_has_no_internal_resources() -> None:
    """B-124: retroactive-message-count 0 (the default) creates nothing."""
    h = Harness()
    h.broker.create_address("plain", {MULTICAST})
    assert not [a for a in h.broker.post_office.addresses if a.startswith("$.")]


def test_a_retroactive_address_is_never_auto_deleted() -> None:
    """B-124, B-114: its divert is a binding, so the reaper keeps the address."""
    h = Harness(
        {
            "news.#": AddressSettings.of(
                retroactive_message_count=1, auto_delete_addresses_skip_usage_check=True
            )
        },
        address_queue_scan_period_ms=100,
    )
    h.producer("news.a", "topic")
    h.advance(100)
    h.advance(100)
    h.advance(100)
    assert "news.a" in h.broker.post_office.addresses


def test_subscription_queues_take_the_default_settings() -> None:
    """B-110 (Artemis applies the dynamic defaults to every queue it creates): a topic's
    subscription queue is a last-value, ring or non-destructive queue by default-*."""
    h = Harness(
        {
            "prices": AddressSettings.of(default_last_value_key="sym"),
            "feed": AddressSettings.of(default_ring_size=1, default_non_destructive=True),
        }
    )
    prices = h.consumer("prices", "topic", credit=0)
    feed = h.consumer("feed", "topic", credit=0)
    topic = h.producer("prices", "topic")
    h.send(topic, b"a1", props={"sym": "A"})
    h.send(topic, b"a2", props={"sym": "A"})
    h.send(h.producer("feed", "topic"), b"f1")
    h.send(h.producer("feed", "topic"), b"f2")
    h.broker.set_credit(prices, 10)
    h.broker.set_credit(feed, 10)
    assert bodies(h.take(prices)) == [b"a2"]
    [f2] = h.take(feed)
    assert bodies([f2]) == [b"f2"]
    h.settle(feed, f2, ACCEPTED)
    [subscription] = h.broker.post_office.addresses["feed"].queues
    assert subscription.message_count == 1  # non-destructive: still there


def test_the_kept_reference_is_enqueued_after_the_message_was_sent() -> None:
    """B-124, B-171: `sent` and the route's `enqueued` come first, then the divert's."""
    h = Harness(RETRO)
    h.consumer("news.a", "topic")
    h.broker.emitter.take()
    h.send(h.producer("news.a", "topic"), b"1")
    kinds = [(e.event, (e.queue or "").startswith("$.")) for e in h.broker.emitter.take()]
    assert kinds.index(("sent", False)) < kinds.index(("enqueued", False))
    assert kinds.index(("enqueued", False)) < kinds.index(("enqueued", True))


def test_a_wildcard_subscription_address_is_not_retroactive() -> None:
    """B-124 with B-011: a consumer on `news.#` makes a pattern address, not a retained one."""
    h = Harness(RETRO)
    h.consumer("news.#", "topic")
    assert not [a for a in h.broker.post_office.addresses if a.startswith("$.")]


def test_consumed_values_are_forgotten() -> None:
    """B-120: distinct keys that a consumer takes do not pile up in the index (each entry
    would keep its message's bytes)."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    c = h.consumer("q", "queue", credit=10_000)
    for i in range(2_000):
        _send(h, (b"x", {"sym": str(i)}))
        for d in h.take(c):
            h.settle(c, d, ACCEPTED)
    assert queue.kind is not None
    assert len(queue.kind.index) < 200  # type: ignore[attr-defined]


class _Malformed:
    """A section reader over bytes whose application-properties do not decode."""

    def properties(self, data: bytes) -> dict[str, Any]:
        return {}

    def application_properties(self, data: bytes) -> dict[str, Any]:
        raise ValueError("malformed section 0x74")

    def message_annotations(self, data: bytes) -> dict[str, Any]:
        return {}


def test_a_message_whose_properties_do_not_decode_is_kept_as_a_plain_one() -> None:
    """B-120 (hostile input): undecodable application-properties mean "no key"."""
    h = Harness()
    queue = _queue(h, last_value_key="sym")
    target = h.producer("q", "queue")
    for body in (b"1", b"2"):
        h.broker.publish(Message(body, reader=_Malformed()), target)
    assert queue.message_count == 2


def test_a_changed_retroactive_count_applies_and_lowering_trims_nothing() -> None:
    """B-124 with B-102 and B-121: raised, more are kept; lowered, the ring keeps its
    length as messages arrive (manual trimming)."""
    h = Harness(RETRO)
    target = h.producer("news.a", "topic")
    kept = h.queue("$.artemis.internal.news.a.queue.multicast.retro")
    for body in (b"1", b"2", b"3"):
        h.send(target, body)
    assert kept.message_count == 2
    h.broker.settings.add("news.#", AddressSettings.of(retroactive_message_count=4))
    for body in (b"4", b"5", b"6"):
        h.send(target, body)
    assert kept.message_count == 4
    h.broker.settings.add("news.#", AddressSettings.of(retroactive_message_count=1))
    h.send(target, b"7")
    assert kept.message_count == 4
    assert [r.message.data for r in kept.refs()] == [b"4", b"5", b"6", b"7"]


def test_a_message_sent_to_a_fully_qualified_queue_is_not_kept() -> None:
    """B-124 (Decision, as Artemis): an FQQN send goes to its queue only, not to the
    address's bindings, so the divert does not see it."""
    h = Harness(RETRO)
    h.broker.create_address("news.a", {MULTICAST})
    h.broker.create_queue(QueueConfig(name="sub", address="news.a", routing_type=MULTICAST))
    h.send(h.producer("news.a::sub"), b"direct")
    h.send(h.producer("news.a", "topic"), b"routed")
    kept = h.queue("$.artemis.internal.news.a.queue.multicast.retro")
    assert [r.message.data for r in kept.refs()] == [b"routed"]
