"""Recovery of last-value, ring and non-destructive queues and retroactive addresses
(B-120, B-121, B-123, B-124): a broker journals into a MemoryJournal, a second broker is
rebuilt from it, without sockets (issue 19)."""

from __future__ import annotations

from random import Random
from typing import Any

from proton import Message as ProtonMessage
from support.core_harness import Harness

from amqpbroker.amqp import sections
from amqpbroker.core import (
    ACCEPTED,
    AddressSettings,
    Broker,
    ManualClock,
    QueueConfig,
    RoutingType,
    SettingsRepository,
)
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.records import AckRef
from amqpbroker.core.refs import Ref
from amqpbroker.protocol import message_of
from amqpbroker.store.journal import JournalState, MemoryJournal
from amqpbroker.store.recovery import recover

RETRO = {"news.#": AddressSettings.of(retroactive_message_count=2)}


def _message(body: str, **props: Any) -> Any:
    encoded = bytes(ProtonMessage(body=body, durable=True, properties=props).encode())
    return message_of(sections.scan(encoded))


def _journaled(
    settings: dict[str, AddressSettings] | None = None, **config: Any
) -> tuple[Harness, MemoryJournal, Persistence]:
    h = Harness(settings)
    journal = MemoryJournal()
    persistence = Persistence(journal)
    h.broker.enable_persistence(persistence)
    if config:
        h.broker.create_address("q", {RoutingType.ANYCAST})
        h.broker.create_queue(
            QueueConfig(name="q", address="q", routing_type=RoutingType.ANYCAST, **config)
        )
    return h, journal, persistence


def _restarted(
    h: Harness, journal: MemoryJournal, settings: dict[str, AddressSettings] | None = None
) -> tuple[Broker, Persistence]:
    clock = ManualClock()
    clock.advance(h.clock.now_ms() - clock.now_ms())
    broker = Broker(settings=SettingsRepository(settings or {}), clock=clock, rng=Random(0))
    persistence = Persistence(journal)
    broker.enable_persistence(persistence)
    recover(broker, JournalState.of(journal.replay()), message_of)
    return broker, persistence


def _driving(broker: Broker) -> Harness:
    h = Harness()
    h.broker = broker
    return h


def _bodies(refs: list[Ref]) -> list[str]:
    out = []
    for ref in refs:
        decoded = ProtonMessage()
        decoded.decode(ref.message.data)
        out.append(decoded.body)
    return out


def test_a_last_value_queue_comes_back_with_its_index() -> None:
    """B-120 across a restart: the value in delivery at the crash and its newer value are
    both journaled; recovery keeps the newer, journals the older's removal once it is
    done, and a value sent after the restart replaces the recovered one."""
    h, journal, persistence = _journaled(last_value_key="sym")
    target = h.producer("q", "queue")
    h.broker.publish(_message("a1", sym="A"), target)
    c = h.consumer("q", "queue", credit=1)
    assert len(h.take(c)) == 1  # a1 in delivery at the "crash"
    h.broker.publish(_message("a2", sym="A"), target)
    persistence.flush()
    broker, after = _restarted(h, journal)
    queue = broker.queues["q"]
    assert queue.config.last_value_key == "sym"
    assert _bodies(queue.refs()) == ["a2"]
    after.flush()
    assert [r for r in journal.replay() if isinstance(r, AckRef)][-1].queue == "q"
    assert len(list(JournalState.of(journal.replay()).refs())) == 1  # a2's
    broker.publish(_message("a3", sym="A"), _driving(broker).producer("q", "queue"))
    assert _bodies(queue.refs()) == ["a3"]


def test_a_ring_queue_is_trimmed_to_its_size_on_recovery() -> None:
    """B-121 across a restart: messages in delivery at the crash come back ready, and the
    ring trims from the head, as Artemis reload does."""
    h, journal, persistence = _journaled(ring_size=2)
    target = h.producer("q", "queue")
    for body in ("1", "2"):
        h.broker.publish(_message(body), target)
    c = h.consumer("q", "queue", credit=2)
    assert len(h.take(c)) == 2
    for body in ("3", "4"):
        h.broker.publish(_message(body), target)
    persistence.flush()
    broker, after = _restarted(h, journal)
    queue = broker.queues["q"]
    assert queue.config.ring_size == 2
    assert _bodies(queue.refs()) == ["3", "4"]
    after.flush()
    assert len(list(JournalState.of(journal.replay()).refs())) == 2


def test_acknowledged_messages_of_a_non_destructive_queue_survive_a_restart() -> None:
    """B-123 across a restart: accepted messages were never removed; a consumer after the
    restart walks them from the start."""
    h, journal, persistence = _journaled(non_destructive=True)
    target = h.producer("q", "queue")
    for body in ("1", "2"):
        h.broker.publish(_message(body), target)
    c = h.consumer("q", "queue")
    for d in h.take(c):
        h.settle(c, d, ACCEPTED)
    persistence.flush()
    broker, _ = _restarted(h, journal)
    queue = broker.queues["q"]
    assert queue.config.non_destructive
    assert queue.message_count == 2
    h2 = _driving(broker)
    c2 = h2.consumer("q", "queue")
    assert [d.message.data for d in h2.take(c2)] == [r.message.data for r in queue.refs()]


def test_retained_messages_survive_a_restart() -> None:
    """B-124 across a restart: the internal ring queues come back with their messages,
    and a queue created after the restart gets them."""
    h, journal, persistence = _journaled(RETRO)
    target = h.producer("news.a", "topic")
    for body in ("1", "2", "3"):
        h.broker.publish(_message(body), target)
    persistence.flush()
    broker, _ = _restarted(h, journal, RETRO)
    retained = broker.queues["$.artemis.internal.news.a.queue.multicast.retro"]
    assert _bodies(retained.refs()) == ["2", "3"]
    sub = broker.create_queue(
        QueueConfig(name="late", address="news.a", routing_type=RoutingType.MULTICAST)
    )
    assert _bodies(sub.refs()) == ["2", "3"]
