"""Expiry in the broker with a ManualClock (B-080…B-087)."""

from __future__ import annotations

import time

from support.core_harness import Harness

from amqpbroker.core import (
    RELEASED,
    AddressSettings,
    QueueConfig,
    RoutingType,
)

EXPIRY = {"#": AddressSettings.of(expiry_address="ExpiryQueue", auto_create_expiry_resources=True)}


def _expiry_queue(h: Harness) -> None:
    h.broker.create_address("ExpiryQueue", {RoutingType.ANYCAST})
    h.broker.create_queue(
        QueueConfig(name="ExpiryQueue", address="ExpiryQueue", routing_type=RoutingType.ANYCAST)
    )


def test_expired_message_is_never_delivered_and_moves_with_annotations() -> None:
    """B-084/B-085/B-090: consumer with credit gets nothing; the copy lands in
    ExpiryQueue and EXP.orders with x-opt-ACTUAL-EXPIRY and the ORIG annotations."""
    h = Harness(EXPIRY)
    _expiry_queue(h)
    h.send(h.producer("orders", "queue"), b"late", ttl_ms=1000)
    h.advance(1000)
    c = h.consumer("orders", "queue")
    assert h.take(c) == []
    assert h.queue("orders").counters.expired == 1
    assert h.queue("orders").message_count == 0
    [copy_ref] = h.queue("EXP.orders").refs()
    annotations = copy_ref.message.get_annotations()
    assert annotations["x-opt-ACTUAL-EXPIRY"] == h.clock.now_ms()
    assert annotations["x-opt-ORIG-ADDRESS"] == "orders"
    assert annotations["x-opt-ORIG-QUEUE"] == "orders"
    assert copy_ref.message.expiration_ms == 0  # B-076: the copy does not expire
    assert h.queue("ExpiryQueue").message_count == 1  # B-073-style routing, no type


def test_auto_created_expiry_queue_is_filtered_multicast() -> None:
    """B-086: EXP.<address> on the expiry address, MULTICAST, filtered on its origin."""
    h = Harness(EXPIRY)
    for address in ("a", "b"):
        h.send(h.producer(address, "queue"), address.encode(), ttl_ms=10)
    h.advance(30_000)  # the periodic scan (B-084), no consumer needed
    for address in ("a", "b"):
        exp = h.queue(f"EXP.{address}")
        assert (exp.address, exp.routing_type) == ("ExpiryQueue", RoutingType.MULTICAST)
        assert exp.config.filter == f"_AMQ_ORIG_ADDRESS = '{address}'"
        assert [r.message.data for r in exp.refs()] == [address.encode()]


def test_scan_runs_every_period_and_can_be_disabled() -> None:
    """B-084: message-expiry-scan-period (default 30000); -1 disables the scan."""
    h = Harness(EXPIRY, message_expiry_scan_period_ms=1000)
    h.send(h.producer("q", "queue"), ttl_ms=10)
    h.advance(999)
    assert h.queue("q").counters.expired == 0
    h.advance(1)
    assert h.queue("q").counters.expired == 1
    off = Harness(EXPIRY, message_expiry_scan_period_ms=-1)
    off.send(off.producer("q", "queue"), ttl_ms=10)
    off.advance(100_000)
    assert off.queue("q").counters.expired == 0
    assert off.queue("q").message_count == 1  # waits for a dispatch attempt


def test_no_expiry_address_drops_and_counts() -> None:
    """B-085: no expiry address -> dropped, messages-expired counted."""
    h = Harness()
    h.send(h.producer("q", "queue"), ttl_ms=5)
    h.advance(30_000)
    assert h.queue("q").message_count == 0
    assert h.queue("q").counters.expired == 1


def test_message_in_delivery_never_expires_but_does_when_it_comes_back() -> None:
    """B-084: acquired messages do not expire; returned past their time, they expire at
    the next dispatch attempt."""
    h = Harness(message_expiry_scan_period_ms=100)
    h.send(h.producer("q", "queue"), ttl_ms=500)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.advance(1000)
    assert h.queue("q").counters.expired == 0
    h.settle(c, d, RELEASED)
    assert h.take(c) == []
    assert h.queue("q").counters.expired == 1


def test_absolute_expiry_time_wins_and_already_expired_waits_for_a_check() -> None:
    """B-080/B-084: absolute-expiry-time overrides ttl; an already expired message sits
    until a check runs."""
    h = Harness(message_expiry_scan_period_ms=1000)
    now = h.clock.now_ms()
    h.send(h.producer("q", "queue"), ttl_ms=10_000_000, expiration_ms=now - 1)
    assert h.queue("q").message_count == 1
    h.advance(1000)
    assert h.queue("q").message_count == 0


def test_expiry_delay_applies_to_messages_without_expiration() -> None:
    """B-081: expiry-delay only for expiration 0."""
    h = Harness({"#": AddressSettings.of(expiry_delay=200)}, message_expiry_scan_period_ms=100)
    target = h.producer("q", "queue")
    h.send(target, b"none")
    h.send(target, b"own", ttl_ms=10_000)
    h.advance(300)
    assert [r.message.data for r in h.queue("q").refs()] == [b"own"]


def test_overrides_apply_to_copies_too() -> None:
    """B-082: an expiry-delay on the expiry address makes expired copies expire again."""
    h = Harness(
        {
            "#": AddressSettings.of(expiry_address="ExpiryQueue"),
            "ExpiryQueue": AddressSettings.of(expiry_delay=5_000, expiry_address=""),
        },
        message_expiry_scan_period_ms=1000,
    )
    _expiry_queue(h)
    h.send(h.producer("q", "queue"), ttl_ms=10)
    h.advance(1000)
    assert h.queue("ExpiryQueue").message_count == 1
    h.advance(5000)
    assert h.queue("ExpiryQueue").message_count == 0  # expired again, dropped


def test_expiry_address_equal_to_queue_address_disables_expiry() -> None:
    """B-087 (SHOULD): both paths treat such a queue as expiry disabled."""
    h = Harness(
        {"loop": AddressSettings.of(expiry_address="loop")}, message_expiry_scan_period_ms=100
    )
    h.send(h.producer("loop", "queue"), b"x", ttl_ms=10)
    h.advance(1000)
    c = h.consumer("loop", "queue")
    assert [d.message.data for d in h.take(c)] == [b"x"]


def test_scheduled_redelivery_can_expire() -> None:
    """B-084: a message waiting for its redelivery delay expires like a ready one."""
    h = Harness(
        {"#": AddressSettings.of(redelivery_delay=10_000)}, message_expiry_scan_period_ms=100
    )
    h.send(h.producer("q", "queue"), ttl_ms=500)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, RELEASED)
    assert h.queue("q").scheduled_count == 1
    h.advance(600)
    assert h.queue("q").scheduled_count == 0
    assert h.queue("q").counters.expired == 1
    h.advance(10_000)
    assert h.take(c) == []


def test_expiry_scan_cost_stays_small_with_many_queues_and_messages() -> None:
    """Issue 4: the scan pops only what is due; with nothing due it costs ~nothing."""
    h = Harness(message_expiry_scan_period_ms=1000)
    for i in range(100):
        target = h.producer(f"q{i}", "queue")
        for _ in range(1000):
            h.send(target, ttl_ms=3_600_000)
    started = time.perf_counter()
    h.advance(1000)  # a scan with nothing due
    idle_scan_s = time.perf_counter() - started
    assert idle_scan_s < 0.05
    assert all(h.queue(f"q{i}").message_count == 1000 for i in range(100))
