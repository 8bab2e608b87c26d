"""Recovery's view of a journal: `JournalState`, the state a sequence of records describes.

Theory of operation
-------------------
Nothing in a journal is updated in place, so the state after a restart is what applying
`replay()` in order computes. `JournalState` keeps it with the same `_LiveSet` as the
journals' compaction (`store/liveness.py`): a message left without references is dead.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from amqpbroker.core.records import (
    AddAddress,
    AddMessage,
    AddQueue,
    AddRef,
    PageCursor,
    PageSkip,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.store.codec import MessageLayout, MessageRow, add_message_of_row
from amqpbroker.store.liveness import _WITH_MSG_ID, _ignore_dead, _LiveSet, _RefSlot
from amqpbroker.store.locs import (
    _SLOT_MASK,
    _SPAN_SHIFT,
    PACK_SHIFT,
    Compact,
    Packs,
    Run,
    _Pack,
    pack_view,
    position,
    queue_ranges,
)

# A live message as `_from_live` reads it: its record, or the open's row of it, or its
# layout when the open left its body in the journal (`FileJournal(body_budget=)`).
StoredMessage = AddMessage | MessageRow | MessageLayout


@dataclass(frozen=True, slots=True)
class RecoveredRef:
    """A message reference after replay: where it is, and its persisted counters."""

    queue: str
    msg_id: int
    delivery_count: int  # B-095: the last persisted count; the next dispatch adds 1
    scheduled_at_ms: int = 0  # not before this epoch ms (B-065); 0 = now


class JournalState:
    """The durable state a sequence of records describes: what recovery rebuilds.

    Apply `journal.replay()` (or use `JournalState.of(journal.replay())`), then read
    `addresses`, `queues`, `messages` and `refs()`, each in append order (`refs()`: per
    queue, queues by name).
    `max_msg_id` is the largest message id in the records replayed, live or not: a
    restarted broker numbers new messages above it. Compaction can drop the records of
    the newest messages once they are all acknowledged, so it is a floor, not a counter.
    """

    # One thread.

    def __init__(self) -> None:
        self._live: _LiveSet[Record] = _LiveSet(_ignore_dead)
        self.max_msg_id = 0
        # Read off another index (`_from_live`): the live messages and the reference
        # rows, resolved once instead of a copy of that index's slots; `apply` puts them
        # back in `_live` first.
        self._messages: dict[int, StoredMessage] | None = None
        # Per queue, its parts (`ref_parts`): `ROW` longs a reference, or runs.
        self._rows: list[tuple[str, list[array[int] | Run]]] | None = None
        self._bodiless = 0  # messages `_from_live` left out of `_messages` (`BODILESS`)

    @classmethod
    def _from_live(
        cls,
        live: _LiveSet[Any],
        record_of: Callable[[Any], Record],
        max_msg_id: int,
        packed: Sequence[Any] = (),
        packs: Sequence[Any] = (),
    ) -> JournalState:
        """The state of a liveness index another reader built (the file journal's, at
        open, where every message has a reference), its items mapped back to their
        records: what applying the same records again would give, without applying them
        twice (issue 23 item 4). A copy: later changes to `live` do not show. An item may
        map to a row instead of its record (`codec.MessageRow`, `codec.RefRow`: the open
        makes no record object per message). An int item is a packed record's handle
        (`store/locs.py`): its record is in `packed` (each pack's `kept`, by pack number),
        read here inline rather than by a call per item (interpreted, a call costs ~1.5k
        instructions: a million messages, two each). A packed message the open left in
        its file (`locs.BODILESS`) gets no entry in `stored_messages()`: its body size,
        first_ts and expiration (its pack's `sizes` and `expiring`, by number in `packs`:
        a first_ts of 0, an expiration early at worst) go into its references' rows, or
        its reference into a `Run` (`ref_parts`), which is all recovery keeps of it in a
        journal backlog (issue 23, ninth and tenth passes: no object, no row a message
        past the budget)."""
        state = cls()
        state.max_msg_id = max_msg_id
        own = state._live
        own.addresses = {k: record_of(v) for k, v in live.addresses.items()}
        own.queues = {k: record_of(v) for k, v in live.queues.items()}
        own.page_cursors = {k: record_of(v) for k, v in live.page_cursors.items()}
        own.cursor_at = dict(live.cursor_at)
        own.page_skips = {  # (the same keys: still heaps)
            k: [(page, last, n, record_of(item)) for page, last, n, item in heap]
            for k, heap in live.page_skips.items()
        }
        messages: dict[int, Any] = {}
        bodiless = 0
        for msg_id, item in live.messages.items():
            if not live.ref_counts.get(msg_id, 1):
                continue
            if isinstance(item, int):
                stored = packed[item >> PACK_SHIFT].get(item & _SLOT_MASK)
                if stored is None:  # `BODILESS`: its values go into its rows
                    bodiless += 1
                    continue
                messages[msg_id] = stored
            else:
                messages[msg_id] = record_of(item)
        compact = live.compact
        # Per queue that had pairs in the compact index, how many it still holds: the
        # others' references are all in their dicts, in order (an evicted pair's are not);
        # and how many of those are of messages left in their files (`BODILESS`).
        counts: dict[str, int] = {}
        left: dict[str, int] = {}
        if compact is not None:
            for pack in compact.packs:
                kept = packed[pack.number]
                runs = pack.queues
                if _whole(pack, kept):  # every pair held, bodiless, counted 0: no load
                    for k in range(len(runs)):
                        first, name = runs[k]
                        many = (runs[k + 1][0] if k + 1 < len(runs) else pack.count) - first
                        counts[name] = counts.get(name, 0) + many
                        left[name] = left.get(name, 0) + many
                        bodiless += many
                    continue
                ids, out, _, _ = pack_view(pack)
                for k in range(len(runs)):
                    first, name = runs[k]
                    last = runs[k + 1][0] if k + 1 < len(runs) else len(ids)
                    held_here = gone = 0
                    for i in range(first, last):
                        if out[i]:
                            continue
                        held_here += 1
                        stored = kept.get(i << 1)
                        if stored is None:  # `BODILESS`
                            gone += 1
                        else:
                            messages[ids[i]] = stored
                    counts[name] = counts.get(name, 0) + held_here
                    if gone:
                        left[name] = left.get(name, 0) + gone
                        bodiless += gone
        rows: list[tuple[str, list[array[int] | Run]]] = []
        for queue in sorted(set(live.refs) | {q for q, n in counts.items() if n}):
            held = live.refs.get(queue, {})
            if queue in left:  # runs of the compact index's references, rows between
                assert compact is not None
                rows.append((queue, _queue_parts(live, compact, queue, held, record_of, packed)))
                continue
            many = counts.get(queue, 0)
            # Its final size at once, written in place: no growth, no copy of it at the
            # peak (a 1M queue's is 48 MB).
            out_rows = array("q", _ZERO) * ((len(held) + many) * ROW)
            view = memoryview(out_rows).cast("B")
            if queue not in counts:  # the dicts alone, in their order (none evicted)
                at_byte = 0
                for msg_id, ref in held.items():
                    at_byte = _ref_row(view, at_byte, live, msg_id, ref, record_of, packed, packs)
            else:
                assert compact is not None
                at_byte = _merged_rows(view, live, compact, queue, held, record_of, packed)
            view.release()
            rows.append((queue, [out_rows]))
        state._bodiless = bodiless
        state._messages, state._rows = messages, rows
        return state

    def _thaw(self) -> None:
        """Put the resolved messages and rows of `_from_live` back in `_live`: the same
        state for every record applied next (an AddRef with the last count stands for
        AddRef + UpdateDeliveryCount)."""
        messages, rows = self._messages, self._rows
        if messages is None or rows is None:
            return
        if self._bodiless:
            raise ValueError(_BODILESS_ERROR)
        self._messages = self._rows = None
        live = self._live
        for stored in messages.values():
            record = stored if isinstance(stored, AddMessage) else _record_of_row(stored)
            live.apply(record, record)
        for queue, msg_id, count, at_ms in self._tuples(rows, None):
            add = AddRef(queue=queue, msg_id=msg_id, delivery_count=count)
            live.apply(add, add)
            if at_ms:
                scheduled = ScheduledDelivery(queue=queue, msg_id=msg_id, at_ms=at_ms)
                live.apply(scheduled, scheduled)

    @classmethod
    def of(cls, records: Iterable[Record]) -> JournalState:
        state = cls()
        for record in records:
            state.apply(record)
        return state

    def apply(self, record: Record) -> None:
        if self._rows is not None:
            self._thaw()
        if isinstance(record, _WITH_MSG_ID) and record.msg_id > self.max_msg_id:
            self.max_msg_id = record.msg_id
        self._live.apply(record, record)

    @property
    def addresses(self) -> list[AddAddress]:
        return [r for r in self._live.addresses.values() if isinstance(r, AddAddress)]

    @property
    def queues(self) -> list[AddQueue]:
        return [r for r in self._live.queues.values() if isinstance(r, AddQueue)]

    @property
    def page_cursors(self) -> dict[str, tuple[int, int]]:
        """Per queue, where its page files were read up to (B-151 PAGE)."""
        return {
            queue: (r.page, r.offset)
            for queue, r in self._live.page_cursors.items()
            if isinstance(r, PageCursor)
        }

    @property
    def page_commits(self) -> dict[str, tuple[int, int]]:
        """Per queue, where the last copy a management walk paged to it ends (B-151,
        issue 23: `store/paging.py`, kind 3 frames)."""
        return {
            queue: (r.committed_page, r.committed_offset)
            for queue, r in self._live.page_cursors.items()
            if isinstance(r, PageCursor)
        }

    @property
    def page_skips(self) -> dict[str, dict[int, list[int]]]:
        """Per queue, per page file, the positions of the paged messages a management walk
        removed ahead of its cursor (B-151, issue 23), sorted."""
        skips: dict[str, dict[int, list[int]]] = {}
        for queue, heap in self._live.page_skips.items():
            pages: dict[int, list[int]] = {}
            for _, _, _, record in heap:
                if isinstance(record, PageSkip):
                    pages.setdefault(record.page, []).extend(record.offsets)
            skips[queue] = {page: sorted(offsets) for page, offsets in pages.items()}
        return skips

    @property
    def messages(self) -> dict[int, AddMessage]:
        """Live messages by id: those with at least one reference."""
        if self._bodiless:
            raise ValueError(_BODILESS_ERROR)
        if self._messages is not None:
            return {
                msg_id: stored if isinstance(stored, AddMessage) else _record_of_row(stored)
                for msg_id, stored in self._messages.items()
            }
        return {
            msg_id: item
            for msg_id, item in self._live.messages.items()
            if self._live.ref_counts.get(msg_id, 1) and isinstance(item, AddMessage)
        }

    def stored_messages(self) -> dict[int, StoredMessage]:
        """`messages`, a row where the open kept one (`codec.MessageRow`): what recovery
        reads, millions of them (issue 23 item 4). Not a copy: read it, do not change it.
        Without the messages the open left in their files as `BODILESS`: their references'
        rows in `ref_arrays` say what they are."""
        if self._messages is not None:
            return self._messages
        return dict(self.messages)

    def refs(self, queue: str | None = None) -> list[RecoveredRef]:
        """References in the order they were added to their queue (one queue, or all,
        queues by name: the order of one queue's is all recovery needs, issue 20)."""
        return [RecoveredRef(*row) for row in self.ref_rows(queue)]

    def ref_rows(self, queue: str | None = None) -> list[tuple[str, int, int, int]]:
        """`refs()` as plain (queue, msg_id, delivery_count, scheduled_at_ms) tuples:
        what recovery reads, millions of them (issue 23 item 4)."""
        rows = self._rows
        if rows is not None:
            return list(self._tuples(rows, queue))
        refs = self._live.refs
        result = []
        for name in sorted(refs) if queue is None else (queue,) if queue in refs else ():
            for msg_id, ref in refs[name].items():
                if not isinstance(ref, _RefSlot):
                    assert isinstance(ref, AddRef)
                    result.append((name, msg_id, ref.delivery_count, 0))
                    continue
                add, count, scheduled = ref.add, ref.count, ref.scheduled
                assert isinstance(add, AddRef)
                result.append(
                    (
                        name,
                        msg_id,
                        count.delivery_count
                        if isinstance(count, UpdateDeliveryCount)
                        else add.delivery_count,
                        scheduled.at_ms if isinstance(scheduled, ScheduledDelivery) else 0,
                    )
                )
        return result

    def ref_arrays(self) -> list[tuple[str, array[int]]]:
        """`ref_rows()` per queue (by name) as one `array('q')` each, `ROW` longs a
        reference: msg_id, delivery_count, scheduled_at_ms, then body size, first_ts and
        expiration_ms of a message left out of `stored_messages()` (`BODILESS`; a size of
        -1 and zeros for the others): no tuple a reference (issue 23, ninth pass). A
        message the open left in its file has its size, a first_ts of 0 and its pack's
        earliest expiration (early at worst): the pack keeps no more of it, its file
        does (tenth pass). Not a copy when
        `_from_live` made them and a queue is one array: read them, do not change them."""
        parts = self._rows
        if parts is not None:
            return [(name, _flat(queue_parts)) for name, queue_parts in parts]
        arrays: dict[str, array[int]] = {}
        for name, msg_id, count, at_ms in self.ref_rows():
            out = arrays.get(name)
            if out is None:
                out = arrays[name] = array("q")
            out.frombytes(_ROW(msg_id, count, at_ms, -1, 0, 0))
        return list(arrays.items())

    def ref_parts(self) -> list[tuple[str, list[array[int] | Run]]]:
        """Per queue (by name), its references in order as parts: `array('q')`s of rows
        (`ref_arrays`' layout) and, for a journal opened with a body budget, `Run`s of
        references of messages left in their files, whose ids and sizes are their packs'
        (`store/locs.py`): what recovery reads, no row a reference for those (issue 23,
        tenth pass). Not copies: read them, do not change them."""
        parts = self._rows
        if parts is not None:
            return parts
        return [(name, [rows]) for name, rows in self.ref_arrays()]

    @staticmethod
    def _tuples(
        parts: list[tuple[str, list[array[int] | Run]]], queue: str | None
    ) -> Iterator[tuple[str, int, int, int]]:
        for name, queue_parts in parts:
            if queue is None or name == queue:
                for part in queue_parts:
                    if isinstance(part, Run):
                        for msg_id in pack_view(part.pack)[0][part.start : part.end]:
                            yield name, msg_id, 0, 0
                        continue
                    for i in range(0, len(part), ROW):
                        yield name, part[i], part[i + 1], part[i + 2]


def _flat(parts: list[array[int] | Run]) -> array[int]:
    """A queue's parts as one array of rows (`JournalState.ref_arrays`)."""
    if len(parts) == 1 and not isinstance(parts[0], Run):
        return parts[0]
    out = array("q")
    for part in parts:
        if isinstance(part, Run):
            ids, _, _, sizes = pack_view(part.pack)
            for i in range(part.start, part.end):
                out.frombytes(_ROW(ids[i], 0, 0, sizes[i], 0, part.expiring))
        else:
            out.extend(part)
    return out


_BODILESS_ERROR = "the journal was opened with a body budget: its bodies are in it"
ROW: Final = 6  # longs a reference in `JournalState.ref_arrays`
_ROW: Final = struct.Struct("=6q").pack
_ROW_INTO: Final = struct.Struct("=6q").pack_into
_ROW_BYTES: Final = ROW * 8
_ZERO: Final = (0,)


def _ref_row(
    view: memoryview,
    at_byte: int,
    live: _LiveSet[Any],
    msg_id: int,
    ref: Any,
    record_of: Callable[[Any], Any],
    packed: Sequence[Any],
    packs_by_number: Sequence[Any],
) -> int:
    """Write the row of a reference the dicts hold (`_from_live`); where the next goes."""
    at_ms = 0
    if isinstance(ref, int):  # a packed AddRef: its count (`frames.index_plain`)
        kept = packed[ref >> PACK_SHIFT]
        slot = ref & _SLOT_MASK
        count = kept.get(slot, 0)
        pack = packs_by_number[ref >> PACK_SHIFT]
        if slot - 1 not in kept and pack.spans[slot - 1] >= 0:  # its message, bodiless
            _ROW_INTO(view, at_byte, msg_id, count, 0, pack.sizes[slot >> 1], 0, pack.expiring)
            return at_byte + _ROW_BYTES
    elif not isinstance(ref, _RefSlot):
        count = _count(record_of(ref))
    else:
        update, scheduled = ref.count, ref.scheduled
        count = _count(_resolve(packed, record_of, ref.add if update is None else update))
        at_ms = 0 if scheduled is None else record_of(scheduled).at_ms
    size, first_ts, expiration_ms = -1, 0, 0
    item = live.messages[msg_id]
    if isinstance(item, int) and (item & _SLOT_MASK) not in packed[item >> PACK_SHIFT]:
        # a bodiless packed message, not in its pair
        pack = packs_by_number[item >> PACK_SHIFT]
        size, first_ts, expiration_ms = pack.sizes[(item & _SLOT_MASK) >> 1], 0, pack.expiring
    _ROW_INTO(view, at_byte, msg_id, count, at_ms, size, first_ts, expiration_ms)
    return at_byte + _ROW_BYTES


def _pending(
    live: _LiveSet[Any], packs: Packs, queue: str, held: dict[int, Any]
) -> list[tuple[int, int]]:
    """`queue`'s references the dicts hold, as (place of their first AddRef, id) in file
    order: merged with the compact index's pairs by `_merged_rows` and `_queue_parts`."""
    first: dict[tuple[str, int], Any] = live.first_of or {}
    pending: list[tuple[int, int]] = []
    for msg_id, ref in held.items():
        item = first.get((queue, msg_id))
        if item is None:
            item = ref.add if isinstance(ref, _RefSlot) else ref
        pending.append((position(packs, item), msg_id))
    pending.sort()
    return pending


def _merged_rows(
    view: memoryview,
    live: _LiveSet[Any],
    compact: Compact,
    queue: str,
    held: dict[int, Any],
    record_of: Callable[[Any], Any],
    packed: Sequence[Any],
) -> int:
    """Write the rows of `queue`'s references, those of the compact index and those of
    the dicts, in the order they were added: by the place of their first AddRef in the
    files (`locs.position`; the open added them in file order, issue 23, tenth pass).
    Where the rows end."""
    packs = compact.all
    pending = _pending(live, packs, queue, held)
    d = 0
    at_byte = 0
    for pack in compact.packs:
        kept = packed[pack.number]
        ranges = queue_ranges(pack, queue)
        if not ranges:
            continue
        ids, out, spans, sizes = pack_view(pack)
        number = pack.seg.number << 40
        for start, last in ranges:
            for i in range(start, last):
                if out[i]:
                    continue
                slot = i << 1 | 1
                if d < len(pending):
                    span: int = spans[slot]
                    here = number | span >> _SPAN_SHIFT
                    while d < len(pending) and pending[d][0] < here:
                        msg_id = pending[d][1]
                        at_byte = _ref_row(
                            view, at_byte, live, msg_id, held[msg_id], record_of, packed, packs
                        )
                        d += 1
                msg_id = ids[i]
                count = kept.get(slot, 0)
                if slot - 1 not in kept:  # bodiless
                    _ROW_INTO(view, at_byte, msg_id, count, 0, sizes[i], 0, pack.expiring)
                else:
                    _ROW_INTO(view, at_byte, msg_id, count, 0, -1, 0, 0)
                at_byte += _ROW_BYTES
    while d < len(pending):
        msg_id = pending[d][1]
        at_byte = _ref_row(view, at_byte, live, msg_id, held[msg_id], record_of, packed, packs)
        d += 1
    return at_byte


def _queue_parts(
    live: _LiveSet[Any],
    compact: Compact,
    queue: str,
    held: dict[int, Any],
    record_of: Callable[[Any], Any],
    packed: Sequence[Any],
) -> list[array[int] | Run]:
    """`queue`'s references as `_merged_rows` orders them, where some messages were left
    in their files: each stretch of compact pairs of such messages with a count of 0 as a
    `Run` (no row: a journal backlog reads their ids and sizes from the pack), rows for
    the rest, between (issue 23, tenth pass)."""
    packs = compact.all
    pending = _pending(live, packs, queue, held)
    parts: list[array[int] | Run] = []
    buf = bytearray()
    scratch = bytearray(_ROW_BYTES)
    row_view = memoryview(scratch)
    run: Run | None = None
    d = 0
    for pack in compact.packs:
        kept = packed[pack.number]
        ranges = queue_ranges(pack, queue)
        if not ranges:
            continue
        number = pack.seg.number << 40
        if _whole(pack, kept):
            # Unloaded, every pair a run's: its queue runs whole as `Run`s, after the dicts'
            # references before its segment, unless one is in it (then loaded, below).
            while d < len(pending) and pending[d][0] < number:
                if run is not None:
                    parts.append(run)
                    run = None
                msg_id = pending[d][1]
                _ref_row(row_view, 0, live, msg_id, held[msg_id], record_of, packed, packs)
                buf += scratch
                d += 1
            if d >= len(pending) or pending[d][0] >= number + (1 << 40):
                for start, last in ranges:
                    if run is not None:
                        parts.append(run)
                    elif buf:
                        parts.append(_rows_of(buf))
                        buf = bytearray()
                    run = Run(pack, start, last, pack.expiring)
                continue
        ids, out, spans, sizes = pack_view(pack)
        for start, last in ranges:
            for i in range(start, last):
                if out[i]:
                    continue
                slot = i << 1 | 1
                if d < len(pending):
                    span: int = spans[slot]
                    here = number | span >> _SPAN_SHIFT
                    while d < len(pending) and pending[d][0] < here:
                        if run is not None:
                            parts.append(run)
                            run = None
                        msg_id = pending[d][1]
                        _ref_row(row_view, 0, live, msg_id, held[msg_id], record_of, packed, packs)
                        buf += scratch
                        d += 1
                count = kept.get(slot, 0)
                bodiless = slot - 1 not in kept
                if bodiless and count == 0:  # a run
                    if run is not None and run.pack is pack and run.end == i:
                        run.end = i + 1
                    else:
                        if run is not None:
                            parts.append(run)
                        elif buf:
                            parts.append(_rows_of(buf))
                            buf = bytearray()
                        run = Run(pack, i, i + 1, pack.expiring)
                    continue
                if run is not None:
                    parts.append(run)
                    run = None
                msg_id = ids[i]
                if bodiless:  # counted
                    buf += _ROW(msg_id, count, 0, sizes[i], 0, pack.expiring)
                else:
                    buf += _ROW(msg_id, count, 0, -1, 0, 0)
    if run is not None:
        parts.append(run)
    while d < len(pending):
        msg_id = pending[d][1]
        _ref_row(row_view, 0, live, msg_id, held[msg_id], record_of, packed, packs)
        buf += scratch
        d += 1
    if buf:
        parts.append(_rows_of(buf))
    return parts


def _whole(pack: _Pack, kept: Any) -> bool:
    """Whether `pack` is unloaded with every pair in the compact index (none taken since:
    `_Pack.taken`), bodiless and counted 0 (no entry in `kept`): what `_from_live` needs
    of it is in its summary (issue 23, eleventh and twelfth passes)."""
    return not pack.loaded and not kept and not pack.taken


def _rows_of(buf: bytearray) -> array[int]:
    rows = array("q")
    rows.frombytes(buf)
    return rows


def _record_of_row(stored: MessageRow | MessageLayout) -> AddMessage:
    """The AddMessage of a row; a layout has no body here (recovery reads it from the
    journal: `FileJournal.read_message`)."""
    if len(stored) != 10:
        raise ValueError(_BODILESS_ERROR)
    return add_message_of_row(cast(MessageRow, stored))


def _resolve(packed: Sequence[Any], record_of: Callable[[Any], Any], item: Any) -> Any:
    """`_from_live`'s record of an item, a packed record's handle or another item."""
    if isinstance(item, int):
        return packed[item >> PACK_SHIFT].get(item & _SLOT_MASK, 0)
    return record_of(item)


def _count(ref: Any) -> int:
    """The delivery count of a reference's AddRef or UpdateDeliveryCount, of an AddRef's
    row (`codec.RefRow`: msg_id, queue, count), or a packed AddRef's count itself."""
    if isinstance(ref, int):
        return ref
    count: int = ref[2] if isinstance(ref, tuple) else ref.delivery_count
    return count
