"""Recovery without sockets: a broker journals into a MemoryJournal, a second broker is
rebuilt from it (issue 5; B-095 counts, B-065 scheduled redeliveries, message ids)."""

from __future__ import annotations

from random import Random

from proton import Message as ProtonMessage
from support.core_harness import Harness

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings, Broker, ManualClock, Modified, SettingsRepository
from amqpbroker.core.persistence import Persistence
from amqpbroker.protocol import message_of
from amqpbroker.store.journal import JournalState, MemoryJournal
from amqpbroker.store.recovery import recover

SETTINGS = {"#": AddressSettings.of(redelivery_delay=60_000, max_delivery_attempts=-1)}


def _encoded(body: str) -> bytes:
    return bytes(ProtonMessage(body=body, durable=True).encode())


def _journaled() -> tuple[Harness, MemoryJournal]:
    h = Harness(SETTINGS)
    journal = MemoryJournal()
    persistence = Persistence(journal)
    h.broker.enable_persistence(persistence)
    target = h.producer("orders", "queue")
    for body in ("a", "b", "c"):
        h.broker.publish(message_of(sections.scan(_encoded(body))), target)
    c = h.consumer("orders", "queue", credit=1)
    [d] = h.take(c)
    h.settle(c, d, Modified(delivery_failed=True))  # "a": count 1, waits 60 s
    persistence.flush()
    return h, journal


def _restarted(journal: MemoryJournal, now_ms: int) -> Broker:
    clock = ManualClock()
    clock.advance(now_ms - clock.now_ms())  # the restart happens at the same moment
    broker = Broker(settings=SettingsRepository(SETTINGS), clock=clock, rng=Random(0))
    broker.enable_persistence(Persistence(journal))
    recover(broker, JournalState.of(journal.replay()), message_of)
    return broker


def test_messages_come_back_in_order_with_counts_and_their_wait() -> None:
    h, journal = _journaled()
    broker = _restarted(journal, h.clock.now_ms())
    queue = broker.queues["orders"]
    refs = queue.refs()
    bodies = []
    for ref in refs:
        decoded = ProtonMessage()
        decoded.decode(ref.message.data)
        bodies.append((decoded.body, ref.delivery_count))
    # "b" was in flight at the "crash" (never settled): back at its place with count 0.
    assert bodies == [("a", 1), ("b", 0), ("c", 0)]
    assert queue.scheduled_count == 1  # "a" still waits for its redelivery delay
    assert queue.ready_count == 2


def test_new_message_ids_continue_above_the_recovered_ones() -> None:
    h, journal = _journaled()
    broker = _restarted(journal, h.clock.now_ms())
    recovered = max(ref.message.msg_id for ref in broker.queues["orders"].refs())
    assert broker.next_message_id() > recovered


def test_recovery_writes_nothing_back() -> None:
    h, journal = _journaled()
    before = list(journal.replay())
    _restarted(journal, h.clock.now_ms())
    after = list(journal.replay())
    # only the configured/recovered address and queue are journaled again (replaced)
    assert len(after) - len(before) <= 2
