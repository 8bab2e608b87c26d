"""Dead-letter addresses and queues as core decisions (B-060, B-061, B-070…B-077)."""

from __future__ import annotations

import pytest
from support.core_harness import Harness, one_delivery

from amqpbroker.core import (
    AddressSettings,
    Modified,
    NotFound,
    QueueConfig,
    Rejected,
    RoutingType,
)

DLA_AUTO = {
    "#": AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)
}


def _fail(h: Harness, times: int, address: str = "q") -> None:
    c = h.consumer(address, "queue")
    for _ in range(times):
        [d] = h.take(c)
        h.settle(c, d, Modified(delivery_failed=True))
    h.broker.detach_consumer(c, closed=True)


def test_settings_of_the_queue_address_apply_not_the_original() -> None:
    """B-061: max-delivery-attempts of the *queue's* address decides."""
    h = Harness(
        {
            "#": AddressSettings.of(
                max_delivery_attempts=5,
                dead_letter_address="DLA",
                auto_create_dead_letter_resources=True,
            ),
            "orders": AddressSettings.of(max_delivery_attempts=1),
        }
    )
    h.send(h.producer("orders", "queue"))
    _fail(h, 1, "orders")
    assert h.queue("DLQ.orders").message_count == 1


def test_runtime_settings_change_applies_to_the_next_check() -> None:
    """B-061/B-102: a changed max-delivery-attempts applies from the next return."""
    h = Harness(
        {
            "#": AddressSettings.of(
                max_delivery_attempts=10,
                dead_letter_address="DLA",
                auto_create_dead_letter_resources=True,
            )
        }
    )
    c, d = one_delivery(h)
    h.settle(c, d, Modified(delivery_failed=True))
    h.broker.settings.add("q", AddressSettings.of(max_delivery_attempts=2))
    [d] = h.take(c)
    h.settle(c, d, Modified(delivery_failed=True))
    assert h.queue("DLQ.q").message_count == 1


def test_auto_created_dlq_is_per_address_multicast_and_filtered() -> None:
    """B-074: `DLQ.<address>` on the DLA, MULTICAST, durable, auto-created, filtered on
    _AMQ_ORIG_ADDRESS; two source addresses -> two DLQs, each with its own letters."""
    h = Harness(DLA_AUTO)
    for address in ("orders", "payments"):
        h.send(h.producer(address, "queue"), address.encode())
        c = h.consumer(address, "queue")
        [d] = h.take(c)
        h.settle(c, d, Rejected())
    for address in ("orders", "payments"):
        dlq = h.queue(f"DLQ.{address}")
        assert (dlq.address, dlq.routing_type, dlq.durable) == ("DLA", RoutingType.MULTICAST, True)
        assert dlq.config.auto_created
        assert dlq.config.filter == f"_AMQ_ORIG_ADDRESS = '{address}'"
        assert [r.message.data for r in dlq.refs()] == [address.encode()]


def test_dlq_prefix_suffix_and_routing_type_come_from_settings() -> None:
    """B-074: dead-letter-queue-prefix/-suffix; routing type from the DLA's settings."""
    h = Harness(
        {
            "#": AddressSettings.of(
                dead_letter_address="DLA",
                auto_create_dead_letter_resources=True,
                dead_letter_queue_prefix="dead-",
                dead_letter_queue_suffix="-x",
            ),
            "DLA": AddressSettings.of(default_queue_routing_type=RoutingType.ANYCAST),
        }
    )
    c, d = one_delivery(h)
    h.settle(c, d, Rejected())
    assert h.queue("dead-q-x").routing_type is RoutingType.ANYCAST


def test_quote_in_address_is_doubled_in_the_dlq_filter() -> None:
    """B-074 decision: a single quote in the address is doubled in the filter."""
    h = Harness(DLA_AUTO)
    h.send(h.producer("it's", "queue"))
    c = h.consumer("it's", "queue")
    [d] = h.take(c)
    h.settle(c, d, Rejected())
    assert h.queue("DLQ.it's").config.filter == "_AMQ_ORIG_ADDRESS = 'it''s'"


def test_copy_goes_to_every_dla_queue() -> None:
    """B-073: routed with no routing type: anycast DLA and multicast DLQ.q both get it."""
    h = Harness(DLA_AUTO)
    h.broker.create_address("DLA", {RoutingType.ANYCAST})
    h.broker.create_queue(QueueConfig(name="DLA", address="DLA", routing_type=RoutingType.ANYCAST))
    c, d = one_delivery(h)
    h.settle(c, d, Rejected())
    assert (h.queue("DLA").message_count, h.queue("DLQ.q").message_count) == (1, 1)


def test_dla_without_queues_drops() -> None:
    """B-072: a DLA with no queue bound (and no auto-create) drops the message."""
    h = Harness({"#": AddressSettings.of(dead_letter_address="DLA")})
    h.broker.create_address("DLA", {RoutingType.MULTICAST})
    c, d = one_delivery(h)
    h.settle(c, d, Rejected())
    assert h.queue("q").message_count == 0
    assert h.queue("q").counters.killed == 1


def test_copy_is_a_new_message_with_count_zero_and_same_durability() -> None:
    """B-076: new id, count 0, durability kept, ORIG annotations added."""
    h = Harness(DLA_AUTO)
    c, d = one_delivery(h)
    original = d.message
    h.settle(c, d, Modified(delivery_failed=True))
    [d] = h.take(c)
    h.settle(c, d, Rejected())
    [ref] = h.queue("DLQ.q").refs()
    assert ref.message.msg_id != original.msg_id
    assert ref.delivery_count == 0
    assert ref.message.durable == original.durable
    annotations = ref.message.get_annotations()
    assert annotations["x-opt-ORIG-MESSAGE-ID"] == original.msg_id
    assert annotations["x-opt-DLQ-DELIVERY-COUNT"] == 2


def test_dlq_has_its_own_counting_and_dla_to_itself_never_drops() -> None:
    """B-077: failing on the DLQ itself re-dead-letters into the DLA, count 0 again."""
    h = Harness({"#": AddressSettings.of(dead_letter_address="DLA", max_delivery_attempts=1)})
    h.broker.create_address("DLA", {RoutingType.ANYCAST})
    h.broker.create_queue(QueueConfig(name="DLA", address="DLA", routing_type=RoutingType.ANYCAST))
    c, d = one_delivery(h)
    h.settle(c, d, Modified(delivery_failed=True))
    dlq = h.consumer("DLA", "queue")
    [d] = h.take(dlq)
    assert d.wire_count == 0
    h.settle(dlq, d, Modified(delivery_failed=True))
    [again] = h.take(dlq)
    assert again.wire_count == 0
    assert again.message.msg_id != d.message.msg_id


def test_send_to_dla_on_no_route() -> None:
    """B-004/B-070(5): unrouted + send-to-dla-on-no-route -> to the DLA, no ORIG-QUEUE."""
    h = Harness({"#": AddressSettings.of(dead_letter_address="DLA", send_to_dla_on_no_route=True)})
    h.broker.create_address("DLA", {RoutingType.ANYCAST})
    h.broker.create_queue(QueueConfig(name="DLA", address="DLA", routing_type=RoutingType.ANYCAST))
    h.send(h.producer("nobody-listens"))
    [ref] = h.queue("DLA").refs()
    annotations = ref.message.get_annotations()
    assert annotations["x-opt-ORIG-ADDRESS"] == "nobody-listens"
    assert annotations["x-opt-DLQ-REASON"] == "no-route"
    assert "x-opt-ORIG-QUEUE" not in annotations


@pytest.mark.parametrize("limit", [-1, 0])
def test_unlimited_attempts_never_dead_letter(limit: int) -> None:
    """B-060: M <= 0 is unlimited."""
    h = Harness({"#": AddressSettings.of(max_delivery_attempts=limit, dead_letter_address="DLA")})
    c, d = one_delivery(h)
    for _ in range(25):
        h.settle(c, d, Modified(delivery_failed=True))
        [d] = h.take(c)
    assert d.wire_count == 25


def test_delivery_count_incremented_before_the_transfer() -> None:
    """B-040: first delivery carries wire count 0 while the broker count is 1."""
    h = Harness()
    _c, d = one_delivery(h)
    assert d.wire_count == 0
    [ref] = h.queue("q").refs()
    assert ref.delivery_count == 1


def test_delivery_count_counts_only_failed_attempts() -> None:
    """B-052: release, modified without failure and orderly close undo the increment;
    only modified{delivery-failed} and connection loss count."""
    from amqpbroker.core import RELEASED, ConnectionId

    h = Harness()
    h.send(h.producer("q", "queue"))
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, RELEASED)
    [d] = h.take(c)
    h.settle(c, d, Modified(delivery_failed=True))  # counted: 1
    [d] = h.take(c)
    h.settle(c, d, Modified())
    [d] = h.take(c)
    h.broker.detach_consumer(c, closed=True)
    lost = ConnectionId(9)
    h.consumer("q", "queue", conn=lost)
    h.broker.connection_closed(lost, abrupt=True)  # counted: 2
    last = h.consumer("q", "queue")
    [d] = h.take(last)
    assert d.wire_count == 2


def test_dlq_is_reached_by_fqqn_not_by_its_bare_name() -> None:
    """B-075: `DLA::DLQ.orders` reads the dead letters; a bare `DLQ.orders` is refused
    with amqp:not-found naming the FQQN (decision: queue names are broker-wide)."""
    h = Harness(DLA_AUTO)
    h.send(h.producer("orders", "queue"), b"dead")
    c = h.consumer("orders", "queue")
    [d] = h.take(c)
    h.settle(c, d, Rejected())
    fqqn = h.consumer("DLA::DLQ.orders")
    assert [x.message.data for x in h.take(fqqn)] == [b"dead"]
    with pytest.raises(NotFound, match=r"attach to DLA::DLQ\.orders"):
        h.consumer("DLQ.orders", "queue")
    assert "DLQ.orders" not in h.broker.post_office.addresses


def test_second_hop_annotations_describe_the_last_hop_and_keep_routing_type() -> None:
    """B-090: earlier x-opt-ORIG-* are replaced; a message moved before carries its
    original routing type forward as x-opt-routing-type."""
    h = Harness(
        {
            "#": AddressSettings.of(dead_letter_address="DLA", max_delivery_attempts=1),
            "DLA": AddressSettings.of(dead_letter_address="DLA2"),
        }
    )
    for name in ("DLA", "DLA2"):
        h.broker.create_address(name, {RoutingType.ANYCAST})
        h.broker.create_queue(
            QueueConfig(name=name, address=name, routing_type=RoutingType.ANYCAST)
        )
    h.send(h.producer("q", "queue"), message_routing_type=RoutingType.ANYCAST)
    h.queue("q").refs()[0].message.annotations = {"x-opt-routing-type": 1}
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, Modified(delivery_failed=True))  # hop 1: q -> DLA
    first = h.queue("DLA").refs()[0].message.get_annotations()
    assert first["x-opt-ORIG-ROUTING-TYPE"] == 1
    assert "x-opt-routing-type" not in first
    dla = h.consumer("DLA", "queue")
    [d] = h.take(dla)
    h.settle(dla, d, Rejected())  # hop 2: DLA -> DLA2
    second = h.queue("DLA2").refs()[0].message.get_annotations()
    assert second["x-opt-ORIG-ADDRESS"] == "DLA"
    assert second["x-opt-ORIG-QUEUE"] == "DLA"
    assert second["x-opt-routing-type"] == 1  # B-090 exception: the original type returns
