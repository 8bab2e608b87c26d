"""B-151 address full: max-size-messages, global-max-size, and the anonymous relay under
BLOCK (issue 23 item 1). The per-address byte limit's own tests are in test_broker.py."""

from __future__ import annotations

import pytest

from amqpbroker.core import AddressSettings, AddressUnblocked, ClientError, ResourceLimitExceeded
from amqpbroker.core.outcomes import Accepted
from tests.support.core_harness import Harness

ACCEPTED = Accepted()


def _drain(h: Harness, address: str) -> list[object]:
    """Consume everything `address`'s queue holds; the effects the broker emitted."""
    effects: list[object] = []
    c = h.consumer(address, "queue")
    for d in h.take(c):
        h.broker.settle(c, d.delivery, ACCEPTED)
        effects += h.broker.take_effects()
    return effects


def test_max_size_messages_makes_the_address_full() -> None:
    """B-151: max-size-messages counts the messages its queues hold (FAIL refuses)."""
    h = Harness({"#": AddressSettings.of(max_size_messages=2, address_full_policy="FAIL")})
    target = h.producer("q", "queue")
    h.send(target, b"a")
    h.send(target, b"b")
    with pytest.raises(ResourceLimitExceeded, match="max-size-messages=2"):
        h.send(target, b"c")
    assert h.queue("q").message_count == 2


def test_global_max_size_fails_every_address() -> None:
    """B-151: past global-max-size every address is full, whatever its own limit."""
    h = Harness({"#": AddressSettings.of(address_full_policy="FAIL")}, global_max_size=6)
    h.send(h.producer("a", "queue"), b"abcd")
    h.send(h.producer("b", "queue"), b"efg")  # 4 bytes < 6: room
    with pytest.raises(ResourceLimitExceeded, match="global-max-size=6"):
        h.send(h.producer("c", "queue"), b"x")


def test_global_max_size_blocks_producers_and_relays_until_memory_is_freed() -> None:
    """B-151 BLOCK: at global-max-size no producer of a BLOCK address and no anonymous
    relay gets credit; below it again, AddressUnblocked(None) resumes them all."""
    h = Harness({"#": AddressSettings.of(address_full_policy="BLOCK")}, global_max_size=8)
    named = h.producer("q", "queue")
    relay = h.producer(None)
    h.send(named, b"12345")
    assert h.broker.producer_may_send(named)
    h.send(relay, b"6789", to="q")  # 9 bytes held: the broker is full
    assert not h.broker.producer_may_send(named)
    assert not h.broker.producer_may_send(relay, to="q")
    assert not h.broker.producer_may_send(relay)
    effects = _drain(h, "q")
    assert AddressUnblocked(None) in effects
    assert h.broker.producer_may_send(named)
    assert h.broker.producer_may_send(relay, to="q")


def test_relay_is_paced_by_the_address_its_last_message_went_to() -> None:
    """B-151 BLOCK: a relay whose last message went to a full address gets no credit (so
    it cannot get past the address's limit); one whose last went elsewhere does."""
    h = Harness({"#": AddressSettings.of(max_size_bytes=3, address_full_policy="BLOCK")})
    h.producer("q", "queue")
    relay = h.producer(None)
    h.send(relay, b"abcd", to="q")
    assert not h.broker.producer_may_send(relay, to="q")
    assert not h.broker.producer_may_send(relay, to="q::q")  # FQQN: the same address
    assert h.broker.producer_may_send(relay, to="other")
    assert h.broker.producer_may_send(relay)  # nothing sent yet
    assert AddressUnblocked("q") in _drain(h, "q")
    assert h.broker.producer_may_send(relay, to="q")


def test_a_commit_is_checked_whole_then_let_in_as_one_unit() -> None:
    """B-141 with B-151 FAIL: `check_publish` refuses what routing would refuse, routing
    nothing; inside `committing` the checked sends are let in past the limit, as one
    message that crosses it is."""
    h = Harness({"#": AddressSettings.of(max_size_bytes=4, address_full_policy="FAIL")})
    target = h.producer("q", "queue")
    h.broker.check_publish(target, durable=False)  # room: no refusal
    with h.broker.committing():
        for body in (b"abc", b"def", b"ghi"):
            h.send(target, body)
    assert h.queue("q").message_count == 3
    with pytest.raises(ResourceLimitExceeded, match="is full"):
        h.broker.check_publish(target, durable=False)
    assert h.queue("q").message_count == 3
    with pytest.raises(ResourceLimitExceeded, match="is full"):
        h.send(target, b"x")  # outside a commit the limit holds again


def test_a_relay_send_is_checked_for_its_address_without_being_routed() -> None:
    """B-141/B-009: the relay's `to` is resolved and checked (a missing `to` is refused)."""
    h = Harness({"#": AddressSettings.of(address_full_policy="FAIL")})
    relay = h.producer(None)
    with pytest.raises(ClientError, match="has no 'to' address"):
        h.broker.check_publish(relay, durable=False)
    h.broker.check_publish(relay, durable=False, to="elsewhere")
    assert h.broker.post_office.addresses["elsewhere"].size_bytes == 0
