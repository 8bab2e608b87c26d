"""Issue 23 (recovery, eleventh pass): a pack of the compact index no rule touched keeps
only its summary after the open; its arrays are rebuilt from its segment when a lookup,
an eviction, compaction or a journal backlog's run wants them, at most `LOADED_MAX` of
them at a time. The journal behaves as with every pack loaded: every id is found, acks
kill the right records, compaction moves them, a backlog drains in order, and a crash
recovers what is on disk. `UNLOAD_MIN` is lowered so that these small segments unload."""

from __future__ import annotations

import importlib.util
from array import array
from pathlib import Path
from typing import Any

import pytest

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.store import FileJournal, locs
from amqpbroker.store.api import JournalError
from amqpbroker.store.journal import JournalState
from amqpbroker.store.locs import LOADED_MAX, compact_find, pack_view

SEGMENT = 4096  # small segments: a few messages each


@pytest.fixture(autouse=True)
def _unload_small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locs, "UNLOAD_MIN", 1)


def _open(directory: Path, **kw: Any) -> FileJournal:
    return FileJournal(directory, fsync=lambda fd: None, auto_compact=False, **kw)


def _message(msg_id: int, queue: str = "q") -> list[Record]:
    return [
        AddMessage(msg_id=msg_id, address=queue, data=bytes([msg_id % 251]) * 500),
        AddRef(queue=queue, msg_id=msg_id),
    ]


_QUEUE: list[Record] = [AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)]


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
    appends = [_QUEUE] + [_message(i) for i in range(1, 61)]
    _write(tmp_path, appends)
    with _open(tmp_path) as journal:
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
        _same(state, _model(appends))


def test_the_state_of_unloaded_packs_is_runs_without_loading_them(tmp_path: Path) -> None:
    """Every message left in the file (a body budget of 0): `state()` reads the runs off
    the packs' summaries; a backlog's reads load one pack at a time."""
    appends = [_QUEUE] + [_message(i) for i in range(1, 61)]
    _write(tmp_path, appends)
    with _open(tmp_path, body_budget=0) as journal:
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
    appends = [_QUEUE] + [_message(i) for i in range(1, 61)]
    _write(tmp_path, appends)
    with _open(tmp_path) as journal:
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
    with _open(tmp_path) as journal:
        _same(journal.state(), _model(appends))


def test_a_pack_changed_past_its_summarys_room_is_pinned(tmp_path: Path) -> None:
    """More changes than `_CHANGES_MAX` (a drain's front): the pack keeps its arrays until
    its segment goes, as before the twelfth pass."""
    n = locs._CHANGES_MAX
    appends = [_QUEUE] + [_message(i) for i in range(1, n + 2)]
    with _open(tmp_path, max_segment_bytes=1 << 20) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with _open(tmp_path, max_segment_bytes=1 << 20, body_budget=0) as journal:
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
    with _open(tmp_path) as journal:
        _same(journal.state(), _model(appends))


def _drop(journal: FileJournal, pack: locs._Pack) -> None:
    """Unload `pack` if it is loaded and not pinned (as `LOADED_MAX` would)."""
    compact = journal._live.compact
    assert compact is not None
    with compact.lock:
        if pack.loaded and not pack.pinned:
            compact.loaded.pop(pack.number, None)
            locs._unload(pack)


def test_compaction_over_unloaded_packs_moves_their_pairs(tmp_path: Path) -> None:
    appends = [_QUEUE] + [_message(i) for i in range(1, 61)]
    _write(tmp_path, appends)
    keep = {5, 33, 34, 58}
    with _open(tmp_path, compact_live_ratio=0.5) as journal:
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
    with _open(tmp_path) as journal:
        state = journal.state()
    _same(state, _model(appends))
    assert [row[1] for row in state.ref_rows()] == sorted(keep)


def test_a_record_in_a_packs_range_that_is_not_a_pair_keeps_it_loaded(tmp_path: Path) -> None:
    """Ids out of order (5 before 3 and 4: those take the dicts) and a message added and
    acked at once between two pairs (short-lived): a rebuild from the file could not tell
    them from pairs, so their packs keep their arrays; the state is the replayed one."""
    appends: list[list[Record]] = [_QUEUE, _message(1), _message(2), _message(5)]
    appends += [_message(3), _message(4), _message(6)]
    appends += [[*_message(7), AckRef(queue="q", msg_id=7)], _message(8)]
    with _open(tmp_path, max_segment_bytes=1 << 20) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with _open(tmp_path, max_segment_bytes=1 << 20) as journal:
        packs = _packs(journal)
        assert len(packs) == 1
        assert packs[0].loaded
        assert packs[0].pinned
        _same(journal.state(), _model(appends))


def test_appends_after_the_open_are_not_read_into_a_rebuilt_pack(tmp_path: Path) -> None:
    """The current segment's pack unloaded, an ack of one of its pairs appended to that
    same segment: the rebuild reads only what the open read, and the ack kills it."""
    appends = [_QUEUE] + [_message(i) for i in range(1, 6)]
    with _open(tmp_path, max_segment_bytes=1 << 20) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
    with _open(tmp_path, max_segment_bytes=1 << 20, body_budget=0) as journal:
        journal.state()  # (every body left in the file: nothing loads the pack)
        (pack,) = _packs(journal)
        assert not pack.loaded
        more: list[list[Record]] = [_message(6), [AckRef(queue="q", msg_id=2)]]
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
    with _open(tmp_path) as journal:
        _same(journal.state(), _model(appends))


def test_a_crash_with_unloaded_packs_recovers_what_is_on_disk(tmp_path: Path) -> None:
    appends = [_QUEUE] + [_message(i) for i in range(1, 31)]
    _write(tmp_path, appends)
    with _open(tmp_path) as journal:
        journal.state()
        whole: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(1, 11)]
        cut: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(11, 21)]
        journal.append(whole, sync=True)
        journal.append(cut, sync=True)
        journal.flush()
    last = sorted(tmp_path.glob("journal-*.seg"))[-1]
    with last.open("r+b") as f:
        f.truncate(last.stat().st_size - 7)  # into the second append's last AckRef
    appends.append(whole)
    with _open(tmp_path) as journal:
        state = journal.state()
        assert any(not p.loaded for p in _packs(journal))
        _same(state, _model(appends))
        assert _held(journal) == list(range(11, 31))


def test_a_rebuild_that_does_not_give_the_packed_pairs_back_fails_loudly(
    tmp_path: Path,
) -> None:
    appends = [_QUEUE] + [_message(i) for i in range(1, 31)]
    _write(tmp_path, appends)
    with _open(tmp_path, body_budget=0) as journal:
        pack = _packs(journal)[1]
        assert not pack.loaded
        pack.digest += 1  # as if the file no longer held what the open packed
        compact = journal._live.compact
        assert compact is not None
        with pytest.raises(JournalError, match="could not be rebuilt"):
            compact_find(compact, pack.first)


def _backlog_helpers() -> Any:
    """`test_recovery_backlog.py`'s restarted broker and its journal of N messages."""
    path = Path(__file__).with_name("test_recovery_backlog.py")
    spec = importlib.util.spec_from_file_location("_recovery_backlog_helpers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_journal_backlog_drains_unloaded_packs_in_order(tmp_path: Path) -> None:
    """A restart with most of a queue left in the journal (`store/backlog.py`), over
    several segments whose packs are unloaded: the backlog's runs load one pack at a time
    as it reaches it, and it drains in order, each message once; acked, the packs go."""
    helpers = _backlog_helpers()
    budget, n, expected = helpers.BUDGET, helpers.N, helpers._expected
    helpers._write(tmp_path / "journal")
    # (the segments of a writer with 64 KiB segments: written again, as a broker would)
    small = tmp_path / "small"
    with _open(tmp_path / "journal") as journal:
        records = list(journal.replay())
    with _open(small / "journal", max_segment_bytes=64 * 1024) as journal:
        for k, record in enumerate(records):
            if isinstance(record, AddRef) and isinstance(records[k - 1], AddMessage):
                continue  # (appended with its message, as a broker does)
            pair = records[k : k + 2] if isinstance(record, AddMessage) else [record]
            journal.append(pair, sync=False)
        journal.flush()
    r = helpers._Restarted(small, budget)
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
    assert got == expected(range(1, n + 1))
    assert peak <= LOADED_MAX
    assert len(set(loads)) >= unloaded  # each read back from its file as it was reached
    r.close()
