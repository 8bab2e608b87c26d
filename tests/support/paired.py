"""Journals of messages in their usual pair (an AddMessage, then its one AddRef) on small
segments, for the tests of the open's packed and compact index (`store/locs.py`): what
they write, and the state replay of the same records gives to compare a reopen with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.store import FileJournal
from amqpbroker.store.journal import JournalState

SEGMENT = 4096  # small segments: a few messages each
QUEUE: list[Record] = [AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)]


def open_journal(directory: Path, **kw: Any) -> FileJournal:
    """A journal that never fsyncs nor compacts on its own (the tests compact)."""
    return FileJournal(directory, fsync=lambda fd: None, auto_compact=False, **kw)


def message(msg_id: int, queue: str = "q") -> list[Record]:
    """Message `msg_id`'s pair in `queue`, 500 bytes of body."""
    return [
        AddMessage(msg_id=msg_id, address=queue, data=bytes([msg_id % 251]) * 500),
        AddRef(queue=queue, msg_id=msg_id),
    ]


def write(directory: Path, appends: list[list[Record]]) -> None:
    """Each of `appends` as one append, on segments of `SEGMENT` bytes."""
    with open_journal(directory, max_segment_bytes=SEGMENT) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()


def model(appends: list[list[Record]]) -> JournalState:
    """The state replay gives for `appends`."""
    return JournalState.of(record for records in appends for record in records)


def same(state: JournalState, expected: JournalState) -> None:
    """`state` holds `expected`'s references and messages, and ids continue above them."""
    assert state.ref_rows() == expected.ref_rows()
    assert {k: v.data for k, v in state.messages.items()} == {
        k: v.data for k, v in expected.messages.items()
    }
    assert state.max_msg_id >= max(expected.messages, default=0)


def acks_torn_by_a_crash(directory: Path) -> list[list[Record]]:
    """Messages 1-30, then after an open (their packs settled) acks of 1-10 in one append
    and of 11-20 in another cut short by a crash (a torn tail in its last AckRef): what
    the journal holds, as `appends` for `model`."""
    appends = [QUEUE] + [message(i) for i in range(1, 31)]
    write(directory, appends)
    with open_journal(directory) as journal:
        journal.state()
        whole: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(1, 11)]
        cut: list[Record] = [AckRef(queue="q", msg_id=i) for i in range(11, 21)]
        journal.append(whole, sync=True)
        journal.append(cut, sync=True)
        journal.flush()
    last = sorted(directory.glob("journal-*.seg"))[-1]
    with last.open("r+b") as f:
        f.truncate(last.stat().st_size - 7)  # into the second append's last AckRef
    appends.append(whole)
    return appends
