"""A consumer's max-message-size (AMQP 1.0 section 2.7.3; issue 16 item 3).

The broker never sends a message larger than the receiver advertised. As for a message
a consumer blocked with undeliverable-here (B-045), it waits in the queue for a consumer
that can take it; it is not dead-lettered and no delivery is counted.
"""

from __future__ import annotations

from support.core_harness import Harness

from amqpbroker.core import Modified
from amqpbroker.core.queue import MAX_HEADER_BYTES, wire_size


def test_a_limited_consumer_gets_only_what_fits_and_the_rest_waits() -> None:
    h = Harness()
    target = h.producer("q", "queue")
    h.send(target, b"x" * 20_000)
    h.send(target, b"y" * 5_000)
    limited = h.consumer("q", "queue", max_message_size=10_000)
    assert [d.message.data for d in h.take(limited)] == [b"y" * 5_000]
    queue = h.queue("q")
    assert (queue.ready_count, queue.delivering) == (1, 1)
    [waiting] = [r for r in queue.refs() if r.message.size == 20_000]
    assert waiting.delivery_count == 0
    anyone = h.consumer("q", "queue")
    [big] = h.take(anyone)
    assert (big.message.size, big.wire_count) == (20_000, 0)


def test_a_message_that_fits_exactly_is_sent() -> None:
    h = Harness()
    message = h.send(h.producer("q", "queue"), b"z" * 100)
    consumer = h.consumer("q", "queue", max_message_size=message.size)
    assert len(h.take(consumer)) == 1


def test_a_redelivery_counts_the_header_it_gets() -> None:
    """B-050: a redelivery carries a re-encoded header; it must fit as well."""
    h = Harness()
    message = h.send(h.producer("q", "queue"), b"z" * 100)
    first = h.consumer("q", "queue")
    [dispatch] = h.take(first)
    h.settle(first, dispatch, Modified(delivery_failed=True))
    h.broker.detach_consumer(first, closed=True)
    tight = h.consumer("q", "queue", max_message_size=message.size)
    assert h.take(tight) == []
    roomy = h.consumer("q", "queue", max_message_size=wire_size(message, 1))
    [again] = h.take(roomy)
    assert again.wire_count == 1
    assert wire_size(message, 1) == message.size - message.header_end + MAX_HEADER_BYTES


def test_a_browser_skips_what_does_not_fit() -> None:
    h = Harness()
    target = h.producer("q", "queue")
    h.send(target, b"x" * 2_000)
    h.send(target, b"y" * 10)
    browser = h.consumer("q", "queue", browse=True, max_message_size=1_000)
    assert [d.message.data for d in h.take(browser)] == [b"y" * 10]
