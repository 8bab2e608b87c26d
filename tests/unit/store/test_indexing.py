"""`store/indexing.py` (issue 20, durable path): the writer's per-record index work,
compiled with mypyc. `survivors` must hand the index every record of an append window
but those of the messages added and fully acked within it, each at its own offset; and
`short_lived` must keep to the liveness rules (B-095: what is acked must never come back,
what is not must never be dropped), for the broker's own record types and any other."""

from __future__ import annotations

from typing import Any

from amqpbroker.core.records import (
    AckRef,
    AddMessage,
    AddRef,
    DeleteQueue,
    Record,
    UpdateDeliveryCount,
)
from amqpbroker.store.framing import frame_records
from amqpbroker.store.indexing import short_lived, survivors
from amqpbroker.store.segments import _Pending


def _message(msg_id: int) -> AddMessage:
    return AddMessage(msg_id=msg_id, address="q", data=b"body")


def _pending(records: list[Record]) -> _Pending:
    data, sizes = frame_records(records)
    return _Pending(tuple(records), data, sizes, True, None)


def _placed(appends: list[list[Record]]) -> list[tuple[_Pending, int]]:
    placed, offset = [], 16
    for records in appends:
        entry = _pending(records)
        placed.append((entry, offset))
        offset += len(entry.data)
    return placed


def _survivors(placed: list[tuple[_Pending, int]], known: dict[int, Any]) -> list[Any]:
    return survivors(placed, short_lived([r for e, _ in placed for r in e.records], known))


def _naive(placed: list[tuple[_Pending, int]], known: dict[int, Any]) -> list[Any]:
    """Every record at its offset, but those of the short-lived messages."""
    records = [r for entry, _ in placed for r in entry.records]
    gone = short_lived(records, known)
    out = []
    for entry, offset in placed:
        for record, size in zip(entry.records, entry.sizes, strict=True):
            if getattr(record, "msg_id", None) not in gone:
                out.append((record, offset, size))
            offset += size
    return out


def test_survivors_skip_a_message_added_and_acked_in_the_window() -> None:
    placed = _placed(
        [
            [_message(1), AddRef(queue="q", msg_id=1), _message(2), AddRef(queue="q", msg_id=2)],
            [AckRef(queue="q", msg_id=1)],  # 1 is gone; 2 is still queued
        ]
    )
    batch = _survivors(placed, {})
    assert [(type(r).__name__, getattr(r, "msg_id", None)) for r, _, _ in batch] == [
        ("AddMessage", 2),
        ("AddRef", 2),
    ]
    first, offset = placed[0]
    skipped = first.sizes[0] + first.sizes[1]  # message 1's two frames come first
    assert batch[0][1:] == (offset + skipped, first.sizes[2])
    assert batch[1][1:] == (offset + skipped + first.sizes[2], first.sizes[3])
    assert batch == _naive(placed, {})


def test_survivors_keep_everything_of_a_known_message_and_after_a_queue_delete() -> None:
    appends: list[list[Record]] = [
        [_message(1), AddRef(queue="q", msg_id=1), AckRef(queue="q", msg_id=1)],
        [_message(7), AddRef(queue="q", msg_id=7), AckRef(queue="q", msg_id=7)],
    ]
    known: dict[int, Any] = {7: object()}  # indexed in an earlier window
    batch = _survivors(_placed(appends), known)
    assert [getattr(r, "msg_id", None) for r, _, _ in batch] == [7, 7, 7]
    with_delete = _placed([*appends, [DeleteQueue(name="r")]])
    assert len(_survivors(with_delete, known)) == 7  # the full rules for all of it


def test_short_lived_follows_every_reference() -> None:
    """Gone only when every reference added in the window is acked in it, once."""
    records: list[Record] = [
        _message(1),
        AddRef(queue="q", msg_id=1),
        AddRef(queue="r", msg_id=1),
        AckRef(queue="q", msg_id=1),  # still in r
        _message(2),
        AddRef(queue="q", msg_id=2),
        UpdateDeliveryCount(queue="q", msg_id=2, delivery_count=1),
        AckRef(queue="q", msg_id=2),  # gone, its count update with it
        _message(3),
        AckRef(queue="q", msg_id=3),  # an ack of nothing: the full rules decide
        _message(4),  # no reference yet: its references may come in the next window
        (5, "q", True, 0, 0, 0, 0, 0, 0, 0, 0),  # a layout (the open's), then acked
        AddRef(queue="q", msg_id=5),
        AckRef(queue="q", msg_id=5),
    ]
    assert short_lived(records, {}) == {2, 5}


def test_a_record_subclass_is_left_to_the_full_rules() -> None:
    """The compiled loop matches the broker's own classes exactly; anything else that
    passes as one of them makes it skip nothing rather than guess."""

    class MyRef(AddRef):
        pass

    records: list[Record] = [
        _message(1),
        MyRef(queue="q", msg_id=1),
        AckRef(queue="q", msg_id=1),
    ]
    assert short_lived(records, {}) == set()
    assert short_lived([*records[:1], AddRef(queue="q", msg_id=1), *records[2:]], {}) == {1}
