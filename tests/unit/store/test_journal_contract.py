"""The journal contract (STYLE.md section 7), run against `MemoryJournal` and `FileJournal`.

Round trip of every record type, append order, liveness after acks and deletes, the
persisted delivery count (B-095), compaction, reopen. The file journal runs with tiny
segments so every test crosses segment rolls; its writer thread is real, waits are bounded.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddAddress,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteAddress,
    DeleteQueue,
    PageCursor,
    PageSkip,
    Record,
    RecordType,
    ScheduledDelivery,
    TxCommit,
    TxPrepare,
    TxRollback,
    UpdateDeliveryCount,
)
from amqpbroker.store import (
    CodecError,
    FileJournal,
    Journal,
    JournalClosed,
    JournalFailed,
    JournalState,
    MemoryJournal,
    RecoveredRef,
)

ANYCAST = RoutingType.ANYCAST
MULTICAST = RoutingType.MULTICAST


class Harness:
    """One journal under test, and how to reopen it as a restarted broker would."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.directory = directory
        self.disk_full = False  # the file journal's fsync fails with ENOSPC while set
        self.journal: Journal = self._open()

    def _open(self) -> Journal:
        if self.kind == "memory":
            return MemoryJournal()
        return FileJournal(
            self.directory, max_segment_bytes=1024, auto_compact=False, fsync=self._fsync
        )

    def _fsync(self, fd: int) -> None:
        if self.disk_full:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.fdatasync(fd)

    def fill_disk(self) -> None:
        """Make the journal fail at its next write, as a full disk would."""
        self.disk_full = True
        if isinstance(self.journal, MemoryJournal):
            self.journal.fail(OSError(errno.ENOSPC, "No space left on device"))

    def free_disk(self) -> None:
        """The cause goes away; the file journal finds out by itself (its retry)."""
        self.disk_full = False
        if isinstance(self.journal, MemoryJournal):
            self.journal.resume()

    def reopen(self) -> Journal:
        old = self.journal
        held = list(old.replay())
        old.close()
        self.journal = self._open()
        if self.kind == "memory":  # the process "survives": what was held is appended again
            self.journal.append(held, sync=True)
        return self.journal


@pytest.fixture(params=["memory", "file"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(request.param, tmp_path / "journal")
    yield h
    h.journal.close()


def append(journal: Journal, records: Sequence[Record], *, sync: bool = True) -> None:
    """Append and wait (bounded) for the callback; fail on an error."""
    done = threading.Event()
    outcome: list[JournalFailed | None] = []

    def on_durable(error: JournalFailed | None) -> None:
        outcome.append(error)
        done.set()

    journal.append(records, sync=sync, on_durable=on_durable)
    assert done.wait(5), "on_durable was not called"
    assert outcome == [None]


def message(msg_id: int, *, size: int = 40, address: str = "orders") -> AddMessage:
    return AddMessage(msg_id=msg_id, address=address, data=bytes([msg_id % 256]) * size)


def send(journal: Journal, msg_id: int, *queues: str, size: int = 40) -> None:
    append(journal, [message(msg_id, size=size), *(AddRef(queue=q, msg_id=msg_id) for q in queues)])


def state(journal: Journal) -> JournalState:
    return JournalState.of(journal.replay())


EVERY_TYPE: list[Record] = [
    AddAddress(name="orders", routing_types=(ANYCAST, MULTICAST)),
    AddQueue(
        name="orders",
        address="orders",
        routing_type=ANYCAST,
        durable=True,
        filter="color = 'red' AND size > 3",
        auto_created=True,
        extra={"max-consumers": -1, "exclusive": True, "ring": None, "nested": {"k": (1, 2.5)}},
    ),
    AddMessage(
        msg_id=2**40,
        address="orders",
        durable=True,
        data=bytes(range(256)) * 3,
        expiration_ms=1_700_000_000_123,
        first_ts=1_600_000_000_000,
        priority=9,
    ),
    AddRef(queue="orders", msg_id=2**40, delivery_count=2),
    UpdateDeliveryCount(queue="orders", msg_id=2**40, delivery_count=3),
    ScheduledDelivery(queue="orders", msg_id=2**40, at_ms=1_700_000_005_000),
    AckRef(queue="orders", msg_id=2**40),
    PageCursor(queue="orders", page=3, offset=4096),
    PageSkip(queue="orders", page=3, offsets=(5120, 6144)),
    DeleteQueue(name="orders"),
    DeleteAddress(name="orders"),
    TxPrepare(txn_id=7),
    TxCommit(txn_id=7),
    TxRollback(txn_id=-1),
    AddAddress(name="ünïcödé.adréss", routing_types=()),
]


def test_every_record_type_round_trips(harness: Harness) -> None:
    """Each record type comes back from replay equal to what was appended."""
    assert {type(r).type_id for r in EVERY_TYPE} == set(RecordType)
    append(harness.journal, EVERY_TYPE)
    assert list(harness.journal.replay()) == EVERY_TYPE


def test_replay_keeps_append_order_across_appends_and_sync_modes(harness: Harness) -> None:
    """Records replay in append order, sync or not, across segment rolls."""
    expected: list[Record] = []
    for i in range(60):
        batch: list[Record] = [message(i), AddRef(queue="q", msg_id=i)]
        harness.journal.append(batch, sync=i % 3 == 0)
        expected.extend(batch)
    harness.journal.flush(timeout=5)
    assert list(harness.journal.replay()) == expected


def test_on_durable_is_called_once_per_append(harness: Harness) -> None:
    calls: list[JournalFailed | None] = []
    all_called = threading.Event()

    def on_durable(error: JournalFailed | None) -> None:
        calls.append(error)
        if len(calls) == 20:
            all_called.set()

    for i in range(20):
        harness.journal.append([message(i)], sync=i % 2 == 0, on_durable=on_durable)
    assert all_called.wait(5)
    harness.journal.flush(timeout=5)
    assert calls == [None] * 20


def test_message_stays_live_until_every_queue_acks_it(harness: Harness) -> None:
    """A message is live while some AddRef for it has no AckRef."""
    journal = harness.journal
    send(journal, 1, "q1", "q2")
    send(journal, 2, "q1")
    append(journal, [AckRef(queue="q1", msg_id=1)], sync=False)
    assert sorted(state(journal).messages) == [1, 2]
    assert [r.queue for r in state(journal).refs() if r.msg_id == 1] == ["q2"]
    append(journal, [AckRef(queue="q2", msg_id=1)], sync=False)
    assert sorted(state(journal).messages) == [2]
    append(journal, [AckRef(queue="q1", msg_id=2)])
    assert state(journal).messages == {}
    assert state(journal).refs() == []
    assert state(journal).max_msg_id == 2  # new ids go above it


def test_last_persisted_delivery_count_and_schedule_win(harness: Harness) -> None:
    """B-095: after a restart each reference has its last persisted count."""
    journal = harness.journal
    send(journal, 1, "q")
    for count in (1, 2, 5):
        append(journal, [UpdateDeliveryCount(queue="q", msg_id=1, delivery_count=count)])
    append(journal, [ScheduledDelivery(queue="q", msg_id=1, at_ms=10_000)])
    append(journal, [ScheduledDelivery(queue="q", msg_id=1, at_ms=20_000)])
    expected = [RecoveredRef(queue="q", msg_id=1, delivery_count=5, scheduled_at_ms=20_000)]
    assert state(journal).refs() == expected
    harness.journal.compact()
    assert state(harness.reopen()).refs() == expected


def test_refs_come_back_in_arrival_order_per_queue(harness: Harness) -> None:
    journal = harness.journal
    for i in range(1, 30):
        send(journal, i, "a" if i % 2 else "b")
    for i in range(1, 30, 3):
        append(journal, [AckRef(queue="a" if i % 2 else "b", msg_id=i)], sync=False)
    journal.compact()
    refs = state(harness.reopen()).refs()
    for queue in ("a", "b"):
        ids = [r.msg_id for r in refs if r.queue == queue]
        assert ids == sorted(ids)
        assert ids == [i for i in range(1, 30) if ("a" if i % 2 else "b") == queue and i % 3 != 1]


def test_delete_queue_drops_its_references(harness: Harness) -> None:
    journal = harness.journal
    append(journal, [AddQueue(name="q1", address="a", routing_type=MULTICAST)])
    append(journal, [AddQueue(name="q2", address="a", routing_type=MULTICAST)])
    send(journal, 1, "q1", "q2")
    send(journal, 2, "q1")
    append(journal, [DeleteQueue(name="q1")])
    result = state(journal)
    assert [q.name for q in result.queues] == ["q2"]
    assert sorted(result.messages) == [1]
    assert [(r.queue, r.msg_id) for r in result.refs()] == [("q2", 1)]


def test_addresses_and_queues_replace_and_delete_by_name(harness: Harness) -> None:
    journal = harness.journal
    append(journal, [AddAddress(name="a", routing_types=(ANYCAST,))])
    append(journal, [AddAddress(name="a", routing_types=(ANYCAST, MULTICAST))])
    append(journal, [AddAddress(name="gone", routing_types=(ANYCAST,))])
    append(journal, [DeleteAddress(name="gone")])
    append(journal, [AddQueue(name="q", address="a", routing_type=ANYCAST, filter="x=1")])
    append(journal, [AddQueue(name="q", address="a", routing_type=ANYCAST, filter="x=2")])
    for result in (state(journal), state(harness.reopen())):
        assert result.addresses == [AddAddress(name="a", routing_types=(ANYCAST, MULTICAST))]
        assert [q.filter for q in result.queues] == ["x=2"]


def test_compaction_drops_dead_records_and_keeps_live_ones(harness: Harness) -> None:
    journal = harness.journal
    append(journal, [AddAddress(name="orders", routing_types=(ANYCAST,))])
    for i in range(60):
        send(journal, i, "q")
    for i in range(60):
        if i % 20:
            append(journal, [UpdateDeliveryCount(queue="q", msg_id=i, delivery_count=1)])
            append(journal, [AckRef(queue="q", msg_id=i)], sync=False)
    append(journal, [UpdateDeliveryCount(queue="q", msg_id=20, delivery_count=4)])
    before = state(journal)
    size_before = journal.size_bytes

    result = journal.compact()

    assert result.size_bytes_after == journal.size_bytes < size_before
    after = state(journal)
    assert after.messages == before.messages
    assert after.refs() == before.refs()
    assert after.addresses == before.addresses
    kept_messages = [r.msg_id for r in journal.replay() if isinstance(r, AddMessage)]
    assert kept_messages == [0, 20, 40]
    assert state(harness.reopen()).refs() == before.refs()


def test_compaction_of_an_empty_journal_does_nothing(harness: Harness) -> None:
    result = harness.journal.compact()
    assert result.size_bytes_after == result.size_bytes_before
    assert list(harness.journal.replay()) == []


def test_size_bytes_grows_with_appends(harness: Harness) -> None:
    before = harness.journal.size_bytes
    send(harness.journal, 1, "q", size=500)
    assert harness.journal.size_bytes >= before + 500


def test_record_that_cannot_be_encoded_raises_in_append(harness: Harness) -> None:
    bad = AddQueue(name="q", address="a", routing_type=ANYCAST, extra={"x": object()})
    with pytest.raises(CodecError):
        harness.journal.append([bad], sync=True)
    assert list(harness.journal.replay()) == []


def test_append_after_close_raises(harness: Harness) -> None:
    harness.journal.close()
    with pytest.raises(JournalClosed):
        harness.journal.append([message(1)], sync=True)


def test_a_working_journal_reports_no_failure(harness: Harness) -> None:
    send(harness.journal, 1, "q")
    assert harness.journal.failure is None
    harness.journal.flush(timeout=5)


def test_memory_journal_fail_fails_appends() -> None:
    """MemoryJournal.fail() drives a broker's disk-full path in tests."""
    journal = MemoryJournal()
    send(journal, 1, "q")
    journal.fail(OSError(28, "No space left on device"))
    errors: list[JournalFailed | None] = []
    journal.append([message(2)], sync=True, on_durable=errors.append)
    assert isinstance(errors[0], JournalFailed)
    assert isinstance(errors[0].__cause__, OSError)
    assert journal.failure is errors[0]
    with pytest.raises(JournalFailed):
        journal.flush()
    assert sorted(state(journal).messages) == [1]


def test_a_failed_journal_works_again_once_the_cause_goes(harness: Harness) -> None:
    """Issue 15 item 2: after a failure (disk full) the journal refuses what is waited for,
    keeps what nobody waited for, and takes appends again by itself once the disk has room;
    a restart replays what it reported done, and nothing it refused."""
    journal = harness.journal
    send(journal, 1, "q")
    send(journal, 2, "q")
    resumed = threading.Event()
    journal.on_resume(resumed.set)
    harness.fill_disk()
    refused: list[JournalFailed | None] = []
    answered = threading.Event()

    def on_durable(error: JournalFailed | None) -> None:
        refused.append(error)
        answered.set()

    journal.append([message(3), AddRef(queue="q", msg_id=3)], sync=True, on_durable=on_durable)
    assert answered.wait(5)
    assert isinstance(refused[0], JournalFailed)
    assert journal.failure is refused[0]
    journal.append([AckRef(queue="q", msg_id=1)], sync=False)  # nobody waits: held
    assert not resumed.is_set()
    harness.free_disk()
    assert resumed.wait(10), "the journal did not resume"
    assert journal.failure is None
    send(journal, 4, "q")
    assert sorted(state(harness.reopen()).messages) == [2, 4]


def _random_workload(seed: int) -> list[list[Record]]:
    import random

    rng = random.Random(seed)
    appends: list[list[Record]] = []
    live: list[tuple[str, int]] = []
    queues = ["a", "b", "c"]
    next_id = 1
    for _ in range(300):
        op = rng.random()
        if op < 0.4 or not live:
            targets = rng.sample(queues, rng.randint(1, 2))
            appends.append(
                [message(next_id, size=rng.randint(1, 120))]
                + [AddRef(queue=q, msg_id=next_id) for q in targets]
            )
            live.extend((q, next_id) for q in targets)
            next_id += 1
        elif op < 0.75:
            queue, msg_id = live.pop(rng.randrange(len(live)))
            appends.append([AckRef(queue=queue, msg_id=msg_id)])
        elif op < 0.9:
            queue, msg_id = rng.choice(live)
            appends.append(
                [UpdateDeliveryCount(queue=queue, msg_id=msg_id, delivery_count=rng.randint(1, 9))]
            )
        elif op < 0.97:
            queue, msg_id = rng.choice(live)
            appends.append(
                [ScheduledDelivery(queue=queue, msg_id=msg_id, at_ms=rng.randint(1, 99))]
            )
        else:
            gone = rng.choice(queues)
            appends.append(
                [DeleteQueue(name=gone), AddQueue(name=gone, address="x", routing_type=ANYCAST)]
            )
            live = [(q, m) for q, m in live if q != gone]
    return appends


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_with_compactions_keeps_the_state(harness: Harness, seed: int) -> None:
    """Whatever mix of records, compacting at any point never changes the replayed state."""
    model = JournalState()
    for i, records in enumerate(_random_workload(seed)):
        harness.journal.append(records, sync=i % 4 == 0)
        for record in records:
            model.apply(record)
        if i % 37 == 36:
            harness.journal.flush(timeout=5)
            harness.journal.compact()
    harness.journal.flush(timeout=5)
    harness.journal.compact()
    for result in (state(harness.journal), state(harness.reopen())):
        assert result.messages == model.messages
        assert result.refs() == model.refs()
        assert result.queues == model.queues
