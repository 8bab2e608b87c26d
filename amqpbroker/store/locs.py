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

*Unloaded packs* (issue 23, eleventh pass): a pack no rule touched keeps only a summary
(its first and last id, its pairs, its queue runs and their body bytes, the bytes of its
segment the open read, a check sum) once the open has read its segment
(`pack_settle`), and its arrays are rebuilt from that segment when wanted
(`Compact.loader`, `frames.reload_pack`: the open's frame loop over one segment). So a
message left in the journal costs nothing per message at rest; what stays is per segment.
A pack is unloaded only if a rebuild gives back exactly its pairs: no bytes of it were
skipped, and if another record of its segment has an id in its range (`note_foreign`: a
*mixed* pack, another queue's short-lived messages between its pairs), the rebuild passes
over the pairs its segment acks and the open checked once that this gives them back
(`Compact.checker`; twelfth pass). A rule's change to a settled pack (a pair taken, a
record dying) goes into its summary (`_summarized`: `taken`, `dead`, at most
`_CHANGES_MAX`), which a rebuild applies, rather than pinning it. Whoever
reads a pack's arrays gets them through `pack_view` (loaded first, under the compact
index's lock; at most `LOADED_MAX` packs no rule touched are loaded at a time, the oldest
unloaded first); a rule that changes a pack (an eviction, a record dying or moved by
compaction) pins it first (`pack_pin`): loaded until its segment is deleted, as before.
"""

from __future__ import annotations

import threading
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from amqpbroker.store.api import JournalError


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

    __slots__ = (
        "count",
        "dead",
        "digest",
        "expiring",
        "first",
        "foreign",
        "ids",
        "index",
        "kept",
        "last",
        "limit",
        "loaded",
        "mixed",
        "number",
        "out",
        "pinned",
        "qbytes",
        "queues",
        "seg",
        "sizes",
        "spans",
        "taken",
        "unreadable",
    )

    def __init__(self, number: int, seg: _Segment, index: Compact | None = None) -> None:
        self.number = number  # its place in the journal's list of packs
        self.seg = seg  # the file its live records are in
        # Unloading (module docstring, "Unloaded packs"): the compact index it is in (for
        # its lock and loader); whether its arrays are here (False: only the summary
        # below is); pinned: a rule touched it (an eviction, a dead or moved record) or it
        # cannot be rebuilt from its file, so its arrays stay until its segment goes.
        self.index = index
        self.loaded = True
        self.pinned = False
        # While the open builds it: whether a record of its segment outside its pairs has
        # an id in its range (`note_foreign`: a rebuild from the file must tell it from
        # them, `frames._reload`, which `pack_settle` checks by one rebuild), and the ids
        # of such records above every id packed when met (resolved when the pack is
        # settled; a few at most, else mixed). Kept in the summary: a rebuild of a mixed
        # pack passes over the pairs its segment acks after them (issue 23, twelfth pass).
        self.mixed = False
        self.foreign: list[int] = []
        # The summary an unloaded pack keeps: its pairs, the bytes of its segment the open
        # read (a rebuild reads no further: what the broker appends later is not the
        # open's), a check of what a rebuild must give back, and per queue run the body
        # bytes of its messages left in the file.
        self.count = 0
        self.first = 0  # its smallest id
        self.last = 0  # its largest id
        self.limit = 0
        self.digest = 0
        self.qbytes: list[int] = []
        # What the rules changed in it since (issue 23, twelfth pass), which a rebuild
        # applies: the pairs they took out of the compact index (`out` 1), the slots that
        # died (span negated); at most `_CHANGES_MAX` in all, then it is pinned.
        self.taken: list[int] = []
        self.dead: list[int] = []
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
        # Why a rebuild from its file failed ("" while none has): the next want of its
        # arrays fails at once with the same error, not with another walk of the file
        # (each under the index's lock; ninth attack pass).
        self.unreadable = ""


Packs = list[_Pack | None]  # by number; None: its segment is deleted


class Compact:
    """The compact index's packs in id order (module docstring), for `compact_find`."""

    __slots__ = ("all", "checker", "firsts", "loaded", "loader", "lock", "packs", "top")

    def __init__(self, packs: Packs) -> None:
        self.all = packs  # the journal's packs by number (`Packs`)
        self.packs: list[_Pack] = []  # those with a pair, in order
        self.firsts: list[int] = []  # the first id of each
        self.top = 0  # the largest id packed: a pair joins only above it
        # Unloaded packs (module docstring): the loaded ones that are not pinned, oldest
        # first (at most `LOADED_MAX`); the lock under which a pack is loaded, unloaded or
        # pinned (the loop thread's backlog reads, the writer's rules and the compactor
        # may meet one); what rebuilds a pack's arrays from its file (`frames.reload_pack`;
        # None: nothing is unloaded).
        self.loaded: dict[int, _Pack] = {}
        self.lock: Any = threading.Lock()
        self.loader: Callable[[_Pack], None] | None = None
        # Whether a rebuild of a mixed pack gives back its arrays (`frames.rebuilds`):
        # `pack_settle` asks it once before unloading one (issue 23, twelfth pass).
        self.checker: Callable[[_Pack], bool] | None = None


# Unloaded packs: at most this many packs no rule touched keep their arrays at a time (a
# backlog reads one, an id lookup loads one, `state()` one at a time); a pack of fewer
# pairs than `UNLOAD_MIN` is never unloaded (its arrays cost less than a rebuild is worth;
# a module global, not `Final`: tests lower it).
LOADED_MAX: Final = 2
UNLOAD_MIN = 256
# Queue runs an unloadable pack may have (its summary keeps them).
_RUNS_MAX: Final = 16
_FOREIGN_MAX: Final = 64
# Changes by the rules an unloaded pack's summary keeps (`_Pack.taken`, `_Pack.dead`).
_CHANGES_MAX: Final = 64


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
    pack.count += 1
    compact.top = msg_id


def note_foreign(pack: _Pack, top: int, msg_id: int) -> None:
    """The open met a record of `pack`'s segment with id `msg_id` that is not one of its
    pairs (the rules took it, or it was short-lived): if the id is or may come to be in
    the pack's range, the pack is mixed: a rebuild from the file must tell it from a
    pair, which `pack_settle` checks before it unloads the pack. `top`: the compact
    index's largest id (the pack's last, if it has a pair: it is the newest)."""
    if pack.mixed:
        return
    if msg_id <= top:
        if pack.ids and msg_id >= pack.ids[0]:
            pack.mixed = True
        return
    if len(pack.foreign) >= _FOREIGN_MAX:
        pack.mixed = True
    else:
        pack.foreign.append(msg_id)


def pack_settle(compact: Compact, pack: _Pack) -> bool:
    """The open read `pack`'s segment to its end: unload its arrays if a rebuild from the
    file can give them back (no rule touched it, no skipped bytes, and if a foreign record
    is in its range, one rebuild gave them back: `Compact.checker`), else pin it (module
    docstring, "Unloaded packs"). A pack the open
    kept records of for `state()` (bodies it read, counts: `kept`) stays loaded until
    `state()` has read them (True: unload it then, `pack_unload`), so that `state()` does
    not rebuild it; those are the body budget's, a bounded few."""
    ids = pack.ids
    count = len(ids)
    if pack.pinned or not count:
        return False
    first, last = ids[0], ids[-1]
    if (
        compact.loader is None
        or count < UNLOAD_MIN
        or pack.seg.skips
        or len(pack.queues) > _RUNS_MAX
        # (an evicted pair or a dead record pinned it already: `compact_take`, `pack_kill`)
    ):
        pack.pinned = True
        pack.foreign = []
        return False
    if any(first <= f <= last for f in pack.foreign):
        pack.mixed = True
    pack.foreign = []
    pack.first = first
    pack.last = last
    pack.limit = pack.seg.size_bytes
    pack.digest = pack_digest(ids, pack.spans)
    if pack.mixed and (compact.checker is None or not compact.checker(pack)):
        pack.pinned = True
        return False
    sizes = pack.sizes
    runs = pack.queues
    pack.qbytes = [
        sum(sizes[runs[k][0] : runs[k + 1][0] if k + 1 < len(runs) else count])
        for k in range(len(runs))
    ]
    if pack.kept:
        return True
    with compact.lock:
        _unload(pack)
    return False


def pack_unload(compact: Compact, pack: _Pack) -> None:
    """Unload a pack `pack_settle` kept loaded for `state()`, unless a rule pinned it."""
    with compact.lock:
        if pack.loaded and not pack.pinned:
            compact.loaded.pop(pack.number, None)
            _unload(pack)


def pack_digest(ids: array[int], spans: array[int]) -> int:
    """The check sum a rebuilt pack's arrays must have (`frames.reload_pack`): a crc of
    their bytes (read in place, at the crc's speed, not an int at a time)."""
    return zlib.crc32(spans, zlib.crc32(ids))


def _unload(pack: _Pack) -> None:
    """Drop a pack's arrays (its summary stays): under the compact index's lock."""
    pack.ids = array("q")
    pack.spans = array("q")
    pack.out = bytearray()
    pack.sizes = array("I")
    pack.loaded = False


def _load(compact: Compact, pack: _Pack) -> None:
    """Rebuild an unloaded pack's arrays from its file, unloading the oldest loaded one
    past `LOADED_MAX`: under the compact index's lock."""
    loader = compact.loader
    assert loader is not None
    if pack.unreadable:
        raise JournalError(pack.unreadable)
    try:
        loader(pack)
    except JournalError as e:
        pack.unreadable = str(e)
        raise
    pack.loaded = True
    loaded = compact.loaded
    loaded[pack.number] = pack
    while len(loaded) > LOADED_MAX:
        oldest = next(iter(loaded))
        _unload(loaded.pop(oldest))


def pack_view(pack: _Pack) -> tuple[array[int], bytearray, array[int], array[int]]:
    """A pack's ids, out bytes, spans and sizes, loaded if they were not: arrays a reader
    may keep while another thread unloads the pack (an unpinned pack's never change)."""
    compact = pack.index
    if pack.pinned or compact is None:  # (no index: never unloaded)
        return pack.ids, pack.out, pack.spans, pack.sizes
    with compact.lock:
        if not pack.loaded:
            _load(compact, pack)
        return pack.ids, pack.out, pack.spans, pack.sizes


def pack_pin(pack: _Pack) -> None:
    """A rule is about to change the pack (an eviction, a record dying or moved): load it
    if it was not, and keep it loaded until its segment goes."""
    if pack.pinned:
        return
    compact = pack.index
    if compact is None:
        pack.pinned = True
        return
    with compact.lock:
        if not pack.loaded:
            _load(compact, pack)
        compact.loaded.pop(pack.number, None)
        pack.pinned = True


def pack_ids(pack: _Pack) -> array[int]:
    """A pack's ids (`pack_view`), for a journal backlog's run."""
    if pack.pinned:
        return pack.ids
    return pack_view(pack)[0]


def pack_sizes(pack: _Pack) -> array[int]:
    """A pack's sizes (`pack_view`), for a journal backlog's run."""
    if pack.pinned:
        return pack.sizes
    return pack_view(pack)[3]


def _find(compact: Compact, msg_id: int) -> tuple[_Pack | None, int]:
    """The pack and pair of `msg_id` if only the compact index holds it, else (None, -1);
    under the lock if the pack is not pinned (loaded first if it must be)."""
    if msg_id > compact.top:
        return None, -1
    k = bisect_right(compact.firsts, msg_id) - 1
    if k < 0:
        return None, -1
    pack = compact.packs[k]
    if not pack.loaded and (msg_id > pack.last or msg_id < pack.first):
        return None, -1
    ids, out, _, _ = pack_view(pack)
    i = bisect_left(ids, msg_id)
    if i < len(ids) and ids[i] == msg_id and not out[i]:
        return pack, i
    return None, -1


def compact_find(compact: Compact, msg_id: int) -> int:
    """The handle of the AddMessage of `msg_id` if only the compact index holds it (its
    AddRef's is one more), else -1."""
    pack, i = _find(compact, msg_id)
    if pack is None:
        return -1
    return pack.number << PACK_SHIFT | i << 1


def compact_take(compact: Compact, msg_id: int) -> tuple[int, str]:
    """Take the pair of `msg_id` out of the compact index (`_LiveSet._evict`): its
    AddMessage's handle and its queue, its pack pinned; (-1, "") if it does not hold it."""
    pack, i = _find(compact, msg_id)
    if pack is None:
        return -1, ""
    if _summarized(pack):
        with compact.lock:
            if _summarized(pack):  # (its summary keeps the change: not pinned)
                if not pack.loaded:
                    _load(compact, pack)
                if pack.out[i]:
                    return -1, ""
                pack.out[i] = 1
                pack.taken.append(i)
                return pack.number << PACK_SHIFT | i << 1, pair_queue(pack, i)
    pack_pin(pack)
    if pack.out[i]:  # (taken meanwhile: the rules run on one thread at a time)
        return -1, ""
    pack.out[i] = 1
    return pack.number << PACK_SHIFT | i << 1, pair_queue(pack, i)


def _summarized(pack: _Pack) -> bool:
    """Whether a rule's change to `pack` goes into its summary (`_Pack.taken`, `dead`),
    which a rebuild applies, rather than pin it (issue 23, twelfth pass): it is settled
    (`limit`: the open read its segment; a pack the open is building stays its own
    arrays) and unpinned, and its summary has room. A pair of a settled segment taken or
    dying is typically a message acked in the next segment (another queue's short-lived
    message at the segment's end), or the first acks of a drain. Read again under the
    lock before the change."""
    return (
        not pack.pinned
        and pack.limit > 0
        and pack.index is not None
        and len(pack.taken) + len(pack.dead) < _CHANGES_MAX
    )


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
            found.append((start, runs[k + 1][0] if k + 1 < len(runs) else pack.count))
    return found


def run_bytes(run: Run) -> int:
    """The body bytes of a run's messages: its pack's summary's if the run is one of its
    queue runs whole, else summed from its sizes."""
    total: int = run_summary_bytes(run)
    if total < 0:
        total = sum(pack_sizes(run.pack)[run.start : run.end])
    return total


def run_summary_bytes(run: Run) -> int:
    """`run_bytes` from an unloaded pack's summary, never loading it: -1 if the pack is
    loaded or the run is not one of its queue runs whole."""
    pack = run.pack
    if not pack.loaded:
        runs = pack.queues
        for k in range(len(runs)):
            end = runs[k + 1][0] if k + 1 < len(runs) else pack.count
            if runs[k][0] == run.start and end == run.end and k < len(pack.qbytes):
                return pack.qbytes[k]
    return -1


def compact_ids(compact: Compact, queue: str) -> list[int]:
    """The ids of the pairs of `queue` only the compact index holds (a DeleteQueue)."""
    found: list[int] = []
    for pack in compact.packs:
        ranges = queue_ranges(pack, queue)
        if not ranges:
            continue
        ids, out, _, _ = pack_view(pack)
        for start, end in ranges:
            for i in range(start, end):
                if not out[i]:
                    found.append(ids[i])
    return found


def compact_drop(pack: _Pack) -> None:
    """The pack's segment is deleted (every record of it dead): its arrays go."""
    compact = pack.index
    if compact is not None:
        with compact.lock:
            compact.loaded.pop(pack.number, None)
            pack.pinned = True
            _unload(pack)
            pack.loaded = True  # (nothing to load: none of it is live)
    else:
        _unload(pack)
        pack.loaded = pack.pinned = True
    pack.queues = []
    pack.count = 0


def pack_kill(packs: Packs, handle: int) -> _Segment | None:
    """A packed record dies: its span goes, its segment's live bytes drop. The segment
    (for the tombstone rule), or None if it was dead already."""
    pack = packs[handle >> PACK_SHIFT]
    if pack is None:
        return None
    slot = handle & _SLOT_MASK
    span: int
    compact = pack.index
    if compact is not None and _summarized(pack):
        with compact.lock:
            if _summarized(pack):  # (its summary keeps the change: not pinned)
                if not pack.loaded:
                    _load(compact, pack)
                span = pack.spans[slot]
                if span < 0:
                    return None
                pack.spans[slot] = ~span
                pack.dead.append(slot)
                return _killed(pack, slot, span)
    pack_pin(pack)
    span = pack.spans[slot]
    if span < 0:
        return None
    pack.spans[slot] = ~span
    return _killed(pack, slot, span)


def _killed(pack: _Pack, slot: int, span: int) -> _Segment:
    """`pack_kill`'s bookkeeping of the dead `slot` (of span `span`): its segment."""
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
    span: int = pack_view(pack)[2][handle & _SLOT_MASK]
    assert span >= 0, handle
    return pack.seg.path, span >> _SPAN_SHIFT, span & _SIZE_MASK


def pack_entries(seg: _Segment) -> list[tuple[int, Item]]:
    """`(span, handle)` of the live packed records of `seg` (compaction's snapshot)."""
    entries: list[tuple[int, Item]] = []
    for pack in seg.packs:
        pack_pin(pack)  # (compaction moves them: `pack_move`)
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
        span: int = pack_view(pack)[2][item & _SLOT_MASK]
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
    pack_pin(pack)
    slot = handle & _SLOT_MASK
    if pack.spans[slot] >= 0:
        pack.spans[slot] = span
        seg.live_bytes += span & _SIZE_MASK
