"""The file journal's index, per record: what its writer thread does for every record.

Theory of operation
-------------------
The writer indexes what is synced in windows of many group commits
(`FileJournal._index_synced`, store/file_journal.py), and first drops the messages
added and acknowledged within the window (`short_lived`): under a steady load that is
nearly all of them, so the index sees only the few that outlive a window. Both loops
run once per record (about three per durable message: AddMessage, AddRef, AckRef) on the
writer thread, which holds the GIL against the event loop while it runs them: a plain
module that mypyc compiles (setup.py HOT_MODULES), as `store/framing.py` is for the
loop's side. `store/liveness.py` keeps the rules themselves; `_short_lived` there is
this module's `short_lived` over a `_LiveSet`'s messages (recovery uses it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from amqpbroker.core.records import (
    AckRef,
    AddMessage,
    AddRef,
    DeleteQueue,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.store.codec import MessageLayout, RefRow
from amqpbroker.store.segments import _Pending

__all__ = ["short_lived", "survivors"]

_AddRef: Final = AddRef
_AckRef: Final = AckRef
_AddMessage: Final = AddMessage
_DeleteQueue: Final = DeleteQueue
_WITH_MSG_ID: Final = (AddMessage, AddRef, AckRef, UpdateDeliveryCount, ScheduledDelivery)
_SPECIAL: Final = (AddRef, AckRef, AddMessage, DeleteQueue, tuple)


def short_lived(
    records: Sequence[Record | MessageLayout | RefRow], known: dict[int, Any], floor: int = 0
) -> set[int]:
    """The messages whose every record in `records` (one segment's, in order) is dead by
    their end: added here, not in `known` (the live messages) before, and every reference
    added here acked here (a message added with no reference yet is not: its references
    may be in the next batch). An id at or below `floor` counts as known: the file
    journal's compact index (`store/locs.py`) may hold it, outside `known`.

    The index can skip their records: indexing them and then killing them leaves it as it
    was (no live bytes, and an ack in the segment of its add needs no tombstone). Records
    that delete a queue leave everything to the full rules.
    """
    open_refs: dict[int, set[str] | None] = {}  # msg_id -> queues holding it; None: keep
    referenced: set[int] = set()  # a message whose references come later is not gone
    for record in records:
        kind: object = type(record)
        rec: Any = record
        row = kind is tuple and len(rec) == 3  # an AddRef's row, read at open
        if row or kind is _AddRef or kind is _AckRef:
            msg_id: int = rec[0] if row else rec.msg_id
            refs = open_refs.get(msg_id)
            if refs is None:
                continue
            queue: str = rec[1] if row else rec.queue
            adding = row or kind is _AddRef
            if (queue in refs) is adding:  # a second add, or an ack of nothing
                open_refs[msg_id] = None
            elif adding:
                refs.add(queue)
                referenced.add(msg_id)
            else:
                refs.discard(queue)
        elif kind is _AddMessage or kind is tuple:  # a tuple: its layout, read at open
            msg_id = rec[0] if kind is tuple else rec.msg_id
            open_refs[msg_id] = (
                None if msg_id in known or msg_id <= floor or msg_id in open_refs else set()
            )
        elif kind is _DeleteQueue:
            return set()
        elif isinstance(record, _SPECIAL):
            return set()  # a subclass: none in the broker; the full rules, to be safe
    return {
        msg_id
        for msg_id, refs in open_refs.items()
        if refs is not None and not refs and msg_id in referenced
    }


def survivors(
    placed: Sequence[tuple[_Pending, int]], gone: set[int]
) -> list[tuple[Record, int, int]]:
    """What of the written appends `placed` (one segment's: each append and its offset, in
    order) the index must apply: each record with its offset and size, but the records of
    the messages in `gone` (`short_lived`)."""
    batch: list[tuple[Record, int, int]] = []
    for entry, offset in placed:
        recs = entry.records
        sizes = entry.sizes
        for i in range(len(recs)):
            record = recs[i]
            size = sizes[i]
            if not gone or not isinstance(record, _WITH_MSG_ID) or record.msg_id not in gone:
                batch.append((record, offset, size))
            offset += size
    return batch
