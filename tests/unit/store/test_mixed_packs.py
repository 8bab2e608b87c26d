"""Issue 23 (recovery, twelfth pass): a segment whose backlog pairs interleave with
another queue's short-lived messages (added, then acked in the next append) unloads its
pack all the same: a rebuild passes over the pairs its segment acks after them, and the
open checks once that the rebuild gives back exactly the packed pairs (else the pack
stays pinned, as before). The open's steps hand their last appends to the next step, so
a message acked across a step's end is short-lived too. `UNLOAD_MIN` is lowered so that
these small segments unload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.store import FileJournal, locs, opening
from amqpbroker.store.journal import JournalState
from amqpbroker.store.locs import LOADED_MAX, compact_find, pack_view


@pytest.fixture(autouse=True)
def _unload_small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locs, "UNLOAD_MIN", 1)


_QUEUES: list[Record] = [
    AddQueue(name=name, address=name, routing_type=RoutingType.ANYCAST) for name in ("q", "r")
]


def _open(directory: Path, **kw: Any) -> FileJournal:
    return FileJournal(directory, fsync=lambda fd: None, auto_compact=False, **kw)


def _add(msg_id: int, queue: str, size: int) -> list[Record]:
    return [
        AddMessage(msg_id=msg_id, address=queue, data=bytes([msg_id % 251]) * size),
        AddRef(queue=queue, msg_id=msg_id),
    ]


def _mixed(pairs: int, lag: int = 0) -> list[list[Record]]:
    """q's odd ids left in the journal, r's even ids after each, acked `lag` appends of
    q's later (0: in the next append)."""
    appends = [_QUEUES]
    for i in range(pairs + lag):
        if i < pairs:
            appends.append(_add(2 * i + 1, "q", 500) + _add(2 * i + 2, "r", 40))
        if i >= lag:
            appends.append([AckRef(queue="r", msg_id=2 * (i - lag) + 2)])
    return appends


def _write(directory: Path, appends: list[list[Record]], segment: int = 1 << 20) -> None:
    with _open(directory, max_segment_bytes=segment) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()


def _model(appends: list[list[Record]]) -> JournalState:
    return JournalState.of(record for records in appends for record in records)


def _same(state: JournalState, model: JournalState, *, bodies: bool = True) -> None:
    """The same references (ids, counts); and the same bodies, if the open read them."""
    assert [row[:2] for row in state.ref_rows()] == [row[:2] for row in model.ref_rows()]
    if bodies:
        assert {k: v.data for k, v in state.messages.items()} == {
            k: v.data for k, v in model.messages.items()
        }


def _packs(journal: FileJournal) -> list[locs._Pack]:
    compact = journal._live.compact
    assert compact is not None
    return list(compact.packs)


def test_short_lived_messages_between_the_backlogs_leave_its_packs_unloaded(
    tmp_path: Path,
) -> None:
    appends = _mixed(60)
    _write(tmp_path, appends, segment=8192)
    with _open(tmp_path, body_budget=0) as journal:
        state = journal.state()
        packs = _packs(journal)
        assert len(packs) > LOADED_MAX + 2
        assert all(p.mixed for p in packs)
        assert not any(p.pinned for p in packs)
        # (an r message at a segment's end is acked in the next: its pack's summary keeps
        # it taken and dead, and `state()` loaded that pack to leave it out of q's runs)
        assert any(p.taken and p.dead for p in packs)
        assert len([p for p in packs if p.loaded]) <= LOADED_MAX
        _same(state, _model(appends), bodies=False)
        compact = journal._live.compact
        assert compact is not None
        for msg_id in range(1, 121):  # q's found, read back; r's nowhere
            if msg_id % 2:
                assert compact_find(compact, msg_id) >= 0
                row = journal.read_message(msg_id)
                assert row is not None
                assert row[3] == bytes([msg_id % 251]) * 500
            else:
                assert compact_find(compact, msg_id) < 0
                assert journal.read_message(msg_id) is None
        held = [m for p in packs for m, out in zip(*pack_view(p)[:2], strict=True) if not out]
        assert held == list(range(1, 121, 2))
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in (3, 61)]
        journal.append(acks, sync=True)
        journal.flush()
        with journal._lock:
            journal._index_synced()
        appends.append(acks)
        assert journal.read_message(3) is None
        assert journal.read_message(5) is not None
    with _open(tmp_path) as journal:
        _same(journal.state(), _model(appends), bodies=False)


def test_a_message_acked_across_a_steps_end_is_short_lived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps of 2 KiB (an append or two each): without the appends a step hands to the
    next (`_CARRY` 0), an r message whose ack the next step reads is packed and then
    evicted by its ack, which pins the pack (as before this pass)."""
    appends = _mixed(40, lag=1)
    _write(tmp_path, appends)
    monkeypatch.setattr(opening, "_STEP", 2048)
    with _open(tmp_path, body_budget=0) as journal:
        (pack,) = _packs(journal)
        assert not pack.pinned
        assert not pack.loaded
        _same(journal.state(), _model(appends), bodies=False)
        assert list(pack_view(pack)[0]) == list(range(1, 81, 2))
    monkeypatch.setattr(opening, "_CARRY", 0)
    with _open(tmp_path, body_budget=0) as journal:
        (pack,) = _packs(journal)
        assert pack.pinned
        _same(journal.state(), _model(appends), bodies=False)


def test_a_mixed_pack_the_rebuild_cannot_give_back_stays_pinned(tmp_path: Path) -> None:
    """A short-lived message with two references (q and r, both acked): the rebuild's walk
    would meet its second AddRef in the pack's range, so the open's check keeps the pack
    loaded; the state is the replayed one."""
    appends = _mixed(10)
    appends.append([*_add(100, "q", 30), AddRef(queue="r", msg_id=100), *_add(101, "q", 500)])
    appends.append([AckRef(queue="q", msg_id=100), AckRef(queue="r", msg_id=100)])
    appends.append(_add(102, "q", 500))
    _write(tmp_path, appends)
    with _open(tmp_path, body_budget=0) as journal:
        (pack,) = _packs(journal)
        assert pack.mixed
        assert pack.pinned
        assert pack.loaded
        _same(journal.state(), _model(appends), bodies=False)
        assert journal.read_message(100) is None
        assert journal.read_message(101) is not None
