"""Issue 23 (recovery, seventh pass): the open keeps a message's usual pair (its
AddMessage, then its one AddRef) in its segment's `_Pack`, two slots of an array, not
two `_Loc`s and their dict entries. The journal behaves as before: an ack in a later
segment kills the packed records (and its tombstone lives while their segment does), a
torn tail cuts packed messages as any others, compaction after the open moves packed
records and keeps them readable, and every reopen gives the state replay gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddMessage,
    AddQueue,
    AddRef,
    Record,
    UpdateDeliveryCount,
)
from amqpbroker.store import FileJournal
from amqpbroker.store.journal import JournalState
from amqpbroker.store.locs import PACK_SHIFT, pack_entries

SEGMENT = 4096  # small segments: a few messages each


def _open(directory: Path, **kw: Any) -> FileJournal:
    return FileJournal(directory, fsync=lambda fd: None, auto_compact=False, **kw)


def _message(msg_id: int, queue: str = "q") -> list[Record]:
    return [
        AddMessage(msg_id=msg_id, address=queue, data=bytes([msg_id % 251]) * 500),
        AddRef(queue=queue, msg_id=msg_id),
    ]


def _write(directory: Path, appends: list[list[Record]]) -> None:
    with _open(directory, max_segment_bytes=SEGMENT) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()


def _model(appends: list[list[Record]]) -> JournalState:
    return JournalState.of(record for records in appends for record in records)


def _same(state: JournalState, model: JournalState) -> None:
    assert state.ref_rows() == model.ref_rows()
    assert {k: v.data for k, v in state.messages.items()} == {
        k: v.data for k, v in model.messages.items()
    }
    assert state.max_msg_id >= max(model.messages, default=0)


def _packed(journal: FileJournal) -> int:
    """Live packed records in the journal's index."""
    return sum(len(pack_entries(seg)) for seg in journal._segments)


_QUEUE: list[Record] = [AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)]


def test_a_reopened_journal_holds_its_pairs_packed_and_gives_the_replayed_state(
    tmp_path: Path,
) -> None:
    appends = [_QUEUE] + [_message(i) for i in range(1, 41)]
    _write(tmp_path, appends)
    with _open(tmp_path) as journal:
        assert journal.segment_count > 3
        assert _packed(journal) == 80  # every pair: no `_Loc` for any of them
        assert all(isinstance(item, int) for item in journal._live.messages.values())
        assert not any(seg.items for seg in journal._segments[1:])  # (the queue's is a `_Loc`)
        _same(journal.state(), _model(appends))
        assert journal.read_message(7) is not None  # read back from its packed span


def test_an_ack_in_a_later_segment_kills_the_packed_pair_and_its_tombstone_waits(
    tmp_path: Path,
) -> None:
    """A message acked in a later segment than its add: the packed records die, their
    segment's live bytes drop, and the AckRef is kept (a tombstone) while that segment is
    on disk; compaction then deletes the segment and the tombstone can go."""
    appends = [_QUEUE] + [_message(i) for i in range(1, 21)]
    _write(tmp_path, appends)
    with _open(tmp_path, max_segment_bytes=SEGMENT) as journal:
        second = journal._segments[1]
        in_second = [m for m, item in journal._live.messages.items() if item >> PACK_SHIFT == 2]
        assert in_second  # messages packed in segment 2
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in in_second]
        journal.append(acks, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()  # the acks indexed: the packed pairs die
        assert all(m not in journal._live.messages for m in in_second)
        assert second.live_bytes == 0
        tombstones = journal._targeted_by[second]
        assert len(tombstones) == len(in_second)  # each AckRef must outlive segment 2
        assert journal._segments[-1].live_bytes >= sum(t.size for t in tombstones)
        journal.compact()
        assert second not in journal._segments  # no live bytes left: deleted
        assert journal._packs[2] is None  # its pack went with it
        assert not journal._targets  # and the tombstones aimed at it are not needed
        appends.append(acks)
    with _open(tmp_path) as journal:
        _same(journal.state(), _model(appends))


def test_updates_and_acks_of_packed_references_keep_their_order_and_counts(
    tmp_path: Path,
) -> None:
    """A packed reference later counted (B-095), one acked, one added to a second queue:
    the state (order of each queue, counts) is replay's, at this open and the next."""
    appends = [_QUEUE, [AddQueue(name="r", address="r", routing_type=RoutingType.ANYCAST)]]
    appends += [_message(i) for i in range(1, 16)]
    appends.append([UpdateDeliveryCount(queue="q", msg_id=3, delivery_count=2)])
    appends.append([AckRef(queue="q", msg_id=5), AddRef(queue="r", msg_id=4)])
    appends.append(_message(16))
    _write(tmp_path, appends)
    for _ in range(2):
        with _open(tmp_path) as journal:
            state = journal.state()
        _same(state, _model(appends))
        assert [row[1] for row in state.ref_rows("q")] == [i for i in range(1, 17) if i != 5]
        assert ("q", 3, 2, 0) in state.ref_rows("q")
        assert state.ref_rows("r") == [("r", 4, 0, 0)]


def test_compaction_after_the_open_moves_packed_records_and_keeps_them_readable(
    tmp_path: Path,
) -> None:
    """Compaction after recovery: most messages acked, the segments rewritten; the
    packed survivors are in the new file (their spans moved), read back from there, and
    acked afterwards as usual; every reopen gives replay's state."""
    appends = [_QUEUE] + [_message(i) for i in range(1, 61)]
    _write(tmp_path, appends)
    keep = {7, 23, 41, 59}
    with _open(tmp_path, max_segment_bytes=SEGMENT, compact_live_ratio=0.5) as journal:
        journal.state()  # as the broker does first
        acks: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(1, 61) if i not in keep]
        journal.append(acks, sync=True)
        journal.flush()
        before = journal.segment_count
        result = journal.compact()
        assert result.segments_rewritten or result.segments_deleted
        assert journal.segment_count < before
        assert _packed(journal) == 2 * len(keep)
        for msg_id in keep:  # read from where compaction put it
            row = journal.read_message(msg_id)
            assert row is not None
            assert (row[0], row[3]) == (msg_id, bytes([msg_id]) * 500)
        appends.append(acks)
        late: list[Record] = [AckRef(queue="q", msg_id=41)]
        journal.append(late, sync=True)
        journal.flush()
        journal.compact()
        assert 41 not in journal._live.messages
        appends.append(late)
    with _open(tmp_path) as journal:
        state = journal.state()
    _same(state, _model(appends))
    assert [row[1] for row in state.ref_rows()] == [7, 23, 59]


def test_a_torn_tail_cuts_packed_messages_as_any_others(tmp_path: Path) -> None:
    """The last append cut short: the open truncates it; the pairs before it are packed
    and whole, the cut one is not there, and appends after the open replay after them."""
    appends = [_QUEUE] + [_message(i) for i in range(1, 6)]
    _write(tmp_path, appends)
    last = sorted(tmp_path.glob("journal-*.seg"))[-1]
    size = last.stat().st_size
    with last.open("r+b") as f:
        f.truncate(size - 100)  # into message 5's pair
    model = _model(appends[:-1])
    with _open(tmp_path) as journal:
        assert 5 not in journal._live.messages
        assert _packed(journal) == 8
        _same(journal.state(), model)
        journal.append(_message(6), sync=True)
        journal.flush()
    with _open(tmp_path) as journal:
        _same(journal.state(), _model([*appends[:-1], _message(6)]))
