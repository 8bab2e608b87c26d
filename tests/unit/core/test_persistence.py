"""What the core journals, and when (issue 5; B-095, B-096, B-097), with a fake journal.

No disk and no sockets: the journal here records each append (one per loop step) and
answers `on_durable` when the test says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from support.core_harness import Harness

from amqpbroker.core import ACCEPTED, RELEASED, AddressSettings, Modified
from amqpbroker.core.errors import ResourceLimitExceeded
from amqpbroker.core.persistence import OnStored, Persistence
from amqpbroker.core.records import (
    AckRef,
    AddAddress,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteQueue,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.store.journal import JournalState, MemoryJournal

FAILED = Modified(delivery_failed=True)


class FakeJournal:
    """Keeps each append; `on_durable` runs when `complete()` is called."""

    def __init__(self) -> None:
        self.appends: list[tuple[list[Record], bool]] = []
        self.pending: list[OnStored] = []
        self.resumed: list[Callable[[], None]] = []

    def on_resume(self, callback: Callable[[], None]) -> None:
        self.resumed.append(callback)

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
    ) -> None:
        self.appends.append((list(records), sync))
        if on_durable is not None:
            self.pending.append(on_durable)

    def complete(self, error: BaseException | None = None) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback(error)

    def records(self) -> list[Record]:
        return [r for records, _ in self.appends for r in records]

    def last(self) -> list[Record]:
        return self.appends[-1][0]


def _harness(
    settings: dict[str, AddressSettings] | None = None, **options: object
) -> tuple[Harness, FakeJournal, Persistence]:
    journal = FakeJournal()
    persistence = Persistence(journal, **options)  # type: ignore[arg-type]
    h = Harness(settings)
    h.broker.enable_persistence(persistence)
    return h, journal, persistence


def _step(persistence: Persistence) -> None:
    persistence.flush()  # what the shell does after each loop step


def test_a_durable_send_is_one_append_with_its_queue_and_address() -> None:
    h, journal, persistence = _harness()
    h.send(h.producer("orders", "queue"), b"x", durable=True)
    _step(persistence)
    [(records, _)] = journal.appends
    kinds = [type(r) for r in records]
    assert kinds == [AddAddress, AddQueue, AddMessage, AddRef]
    add = records[2]
    assert isinstance(add, AddMessage)
    assert (add.data, add.address) == (b"x", "orders")
    assert persistence.messages_added == 1


def test_non_durable_messages_never_touch_the_journal() -> None:
    h, journal, persistence = _harness()
    target = h.producer("orders", "queue")
    _step(persistence)
    before = len(journal.appends)
    h.send(target, b"x")
    c = h.consumer("orders", "queue")
    [d] = h.take(c)
    h.settle(c, d, FAILED)
    _step(persistence)
    assert len(journal.appends) == before


def test_the_producer_waits_for_the_sync_of_its_step() -> None:
    h, journal, persistence = _harness()
    target = h.producer("orders", "queue")
    _step(persistence)
    h.send(target, durable=True)
    answers: list[BaseException | None] = []
    persistence.when_stored(answers.append)
    _step(persistence)
    assert journal.appends[-1][1] is True  # a waiter: sync=True
    assert answers == []  # not before the journal says so
    journal.complete()
    assert answers == [None]


def test_accept_acknowledges_the_reference() -> None:
    h, journal, persistence = _harness()
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, ACCEPTED)
    _step(persistence)
    assert AckRef(queue="q", msg_id=d.message.msg_id) in journal.records()
    assert JournalState.of(journal.records()).messages == {}


def test_b095_failed_return_persists_the_count_release_writes_nothing() -> None:
    h, journal, persistence = _harness()
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, FAILED)  # count 1
    [d] = h.take(c)
    h.settle(c, d, RELEASED)  # count stays 1: equal to the stored value, no record
    _step(persistence)
    updates = [r for r in journal.records() if isinstance(r, UpdateDeliveryCount)]
    assert updates == [UpdateDeliveryCount(queue="q", msg_id=d.message.msg_id, delivery_count=1)]
    [ref] = JournalState.of(journal.records()).refs()
    assert ref.delivery_count == 1


def test_b096_counts_past_max_redelivery_records_are_not_written() -> None:
    h, journal, persistence = _harness(max_redelivery_records=1)
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    for _ in range(5):
        [d] = h.take(c)
        h.settle(c, d, Modified(delivery_failed=True))
    _step(persistence)
    counts = [r.delivery_count for r in journal.records() if isinstance(r, UpdateDeliveryCount)]
    assert counts == [1]
    assert h.queue("q").refs()[0].delivery_count == 6  # memory keeps counting (6th out)


def test_b096_a_negative_cap_writes_every_count() -> None:
    h, journal, persistence = _harness(
        {"#": AddressSettings.of(max_delivery_attempts=-1)}, max_redelivery_records=-1
    )
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    for _ in range(12):
        [d] = h.take(c)
        h.settle(c, d, FAILED)
    _step(persistence)
    counts = [r.delivery_count for r in journal.records() if isinstance(r, UpdateDeliveryCount)]
    assert counts == list(range(1, 13))


@pytest.mark.parametrize(("before", "expected"), [(False, []), (True, [1])])
def test_b097_count_persisted_before_dispatch_only_when_asked(
    before: bool, expected: list[int]
) -> None:
    h, journal, persistence = _harness(before_delivery=before)
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    assert len(h.take(c)) == 1
    assert persistence.dispatch_waits is before  # the shell holds the transfer until written
    _step(persistence)
    counts = [r.delivery_count for r in journal.records() if isinstance(r, UpdateDeliveryCount)]
    assert counts == expected


def test_b097_written_waiters_keep_append_order_even_without_records() -> None:
    """Held dispatches are released by `when_written` callbacks in append order; a step
    with nothing to write still goes through the journal so it cannot overtake."""
    h, journal, persistence = _harness()
    order: list[str] = []
    h.send(h.producer("q", "queue"), durable=True)
    persistence.when_written(lambda error: order.append("first"))
    _step(persistence)
    persistence.when_written(lambda error: order.append("second"))
    _step(persistence)  # no records of its own
    assert [sync for _, sync in journal.appends] == [False, False]
    assert journal.appends[1][0] == []
    journal.complete()
    assert order == ["first", "second"]


def test_a_redelivery_delay_is_journaled_as_a_scheduled_time() -> None:
    h, journal, persistence = _harness({"#": AddressSettings.of(redelivery_delay=5000)})
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.settle(c, d, FAILED)
    _step(persistence)
    scheduled = [r for r in journal.records() if isinstance(r, ScheduledDelivery)]
    assert scheduled == [
        ScheduledDelivery(queue="q", msg_id=d.message.msg_id, at_ms=h.clock.now_ms() + 5000)
    ]


def test_a_dead_letter_move_is_one_append_ack_and_copy() -> None:
    h, journal, persistence = _harness(
        {
            "#": AddressSettings.of(
                dead_letter_address="DLA",
                auto_create_dead_letter_resources=True,
                max_delivery_attempts=1,
            )
        }
    )
    h.send(h.producer("q", "queue"), durable=True)
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    _step(persistence)
    h.settle(c, d, FAILED)
    _step(persistence)
    last = journal.last()
    assert AckRef(queue="q", msg_id=d.message.msg_id) in last
    copies = [r for r in last if isinstance(r, AddMessage)]
    [copy] = copies
    assert copy.address == "DLA"
    assert copy.msg_id != d.message.msg_id
    assert AddRef(queue="DLQ.q", msg_id=copy.msg_id, delivery_count=0) in last
    state = JournalState.of(journal.records())
    assert [r.queue for r in state.refs()] == ["DLQ.q"]


def test_deleting_a_queue_is_one_record_for_all_its_messages() -> None:
    h, journal, persistence = _harness()
    target = h.producer("q", "queue")
    for _ in range(3):
        h.send(target, durable=True)
    _step(persistence)
    h.broker.delete_queue("q")
    _step(persistence)
    assert journal.last() == [DeleteQueue(name="q")]
    assert JournalState.of(journal.records()).messages == {}


def test_a_failed_journal_refuses_durable_sends_and_keeps_serving() -> None:
    h, journal, persistence = _harness()
    target = h.producer("q", "queue")
    h.send(target, b"stored", durable=True)
    _step(persistence)
    journal.complete()  # on disk
    h.send(target, b"refused", durable=True)
    answers: list[BaseException | None] = []
    persistence.when_stored(answers.append)
    _step(persistence)
    h.clock.advance(7)  # the journal answers later: a call into the broker of its own
    error = OSError(28, "No space left on device")
    journal.complete(error)
    assert answers == [error]  # its producer is told (resource-limit-exceeded)
    killed = h.queue("q").counters.killed_by_reason
    assert {reason: n for reason, n in killed.items() if n} == {"journal-failed": 1}
    [event] = [e for e in h.broker.emitter.take() if e.event == "killed"]
    assert event.ts == h.clock.now_ms()  # issue 18: the answer's time, not the send's
    with pytest.raises(ResourceLimitExceeded, match="No space left"):
        h.send(target, b"later", durable=True)
    h.send(target, b"volatile")  # non-durable messages still flow
    c = h.consumer("q", "queue")
    assert [d.message.data for d in h.take(c)] == [b"stored", b"volatile"]


def test_a_message_the_journal_lost_is_killed_at_the_time_the_journal_answered() -> None:
    """Issue 18 (one clock, B-170 ts): the journal's completion callback is a call into
    the broker of its own, so the `killed`/`journal-failed` event carries the time the
    failure was heard, not the time of the last call before it (the send's)."""
    h, journal, persistence = _harness()
    h.send(h.producer("q", "queue"), b"lost", durable=True)
    _step(persistence)
    h.broker.emitter.take()
    h.clock.advance(5_000)
    journal.complete(OSError(28, "No space left on device"))
    (killed,) = [e for e in h.broker.emitter.take() if e.event == "killed"]
    assert killed.ts == h.clock.now_ms()


def test_a_step_nobody_waits_on_is_appended_without_a_callback() -> None:
    """Acks and counts alone: no callback for the journal's writer thread to run (and
    then the loop); a journal that refuses such an append still fails persistence."""
    h, journal, persistence = _harness()
    target = h.producer("q", "queue")
    h.send(target, b"x", durable=True)
    h.send(target, b"y", durable=True)
    _step(persistence)
    journal.complete()
    c = h.consumer("q", "queue")
    first, second = h.take(c)
    h.settle(c, first, ACCEPTED)
    _step(persistence)
    assert journal.last() == [AckRef(queue="q", msg_id=first.message.msg_id)]
    assert journal.pending == []

    class Closed(FakeJournal):
        def append(
            self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
        ) -> None:
            raise OSError("journal closed")

    persistence.journal = Closed()
    h.settle(c, second, ACCEPTED)
    _step(persistence)
    assert isinstance(persistence.failure, OSError)


def test_a_step_the_journal_cannot_encode_is_refused_alone() -> None:
    """Issue 15 attack (B-095): a record the journal cannot encode (a value past i64, a
    lone surrogate) raised from `append` and failed persistence for good: every later
    durable send was refused until a restart. Now that step alone is refused (its
    producer told, its message killed) and the next durable send is stored, with the
    topology journaled anew."""
    from amqpbroker.store.codec import CodecError

    h, journal, persistence = _harness()
    target = h.producer("q", "queue")

    class Unencodable(FakeJournal):
        """Takes the topology, not the message (a field of it past i64)."""

        def append(
            self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
        ) -> None:
            if any(isinstance(r, AddMessage) for r in records):
                raise CodecError("integer out of the i64 range: 18446744073709551615")
            journal.append(records, sync=sync, on_durable=on_durable)

    persistence.journal = Unencodable()
    h.send(target, b"refused", durable=True)
    answers: list[BaseException | None] = []
    persistence.when_stored(answers.append)
    _step(persistence)
    assert [type(a) for a in answers] == [CodecError]
    assert persistence.failure is None
    persistence.journal = journal
    h.send(target, b"stored", durable=True)  # ResourceLimitExceeded before
    _step(persistence)
    journal.complete()
    assert any(isinstance(r, AddQueue) and r.name == "q" for r in journal.records())
    c = h.consumer("q", "queue")
    assert [d.message.data for d in h.take(c)] == [b"stored"]


def test_a_resumed_journal_accepts_durable_sends_and_still_knows_their_queue() -> None:
    """Issue 15 item 2 (B-095): the first send to an auto-created queue fails with the
    disk, and its AddQueue with it; once the journal works again, durable sends are
    accepted without a restart, and a restart finds them in their queue."""
    journal = MemoryJournal()
    persistence = Persistence(journal)
    h = Harness()
    h.broker.enable_persistence(persistence)
    journal.fail(OSError(28, "No space left on device"))
    target = h.producer("fresh", "queue")
    h.send(target, b"refused", durable=True)  # creates the queue: its records fail too
    _step(persistence)
    with pytest.raises(ResourceLimitExceeded):
        h.send(target, b"refused too", durable=True)
    journal.resume()
    h.send(target, b"accepted", durable=True)
    _step(persistence)
    state = JournalState.of(journal.replay())
    assert [q.name for q in state.queues] == ["fresh"]
    assert [state.messages[r.msg_id].data for r in state.refs("fresh")] == [b"accepted"]


def test_a_page_file_sync_that_fails_refuses_the_steps_producers_and_still_appends() -> None:
    """Issue 23 item 2 (disk full or an I/O error while paging, B-151): the page files'
    fsync runs before the step's append (`before_flush`); when it failed, the OSError
    went out of `flush` into the loop step, the records stayed for the next step and
    its producers then heard "stored" although their paged messages' fsync had failed.
    Now the step's waiters are refused with that error and its records appended."""
    h, journal, persistence = _harness()

    def failing_sync() -> None:
        raise OSError(5, "Input/output error")

    persistence.before_flush = failing_sync
    h.send(h.producer("orders", "queue"), b"x", durable=True)
    heard: list[BaseException | None] = []
    persistence.when_stored(heard.append)
    _step(persistence)
    assert len(heard) == 1
    assert isinstance(heard[0], OSError)
    assert any(isinstance(r, AddMessage) for r in journal.records())
    journal.complete()
    assert len(heard) == 1  # told once
