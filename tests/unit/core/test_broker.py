"""The Broker state machine without sockets, with a ManualClock (B-001…B-054, B-110…B-115)."""

from __future__ import annotations

import pytest
from support.core_harness import CONN, Harness, bodies, one_delivery

from amqpbroker.core import (
    ACCEPTED,
    RELEASED,
    AddressSettings,
    ClientError,
    ConnectionId,
    ConsumerId,
    ConsumerRequest,
    DeliveryId,
    IllegalState,
    Message,
    Modified,
    NotFound,
    Outcome,
    ProducerTarget,
    QueueConfig,
    Rejected,
    RoutingType,
    Window,
)

# -- routing and attach ------------------------------------------------------------------


def test_point_to_point_with_queue_capability() -> None:
    """B-005/B-008/B-110: `queue` capability auto-creates an ANYCAST address and queue."""
    h = Harness()
    target = h.producer("orders", "queue")
    h.send(target, b"one")
    assert h.queue("orders").routing_type is RoutingType.ANYCAST
    c = h.consumer("orders", "queue")
    [d] = h.take(c)
    assert (d.message.data, d.wire_count) == (b"one", 0)
    h.settle(c, d, ACCEPTED)
    assert h.queue("orders").message_count == 0
    assert h.queue("orders").counters.acknowledged == 1


def test_bare_producer_to_new_address_is_multicast_and_unrouted() -> None:
    """B-008 rule 3 + B-004: default MULTICAST address with no queues drops the message."""
    h = Harness()
    target = h.producer("news")
    h.send(target)
    address = h.broker.post_office.addresses["news"]
    assert address.routing_types == {RoutingType.MULTICAST}
    assert address.unrouted == 1
    assert not address.queues


def test_default_anycast_settings_give_queue_semantics() -> None:
    """B-008: default-address-routing-type ANYCAST makes bare producers queue-like."""
    h = Harness(
        {
            "#": AddressSettings.of(
                default_address_routing_type=RoutingType.ANYCAST,
                default_queue_routing_type=RoutingType.ANYCAST,
            )
        }
    )
    h.send(h.producer("jobs"), b"j")
    assert h.queue("jobs").message_count == 1


def test_competing_consumers_round_robin() -> None:
    """Competing consumers on one queue share messages round-robin."""
    h = Harness()
    target = h.producer("work", "queue")
    c1, c2 = h.consumer("work", "queue"), h.consumer("work", "queue")
    for i in range(6):
        h.send(target, b"%d" % i)
    assert bodies(h.take(c1)) == [b"0", b"2", b"4"]
    assert bodies(h.take(c2)) == [b"1", b"3", b"5"]


def test_multicast_fan_out_gives_each_subscription_a_copy() -> None:
    """B-002/B-026: every subscription queue gets its own reference."""
    h = Harness()
    s1 = h.consumer("news", "topic", container="a")
    s2 = h.consumer("news", "topic", container="b")
    h.send(h.producer("news", "topic"), b"hello")
    assert bodies(h.take(s1)) == [b"hello"]
    assert bodies(h.take(s2)) == [b"hello"]


def test_message_without_routing_preference_goes_to_both_kinds() -> None:
    """B-002: routing type none -> one anycast queue and every multicast queue."""
    h = Harness()
    h.broker.create_address("mixed", {RoutingType.ANYCAST, RoutingType.MULTICAST})
    for name, rt in (
        ("a1", RoutingType.ANYCAST),
        ("a2", RoutingType.ANYCAST),
        ("m1", RoutingType.MULTICAST),
        ("m2", RoutingType.MULTICAST),
    ):
        h.broker.create_queue(QueueConfig(name=name, address="mixed", routing_type=rt))
    target = h.producer("mixed")
    h.send(target)
    h.send(target)
    counts = {n: h.queue(n).message_count for n in ("a1", "a2", "m1", "m2")}
    assert counts == {"a1": 1, "a2": 1, "m1": 2, "m2": 2}


def test_message_routing_type_annotation_decides_when_link_has_none() -> None:
    """B-008 rule 2: x-opt-routing-type 1 (ANYCAST) on a link without capabilities."""
    h = Harness()
    h.broker.create_address("mixed", {RoutingType.ANYCAST, RoutingType.MULTICAST})
    h.broker.create_queue(QueueConfig(name="a", address="mixed", routing_type=RoutingType.ANYCAST))
    h.broker.create_queue(
        QueueConfig(name="m", address="mixed", routing_type=RoutingType.MULTICAST)
    )
    h.send(h.producer("mixed"), message_routing_type=RoutingType.ANYCAST)
    assert (h.queue("a").message_count, h.queue("m").message_count) == (1, 0)


def test_fqqn_producer_targets_only_that_queue() -> None:
    """B-006: a producer to `address::queue` delivers only to that queue."""
    h = Harness()
    h.broker.create_address("news", {RoutingType.MULTICAST})
    for name in ("q1", "q2"):
        h.broker.create_queue(
            QueueConfig(name=name, address="news", routing_type=RoutingType.MULTICAST)
        )
    h.send(h.producer("news::q2"))
    assert (h.queue("q1").message_count, h.queue("q2").message_count) == (0, 1)


def test_fqqn_consumers_compete_on_a_multicast_queue() -> None:
    """B-006: FQQN consumers on a MULTICAST queue compete rather than each get a copy."""
    h = Harness()
    h.broker.create_address("news", {RoutingType.MULTICAST})
    h.broker.create_queue(
        QueueConfig(name="sub", address="news", routing_type=RoutingType.MULTICAST)
    )
    c1, c2 = h.consumer("news::sub"), h.consumer("news::sub")
    target = h.producer("news")
    h.send(target, b"1")
    h.send(target, b"2")
    assert len(h.take(c1)) + len(h.take(c2)) == 2


def test_fqqn_queue_on_another_address_is_not_found() -> None:
    """B-006: queue exists on another address -> amqp:not-found."""
    h = Harness()
    h.producer("a", "queue")
    with pytest.raises(NotFound, match="does not exist for address b"):
        h.consumer("b::a")


@pytest.mark.parametrize("address", ["a::b::c", "bad\x01name", ""])
def test_invalid_names_are_refused(address: str) -> None:
    """B-150: more than one '::', control characters, empty names."""
    h = Harness()
    with pytest.raises(ClientError):
        h.consumer(address)


def test_producer_to_wildcard_address_is_refused() -> None:
    """B-011 decision: sending to a wildcard address is amqp:invalid-field."""
    h = Harness()
    with pytest.raises(ClientError, match="wildcard"):
        h.producer("news.#")


def test_wildcard_subscription_receives_matching_addresses() -> None:
    """B-011: a queue on `news.#` gets messages sent to `news.eu.sport`."""
    h = Harness()
    c = h.consumer("news.#", "topic")
    h.send(h.producer("news.eu.sport", "topic"), b"goal")
    h.send(h.producer("weather", "topic"), b"rain")
    assert bodies(h.take(c)) == [b"goal"]


def test_auto_create_disabled_refuses_attach() -> None:
    """B-110: a missing address that may not be created -> amqp:not-found."""
    h = Harness({"#": AddressSettings.of(auto_create_addresses=False, auto_create_queues=False)})
    with pytest.raises(NotFound):
        h.producer("nope", "queue")
    with pytest.raises(NotFound):
        h.consumer("nope", "queue")


def test_capability_conflicting_with_address_is_illegal_state() -> None:
    """B-024: address exists without the requested type -> amqp:illegal-state."""
    h = Harness()
    h.producer("orders", "queue")
    with pytest.raises(IllegalState, match="topic support"):
        h.consumer("orders", "topic")


def test_queue_consumer_on_anycast_only_address_without_capability() -> None:
    """B-024 rule 2 / B-025: an ANYCAST address means a queue consumer."""
    h = Harness()
    h.send(h.producer("orders", "queue"), b"x")
    c = h.consumer("orders")
    assert bodies(h.take(c)) == [b"x"]


def test_anonymous_relay_routes_by_to() -> None:
    """B-009: address None -> properties.to per message; missing `to` is refused."""
    h = Harness()
    h.producer("orders", "queue")
    relay = h.producer(None)
    h.send(relay, b"x", to="orders")
    assert h.queue("orders").message_count == 1
    with pytest.raises(ClientError, match="no 'to'"):
        h.send(relay, b"y")


def test_anonymous_relay_to_missing_address_without_auto_create() -> None:
    """B-009: 'target address X does not exist' (the adapter answers `failed`)."""
    h = Harness({"#": AddressSettings.of(auto_create_addresses=False)})
    with pytest.raises(NotFound, match="target address ghost does not exist"):
        h.send(h.producer(None), to="ghost")


def test_an_fqqn_on_the_relay_reaches_only_a_queue_of_its_address() -> None:
    """B-006/B-154, third attack pass: with `send` on `alice.#` only, a relay message to
    `alice.x::bob.q` (alice.x existing) was put on `bob.q`, an address alice may not
    send to. Now the FQQN's queue must be on the address, as on a link's target."""
    from amqpbroker.core.security import SecurityRepository

    h = Harness()
    h.producer("alice.x", "queue")
    h.producer("bob.q", "queue")
    h.broker.security = SecurityRepository({"alice.#": {"send": ("alice",)}})
    relay = ProducerTarget(None, user="alice", roles=frozenset({"alice"}))
    with pytest.raises(NotFound, match=r"queue bob\.q does not exist for address alice\.x"):
        h.send(relay, b"injected", to="alice.x::bob.q")
    assert h.queue("bob.q").message_count == 0
    h.send(relay, b"mine", to="alice.x::alice.x")
    assert h.queue("alice.x").message_count == 1


def test_an_fqqn_link_sends_nothing_to_a_new_queue_of_that_name_elsewhere() -> None:
    """B-006, third attack pass: a link attached to `a::q` kept sending to whatever
    queue was named `q`, also one re-created on another address."""
    h = Harness()
    target = h.producer("a::q")
    h.send(target, b"1")
    h.broker.delete_queue("q")
    h.producer("b::q")
    h.send(target, b"2")
    assert h.queue("q").message_count == 0


# -- credit, order, browsing -------------------------------------------------------------


def test_no_dispatch_without_credit_then_drain() -> None:
    """B-037: send only with credit; drain with nothing to send answers drained."""
    h = Harness()
    c = h.consumer("q", "queue", credit=0)
    h.send(h.producer("q", "queue"))
    assert h.take(c) == []
    h.broker.set_credit(c, 5, drain=True)
    assert len(h.take(c)) == 1
    assert h.drained == [c]


def test_a_spent_write_window_stops_dispatch_until_resumed() -> None:
    """Issue 15, B-037: consumers sharing a connection's window get nothing more once it
    is spent, whatever their credit, and a drain waits; `resume` after the adapter
    refills it goes on in order, then answers the drain."""
    h = Harness()
    window = Window(250)
    first = h.consumer("a", "queue", credit=0, window=window)
    second = h.consumer("b", "queue", credit=0, window=window)
    for address in ("a", "b"):
        target = h.producer(address, "queue")
        for i in range(5):
            h.send(target, b"%s%d" % (address.encode(), i) + b"x" * 90)
    h.broker.set_credit(first, 100, drain=True)
    h.broker.set_credit(second, 100)
    got = h.take(first)
    assert bodies(got) == [b"a%d" % i + b"x" * 90 for i in range(len(got))]
    assert 0 < len(got) < 5
    assert h.take(second) == []
    assert h.drained == []
    assert window.room <= 0
    window.room = 10_000
    h.broker.resume(first)
    h.broker.resume(second)
    rest = h.take(first)
    assert bodies(got + rest) == [b"a%d" % i + b"x" * 90 for i in range(5)]
    assert len(h.take(second)) == 5
    assert h.drained == [first]


def test_priority_then_fifo() -> None:
    """B-013: higher priority first, FIFO within a priority."""
    h = Harness()
    target = h.producer("q", "queue")
    for body, prio in ((b"l1", 1), (b"h1", 9), (b"n1", 4), (b"h2", 9)):
        h.send(target, body, priority=prio)
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"h1", b"h2", b"n1", b"l1"]


def test_returned_message_keeps_its_place() -> None:
    """B-014: a released message is delivered before later arrivals."""
    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue", credit=1)
    h.send(target, b"first")
    h.send(target, b"second")
    [d] = h.take(c)
    h.settle(c, d, RELEASED)
    h.broker.set_credit(c, 0)
    h.broker.set_credit(c, 2)
    assert bodies(h.take(c)) == [b"first", b"second"]


def test_browser_does_not_acquire() -> None:
    """B-031: a browser sees messages; others still get them; counts unchanged."""
    h = Harness()
    target = h.producer("q", "queue")
    h.send(target, b"a")
    h.send(target, b"b")
    browser = h.consumer("q", "queue", browse=True)
    assert bodies(h.take(browser)) == [b"a", b"b"]
    assert all(d.settled for d in h.inbox[browser] or [])
    c = h.consumer("q", "queue")
    got = h.take(c)
    assert [(d.message.data, d.wire_count) for d in got] == [(b"a", 0), (b"b", 0)]


def test_presettled_consumer_acknowledges_on_send() -> None:
    """B-037: snd-settle-mode settled is at-most-once."""
    h = Harness()
    h.send(h.producer("q", "queue"))
    c = h.consumer("q", "queue", presettled=True)
    [d] = h.take(c)
    assert d.settled
    assert h.queue("q").message_count == 0


# -- the disposition table (B-051) --------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "next_wire_count"),
    [
        (RELEASED, 0),  # B-042
        (Modified(), 0),  # B-043
        (Modified(delivery_failed=True), 1),  # B-044
    ],
)
def test_return_outcomes_and_next_delivery_count(outcome: Outcome, next_wire_count: int) -> None:
    """B-051: released / modified keep or bump the wire delivery-count."""
    h = Harness()
    c, d = one_delivery(h)
    h.settle(c, d, outcome)
    [again] = h.take(c)
    assert again.wire_count == next_wire_count


@pytest.mark.parametrize("failed", [False, True])
def test_undeliverable_here_blocks_only_that_link(failed: bool) -> None:
    """B-045: never offered to that link again; another link gets it; not dead-lettered."""
    h = Harness()
    c, d = one_delivery(h)
    h.settle(c, d, Modified(delivery_failed=failed, undeliverable_here=True))
    assert h.take(c) == []
    assert h.queue("q").message_count == 1
    other = h.consumer("q", "queue")
    [again] = h.take(other)
    assert again.wire_count == (1 if failed else 0)


def test_released_forever_never_dead_letters() -> None:
    """B-042: releases alone can never reach max-delivery-attempts."""
    h = Harness({"#": AddressSettings.of(max_delivery_attempts=2, dead_letter_address="DLA")})
    c, d = one_delivery(h)
    for _ in range(10):
        h.settle(c, d, RELEASED)
        [d] = h.take(c)
    assert d.wire_count == 0


def test_delivery_failed_dead_letters_after_max_attempts() -> None:
    """B-060: wire counts 0..M-1, the M-th failure moves it to the DLA."""
    h = Harness({"#": AddressSettings.of(max_delivery_attempts=3, dead_letter_address="DLA")})
    h.broker.create_address("DLA", {RoutingType.ANYCAST})
    h.broker.create_queue(QueueConfig(name="DLA", address="DLA", routing_type=RoutingType.ANYCAST))
    c, d = one_delivery(h)
    seen = [d.wire_count]
    for _ in range(2):
        h.settle(c, d, Modified(delivery_failed=True))
        [d] = h.take(c)
        seen.append(d.wire_count)
    h.settle(c, d, Modified(delivery_failed=True))
    assert seen == [0, 1, 2]
    assert h.take(c) == []
    assert h.queue("q").message_count == 0
    assert h.queue("DLA").message_count == 1
    copy = h.queue("DLA").refs()[0].message
    assert copy.get_annotations()["x-opt-ORIG-QUEUE"] == "q"
    assert copy.get_annotations()["x-opt-DLQ-REASON"] == "max-attempts"


def test_rejected_dead_letters_at_once_even_with_unlimited_attempts() -> None:
    """B-046: rejected moves to the DLA immediately, whatever max-delivery-attempts."""
    h = Harness(
        {
            "#": AddressSettings.of(
                max_delivery_attempts=-1,
                dead_letter_address="DLA",
                auto_create_dead_letter_resources=True,
            )
        }
    )
    c, d = one_delivery(h)
    h.settle(c, d, Rejected(condition="app:bad", description="nope"))
    dlq = h.queue("DLQ.q")
    assert dlq.address == "DLA"
    assert dlq.routing_type is RoutingType.MULTICAST
    annotations = dlq.refs()[0].message.get_annotations()
    assert annotations["x-opt-DLQ-ERROR-CONDITION"] == "app:bad"
    assert annotations["x-opt-ORIG-ADDRESS"] == "q"
    assert h.queue("q").counters.killed == 1


def test_rejected_without_dla_drops() -> None:
    """B-046/B-071: no DLA -> the message is dropped and counted killed."""
    h = Harness()
    c, d = one_delivery(h)
    h.settle(c, d, Rejected())
    assert h.queue("q").message_count == 0
    assert h.queue("q").counters.killed == 1
    assert h.take(c) == []


def test_link_close_returns_uncounted_without_delay() -> None:
    """B-053: orderly detach undoes the count and never delays."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=10_000)})
    c, _ = one_delivery(h)
    h.broker.detach_consumer(c, closed=True)
    c2 = h.consumer("q", "queue")
    [d] = h.take(c2)
    assert d.wire_count == 0


def test_abrupt_connection_loss_counts_the_attempt_without_delay() -> None:
    """B-054: the loss counts as a failed attempt; no delay."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=10_000)})
    conn2 = ConnectionId(2)
    h.send(h.producer("q", "queue"))
    h.consumer("q", "queue", conn=conn2)
    h.broker.connection_closed(conn2, abrupt=True)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    assert d.wire_count == 1


def test_outcome_for_a_delivery_no_longer_held_is_ignored() -> None:
    """B-055: ignored, never an error."""
    h = Harness()
    c, d = one_delivery(h)
    h.settle(c, d, ACCEPTED)
    h.broker.settle(c, DeliveryId(d.delivery), ACCEPTED)
    h.broker.settle(ConsumerId(999), DeliveryId(1), ACCEPTED)
    assert h.queue("q").counters.acknowledged == 1


# -- redelivery delay (B-065) ------------------------------------------------------------


def test_only_the_failed_message_waits() -> None:
    """B-065: the failed message is scheduled; other messages keep flowing."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=1000)})
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue", credit=1)
    h.send(target, b"bad")
    h.send(target, b"good")
    [bad] = h.take(c)
    h.settle(c, bad, Modified(delivery_failed=True))
    assert h.queue("q").scheduled_count == 1
    h.broker.set_credit(c, 10)
    assert bodies(h.take(c)) == [b"good"]
    h.advance(999)
    assert h.take(c) == []
    h.advance(1)
    [again] = h.take(c)
    assert (again.message.data, again.wire_count) == (b"bad", 1)


def test_release_is_delayed_too() -> None:
    """B-065: released messages are delayed, computed with the decremented count."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=500)})
    c, d = one_delivery(h)
    h.settle(c, d, RELEASED)
    assert h.broker.next_deadline_ms() == h.clock.now_ms() + 500
    h.advance(500)
    assert len(h.take(c)) == 1


# -- subscriptions and temporaries -------------------------------------------------------


def test_durable_subscription_keeps_messages_across_detach() -> None:
    """B-026/B-027/B-028: `container.link`; detach keeps it; close unsubscribes."""
    h = Harness()
    sub = h.consumer(
        "news", "topic", container="app", name="sub1", durable=True, expiry_policy="never"
    )
    assert "app.sub1" in h.broker.queues
    h.broker.detach_consumer(sub, closed=False)
    h.send(h.producer("news", "topic"), b"while-away")
    again = h.consumer(
        "news", "topic", container="app", name="sub1", durable=True, expiry_policy="never"
    )
    assert bodies(h.take(again)) == [b"while-away"]
    h.broker.detach_consumer(again, closed=True)
    assert "app.sub1" not in h.broker.queues


def test_durable_subscription_with_new_filter_is_recreated_when_idle() -> None:
    """B-027: a different filter and no consumers -> re-created empty."""
    h = Harness()
    sub = h.consumer("news", "topic", container="app", name="s", durable=True)
    h.broker.detach_consumer(sub, closed=False)
    h.send(h.producer("news", "topic"), b"old")
    h.consumer("news", "topic", container="app", name="s", durable=True, selector="x = 1")
    assert h.queue("app.s").message_count == 0


def test_durable_subscription_in_use_cannot_change() -> None:
    """B-027: with consumers attached -> amqp:illegal-state."""
    h = Harness()
    h.consumer("news", "topic", "shared", container="app", name="s", durable=True)
    with pytest.raises(IllegalState, match="consumers already exist"):
        h.consumer(
            "news", "topic", "shared", container="app", name="s", durable=True, selector="x = 2"
        )


def test_private_volatile_subscription_dies_with_connection() -> None:
    """B-026/B-028/B-115: a temporary queue deleted when its connection closes."""
    h = Harness()
    conn2 = ConnectionId(2)
    h.consumer("news", "topic", conn=conn2, expiry_policy="never")
    temporary = [q for q in h.broker.queues.values() if q.config.temporary]
    assert len(temporary) == 1
    h.broker.connection_closed(conn2, abrupt=False)
    assert temporary[0].name not in h.broker.queues


def test_dynamic_source_is_a_temporary_anycast_queue() -> None:
    """B-030: random name returned as the address; gone with the connection."""
    h = Harness()
    conn2 = ConnectionId(2)
    attached = h.broker.attach_consumer(
        ConsumerRequest(
            connection=conn2, container_id="c", link_name="r", address=None, dynamic=True
        )
    )
    queue = h.queue(attached.queue)
    assert attached.address == attached.queue
    assert queue.routing_type is RoutingType.ANYCAST
    assert not queue.durable
    h.broker.connection_closed(conn2, abrupt=False)
    assert attached.queue not in h.broker.queues
    assert attached.queue not in h.broker.post_office.addresses


def test_source_without_address_is_invalid() -> None:
    """B-038: no address and not dynamic -> amqp:invalid-field."""
    h = Harness()
    with pytest.raises(ClientError, match="no address"):
        h.consumer(None)


def test_deleting_a_queue_detaches_its_consumers() -> None:
    """B-038: amqp:resource-deleted to attached consumers."""
    h = Harness()
    c = h.consumer("q", "queue")
    h.broker.delete_queue("q")
    h._collect()
    assert [(e.consumer, e.condition) for e in h.closed] == [(c, "amqp:resource-deleted")]


# -- auto-delete (B-111…B-114) -----------------------------------------------------------


def test_used_auto_created_queue_is_reaped_after_two_scans() -> None:
    """B-111/B-113: qualifies on two consecutive scans, then deleted."""
    h = Harness(address_queue_scan_period_ms=1000)
    c = h.consumer("q", "queue")
    h.broker.detach_consumer(c, closed=True)
    h.advance(1000)
    assert "q" in h.broker.queues  # first scan only marks it
    h.advance(1000)
    assert "q" not in h.broker.queues
    h.advance(1000)
    h.advance(1000)
    assert "q" not in h.broker.post_office.addresses  # B-114: binding removed -> used


def test_unused_auto_created_queue_is_kept() -> None:
    """B-113: a queue nobody consumed from is kept."""
    h = Harness(address_queue_scan_period_ms=1000)
    h.producer("q", "queue")
    for _ in range(3):
        h.advance(1000)
    assert "q" in h.broker.queues


def test_queue_with_messages_is_kept() -> None:
    """B-113: message count above auto-delete-queues-message-count (0)."""
    h = Harness(address_queue_scan_period_ms=1000)
    h.send(h.producer("q", "queue"))
    c = h.consumer("q", "queue", credit=0)
    h.broker.detach_consumer(c, closed=True)
    for _ in range(3):
        h.advance(1000)
    assert "q" in h.broker.queues


# -- lifecycle events (B-170/B-171) ------------------------------------------------------


def _events(h: Harness) -> list[tuple[str, str | None, str | None]]:
    return [(e.event, e.queue, e.reason) for e in h.broker.emitter.take()]


def test_lifecycle_of_an_accepted_message() -> None:
    """B-171: sent, enqueued, dispatched, acked, in order, with the container and link."""
    h = Harness()
    c = h.consumer("q", "queue", container="app", name="r1")
    h.broker.emitter.take()
    h.send(h.producer("q", "queue"))
    [d] = h.take(c)
    h.settle(c, d, ACCEPTED)
    events = h.broker.emitter.take()
    assert [(e.event, e.reason) for e in events] == [
        ("sent", None),
        ("enqueued", "route"),
        ("dispatched", None),
        ("acked", "accepted"),
    ]
    assert (events[2].connection, events[2].link, events[2].delivery_count) == ("app", "r1", 1)
    assert events[0].target_queues == ("q",)


def test_lifecycle_of_a_dead_letter() -> None:
    """B-171: returned (modified-failed), then dead-lettered with the copy's id, then the
    copy's enqueued on the DLQ (reason move)."""
    h = Harness(
        {
            "#": AddressSettings.of(
                max_delivery_attempts=2,
                dead_letter_address="DLA",
                auto_create_dead_letter_resources=True,
            )
        }
    )
    c, d = one_delivery(h)
    h.settle(c, d, Modified(delivery_failed=True))
    [d] = h.take(c)
    h.broker.emitter.take()
    h.settle(c, d, Modified(delivery_failed=True))
    events = h.broker.emitter.take()
    assert [(e.event, e.queue, e.reason) for e in events] == [
        ("dead-lettered", "q", "max-attempts"),
        ("enqueued", "DLQ.q", "move"),
    ]
    assert events[0].copy_msg_id == events[1].msg_id
    assert events[0].target_address == "DLA"


def test_failures_level_builds_only_failure_events() -> None:
    """B-170: level `failures` -> returned/dead-lettered/killed/unrouted only."""
    from amqpbroker.core import EventLevel

    h = Harness(event_level=EventLevel.FAILURES)
    c, d = one_delivery(h)
    h.settle(c, d, RELEASED)
    h.send(h.producer("nowhere"))
    assert [e[0] for e in _events(h)] == ["returned", "unrouted"]


def test_connection_loss_event_reason() -> None:
    """B-171: returned with reason connection-lost on an abrupt loss."""
    h = Harness()
    conn2 = ConnectionId(2)
    h.send(h.producer("q", "queue"))
    h.consumer("q", "queue", conn=conn2)
    h.broker.emitter.take()
    h.broker.connection_closed(conn2, abrupt=True)
    assert ("returned", "q", "connection-lost") in _events(h)


# -- address full (B-151) ----------------------------------------------------------------


def test_address_full_fail_refuses_with_resource_limit() -> None:
    """B-151 FAIL: each new transfer -> amqp:resource-limit-exceeded."""
    from amqpbroker.core import ResourceLimitExceeded

    h = Harness({"#": AddressSettings.of(max_size_bytes=3, address_full_policy="FAIL")})
    target = h.producer("q", "queue")
    h.send(target, b"abcd")
    with pytest.raises(ResourceLimitExceeded, match="full"):
        h.send(target, b"x")
    assert h.queue("q").message_count == 1


def test_address_full_drop_discards_silently() -> None:
    """B-151 DROP: discarded; the producer still gets accepted; counted unrouted."""
    h = Harness({"#": AddressSettings.of(max_size_bytes=3, address_full_policy="DROP")})
    target = h.producer("q", "queue")
    h.send(target, b"abcd")
    h.send(target, b"x")
    assert h.queue("q").message_count == 1
    assert h.broker.post_office.addresses["q"].unrouted == 1


def test_address_full_block_withholds_credit_until_it_drains() -> None:
    """B-151 BLOCK: producers get no credit while full; room again -> AddressUnblocked."""
    from amqpbroker.core import AddressUnblocked

    h = Harness({"#": AddressSettings.of(max_size_bytes=3, address_full_policy="BLOCK")})
    target = h.producer("q", "queue")
    h.send(target, b"abcd")
    h.send(target, b"e")
    assert not h.broker.producer_may_send(target)
    c = h.consumer("q", "queue")
    dispatched = h.broker.take_effects() or []
    for d in h.take(c):
        h.broker.settle(c, d.delivery, ACCEPTED)
    assert any(isinstance(e, AddressUnblocked) for e in h.broker.take_effects() + dispatched)
    assert h.broker.producer_may_send(target)


def test_block_refuses_past_the_reject_threshold() -> None:
    """B-151 BLOCK with max-size-bytes-reject-threshold: a producer that still has credit
    is let in up to the threshold, then refused as under FAIL until the address drains."""
    from amqpbroker.core import ResourceLimitExceeded

    settings = AddressSettings.of(
        max_size_bytes=3, address_full_policy="BLOCK", max_size_bytes_reject_threshold=5
    )
    h = Harness({"#": settings})
    target = h.producer("q", "queue")
    h.send(target, b"abcd")
    h.send(target, b"ef")  # full (blocked), not yet over the threshold: let in
    assert not h.broker.producer_may_send(target)
    with pytest.raises(ResourceLimitExceeded, match="max-size-bytes-reject-threshold=5"):
        h.send(target, b"g")
    assert h.queue("q").message_count == 2


def test_reject_threshold_applies_to_block_only() -> None:
    """Artemis isRejectingMessages: the threshold means nothing under another policy."""
    settings = AddressSettings.of(address_full_policy="DROP", max_size_bytes_reject_threshold=1)
    h = Harness({"#": settings})
    target = h.producer("q", "queue")
    for body in (b"abc", b"def"):
        h.send(target, body)
    assert h.queue("q").message_count == 2


# -- consumer priority (B-035) and no-local (B-034) -------------------------------------


def test_higher_priority_consumers_are_served_first() -> None:
    """B-035: the highest-priority consumers with credit get messages, round-robin among
    equals; a lower priority only when no higher one can take it."""
    h = Harness()
    target = h.producer("q", "queue")
    low = h.consumer("q", "queue", priority=1)
    high_a = h.consumer("q", "queue", priority=5)
    high_b = h.consumer("q", "queue", priority=5)
    for i in range(4):
        h.send(target, b"%d" % i)
    assert bodies(h.take(high_a)) == [b"0", b"2"]
    assert bodies(h.take(high_b)) == [b"1", b"3"]
    assert h.take(low) == []
    h.broker.set_credit(high_a, 0)
    h.broker.set_credit(high_b, 0)
    h.send(target, b"4")
    assert bodies(h.take(low)) == [b"4"]


def test_consumer_priority_from_the_address_parameter() -> None:
    """B-035/B-036: `?consumer-priority=N` sets it; the attach property wins."""
    h = Harness()
    target = h.producer("q", "queue")
    by_param = h.consumer("q?consumer-priority=9", "queue")
    h.consumer("q", "queue", priority=3)
    h.send(target, b"x")
    assert bodies(h.take(by_param)) == [b"x"]


def test_no_local_subscription_skips_its_own_messages() -> None:
    """B-034: a no-local subscription does not receive what its own container sent."""
    h = Harness()
    sub = h.consumer("chat", "topic", container="me", no_local=True)
    target = h.producer("chat", "topic")
    for origin in ("me", "you"):
        message = Message(
            origin.encode(),
            annotations={},
            properties={},
            application_properties={},
            origin_container=origin,
        )
        h.broker.publish(message, target)
    assert bodies(h.take(sub)) == [b"you"]


def test_no_local_is_ignored_on_queue_consumers() -> None:
    """B-034: honoured only on subscriptions."""
    h = Harness()
    attached = h.broker.attach_consumer(
        ConsumerRequest(
            connection=CONN,
            container_id="me",
            link_name="l",
            address="q",
            capabilities=("queue",),
            no_local=True,
        )
    )
    assert attached.no_local is False


# -- authorization in the core (B-154) ---------------------------------------------------


def _secured(**grants: tuple[str, ...]) -> Harness:
    from amqpbroker.core.security import SecurityRepository

    h = Harness()
    h.broker.security = SecurityRepository(
        {"#": {k.replace("_", "-"): v for k, v in grants.items()}}
    )
    return h


def _consumer_as(
    h: Harness, address: str | None, roles: frozenset[str], **kw: object
) -> ConsumerId:
    attached = h.broker.attach_consumer(
        ConsumerRequest(
            connection=CONN,
            container_id="c",
            link_name=f"l-{address}",
            address=address,
            user="u",
            roles=roles,
            **kw,
        )
    )  # type: ignore[arg-type]
    return attached.consumer


def test_browse_needs_browse_not_consume() -> None:
    """B-154: a browser needs `browse`; `consume` alone is not enough."""
    from amqpbroker.core import NotAuthorized

    h = _secured(consume=("c",), create_address=("c",), create_durable_queue=("c",))
    h.producer("q", "queue")
    with pytest.raises(NotAuthorized, match="'browse'"):
        _consumer_as(h, "q", frozenset({"c"}), capabilities=("queue",), browse=True)
    _consumer_as(h, "q", frozenset({"c"}), capabilities=("queue",))


def test_dynamic_node_needs_create_non_durable_queue() -> None:
    from amqpbroker.core import NotAuthorized

    h = _secured(consume=("c",))
    with pytest.raises(NotAuthorized, match="'create-non-durable-queue'"):
        _consumer_as(h, None, frozenset({"c"}), dynamic=True)


def test_unsubscribe_needs_delete_durable_queue() -> None:
    """B-154: closing a durable subscription deletes its queue only with the permission."""
    h = _secured(consume=("c",), create_address=("c",), create_durable_queue=("c",))
    sub = _consumer_as(h, "news", frozenset({"c"}), capabilities=("topic",), durable=True)
    h.broker.detach_consumer(sub, closed=True)
    assert "c.l-news" in h.broker.queues
    h2 = _secured(
        consume=("c",),
        create_address=("c",),
        create_durable_queue=("c",),
        delete_durable_queue=("c",),
    )
    sub = _consumer_as(h2, "news", frozenset({"c"}), capabilities=("topic",), durable=True)
    h2.broker.detach_consumer(sub, closed=True)
    assert "c.l-news" not in h2.broker.queues


def test_reusing_a_subscription_name_needs_delete_on_the_old_address() -> None:
    """B-154, third attack pass: `bob`'s idle durable subscription `c1.sub` on `bob.t`
    was deleted, messages and all, when `alice` attached container c1, link `sub` to
    `alice.t` (the re-create checked only consume on her own address). Now the re-create
    needs delete-durable-queue on the old address, as Artemis's deleteQueue does."""
    from amqpbroker.core import NotAuthorized
    from amqpbroker.core.security import SecurityRepository

    h = Harness()
    mine = ("send", "consume", "create-address", "create-durable-queue")
    h.broker.security = SecurityRepository(
        {f"{u}.#": {p: (u,) for p in mine} for u in ("alice", "bob")}
    )

    def subscribe(user: str, address: str) -> ConsumerId:
        return h.consumer(
            address,
            "topic",
            container="c1",
            name="sub",
            durable=True,
            expiry_policy="never",
            user=user,
            roles=frozenset({user}),
        )

    h.broker.detach_consumer(subscribe("bob", "bob.t"), closed=False)
    h.send(h.producer("bob.t", "topic"), b"bob's")
    with pytest.raises(NotAuthorized, match="'delete-durable-queue'"):
        subscribe("alice", "alice.t")
    assert h.queue("c1.sub").address == "bob.t"
    assert h.queue("c1.sub").message_count == 1
    bob_again = subscribe("bob", "bob.t")
    assert bodies(h.take(bob_again)) == [b"bob's"]


def test_scheduled_message_waits_until_its_time() -> None:
    """B-015: counted as scheduled, deliverable at its time; others flow meanwhile."""
    h = Harness()
    target = h.producer("q", "queue")
    later = Message(
        b"later",
        annotations={},
        properties={},
        application_properties={},
        deliver_at_ms=h.clock.now_ms() + 1000,
    )
    h.broker.publish(later, target)
    h.send(target, b"now")
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"now"]
    assert h.queue("q").scheduled_count == 1
    h.advance(999)
    assert h.take(c) == []
    h.advance(1)
    assert bodies(h.take(c)) == [b"later"]


def test_duplicate_id_is_not_routed_twice_while_cached() -> None:
    """B-012: a later message with the same _AMQ_DUPL_ID on the same address is not
    routed (the producer still gets accepted); the cache holds the last id-cache-size."""
    h = Harness(id_cache_size=2)
    target = h.producer("q", "queue")

    def send(dup: str) -> int:
        message = Message(
            dup.encode(),
            annotations={},
            properties={},
            application_properties={"_AMQ_DUPL_ID": dup},
        )
        return h.broker.publish(message, target, duplicate_id=dup)

    assert [send(d) for d in ("a", "b", "a")] == [1, 1, 0]
    assert h.broker.post_office.addresses["q"].unrouted == 1
    send("c")  # the cache (2 ids) drops "a"
    assert send("a") == 1


def test_anycast_consumer_on_hash_does_not_steal_from_queues() -> None:
    """Issue 15 / B-011 decision: with security off, a `queue` consumer on `#` auto-creates
    an ANYCAST queue `#`; it must not compete with `orders` (it took the odd messages)."""
    h = Harness()
    thief = h.consumer("#", "queue")
    target = h.producer("orders", "queue")
    for i in range(10):
        h.send(target, b"%d" % i)
    assert h.take(thief) == []
    assert h.queue("orders").message_count == 10
    assert h.queue("#").message_count == 0


@pytest.mark.parametrize(
    ("subscription", "address"), [("#", "orders"), ("news.#", "news.eu"), ("news.*", "news.eu")]
)
def test_wildcard_subscription_still_gets_a_copy_beside_queues(
    subscription: str, address: str
) -> None:
    """B-011: a MULTICAST subscription on a wildcard address still receives what is sent
    (without a routing type) to a matching address, beside that address's own queue."""
    h = Harness()
    sub = h.consumer(subscription, "topic")
    h.producer(address, "queue")  # creates the ANYCAST queue of the address
    h.send(h.producer(address), b"x")
    assert bodies(h.take(sub)) == [b"x"]
    assert h.queue(address).message_count == 1


def test_enable_ingress_timestamp_annotates_at_publish() -> None:
    """B-018 (d): with enable-ingress-timestamp, x-opt-ingress-time = when the broker
    took the message; without it the message is not touched."""
    h = Harness({"stamped.#": AddressSettings.of(enable_ingress_timestamp=True)})
    h.clock.advance(5_000)
    stamped = h.send(h.producer("stamped.q", "queue"))
    plain = h.send(h.producer("plain", "queue"))
    assert stamped.get_annotations()["x-opt-ingress-time"] == h.clock.now_ms()
    assert "x-opt-ingress-time" not in plain.get_annotations()
