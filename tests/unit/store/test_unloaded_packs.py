"""Issue 23 (recovery, eleventh pass): a pack of the compact index no rule touched keeps
only its summary after the open; its arrays are rebuilt from its segment when a lookup,
an eviction, compaction or a journal backlog's run wants them, at most `LOADED_MAX` of
them at a time. The journal behaves as with every pack loaded: every id is found, acks
kill the right records, compaction moves them, a backlog drains in order, and a crash
recovers what is on disk. `UNLOAD_MIN` is lowered so that these small segments unload."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import pytest
from support import journal_backlog, paired

from amqpbroker.core.records import AckRef, AddMessage, AddRef, Record
from amqpbroker.store import FileJournal, file_journal, locs
from amqpbroker.store.api import JournalError
from amqpbroker.store.locs import LOADED_MAX, compact_find, pack_view


@pytest.fixture(autouse=True)
def _unload_small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locs, "UNLOAD_MIN", 1)


def _packs(journal: FileJournal) -> list[locs._Pack]:
    compact = journal._live.compact
    assert compact is not None
    return list(compact.packs)


def _held(journal: FileJournal) -> list[int]:
    """The ids only the compact index holds, every pack loaded to read them."""
    found: list[int] = []
    for pack in _packs(journal):
        ids, out, _, _ = pack_view(pack)
        found += [m for i, m in enumerate(ids) if not out[i]]
    return found


def _loaded(journal: FileJournal) -> list[locs._Pack]:
    """Loaded packs no rule pinned: never more than `LOADED_MAX`."""
    return [p for p in _packs(journal) if p.loaded and not p.pinned]


def test_untouched_packs_are_unloaded_at_the_open_and_found_by_id(tmp_path: Path) -> None:
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        packs = _packs(journal)
        assert all(p.loaded for p in packs)  # (the bodies it read: until `state()`)
        compact = journal._live.compact
        assert compact is not None
        loader = compact.loader
        assert loader is not None
        loads: list[int] = []
        compact.loader = lambda pack: (loads.append(pack.number), loader(pack))[1]
        state = journal.state()
        assert not loads  # `state()` rebuilt none: it read them before they went
        assert len(packs) > LOADED_MAX + 2
        assert not any(p.loaded for p in packs)  # no array left: summaries only
        assert all(p.ids == p.spans == array("q") for p in packs)
        compact = journal._live.compact
        assert compact is not None
        for msg_id in range(1, 61):  # each found where the open put it, read back
            assert compact_find(compact, msg_id) >= 0
            row = journal.read_message(msg_id)
            assert row is not None
            assert (row[0], row[3]) == (msg_id, bytes([msg_id % 251]) * 500)
            assert len(_loaded(journal)) <= LOADED_MAX
        assert compact_find(compact, 61) < 0
        assert _held(journal) == list(range(1, 61))
        paired.same(state, paired.model(appends))


def test_the_state_of_unloaded_packs_is_runs_without_loading_them(tmp_path: Path) -> None:
    """Every message left in the file (a body budget of 0): `state()` reads the runs off
    the packs' summaries; a backlog's reads load one pack at a time."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path, body_budget=0) as journal:
        state = journal.state()
        assert not any(p.loaded for p in _packs(journal))  # nothing loaded for it
        runs = [part for _, parts in state.ref_parts() for part in parts]
        assert all(isinstance(part, locs.Run) for part in runs)
        assert sum(locs.run_bytes(r) for r in runs if isinstance(r, locs.Run)) == 60 * 500
        ids = [m for _, m, _, _ in state.ref_rows()]
        assert ids == list(range(1, 61))
        assert len(_loaded(journal)) <= LOADED_MAX


def test_an_ack_of_an_unloaded_pack_is_kept_in_its_summary(tmp_path: Path) -> None:
    """Twelfth pass: the ack loads the pack and its summary keeps the change (the pair
    taken, its records dead), which a rebuild applies: the pack is not pinned."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        journal.state()
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in (3, 30)]
        journal.append(acks, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()
        appends.append(acks)
        touched = [p for p in _packs(journal) if p.taken]
        assert len(touched) == 2  # the two packs the acks met
        assert all(len(p.dead) == 2 and not p.pinned for p in touched)
        for pack in _packs(journal):  # every pack unloaded, then rebuilt: changes kept
            _drop(journal, pack)
        assert not any(p.loaded for p in _packs(journal))
        assert journal.read_message(3) is None
        assert journal.read_message(30) is None
        assert journal.read_message(4) is not None
        assert 4 in _held(journal)
        assert 3 not in _held(journal)
        assert len(_loaded(journal)) <= LOADED_MAX
    with paired.open_journal(tmp_path) as journal:
        paired.same(journal.state(), paired.model(appends))


def test_a_pack_changed_past_its_summarys_room_is_pinned(tmp_path: Path) -> None:
    """More changes than `_CHANGES_MAX` (a drain's front): the pack keeps its arrays until
    its segment goes, as before the twelfth pass."""
    n = locs._CHANGES_MAX
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, n + 2)]
    with paired.open_journal(tmp_path, max_segment_bytes=1 << 20) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with paired.open_journal(tmp_path, max_segment_bytes=1 << 20, body_budget=0) as journal:
        journal.state()
        (pack,) = _packs(journal)
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in range(1, n + 1)]
        journal.append(acks, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()
        appends.append(acks)
        assert pack.pinned
        assert pack.loaded
        assert journal.read_message(n + 1) is not None
    with paired.open_journal(tmp_path) as journal:
        paired.same(journal.state(), paired.model(appends))


def _drop(journal: FileJournal, pack: locs._Pack) -> None:
    """Unload `pack` if it is loaded and not pinned (as `LOADED_MAX` would)."""
    compact = journal._live.compact
    assert compact is not None
    with compact.lock:
        if pack.loaded and not pack.pinned:
            compact.loaded.pop(pack.number, None)
            locs._unload(pack)


def test_compaction_over_unloaded_packs_moves_their_pairs(tmp_path: Path) -> None:
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    keep = {5, 33, 34, 58}
    with paired.open_journal(tmp_path, compact_live_ratio=0.5) as journal:
        journal.state()
        acks: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(1, 61) if i not in keep]
        journal.append(acks, sync=True)
        journal.flush()
        appends.append(acks)
        assert journal.compact().segments_deleted
        assert sorted(_held(journal)) == sorted(keep)
        for msg_id in keep:
            row = journal.read_message(msg_id)
            assert row is not None
            assert row[3] == bytes([msg_id]) * 500
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
    paired.same(state, paired.model(appends))
    assert [row[1] for row in state.ref_rows()] == sorted(keep)


def test_a_record_in_a_packs_range_that_is_not_a_pair_keeps_it_loaded(tmp_path: Path) -> None:
    """Ids out of order (5 before 3 and 4: those take the dicts) and a message added and
    acked at once between two pairs (short-lived): a rebuild from the file could not tell
    them from pairs, so their packs keep their arrays; the state is the replayed one."""
    appends: list[list[Record]] = [
        paired.QUEUE,
        paired.message(1),
        paired.message(2),
        paired.message(5),
    ]
    appends += [paired.message(3), paired.message(4), paired.message(6)]
    appends += [[*paired.message(7), AckRef(queue="q", msg_id=7)], paired.message(8)]
    with paired.open_journal(tmp_path, max_segment_bytes=1 << 20) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with paired.open_journal(tmp_path, max_segment_bytes=1 << 20) as journal:
        packs = _packs(journal)
        assert len(packs) == 1
        assert packs[0].loaded
        assert packs[0].pinned
        paired.same(journal.state(), paired.model(appends))


def test_appends_after_the_open_are_not_read_into_a_rebuilt_pack(tmp_path: Path) -> None:
    """The current segment's pack unloaded, an ack of one of its pairs appended to that
    same segment: the rebuild reads only what the open read, and the ack kills it."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 6)]
    with paired.open_journal(tmp_path, max_segment_bytes=1 << 20) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with paired.open_journal(tmp_path, max_segment_bytes=1 << 20, body_budget=0) as journal:
        journal.state()  # (every body left in the file: nothing loads the pack)
        (pack,) = _packs(journal)
        assert not pack.loaded
        more: list[list[Record]] = [paired.message(6), [AckRef(queue="q", msg_id=2)]]
        for records in more:
            journal.append(records, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()
        appends += more
        assert pack.taken == [1]
        assert not pack.pinned
        _drop(journal, pack)
        assert list(pack_view(pack)[0]) == [1, 2, 3, 4, 5]  # not message 6
        assert journal.read_message(2) is None
        assert journal.read_message(6) is not None
    with paired.open_journal(tmp_path) as journal:
        paired.same(journal.state(), paired.model(appends))


def test_a_crash_with_unloaded_packs_recovers_what_is_on_disk(tmp_path: Path) -> None:
    appends = paired.acks_torn_by_a_crash(tmp_path)
    with paired.open_journal(tmp_path) as journal:
        state = journal.state()
        assert any(not p.loaded for p in _packs(journal))
        paired.same(state, paired.model(appends))
        assert _held(journal) == list(range(11, 31))


def test_a_rebuild_that_does_not_give_the_packed_pairs_back_fails_loudly(
    tmp_path: Path,
) -> None:
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 31)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path, body_budget=0) as journal:
        pack = _packs(journal)[1]
        assert not pack.loaded
        pack.digest += 1  # as if the file no longer held what the open packed
        compact = journal._live.compact
        assert compact is not None
        with pytest.raises(JournalError, match="could not be rebuilt"):
            compact_find(compact, pack.first)


@pytest.mark.parametrize("damage", ["remove", "empty", "cut"])
def test_a_rebuild_from_a_segment_removed_or_cut_after_the_open_is_a_journal_error(
    tmp_path: Path, damage: str
) -> None:
    """Ninth attack pass: whatever happened to the file, the rebuild's one error is
    JournalError (what `store/backlog.py` passes as lost), not an OSError or mmap's
    ValueError escaping to the loop."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 31)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path, body_budget=0) as journal:
        pack = _packs(journal)[1]
        assert not pack.loaded
        path = pack.seg.path
        if damage == "remove":
            path.unlink()
        else:
            os.truncate(path, 0 if damage == "empty" else 100)
        compact = journal._live.compact
        assert compact is not None
        loader = compact.loader
        assert loader is not None
        loads: list[int] = []
        compact.loader = lambda pack: (loads.append(pack.number), loader(pack))[1]
        with pytest.raises(JournalError, match="could not be rebuilt"):
            compact_find(compact, pack.first)
        assert not pack.loaded
        # Wanted again (every ack, lookup or backlog step of its ids): the same error at
        # once, not another walk of the file under the index's lock.
        with pytest.raises(JournalError, match="could not be rebuilt"):
            compact_find(compact, pack.last)
        assert loads == [pack.number]


def test_an_ack_into_a_pack_that_cannot_be_rebuilt_does_not_fail_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ninth attack pass: an acknowledgement of a message whose unloaded pack's segment
    was cut after the open. It was written and synced; indexing it raised JournalError in
    the writer thread, which failed the journal, and as the ack stayed unindexed every
    later sync that indexed failed again: every other durable append refused, for good.
    Now the index cannot tell, so the pack's pairs stay live, the ack is kept (a live
    record, for a restart to apply), it is logged once, and the journal goes on."""
    monkeypatch.setattr(file_journal, "INDEX_EVERY_SYNCS", 3)
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        journal.state()
        pack = _packs(journal)[2]
        assert not pack.loaded
        os.truncate(pack.seg.path, 100)
        steps: list[list[Record]] = [
            paired.message(100),
            [AckRef(queue="q", msg_id=pack.first)],
            *[paired.message(101 + k) for k in range(8)],
        ]
        for records in steps:
            journal.append(records, sync=True)
            journal.flush(timeout=10)  # raises JournalFailed if the journal failed
        with journal._lock:
            journal._index_synced()
        assert journal.failure is None
        assert not journal._live.unknown
        for msg_id in (100, 108, 1, 60):  # the new ones, and other packs' alike
            assert journal.read_message(msg_id) is not None


def test_compaction_passes_a_run_with_a_segment_cut_after_the_open(tmp_path: Path) -> None:
    """Ninth attack pass: compaction meets an unloaded pack whose segment was cut: that
    run is passed (logged once, nothing of it moved) and the others are still compacted;
    it had raised out of `compact()` (the auto-compaction thread logged it and compacted
    nothing more, so the journal only grew)."""
    appends = [paired.QUEUE] + [paired.message(i) for i in range(1, 61)]
    paired.write(tmp_path, appends)
    with paired.open_journal(tmp_path) as journal:
        journal.state()
        packs = _packs(journal)
        victim = packs[2]
        os.truncate(victim.seg.path, 100)
        acks: list[Record] = [
            AckRef(queue="q", msg_id=m)
            for m in range(1, 61)
            if not victim.first <= m <= victim.last
        ]
        journal.append(acks, sync=True)
        journal.flush()
        before = journal.segment_count
        result = journal.compact()
        assert result.segments_deleted > 0
        assert journal.segment_count < before
        assert victim.seg.path.exists()  # passed, as it is
        assert journal.failure is None
        result = journal.compact()  # again: the same run passed, no error


def test_a_journal_backlog_drains_unloaded_packs_in_order(tmp_path: Path) -> None:
    """A restart with most of a queue left in the journal (`store/backlog.py`), over
    several segments whose packs are unloaded: the backlog's runs load one pack at a time
    as it reaches it, and it drains in order, each message once; acked, the packs go."""
    budget, n = journal_backlog.BUDGET, journal_backlog.N
    journal_backlog.write(tmp_path / "journal")
    # (the segments of a writer with 64 KiB segments: written again, as a broker would)
    small = tmp_path / "small"
    with paired.open_journal(tmp_path / "journal") as journal:
        records = list(journal.replay())
    with paired.open_journal(small / "journal", max_segment_bytes=64 * 1024) as journal:
        for k, record in enumerate(records):
            if isinstance(record, AddRef) and isinstance(records[k - 1], AddMessage):
                continue  # (appended with its message, as a broker does)
            pair = records[k : k + 2] if isinstance(record, AddMessage) else [record]
            journal.append(pair, sync=False)
        journal.flush()
    r = journal_backlog.Restarted(small, budget)
    packs = _packs(r.journal)
    assert len(packs) > LOADED_MAX + 1
    unloaded = sum(not p.loaded for p in packs)
    assert unloaded >= len(packs) - LOADED_MAX - 1
    compact = r.journal._live.compact
    assert compact is not None
    assert compact.loader is not None
    loads: list[int] = []
    loader = compact.loader

    def counted(pack: locs._Pack) -> None:
        loads.append(pack.number)
        loader(pack)

    compact.loader = counted
    peak = 0
    got: list[tuple[str, int]] = []
    while True:
        more = r.drain(limit=20)
        got += more
        peak = max(peak, len(_loaded(r.journal)))
        if not more:
            break
    assert got == journal_backlog.expected(range(1, n + 1))
    assert peak <= LOADED_MAX
    assert len(set(loads)) >= unloaded  # each read back from its file as it was reached
    r.close()
