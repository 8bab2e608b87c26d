"""Issue 23 item 4: `FileJournal.state()` builds recovery's `JournalState` from the index
the open computed (liveness applied once), and it equals what replaying the files into
`JournalState.of` gives, on randomized journals with torn and corrupt tails."""

from __future__ import annotations

import random
from pathlib import Path

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
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.store import FileJournal, JournalState
from amqpbroker.store.memory import MemoryJournal
from amqpbroker.store.segments import BATCH_END, _Bad, _check_frame, _frame

QUEUES = ("a", "b", "c")


def _record(rng: random.Random, next_id: list[int]) -> Record:
    queue = rng.choice(QUEUES)
    msg_id = rng.randint(1, next_id[0] + 1)
    kind = rng.random()
    if kind < 0.25:
        next_id[0] += 1
        return AddMessage(msg_id=next_id[0], address=queue, data=rng.randbytes(rng.randint(0, 40)))
    if kind < 0.5:
        return AddRef(queue=queue, msg_id=msg_id, delivery_count=rng.randint(0, 3))
    if kind < 0.65:
        return AckRef(queue=queue, msg_id=msg_id)
    if kind < 0.7:
        return UpdateDeliveryCount(queue=queue, msg_id=msg_id, delivery_count=rng.randint(1, 9))
    if kind < 0.75:
        return ScheduledDelivery(queue=queue, msg_id=msg_id, at_ms=rng.randint(1, 10**6))
    if kind < 0.82:
        return AddQueue(name=queue, address=queue, routing_type=RoutingType.ANYCAST)
    if kind < 0.85:
        return DeleteQueue(name=queue)
    if kind < 0.9:
        return AddAddress(name=queue, routing_types=(RoutingType.ANYCAST,))
    if kind < 0.92:
        return DeleteAddress(name=queue)
    if kind < 0.95:
        return PageCursor(queue=queue, page=rng.randint(0, 5), offset=rng.randint(0, 999))
    if kind < 0.97:
        offsets = tuple(sorted(rng.sample(range(1000), rng.randint(1, 4))))
        return PageSkip(queue=queue, page=rng.randint(0, 5), offsets=offsets)
    next_id[0] += 3  # an id skipped: max_msg_id comes from every record
    return AddRef(queue=queue, msg_id=next_id[0])


def _summary(state: JournalState) -> object:
    return (
        state.addresses,
        state.queues,
        state.page_cursors,
        state.page_skips,
        state.messages,
        state.refs(),
        [state.refs(q) for q in QUEUES],
        state.max_msg_id,
    )


def _write(directory: Path, rng: random.Random) -> None:
    next_id = [0]
    with FileJournal(
        directory, max_segment_bytes=rng.choice((300, 2000, 1 << 20)), fsync=lambda fd: None
    ) as journal:
        for _ in range(rng.randint(1, 40)):
            batch = [_record(rng, next_id) for _ in range(rng.randint(1, 8))]
            journal.append(batch, sync=rng.random() < 0.3)
        journal.flush()


def _damage(directory: Path, rng: random.Random) -> None:
    last = sorted(directory.glob("journal-*.seg"))[-1]
    data = bytearray(last.read_bytes())
    how = rng.choice(("none", "cut", "zeros", "flip"))
    if how == "cut" and len(data) > 20:
        data = data[: rng.randint(16, len(data) - 1)]
    elif how == "zeros":
        data += bytes(rng.randint(1, 30))
    elif how == "flip" and len(data) > 40:
        at = rng.randint(len(data) - 20, len(data) - 1)  # in the last record: a torn tail
        data[at] ^= 0xFF
    last.write_bytes(bytes(data))


def test_state_from_the_index_equals_replaying_the_files(tmp_path: Path) -> None:
    rng = random.Random(23)
    for n in range(60):
        directory = tmp_path / str(n)
        _write(directory, rng)
        _damage(directory, rng)
        with FileJournal(directory, fsync=lambda fd: None, auto_compact=False) as journal:
            fast = journal.state()
            again = journal.state()  # the open's records are used once: then the files
        with FileJournal(directory, read_only=True) as files:
            old = JournalState.of(files.replay())
        assert _summary(fast) == _summary(old), n
        assert _summary(again) == _summary(old), n


def test_after_an_append_state_reads_the_files(tmp_path: Path) -> None:
    """The index moves on with appends; `state()` then replays the files."""
    queue = AddQueue(name="a", address="a", routing_type=RoutingType.ANYCAST)
    with FileJournal(tmp_path, fsync=lambda fd: None) as journal:
        journal.append([queue, AddMessage(msg_id=1, address="a", data=b"x")], sync=True)
        journal.append([AddRef(queue="a", msg_id=1)], sync=True)
    with FileJournal(tmp_path, fsync=lambda fd: None) as journal:
        journal.append([AckRef(queue="a", msg_id=1)], sync=True)
        state = journal.state()
    assert state.queues == [queue]
    assert state.messages == {}
    assert state.refs() == []
    assert state.max_msg_id == 1


def test_the_frame_check_reads_the_crc_as_written() -> None:
    """`_check_frame` checks the crc over the frame's bytes as they lie (no repacking):
    a frame `_frame` wrote is sound, and any one byte changed anywhere makes it bad."""
    rng = random.Random(4)
    for _ in range(20):
        payload = rng.randbytes(rng.randint(0, 50))
        frame = _frame(int(AddRef.type_id), rng.choice((0, BATCH_END)), payload)
        assert _check_frame(frame, 0) == (len(frame), AddRef.type_id, frame[10])
        for at in range(len(frame)):
            damaged = bytearray(frame)
            damaged[at] ^= 1 << rng.randint(0, 7)
            assert isinstance(_check_frame(bytes(damaged), 0), _Bad), at


def test_a_page_skip_lives_until_its_queue_s_cursor_passes_it(tmp_path: Path) -> None:
    """Issue 23 (sliced walks): the positions a walk removed ahead of the cursor come back
    at a restart until a cursor passes the last of them (then compaction drops them); one
    journaled behind the cursor is dead at once; `DeleteQueue` ends them."""
    queue = AddQueue(name="a", address="a", routing_type=RoutingType.ANYCAST)
    steps: list[list[Record]] = [
        [queue, PageCursor(queue="a", page=2, offset=100)],
        [PageSkip(queue="a", page=2, offsets=(50, 90))],  # behind the cursor: dead
        [PageSkip(queue="a", page=2, offsets=(300, 200))],
        [PageSkip(queue="a", page=3, offsets=(40,))],
        [PageCursor(queue="a", page=2, offset=250)],
    ]
    with FileJournal(tmp_path, fsync=lambda fd: None) as journal:
        for step in steps:
            journal.append(step, sync=True)
        assert journal.state().page_skips == {"a": {2: [200, 300], 3: [40]}}
        journal.append([PageCursor(queue="a", page=2, offset=300)], sync=True)
    with FileJournal(tmp_path, fsync=lambda fd: None) as journal:
        assert journal.state().page_skips == {"a": {3: [40]}}
        journal.append([DeleteQueue(name="a")], sync=True)
        assert journal.state().page_skips == {}
    memory = MemoryJournal()
    for step in [*steps, [PageCursor(queue="a", page=2, offset=300)]]:
        memory.append(step, sync=True)
    memory.compact()
    assert [r for r in memory.replay() if isinstance(r, PageSkip)] == [steps[3][0]]
