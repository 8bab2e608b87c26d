"""Counters across queue and address incarnations, and broker-wide (issue 16 item 4).

Prometheus's increase() treats a counter that starts over as a reset and misses what a
new incarnation of an auto-deleted queue held before its first scrape (a queue fed 120
messages in 5 minutes showed 80), and a series born at its first dead letter is not an
increase at all.
"""

from __future__ import annotations

from support.core_harness import Harness

from amqpbroker.core import AddressSettings, Rejected
from amqpbroker.core.queue import DEAD_LETTER_REASONS, KILL_REASONS, RETURN_OUTCOMES
from amqpbroker.core.totals import CounterTotals

DLA = {"#": AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)}


def _feed(h: Harness, address: str, count: int) -> None:
    target = h.producer(address, "queue")
    for _ in range(count):
        h.send(target)


def test_an_address_keeps_counting_across_queue_incarnations() -> None:
    h = Harness()
    _feed(h, "orders", 80)
    h.broker.delete_address("orders")  # as the reaper does for auto-created ones
    _feed(h, "orders", 40)
    per_address, everything = h.broker.totals.totals(h.broker.queues.values())
    assert per_address["orders"].added == 120
    assert everything.added == 120
    assert h.queue("orders").counters.added == 40  # the queue's own: Artemis semantics
    assert h.broker.post_office.addresses["orders"].routed == 120  # continued too


def test_every_known_reason_starts_at_zero() -> None:
    h = Harness()
    _feed(h, "q", 1)
    counters = h.queue("q").counters
    assert counters.dead_lettered_by_reason == dict.fromkeys(DEAD_LETTER_REASONS, 0)
    assert counters.killed_by_reason == dict.fromkeys(KILL_REASONS, 0)
    assert counters.returned_by_reason == dict.fromkeys(RETURN_OUTCOMES, 0)
    _, everything = h.broker.totals.totals(h.broker.queues.values())
    assert everything.dead_lettered_by_reason == dict.fromkeys(DEAD_LETTER_REASONS, 0)


def test_broker_wide_dead_letters_survive_their_queues() -> None:
    h = Harness(DLA)
    _feed(h, "orders", 2)
    consumer = h.consumer("orders", "queue")
    for dispatch in h.take(consumer):
        h.settle(consumer, dispatch, Rejected())
    h.broker.detach_consumer(consumer, closed=True)
    h.broker.delete_address("orders")
    _, everything = h.broker.totals.totals(h.broker.queues.values())
    assert everything.dead_lettered_by_reason["rejected"] == 2
    assert everything.dead_lettered == 2


def test_forgotten_addresses_still_count_broker_wide() -> None:
    """Bounded memory: beyond `limit` deleted addresses, the oldest leave the per-address
    totals (their series end) but stay in the broker-wide ones."""
    h = Harness()
    h.broker.totals = CounterTotals(limit=2)
    for n in range(5):
        _feed(h, f"a{n}", 1)
        h.broker.delete_address(f"a{n}")
    per_address, everything = h.broker.totals.totals(h.broker.queues.values())
    assert sorted(per_address) == ["a3", "a4"]
    assert everything.added == 5


def test_temporary_queues_go_to_the_broker_totals_only() -> None:
    h = Harness()
    consumer = h.consumer(None, dynamic=True)
    [queue] = [q for q in h.broker.queues.values() if q.config.temporary]
    h.send(h.producer(queue.address))
    h.broker.detach_consumer(consumer, closed=True)
    per_address, everything = h.broker.totals.totals(h.broker.queues.values())
    assert queue.address not in per_address
    assert everything.added == 1
