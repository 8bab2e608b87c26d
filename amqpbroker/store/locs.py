"""Where the file journal's live records are: `_Segment`, `_Loc` and `_Pack` (issue 23).

A plain module that mypyc compiles (setup.py HOT_MODULES), apart from `segments.py`:
the open indexes millions of records, and the compiled read path (`store/frames.py`)
builds these as native objects and reads their fields directly, not through an
interpreted `__init__` and Python's attribute protocol. `segments.py` re-exports the
names (the journal's parts import them from there).

An index item (`Item`) is a `_Loc` or, for a record the open met in a message's usual
pair (its AddMessage, then its one AddRef), a *handle*: an int naming a slot of a
segment's `_Pack` (`pack number << PACK_SHIFT | slot`). The pack keeps the pair's two
spans in one `array('q')` (8 bytes a record, negative once dead) where a `_Loc` each, their
`_Segment.items` entries and the open's `keep` entries were: no object per record for
the millions of messages a restart indexes, most of which stay untouched until their
ack (issue 23, seventh pass). The liveness rules see handles as any other item.

The *compact index* (`Compact`, issue 23, tenth pass): a pair whose id is above every id
packed before is not in the liveness dicts at all. Its pack keeps its id (`_Pack.ids`,
increasing), its queue (`_Pack.queues`, runs) and one byte (`_Pack.out`: 0 while only
the compact index holds it); `compact_find` finds it by id (a bisect over the packs'
first ids, then one in the pack). The first rule that meets it by id (an ack, a count, a
second reference, a re-add, its queue deleted: `_LiveSet._evict`) moves it into the
dicts as its two handles, and the rules go on as before. So a message the open left in
its file costs the index 25 bytes (its id, two spans, a byte), no object and no dict
entry. A pair whose id is not above the last one packed (ids reused or out of order)
takes the rules' own path (`_Loc`s in the dicts).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any, Final


class _Segment:
    __slots__ = ("items", "live_bytes", "number", "packs", "path", "size_bytes", "skips")

    def __init__(self, number: int, path: Path, size_bytes: int) -> None:
        self.number = number
        self.path = path
        self.size_bytes = size_bytes  # bytes on disk, header included
        self.live_bytes = 0  # of live records and needed tombstones
        self.items: dict[int, _Loc] = {}  # `_Loc.span` -> live record or needed tombstone
        self.skips: list[tuple[int, int]] = []  # corrupt ranges skipped (skip_corrupt)
        # Packed records in this file (the open's, `_Pack`): one per segment read at open,
        # several after compaction merged segments.
        self.packs: list[_Pack] = []

    def __repr__(self) -> str:
        return f"<segment {self.number} {self.size_bytes}B live={self.live_bytes}B>"


_SPAN_SHIFT: Final = 33  # `_Loc.span`: offset << _SPAN_SHIFT | size
_SIZE_MASK: Final = (1 << _SPAN_SHIFT) - 1


class _Loc:
    """Where one live record (or needed tombstone) is. Two per queued durable message:
    nothing else on it (a tombstone's targets and compaction's copying are kept by the
    journal, issue 20). `span` is offset and size in one int (`offset << 33 | size`: a
    frame is at most 2**32 + 11 bytes): one int object where two were, also the key in
    `_Segment.items` (so in offset order)."""

    __slots__ = ("seg", "span")

    # `Any`, not `int`: compiled, an `int` field is stored unboxed and boxed again, a new
    # int object, at each read (a `_Segment.items` key is the span object itself).
    span: Any

    def __init__(self, seg: _Segment, offset: int, size: int) -> None:
        self.seg = seg
        self.span = offset << _SPAN_SHIFT | size

    @property
    def offset(self) -> int:
        offset: int = self.span >> _SPAN_SHIFT
        return offset

    @property
    def size(self) -> int:
        size: int = self.span & _SIZE_MASK
        return size


PACK_SHIFT: Final = 32  # a handle: pack number << PACK_SHIFT | slot
_SLOT_MASK: Final = (1 << PACK_SHIFT) - 1


# An index item: a record's `_Loc`, or the handle of its slot in a `_Pack`.
Item = _Loc | int


class _Pack:
    """The records the open indexed as a message's usual pair, in one segment (see the
    module docstring). Slot `2i` is the i-th pair's AddMessage, `2i + 1` its AddRef.
    Records only join at open; they leave by dying (`pack_kill`) and move only when
    compaction copies them (`pack_move`)."""

    __slots__ = ("expiring", "ids", "kept", "number", "out", "queues", "seg", "sizes", "spans")

    def __init__(self, number: int, seg: _Segment) -> None:
        self.number = number  # its place in the journal's list of packs
        self.seg = seg  # the file its live records are in
        # Per slot: `_Loc.span`, or `~span` once dead (negative: the place stays known,
        # `position`).
        self.spans: array[int] = array("q")
        # By slot, the open's layout or row of the AddMessage, or the AddRef's delivery
        # count if not 0 (what `keep` is for a `_Loc`, less the keys), until
        # `FileJournal.state()` has read them (None: read). A live pair's AddMessage with
        # no entry is `BODILESS`: a message whose body the open left in the file (past
        # its body budget): what recovery needs of it is in `sizes`. A dict, not a list
        # of every slot: nothing a message past the budget (issue 23, tenth pass).
        self.kept: dict[int, Any] | None = {}
        # The compact index (module docstring): per pair, its message id (increasing) and
        # 0 while the liveness dicts do not hold it (1: evicted into them, or dead); its
        # queue in runs, (first pair, queue), in pair order.
        self.ids: array[int] = array("q")
        self.out = bytearray()
        self.queues: list[tuple[int, str]] = []
        # Per pair, the body size of a message the open left in its file (`BODILESS`; 0
        # for the others, up to the last such pair): a journal backlog's bytes, 4 bytes a
        # message where its size, first_ts and expiration were 24 (`frames.read_unread`);
        # and the earliest expiration among those messages (0: none), for a backlog's
        # expiry, which is early at worst (issue 23, tenth pass; a message's own first_ts
        # and expiration are in its file).
        self.sizes: array[int] = array("I")
        self.expiring = 0


Packs = list[_Pack | None]  # by number; None: its segment is deleted


class Compact:
    """The compact index's packs in id order (module docstring), for `compact_find`."""

    __slots__ = ("all", "firsts", "packs", "top")

    def __init__(self, packs: Packs) -> None:
        self.all = packs  # the journal's packs by number (`Packs`)
        self.packs: list[_Pack] = []  # those with a pair, in order
        self.firsts: list[int] = []  # the first id of each
        self.top = 0  # the largest id packed: a pair joins only above it


class Run:
    """A run of a queue's references that only the compact index holds, each of a message
    the open left in its file with a delivery count of 0: pairs `start` to `end` of
    `pack`, in order. What a journal backlog keeps of them (`store/backlog.py`): no row a
    reference, their ids and sizes are the pack's (issue 23, tenth pass). `expiring`: the
    earliest expiration among them (0: none)."""

    __slots__ = ("end", "expiring", "pack", "start")

    def __init__(self, pack: _Pack, start: int, end: int, expiring: int) -> None:
        self.pack = pack
        self.start = start
        self.end = end
        self.expiring = expiring

    def __len__(self) -> int:
        return self.end - self.start


def compact_add(compact: Compact, pack: _Pack, msg_id: int, queue: str) -> None:
    """A pair joins the compact index (its spans are the pack's next two slots)."""
    ids = pack.ids
    if not ids:
        compact.packs.append(pack)
        compact.firsts.append(msg_id)
    queues = pack.queues
    if not queues or queues[-1][1] != queue:
        queues.append((len(ids), queue))
    ids.append(msg_id)
    pack.out.append(0)
    compact.top = msg_id


def compact_find(compact: Compact, msg_id: int) -> int:
    """The handle of the AddMessage of `msg_id` if only the compact index holds it (its
    AddRef's is one more), else -1."""
    if msg_id > compact.top:
        return -1
    k = bisect_right(compact.firsts, msg_id) - 1
    if k < 0:
        return -1
    pack = compact.packs[k]
    ids = pack.ids
    i = bisect_left(ids, msg_id)
    if i < len(ids) and ids[i] == msg_id and not pack.out[i]:
        return pack.number << PACK_SHIFT | i << 1
    return -1


def pair_queue(pack: _Pack, pair: int) -> str:
    """The queue of the pack's `pair`-th pair (a pack's runs are few: mostly one)."""
    queues = pack.queues
    k = len(queues) - 1
    while queues[k][0] > pair:
        k -= 1
    return queues[k][1]


def queue_ranges(pack: _Pack, queue: str) -> list[tuple[int, int]]:
    """The index ranges `[start, end)` of `pack`'s pairs that are `queue`'s (its runs of
    one queue), in file order; some of them may be out (`pack.out`)."""
    runs = pack.queues
    found: list[tuple[int, int]] = []
    for k in range(len(runs)):
        start, name = runs[k]
        if name == queue:
            found.append((start, runs[k + 1][0] if k + 1 < len(runs) else len(pack.ids)))
    return found


def compact_ids(compact: Compact, queue: str) -> list[int]:
    """The ids of the pairs of `queue` only the compact index holds (a DeleteQueue)."""
    found: list[int] = []
    for pack in compact.packs:
        ids, out = pack.ids, pack.out
        for start, end in queue_ranges(pack, queue):
            for i in range(start, end):
                if not out[i]:
                    found.append(ids[i])
    return found


def compact_drop(pack: _Pack) -> None:
    """The pack's segment is deleted (every record of it dead): its arrays go."""
    pack.ids = array("q")
    pack.out = bytearray()
    pack.queues = []
    pack.sizes = array("I")


def pack_kill(packs: Packs, handle: int) -> _Segment | None:
    """A packed record dies: its span goes, its segment's live bytes drop. The segment
    (for the tombstone rule), or None if it was dead already."""
    pack = packs[handle >> PACK_SHIFT]
    if pack is None:
        return None
    slot = handle & _SLOT_MASK
    span: int = pack.spans[slot]
    if span < 0:
        return None
    pack.spans[slot] = ~span
    kept = pack.kept
    if kept is not None:
        kept.pop(slot, None)
    seg = pack.seg
    seg.live_bytes -= span & _SIZE_MASK
    return seg


def pack_where(packs: Packs, handle: int) -> tuple[Path, int, int]:
    """Path, offset and size of a live packed record (`FileJournal.read_message`)."""
    pack = packs[handle >> PACK_SHIFT]
    assert pack is not None
    span: int = pack.spans[handle & _SLOT_MASK]
    assert span >= 0, handle
    return pack.seg.path, span >> _SPAN_SHIFT, span & _SIZE_MASK


def pack_entries(seg: _Segment) -> list[tuple[int, Item]]:
    """`(span, handle)` of the live packed records of `seg` (compaction's snapshot)."""
    entries: list[tuple[int, Item]] = []
    for pack in seg.packs:
        base = pack.number << PACK_SHIFT
        spans = pack.spans
        for slot in range(len(spans)):
            span: int = spans[slot]
            if span >= 0:
                entries.append((span, base | slot))
    return entries


def position(packs: Packs, item: Item) -> int:
    """Where a record is (live or dead), as one int in file order: segment number, then
    offset. The open's `state()` merges a queue's references in the dicts with those of
    the compact index by it."""
    if isinstance(item, int):
        pack = packs[item >> PACK_SHIFT]
        assert pack is not None
        span: int = pack.spans[item & _SLOT_MASK]
        if span < 0:
            span = ~span
        return pack.seg.number << 40 | span >> _SPAN_SHIFT
    loc: _Loc = item
    return loc.seg.number << 40 | loc.offset


def pack_move(packs: Packs, handle: int, seg: _Segment, span: int) -> None:
    """Compaction copied a packed record to `span` of `seg`: if it is still live, it
    is there now (the caller moves the packs themselves to `seg`)."""
    pack = packs[handle >> PACK_SHIFT]
    assert pack is not None
    slot = handle & _SLOT_MASK
    if pack.spans[slot] >= 0:
        pack.spans[slot] = span
        seg.live_bytes += span & _SIZE_MASK
