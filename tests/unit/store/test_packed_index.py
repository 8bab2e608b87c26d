"""Issue 23 (recovery, seventh pass): the open keeps a message's usual pair (its
AddMessage, then its one AddRef) in its segment's `_Pack`, two slots of an array, not
two `_Loc`s and their dict entries. The journal behaves as before: an ack in a later
segment kills the packed records (and its tombstone lives while their segment does), a
torn tail cuts packed messages as any others, compaction after the open moves packed
records and keeps them readable, and every reopen gives the state replay gives."""

from __future__ import annotations

from pathlib import Path

from support import paired

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteQueue,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.store import FileJournal
from amqpbroker.store.locs import compact_find, pack_entries, pack_view


def _packed(journal: FileJournal) -> int:
    """Live packed records in the journal's index."""
    return sum(len(pack_entries(seg)) for seg in journal._segments)


def test_a_reopened_journal_holds_its_pairs_packed_and_gives_the_replayed_state(
    tmp_path: Path,
) -> None:
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 41)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        assert journal.segment_count > 3
        assert _packed(journal) == 80  # every pair: no `_Loc` for any of them
        # and in the compact index: no entry in the liveness dicts (tenth pass)
        assert not journal._live.messages
        assert not journal._live.refs
        compact = journal._live.compact
        assert compact is not None
        assert [m for pack in compact.packs for m in pack.ids] == list(range(1, 41))
        assert not any(seg.items for seg in journal._segments[1:])  # (the queue's is a `_Loc`)
        paired.same(journal.state(), paired.model(appends))
        assert journal.read_message(7) is not None  # read back from its packed span


def test_an_ack_in_a_later_segment_kills_the_packed_pair_and_its_tombstone_waits(
    tmp_path: Path,
) -> None:
    """A message acked in a later segment than its add: the packed records die, their
    segment's live bytes drop, and the AckRef is kept (a tombstone) while that segment is
    on disk; compaction then deletes the segment and the tombstone can go."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 21)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path, max_segment_bytes=paired.SEGMENT) as journal:
        second = journal._segments[1]
        pack = journal._packs[2]
        assert pack is not None
        in_second = list(pack_view(pack)[0])
        assert in_second  # messages packed in segment 2
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in in_second]
        journal.append(acks, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()  # the acks indexed: the packed pairs die
        assert all(m not in journal._live.messages for m in in_second)
        compact = journal._live.compact
        assert compact is not None
        assert all(compact_find(compact, m) < 0 for m in in_second)
        assert second.live_bytes == 0
        tombstones = journal._targeted_by[second]
        assert len(tombstones) == len(in_second)  # each AckRef must outlive segment 2
        assert journal._segments[-1].live_bytes >= sum(t.size for t in tombstones)
        journal.compact()
        assert second not in journal._segments  # no live bytes left: deleted
        assert journal._packs[2] is None  # its pack went with it
        assert not journal._targets  # and the tombstones aimed at it are not needed
        appends.append(acks)
    with paired.open_journal(tmp_path) as journal:
        paired.same(journal.state(), paired.model(appends))


def test_updates_and_acks_of_packed_references_keep_their_order_and_counts(
    tmp_path: Path,
) -> None:
    """A packed reference later counted (B-095), one acked, one added to a second queue:
    the state (order of each queue, counts) is replay's, at this open and the next."""
    appends = [paired.QUEUE, [AddQueue(name="r", address="r", routing_type=RoutingType.ANYCAST)]]
    appends += [paired.message(i) for i in range(1, 16)]
    appends.append([UpdateDeliveryCount(queue="q", msg_id=3, delivery_count=2)])
    appends.append([AckRef(queue="q", msg_id=5), AddRef(queue="r", msg_id=4)])
    appends.append(paired.message(16))
    paired.write(tmp_path, appends)
    for _ in range(2):
        with paired.open_journal(tmp_path) as journal:
            state = journal.state()
        paired.same(state, paired.model(appends))
        assert [row[1] for row in state.ref_rows("q")] == [i for i in range(1, 17) if i != 5]
        assert ("q", 3, 2, 0) in state.ref_rows("q")
        assert state.ref_rows("r") == [("r", 4, 0, 0)]


def test_compaction_after_the_open_moves_packed_records_and_keeps_them_readable(
    tmp_path: Path,
) -> None:
    """Compaction after recovery: most messages acked, the segments rewritten; the
    packed survivors are in the new file (their spans moved), read back from there, and
    acked afterwards as usual; every reopen gives replay's state."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    keep = {7, 23, 41, 59}
    with paired.open_journal(
        tmp_path, max_segment_bytes=paired.SEGMENT, compact_live_ratio=0.5
    ) as journal:
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
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
    paired.same(state, paired.model(appends))
    assert [row[1] for row in state.ref_rows()] == [7, 23, 59]


def test_a_torn_tail_cuts_packed_messages_as_any_others(tmp_path: Path) -> None:
    """The last append cut short: the open truncates it; the pairs before it are packed
    and whole, the cut one is not there, and appends after the open replay after them."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 6)]
    paired.write(tmp_path, appends)
    last = sorted(tmp_path.glob("journal-*.seg"))[-1]
    size = last.stat().st_size
    with last.open("r+b") as f:
        f.truncate(size - 100)  # into message 5's pair
    model = paired.model(appends[:-1])
    with paired.open_journal(tmp_path) as journal:
        assert 5 not in journal._live.messages
        assert _packed(journal) == 8
        paired.same(journal.state(), model)
        journal.append(paired.message(6), sync=True)
        journal.flush()
    with paired.open_journal(tmp_path) as journal:
        paired.same(journal.state(), paired.model([*appends[:-1], paired.message(6)]))


# --- the compact index (issue 23, tenth pass) ----------------------------------------


def _compact(journal: FileJournal) -> list[int]:
    """The ids only the compact index holds (no liveness dict entry)."""
    compact = journal._live.compact
    assert compact is not None
    found = []
    for pack in compact.packs:
        ids, out, _, _ = pack_view(pack)  # (an unloaded pack's rebuilt: eleventh pass)
        found += [m for i, m in enumerate(ids) if not out[i]]
    return found


def test_ids_not_increasing_within_a_pack_take_the_dicts_and_keep_their_order(
    tmp_path: Path,
) -> None:
    """Ids out of order (a transaction's messages committed after later ones): a pair
    whose id is not above every id packed before goes into the liveness dicts; the
    queue's order is the file's, the state replay's, and each is read back and acked."""
    ids = [1, 2, 9, 3, 4, 10, 5, 11]
    appends = [paired.QUEUE] + [paired.message(i) for i in ids]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        assert _compact(journal) == [1, 2, 9, 10, 11]
        assert sorted(journal._live.messages) == [3, 4, 5]
        state = journal.state()
        paired.same(state, paired.model(appends))
        assert [row[1] for row in state.ref_rows("q")] == ids
        for msg_id in ids:
            row = journal.read_message(msg_id)
            assert row is not None
            assert row[0] == msg_id
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in (9, 3, 11)]
        journal.append(acks, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()
        assert _compact(journal) == [1, 2, 10]
        assert journal.read_message(9) is None
        assert journal.read_message(3) is None
        appends.append(acks)
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
    paired.same(state, paired.model(appends))
    assert [row[1] for row in state.ref_rows("q")] == [1, 2, 4, 10, 5]


def test_an_ack_of_a_compact_pair_after_recovery_kills_it_and_survives_a_reopen(
    tmp_path: Path,
) -> None:
    """After the open (and `state()`), an ack of a message only the compact index holds:
    the pair moves into the dicts and dies there (its segment's live bytes drop, the
    AckRef is a tombstone while the pair's segment is on disk); a count on another one
    (B-095) keeps its place; the next open gives replay's state."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 21)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path, max_segment_bytes=paired.SEGMENT) as journal:
        journal.state()
        first = journal._segments[0]
        live_before = first.live_bytes
        later: list[Record] = [
            AckRef(queue="q", msg_id=2),
            UpdateDeliveryCount(queue="q", msg_id=3, delivery_count=4),
        ]
        journal.append(later, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()
        assert 2 not in _compact(journal)
        assert 2 not in journal._live.messages
        assert first.live_bytes < live_before
        assert first in journal._targeted_by  # the ack outlives message 2's segment
        assert 3 in journal._live.messages  # counted: in the dicts now
        assert journal.read_message(2) is None
        row = journal.read_message(3)
        assert row is not None
        assert row[0] == 3
        appends.append(later)
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
    paired.same(state, paired.model(appends))
    assert [row[1] for row in state.ref_rows("q")] == [1, *range(3, 21)]
    assert state.ref_rows("q")[1] == ("q", 3, 4, 0)


def test_compaction_over_the_compact_index_moves_its_pairs_and_drops_deleted_packs(
    tmp_path: Path,
) -> None:
    """Compaction after the open: segments all acked are deleted (their packs' ids go
    with them), mostly dead ones are rewritten; the compact index still finds the
    survivors by id where compaction put them, and acks them afterwards."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    keep = {5, 33, 34, 58}
    with paired.open_journal(
        tmp_path, max_segment_bytes=paired.SEGMENT, compact_live_ratio=0.5
    ) as journal:
        journal.state()
        packs = [p for p in journal._packs if p is not None and p.count]
        acks: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(1, 61) if i not in keep]
        journal.append(acks, sync=True)
        journal.flush()
        result = journal.compact()
        assert result.segments_deleted
        dropped = [p for p in packs if journal._packs[p.number] is None]
        assert dropped
        assert all(not p.ids and not p.out for p in dropped)  # (their memory goes)
        assert sorted(journal._live.messages) == []  # the acks evicted and killed theirs
        assert sorted(_compact(journal)) == sorted(keep)
        for msg_id in keep:
            row = journal.read_message(msg_id)
            assert row is not None
            assert (row[0], row[3]) == (msg_id, bytes([msg_id]) * 500)
        appends.append(acks)
        late: list[Record] = [AckRef(queue="q", msg_id=33)]
        journal.append(late, sync=True)
        journal.flush()
        journal.compact()
        assert 33 not in _compact(journal)
        assert journal.read_message(33) is None
        appends.append(late)
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
    paired.same(state, paired.model(appends))
    assert [row[1] for row in state.ref_rows()] == [5, 34, 58]


def test_a_crash_after_a_partial_ack_of_compact_pairs_recovers_what_is_on_disk(
    tmp_path: Path,
) -> None:
    """Acks of compact pairs, the last append of them cut short by a crash (a torn
    tail): the open keeps the acks that are whole, and the pairs whose acks were cut
    are live again, in their places; acking those then, the next open has none."""
    appends = paired.acks_torn_by_a_crash(tmp_path)
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
        paired.same(state, paired.model(appends))
        assert [row[1] for row in state.ref_rows("q")] == list(range(11, 31))
        assert _compact(journal) == list(range(11, 31))
        again: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(11, 31)]
        journal.append(again, sync=True)
        journal.flush()
        appends.append(again)
    with paired.open_journal(tmp_path) as journal:
        assert journal.state().ref_rows() == []
        assert not _compact(journal)


def test_records_that_meet_compact_pairs_at_the_open_give_replays_order(
    tmp_path: Path,
) -> None:
    """At the open, records in later segments meet pairs of the compact index: a second
    queue, a schedule, a reference added again, a message added again, a queue deleted;
    each moves its pair into the dicts, and `state()` merges the two by place in the
    files: each queue's order is replay's (the re-added reference keeps its first
    place, as replay's dict keeps it)."""
    appends = [paired.QUEUE, [AddQueue(name="r", address="r", routing_type=RoutingType.ANYCAST)]]
    appends += [paired.message(i) for i in range(1, 9)]
    appends += [paired.message(i, "r") for i in range(9, 13)]
    appends.append(
        [
            AddRef(queue="r", msg_id=2),
            ScheduledDelivery(queue="q", msg_id=4, at_ms=77),
            AddRef(queue="q", msg_id=5, delivery_count=3),  # added again: first place
            AddMessage(msg_id=6, address="q", data=b"six"),  # added again: new body
        ]
    )
    appends += [paired.message(i) for i in range(13, 16)]
    appends.append([DeleteQueue(name="r")])
    appends.append([AddQueue(name="r", address="r", routing_type=RoutingType.ANYCAST)])
    appends.append(paired.message(16, "r"))
    paired.write(tmp_path, appends)
    model = paired.model(appends)
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
    paired.same(state, model)
    assert [row[1] for row in state.ref_rows("q")] == [*range(1, 9), 13, 14, 15]
    assert ("q", 4, 0, 77) in state.ref_rows("q")
    assert ("q", 5, 3, 0) in state.ref_rows("q")
    assert state.ref_rows("r") == [("r", 16, 0, 0)]
    assert state.messages[6].data == b"six"


def test_a_queue_whose_compact_pairs_were_all_evicted_keeps_the_files_order(
    tmp_path: Path,
) -> None:
    """A queue's one compact pair (10), a reference of an older message added to the
    queue after it (1, in the dicts), then the pair evicted by a second queue's
    reference: the queue holds nothing in the compact index, and its order is still the
    files' (10 before 1), not the dict's insertion order (found by the random journals
    of test_recovery_state)."""
    appends = [paired.QUEUE, [AddQueue(name="r", address="r", routing_type=RoutingType.ANYCAST)]]
    appends += [paired.message(1, "r"), paired.message(10)]
    appends.append([AddRef(queue="q", msg_id=1)])
    appends.append([AddRef(queue="r", msg_id=10)])
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        assert not _compact(journal)
        state = journal.state()
    paired.same(state, paired.model(appends))
    assert [row[1] for row in state.ref_rows("q")] == [10, 1]
