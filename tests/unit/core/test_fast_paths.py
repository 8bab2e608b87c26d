"""The core's per-message shortcuts (issue 20) keep the behaviour of the general path:
the highest non-empty priority level (B-013, B-014, B-161 changeMessagesPriority), the
hand-over of an arrival to a queue's only consumer (B-003 rotation, B-031 browsers, the
memory of removed references), and the routing of filtered and purge-on-no-consumers
queues (B-002, B-126); the return leg of a redelivery (issue 20): the `returned` event
(B-171) and the address-settings a queue keeps between changes (B-102, B-060, B-065)."""

from __future__ import annotations

import pytest
from support.core_harness import Harness, bodies

from amqpbroker.core import (
    ACCEPTED,
    FAILED,
    RELEASED,
    AddressSettings,
    LifecycleEvent,
    Message,
    Modified,
    QueueConfig,
    RawEvent,
    RoutingType,
)
from amqpbroker.core.errors import ResourceLimitExceeded
from amqpbroker.core.operations import change_priority
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.queue import DeliveryIds
from amqpbroker.core.refs import Ref
from amqpbroker.store.journal import MemoryJournal


def test_a_released_high_priority_message_goes_before_a_waiting_lower_one() -> None:
    """B-013/B-014: dispatch had last found work at level 4; a priority-9 message coming
    back must still be the next one out (the level hint rises with the return)."""
    h = Harness()
    target = h.producer("q", "queue")
    h.send(target, b"h", priority=9)
    h.send(target, b"n1", priority=4)
    h.send(target, b"n2", priority=4)
    c = h.consumer("q", "queue", credit=2)
    first, second = h.take(c)
    assert bodies([first, second]) == [b"h", b"n1"]
    h.settle(c, first, RELEASED)
    h.broker.set_credit(c, 1)
    assert bodies(h.take(c)) == [b"h"]


def test_a_message_raised_to_a_higher_priority_is_delivered_first() -> None:
    """B-161 changeMessagesPriority to a level above every waiting message: it is found
    (the level hint rises with the change), not stranded."""
    h = Harness()
    target = h.producer("q", "queue")
    h.send(target, b"a", priority=1, props={"k": "a"})
    h.send(target, b"b", priority=1)
    assert change_priority(h.broker, "q", selector="k = 'a'", priority=9) == 1
    c = h.consumer("q", "queue")
    got = h.take(c)
    assert bodies(got) == [b"a", b"b"]
    assert [d.message.priority for d in got] == [9, 1]


def test_the_rotation_continues_after_a_hand_over() -> None:
    """B-003 round-robin: a message handed straight to a lone consumer moves the rotation
    past it, as dispatch does, so a second consumer gets the next message."""
    h = Harness()
    target = h.producer("q", "queue")
    first = h.consumer("q", "queue")
    h.send(target, b"0")
    assert bodies(h.take(first)) == [b"0"]
    second = h.consumer("q", "queue")
    for body in (b"1", b"2", b"3"):
        h.send(target, body)
    assert bodies(h.take(second)) == [b"1", b"3"]
    assert bodies(h.take(first)) == [b"2"]


def test_a_lone_browser_is_not_handed_the_message() -> None:
    """B-031: a browser alone on the queue sees an arrival without acquiring it."""
    h = Harness()
    target = h.producer("q", "queue")
    browser = h.consumer("q", "queue", browse=True)
    h.send(target, b"a")
    [seen] = h.take(browser)
    assert seen.settled
    assert h.queue("q").message_count == 1
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, ACCEPTED)
    assert h.queue("q").message_count == 0


def test_expired_references_do_not_outlive_the_next_arrival() -> None:
    """Messages the expiry scan removed (B-084) are left in place for dispatch to drop;
    an arrival handed to a consumer must not leave them holding their bodies' memory."""
    h = Harness()
    target = h.producer("q", "queue")
    for i in range(3):
        h.send(target, b"old-%d" % i + b"x" * 1000, ttl_ms=10)
    h.advance(30_000)  # the periodic scan: expired, removed lazily
    queue = h.queue("q")
    assert queue.message_count == 0
    c = h.consumer("q", "queue")
    h.send(target, b"new")
    assert bodies(h.take(c)) == [b"new"]
    assert [ref for level in queue._fresh for ref in level] == []


def test_filtered_and_purging_queues_are_still_skipped_by_routing() -> None:
    """B-002 filters and B-126 purge-on-no-consumers on the multicast route."""
    h = Harness()
    h.broker.create_address("t", {RoutingType.MULTICAST})
    for name, extra in (
        ("all", {}),
        ("red", {"filter": "colour = 'red'"}),
        ("purging", {"purge_on_no_consumers": True}),
    ):
        h.broker.create_queue(
            QueueConfig(name=name, address="t", routing_type=RoutingType.MULTICAST, **extra)
        )
    target = h.producer("t", "topic")
    h.send(target, b"blue", props={"colour": "blue"})
    h.send(target, b"red", props={"colour": "red"})
    assert [h.queue(n).message_count for n in ("all", "red", "purging")] == [2, 1, 0]


def test_a_returned_message_goes_straight_back_with_its_counts() -> None:
    """B-042/B-044/B-050: released (count undone) and modified{delivery-failed} (counted)
    come back to the lone consumer at once, with the wire count dispatch would give."""
    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    h.send(target, b"m")
    [d] = h.take(c)
    h.settle(c, d, RELEASED)
    [again] = h.take(c)
    assert (again.message.data, again.wire_count) == (b"m", 0)
    h.settle(c, again, Modified(delivery_failed=True))
    [third] = h.take(c)
    assert third.wire_count == 1
    h.settle(c, third, ACCEPTED)
    assert h.queue("q").message_count == 0


def test_a_message_modified_undeliverable_here_is_not_handed_back() -> None:
    """B-045: modified{undeliverable-here} blocks the message for that link; a lone
    consumer does not get it back, another consumer does."""
    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    h.send(target, b"m")
    [d] = h.take(c)
    h.settle(c, d, Modified(undeliverable_here=True))
    assert h.take(c) == []
    other = h.consumer("q", "queue")
    assert bodies(h.take(other)) == [b"m"]


def test_the_shared_failed_outcome_counts_the_attempt_as_any_failed_modified() -> None:
    """B-044/B-045 (issue 20): `Queue.settle` takes the shared `FAILED` (what the adapter
    hands over for modified{delivery-failed}) without reading its fields; it counts the
    attempt and blocks nothing, exactly as an equal `Modified` built elsewhere, while
    delivery-failed with undeliverable-here still blocks the link."""
    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    h.send(target, b"m")
    for outcome in (FAILED, Modified(delivery_failed=True)):
        [d] = h.take(c)
        h.settle(c, d, outcome)
    [d] = h.take(c)
    assert d.wire_count == 2
    h.settle(c, d, Modified(delivery_failed=True, undeliverable_here=True))
    assert h.take(c) == []
    other = h.consumer("q", "queue")
    [last] = h.take(other)
    assert last.wire_count == 3


def test_a_fan_out_sent_event_names_the_queues_each_message_reached() -> None:
    """B-170/B-171 `sent` target_queues: the event of a message routed to the same queues
    as the one before shares its field; a subscription added or filtered out between
    two messages shows in the next event."""
    h = Harness()
    h.broker.create_address("t", {RoutingType.MULTICAST})
    for name, extra in (("a", {}), ("b", {}), ("red", {"filter": "colour = 'red'"})):
        h.broker.create_queue(
            QueueConfig(name=name, address="t", routing_type=RoutingType.MULTICAST, **extra)
        )
    target = h.producer("t", "topic")

    def sent(**props: str) -> tuple[str, ...] | None:
        h.broker.emitter.take()
        h.send(target, props=props)
        [event] = [e for e in h.broker.emitter.take() if e.event == "sent"]
        return event.target_queues

    assert sent(colour="red") == ("a", "b", "red")
    assert sent(colour="blue") == ("a", "b")
    assert sent(colour="blue") == ("a", "b")
    h.broker.create_queue(QueueConfig(name="c", address="t", routing_type=RoutingType.MULTICAST))
    assert sent(colour="blue") == ("a", "b", "c")
    h.broker.delete_queue("a")
    assert sent(colour="red") == ("b", "red", "c")


def test_messages_restored_in_bulk_are_found_at_every_priority() -> None:
    """Recovery's bulk restore (issue 23) fills the priority levels directly: the level
    hint must cover them, highest first (B-013)."""
    h = Harness()
    h.producer("q", "queue")
    queue = h.queue("q")
    queue.restore_many(
        [(Message(b"n", msg_id=1, priority=4), 0, 0), (Message(b"h", msg_id=2, priority=9), 0, 0)]
    )
    c = h.consumer("q", "queue")
    assert bodies(h.take(c)) == [b"h", b"n"]


def _returned_by_the_general_path(h: Harness, event: LifecycleEvent) -> RawEvent:
    """The `returned` event `Queue.event` records for the same return (the slow path)."""
    queue = h.queue(event.queue)
    consumer = next(iter(h.broker._consumers.values())).consumer
    ref = Ref(next(r for r in queue.iter_refs() if r.message.msg_id == event.msg_id).message, 0)
    ref.delivery_count = event.delivery_count or 0
    h.broker.moment.ms = event.ts
    queue.event("returned", ref, consumer, reason=event.reason, delay_ms=event.delay_ms)
    [raw] = h.broker.emitter.take_raw()
    return raw


def test_a_return_records_the_returned_event_of_the_general_path() -> None:
    """B-171 `returned`, issue 20: the shape a consumer keeps per reason and the shared
    `extra` of a return without delay give the very event `Queue.event` builds, with
    and without a redelivery delay, for each reason; a shape is built once per
    consumer and reason (the fast path is taken)."""
    h = Harness({"q": AddressSettings.of(redelivery_delay=0)})
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    h.send(target, b"m")
    h.broker.emitter.take()
    recorded = []
    for outcome in (RELEASED, Modified(), Modified(delivery_failed=True), RELEASED):
        [d] = h.take(c)
        h.settle(c, d, outcome)
        [returned] = [e for e in h.broker.emitter.take_raw() if e[0][0] == "returned"]
        recorded.append(returned)
    reasons = [raw[0][3] for raw in recorded]
    assert reasons == ["released", "modified", "modified-failed", "released"]
    kept = next(iter(h.broker._consumers.values())).consumer.event_returned
    # The kept shape, not one built per return (from the second return of a reason on:
    # compiled, the first one's tuple is boxed apart from the one the consumer keeps).
    assert recorded[3][0] is kept["released"]
    assert recorded[0][4] is recorded[1][4]  # the shared extra of a return at once
    h.broker.settings.add("q", AddressSettings.of(redelivery_delay=500))
    [d] = h.take(c)
    h.settle(c, d, Modified(delivery_failed=True))
    [delayed] = [e for e in h.broker.emitter.take_raw() if e[0][0] == "returned"]
    for raw in (*recorded, delayed):
        assert raw == _returned_by_the_general_path(h, LifecycleEvent.of(raw))
    assert LifecycleEvent.of(delayed).delay_ms == 500


def test_a_returned_event_in_a_transaction_carries_it() -> None:
    """B-170 `txn`: a return while a transaction is carried out (B-143 rollback) takes
    the general path, which names the transaction; the kept shapes do not leak it."""
    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    h.send(target, b"m")
    [d] = h.take(c)
    h.broker.emitter.txn = "ab12"
    try:
        h.broker.rollback_delivery(c, d.delivery)
    finally:
        h.broker.emitter.txn = None
    [event] = [e for e in h.broker.emitter.take() if e.event == "returned"]
    assert (event.txn, event.reason) == ("ab12", "tx-rollback")
    [d] = h.take(c)
    h.settle(c, d, RELEASED)
    [event] = [e for e in h.broker.emitter.take() if e.event == "returned"]
    assert (event.txn, event.reason, event.delay_ms) == (None, "released", 0)


def test_a_settings_change_reaches_the_next_return() -> None:
    """B-102 (a change takes effect on the next lookup) over the settings a queue keeps
    for its returns (issue 20): max-delivery-attempts lowered between two failed
    attempts dead-letters the message at the next one (B-060), and a redelivery delay
    set meanwhile delays it (B-065)."""
    h = Harness({"DLQ": AddressSettings.of()})
    h.broker.create_address("DLQ", {RoutingType.ANYCAST})
    h.broker.create_queue(QueueConfig(name="DLQ", address="DLQ", routing_type=RoutingType.ANYCAST))
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue")
    h.send(target, b"m")
    [d] = h.take(c)
    h.settle(c, d, Modified(delivery_failed=True))  # attempt 1 of 10 (the default)
    [d] = h.take(c)
    h.broker.settings.add("q", AddressSettings.of(redelivery_delay=1000))
    h.settle(c, d, Modified(delivery_failed=True))
    assert h.take(c) == []  # delayed by the new setting
    assert h.queue("q").scheduled_count == 1
    h.advance(1000)
    [d] = h.take(c)
    h.broker.settings.add(
        "q", AddressSettings.of(max_delivery_attempts=3, dead_letter_address="DLQ")
    )
    h.settle(c, d, Modified(delivery_failed=True))  # attempt 3 of 3
    assert h.take(c) == []
    assert h.queue("q").message_count == 0
    assert h.queue("DLQ").message_count == 1


def test_the_hot_view_follows_the_brokers_swapped_and_enabled_state() -> None:
    """Issue 20 (`core.broker.Hot`): the per-message paths read the broker's collaborators
    from one native object. A dispatch after `take_effects` swapped the list must reach
    the next take (B-001), and the journal `enable_persistence` sets must be the one a
    publish reads: a durable send is refused while it has failed (B-095)."""
    h = Harness()
    target = h.producer("q", "queue")
    c = h.consumer("q", "queue", credit=2)
    h.broker.take_effects()  # swaps the list the per-message paths append to
    h.send(target, b"a")
    assert bodies(h.take(c)) == [b"a"]
    persistence = Persistence(MemoryJournal())
    h.broker.enable_persistence(persistence)
    persistence.refusing = OSError("disk full")
    with pytest.raises(ResourceLimitExceeded, match="disk full"):
        h.send(target, b"b", durable=True)
    h.send(target, b"c")  # not durable: routed
    assert bodies(h.take(c)) == [b"c"]


def test_returned_messages_come_back_in_queue_order_through_the_heap_shortcuts() -> None:
    """B-014 (issue 20): a return to an empty returned heap is an append and the last one
    out is a list pop; returned in any order, messages come back in their queue order,
    ahead of a later arrival, and each delivery has a new id."""
    h = Harness()
    target = h.producer("q", "queue")
    for body in (b"1", b"2", b"3"):
        h.send(target, body)
    c = h.consumer("q", "queue", credit=3)
    one, two, three = h.take(c)
    h.settle(c, two, RELEASED)  # the append into the empty heap
    h.settle(c, three, RELEASED)
    h.settle(c, one, RELEASED)
    h.send(target, b"4")
    h.broker.set_credit(c, 4)
    again = h.take(c)
    assert bodies(again) == [b"1", b"2", b"3", b"4"]
    ids = [d.delivery for d in (one, two, three, *again)]
    assert len(set(ids)) == len(ids)


def test_queues_share_one_sequence_of_delivery_ids() -> None:
    """The broker's queues draw their delivery ids from one `DeliveryIds` (issue 20): two
    queues' deliveries never share an id, and the ids rise."""
    h = Harness()
    a, b = h.producer("a", "queue"), h.producer("b", "queue")
    ca, cb = h.consumer("a", "queue"), h.consumer("b", "queue")
    for i in range(3):
        h.send(a, b"a%d" % i)
        h.send(b, b"b%d" % i)
    ids = [d.delivery for d in h.take(ca) + h.take(cb)]
    assert len(set(ids)) == 6
    assert sorted(ids[:3]) == ids[:3]
    assert sorted(ids[3:]) == ids[3:]


def test_delivery_ids_count_up_from_the_first() -> None:
    """`DeliveryIds.take`: first, first + 1, ... (the adapter keys unsettled deliveries
    by them)."""
    ids = DeliveryIds(5)
    assert [ids.take(), ids.take(), ids.take()] == [5, 6, 7]
