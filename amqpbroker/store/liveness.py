"""Liveness: which records still matter to the state replay would compute.

Theory of operation
-------------------
The rules are in the `core/records.py` docstring and live in one place, `_LiveSet`,
shared by recovery (`store/state.py`), the memory journal and the file journal's index: a
record is *live* while it still matters to the state replay would compute. `compact()`
drops what is not live. Cancelling records (`AckRef`, `DeleteQueue`, `DeleteAddress`) are
*tombstones*: they are kept while the record they cancel is still on disk in an earlier
segment, else replay would bring that record back. `_short_lived` finds the messages
added and acknowledged within one index batch, which the file journal's index then skips.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

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
    TxCommit,
    TxPrepare,
    TxRollback,
    UpdateDeliveryCount,
)
from amqpbroker.store.api import JournalError
from amqpbroker.store.codec import MessageLayout, RefRow
from amqpbroker.store.indexing import short_lived
from amqpbroker.store.locs import (
    Compact,
    compact_ids,
    compact_take,
)

log = logging.getLogger(__name__)

# --- liveness ------------------------------------------------------------------------

_Item = TypeVar("_Item")


class _RefSlot(Generic[_Item]):
    """A reference with updates (a delivery count, a schedule) besides its `AddRef`; a
    reference with none is held as its `AddRef`'s item alone (issue 20: one object less
    per queued message)."""

    __slots__ = ("add", "count", "scheduled")

    def __init__(self, add: _Item) -> None:
        self.add = add
        self.count: _Item | None = None
        self.scheduled: _Item | None = None


class _LiveSet(Generic[_Item]):
    """The liveness rules of `core/records.py`, applied record by record.

    Each applied record comes with an item (the record itself for `JournalState`, its
    location for the file journal's index). `apply` says whether the record is live; when
    a record stops being live, `dead(item, needs_tombstone)` is called: `needs_tombstone`
    is true when the killing record must be kept while `item` is still on disk.
    """

    # Used by one thread at a time (the owner's lock).

    def __init__(self, dead: Callable[[_Item, bool], None]) -> None:
        self._dead = dead
        self.addresses: dict[str, _Item] = {}
        self.queues: dict[str, _Item] = {}
        self.messages: dict[int, _Item] = {}
        # How many references hold each message whose count is not 1 (0: none yet): most
        # messages are in one queue, and then cost no count at all (issue 20).
        self.ref_counts: dict[int, int] = {}
        # References by queue, then message id, in the order they were added: no key
        # tuple per reference, and a queue's references are at hand (issue 20).
        self.refs: dict[str, dict[int, _Item | _RefSlot[_Item]]] = {}
        self.page_cursors: dict[str, _Item] = {}
        # Per queue: where its latest PageCursor stands, and its live PageSkips as a heap
        # by the last position each names (a cursor past it kills it).
        self.cursor_at: dict[str, tuple[int, int]] = {}
        self.page_skips: dict[str, list[tuple[int, int, int, _Item]]] = {}
        self._skip_seq = itertools.count()
        # The file journal's compact index (`store/locs.py`): pairs the open packed that no
        # dict holds until a rule meets them by id (`_evict`). None: every item is in the
        # dicts (`JournalState`, the memory journal).
        self.compact: Compact | None = None
        # While the open runs (the file journal's; None otherwise): of a reference added
        # again while it was held (`add_ref_of`), its first item, whose place in the file
        # is its place in its queue's order (`JournalState._from_live` merges the dicts'
        # references with the compact index's by place).
        self.first_of: dict[tuple[str, int], _Item] | None = None
        # Whether the last `_evict` could not tell: the pack that may hold the id could not
        # be rebuilt from its segment (changed or removed since the open; ninth attack
        # pass). Its segments' texts already said (`unreadable`), once each.
        self.unknown = False
        self.unreadable: set[str] = set()
        # The rule of each record type (`apply`; the file journal's index calls them).
        self.rules: dict[type[Any], Callable[[Any, _Item], bool]] = {
            AddMessage: self._add_message,
            AddRef: self.add_ref,
            AckRef: self._ack_ref,
            UpdateDeliveryCount: self._update_count,
            ScheduledDelivery: self._scheduled,
            AddQueue: self._add_queue,
            DeleteQueue: self._delete_queue,
            AddAddress: self._add_address,
            DeleteAddress: self._delete_address,
            PageCursor: self._page_cursor,
            PageSkip: self._page_skip,
            TxPrepare: self._not_kept,
            TxCommit: self._not_kept,
            TxRollback: self._not_kept,
        }

    def apply(self, record: Record, item: _Item) -> bool:
        return self.rules[type(record)](record, item)

    def _add_message(self, record: AddMessage, item: _Item) -> bool:
        return self.add_message(record.msg_id, item)

    def add_message(self, msg_id: int, item: _Item) -> bool:
        """`AddMessage` by its id alone (recovery indexes a message before reading its
        body, and reads the body only if the message is still live)."""
        old = self.messages.get(msg_id)
        if old is None and self.compact is not None and self._evict(msg_id):
            old = self.messages.get(msg_id)
        if old is None:
            self.ref_counts[msg_id] = 0
        else:
            self._dead(old, False)
        self.messages[msg_id] = item
        return True

    def _evict(self, msg_id: int) -> bool:
        """Move the pair of `msg_id` from the compact index into the dicts, as its two
        handles (a message with one reference: no `ref_counts` entry), for a rule to meet
        it there. False: the compact index does not hold it."""
        compact = self.compact
        self.unknown = False
        if compact is None:
            return False
        try:
            handle, queue = compact_take(compact, msg_id)
        except JournalError as e:
            # Not the writer's failure: its pairs stay live (their segment is kept) and
            # the rules go on, so one damaged segment neither fails every later sync that
            # indexes (a synced record indexed again and again) nor takes the rest down.
            self.unknown = True
            if str(e) not in self.unreadable:
                self.unreadable.add(str(e))
                log.error("journal index: %s; its messages are kept as they are", e)
            return False
        if handle < 0:
            return False
        message: Any = handle
        ref: Any = handle + 1
        self.messages[msg_id] = message
        held = self.refs.get(queue)
        if held is None:
            held = self.refs[queue] = {}
        held[msg_id] = ref
        return True

    def add_ref(self, record: AddRef, item: _Item) -> bool:
        """`AddRef`'s rule (public: the open's `frames.index_plain` calls it)."""
        return self.add_ref_of(record.queue, record.msg_id, item)

    def add_ref_of(self, queue: str, msg_id: int, item: _Item) -> bool:
        """`add_ref` by the reference's queue and message id (the open reads an AddRef
        as a row, not a record: `codec.RefRow`)."""
        if msg_id not in self.messages and not self._evict(msg_id):
            return False  # its message is gone (or never was): replay ignores it too
        held = self.refs.get(queue)
        if held is None:  # (not setdefault: that builds a dict per reference)
            held = self.refs[queue] = {}
        old = held.get(msg_id)
        if old is None:
            count = self.ref_counts.pop(msg_id, 1) + 1
            if count != 1:
                self.ref_counts[msg_id] = count
        else:
            first = self.first_of
            if first is not None:  # (its place in the queue stays its first AddRef's)
                key = (queue, msg_id)
                if key not in first:
                    first[key] = old.add if isinstance(old, _RefSlot) else old
            if isinstance(old, _RefSlot):  # the new AddRef is the whole state of the reference
                self._dead(old.add, False)
                self._drop_updates(old)
            else:
                self._dead(old, False)
        held[msg_id] = item
        return True

    def _drop_updates(self, slot: _RefSlot[_Item]) -> None:
        if slot.count is not None:
            self._dead(slot.count, False)
            slot.count = None
        if slot.scheduled is not None:
            self._dead(slot.scheduled, False)
            slot.scheduled = None

    def _remove_ref(self, msg_id: int, ref: _Item | _RefSlot[_Item]) -> None:
        if isinstance(ref, _RefSlot):
            self._dead(ref.add, True)
            self._drop_updates(ref)
        else:
            self._dead(ref, True)
        count = self.ref_counts.pop(msg_id, 1) - 1
        if count == 0:
            self._dead(self.messages.pop(msg_id), False)
        elif count != 1:
            self.ref_counts[msg_id] = count

    def _ack_ref(self, record: AckRef, item: _Item) -> bool:
        queue, msg_id = record.queue, record.msg_id
        refs = self.refs.get(queue)
        if refs is None or msg_id not in refs:
            if self._evict(msg_id):
                refs = self.refs.get(queue)
            elif self.unknown:  # (its pack unreadable: the ack is kept, for a restart)
                return True
        if refs is not None:
            ref = refs.pop(msg_id, None)
            if ref is not None:
                if not refs:
                    del self.refs[queue]
                if self.first_of:
                    self.first_of.pop((queue, msg_id), None)
                self._remove_ref(msg_id, ref)
        return False

    def _slot(self, queue: str, msg_id: int) -> _RefSlot[_Item] | None:
        """The reference's slot, made if it had none (None: no such reference)."""
        refs = self.refs.get(queue)
        if (refs is None or msg_id not in refs) and self._evict(msg_id):
            refs = self.refs.get(queue)
        if refs is None:
            return None
        ref = refs.get(msg_id)
        if ref is None or isinstance(ref, _RefSlot):
            return ref
        slot = refs[msg_id] = _RefSlot(ref)  # (same key: its place in the order stays)
        return slot

    def _update_count(self, record: UpdateDeliveryCount, item: _Item) -> bool:
        slot = self._slot(record.queue, record.msg_id)
        if slot is None:
            return False
        if slot.count is not None:
            self._dead(slot.count, False)
        slot.count = item
        return True

    def _scheduled(self, record: ScheduledDelivery, item: _Item) -> bool:
        slot = self._slot(record.queue, record.msg_id)
        if slot is None:
            return False
        if slot.scheduled is not None:
            self._dead(slot.scheduled, False)
        slot.scheduled = item
        return True

    def _add_queue(self, record: AddQueue, item: _Item) -> bool:
        old = self.queues.get(record.name)
        if old is not None:
            self._dead(old, False)
        self.queues[record.name] = item
        return True

    def _delete_queue(self, record: DeleteQueue, item: _Item) -> bool:
        old = self.queues.pop(record.name, None)
        if old is not None:
            self._dead(old, True)
        cursor = self.page_cursors.pop(record.name, None)
        if cursor is not None:
            self._dead(cursor, False)
        self.cursor_at.pop(record.name, None)
        for skip in self.page_skips.pop(record.name, ()):
            self._dead(skip[3], False)
        compact = self.compact
        if compact is not None:  # the queue's pairs in the compact index die too
            try:
                ids = compact_ids(compact, record.name)
            except JournalError as e:  # (as `_evict`: the unreadable pack's pairs stay)
                if str(e) not in self.unreadable:
                    self.unreadable.add(str(e))
                    log.error("journal index: %s; its messages are kept as they are", e)
                ids = []
            for msg_id in ids:
                self._evict(msg_id)
        first = self.first_of
        if first:
            for key in [key for key in first if key[0] == record.name]:
                del first[key]
        for msg_id, ref in self.refs.pop(record.name, {}).items():
            self._remove_ref(msg_id, ref)
        return False

    def _add_address(self, record: AddAddress, item: _Item) -> bool:
        old = self.addresses.get(record.name)
        if old is not None:
            self._dead(old, False)
        self.addresses[record.name] = item
        return True

    def _delete_address(self, record: DeleteAddress, item: _Item) -> bool:
        old = self.addresses.pop(record.name, None)
        if old is not None:
            self._dead(old, True)
        return False

    def _page_cursor(self, record: PageCursor, item: _Item) -> bool:
        old = self.page_cursors.get(record.queue)
        if old is not None:
            self._dead(old, False)
        self.page_cursors[record.queue] = item
        at = self.cursor_at[record.queue] = (record.page, record.offset)
        skips = self.page_skips.get(record.queue)
        while skips and (skips[0][0], skips[0][1]) <= at:
            self._dead(heapq.heappop(skips)[3], False)
        return True

    def _page_skip(self, record: PageSkip, item: _Item) -> bool:
        """Live until the queue's cursor passes its last position (born dead when the
        cursor journaled before it already has)."""
        if not record.offsets:
            return False
        last = (record.page, max(record.offsets))
        at = self.cursor_at.get(record.queue)
        if at is not None and last <= at:
            return False
        skips = self.page_skips.setdefault(record.queue, [])
        heapq.heappush(skips, (last[0], last[1], next(self._skip_seq), item))
        return True

    def _not_kept(self, record: Record, item: _Item) -> bool:
        return False


_WITH_MSG_ID = (AddMessage, AddRef, AckRef, UpdateDeliveryCount, ScheduledDelivery)


def _short_lived(
    records: Sequence[Record | MessageLayout | RefRow], live: _LiveSet[Any]
) -> set[int]:
    """The messages whose every record in `records` (one segment's, in order) is dead by
    their end, which the file journal's index then skips: `store/indexing.short_lived`
    (compiled: it runs per record on the journal's writer thread) against `live`."""
    compact = live.compact
    return short_lived(records, live.messages, 0 if compact is None else compact.top)


def _ignore_dead(item: Record, needs_tombstone: bool) -> None:
    pass
