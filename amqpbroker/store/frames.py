"""Reading a segment's frames at recovery speed (issue 23 item 4).

The open reads millions of frames; almost all are sound and of the layouts the broker
writes per message. `read_batches` checks those (length, flags, crc, payload layout)
as `segments._check_frame` and `codec.decode` do, in one loop without a call per check,
and stops at the first frame it does not take: the end of the data, a bad frame, or a
record of another type or layout, which the caller reads with the full checks (and their
reasons). An AddMessage comes back as its `codec.MessageLayout` (no body copied), an
AddRef as its `codec.RefRow` (no record object): tuples, told apart by their length.

A plain module (not a part of `FileJournal`), so that mypyc can compile it (setup.py).
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Final

import amqpbroker.store.codec as codec
from amqpbroker.core.records import AddRef, Record, RecordType
from amqpbroker.store.api import JournalError
from amqpbroker.store.liveness import _LiveSet
from amqpbroker.store.locs import (
    _SLOT_MASK,
    PACK_SHIFT,
    Item,
    _Pack,
    compact_add,
    note_foreign,
    pack_digest,
)
from amqpbroker.store.segments import (
    _FLAGS_KNOWN,
    _FRAME,
    _MAX_PAYLOAD,
    _SPAN_SHIFT,
    BATCH_END,
    FRAME_BYTES,
    HEADER_BYTES,
    _Loc,
    _Segment,
)

# A record read (or an AddMessage's layout, an AddRef's row), its offset, its frame's size.
Entry = tuple[Record | codec.MessageLayout | codec.RefRow, int, int]
# What the open keeps of a live record for `FileJournal.state()`: the record, or a row.
Kept = Record | codec.MessageLayout | codec.MessageRow | codec.RefRow

# Final: C statics once compiled (a plain global is a dict lookup per use there).
_ADD_MESSAGE: Final = int(RecordType.ADD_MESSAGE)
_ADD_REF: Final = int(RecordType.ADD_REF)
_ACK_REF: Final = int(RecordType.ACK_REF)
_HEAD: Final = FRAME_BYTES
_UNKNOWN_FLAGS: Final = ~_FLAGS_KNOWN
_MAX: Final = _MAX_PAYLOAD
_END: Final = BATCH_END
_UNPACK: Final = _FRAME.unpack_from
# A pair's two spans as the bytes of two slots of `_Pack.spans` (`array('q')`: native
# order): one `frombytes` of a run, not `extend` with an int each, which converts each
# through the generic argument parser (issue 23, eighth pass).
_PAIR: Final = struct.Struct("=2q").pack
_DECODERS: Final = codec._FAST_DECODE_AT
_TAG_INT_AT: Final = codec._TAG_INT.unpack_from
_STRINGS: Final = codec._STRINGS

# The same loop in C for the two records of every queued message (`_framescan.c`, built
# with the compiled build only, setup.py): `read_batches` hands it each run of them and
# reads the frame it stops at itself. None: this loop does all of it.
Scan = Callable[
    [
        codec.Data | memoryview,
        int,
        list[Entry],
        int,
        list[tuple[list[Entry], int]],
        dict[bytes, str],
    ],
    tuple[int, list[Entry], int],
]
_scan: Scan | None
try:
    from amqpbroker.store._framescan import scan as _scan
except ImportError:  # the pure-Python build (editable installs, no C compiler)
    _scan = None


def read_batches(
    data: codec.Data,
    pos: int,
    batch: list[Entry],
    top: int,
    batches: list[tuple[list[Entry], int]],
    limit: int = -1,
) -> tuple[int, list[Entry], int, int]:
    """Read frames from `pos` on, adding to `batch` (the records of an unfinished append,
    whose largest message id is `top`); each complete append goes to `batches` with its
    largest message id. Returns where it stopped (the end of `data`, or a frame for the
    full checks), the unfinished append with its largest id, and how many AckRefs it
    read (none: no message can have died meanwhile). `limit` (>= 0): no frame ending
    after it is read (the open reads a segment in bounded steps, `_Opening._scan_data`)."""
    size = len(data) if limit < 0 else min(limit, len(data))
    view = memoryview(data)
    if size < len(data):
        view = view[:size]  # (what the C loop reads: it stops at its buffer's end)
    unpack = _UNPACK
    crc32 = zlib.crc32
    acks = 0
    # The crc of a frame's length field, by length: a journal's frames come in a few
    # sizes, and a lookup costs less than a crc32 call over a slice.
    heads: dict[int, int] = {}
    # Declared: compiled, the unpacked fields are then native ints, not objects each
    # operation below goes through Python's number protocol for.
    length: int
    crc: int
    type_id: int
    flags: int
    scan = _scan
    while size - pos >= _HEAD:
        if scan is not None:
            pos, batch, top = scan(view, pos, batch, top, batches, _STRINGS)
            if size - pos < _HEAD:
                break
        length, crc, type_id, flags = unpack(data, pos)
        end = pos + _HEAD + length
        if end > size or flags & _UNKNOWN_FLAGS or length > _MAX:
            break
        head = heads.get(length)
        if head is None:
            head = crc32(view[pos : pos + 4])
            if len(heads) < 1024:
                heads[length] = head
        if crc32(view[pos + 8 : end], head) != crc:
            break
        msg_id: int
        record: Record | codec.MessageLayout | codec.RefRow
        if type_id == _ADD_MESSAGE:
            layout = codec.add_message_layout(data, pos + _HEAD, end)
            if layout is None:
                break
            msg_id = layout[0]
            record = layout
        elif type_id == _ADD_REF:
            row = codec.add_ref_row(data, pos + _HEAD, end)
            if row is None:
                break
            msg_id = row[0]
            record = row
        else:
            decoder = _DECODERS.get(type_id)
            if decoder is None:
                break
            try:
                decoded: Any = decoder(data, pos + _HEAD, end)
            except (IndexError, struct.error, UnicodeError):
                break
            if decoded is None:
                break
            msg_id = decoded.msg_id
            record = decoded
            if type_id == _ACK_REF:
                acks += 1
        if msg_id > top:
            top = msg_id
        batch.append((record, pos, end - pos))
        pos = end
        if flags & _END:
            batches.append((batch, top))
            batch = []
            top = 0
    return pos, batch, top, acks


def index_plain(
    seg: _Segment,
    batch: list[Entry],
    live: _LiveSet[Item],
    keep: dict[_Loc, Kept],
    unread: list[Item],
    pack: _Pack,
) -> int:
    """Index the leading AddMessage layouts and AddRefs of `batch` (an append read at
    open) as `FileJournal._index_batch` does, without its checks for tombstones: neither
    record kills one that needs one (`_LiveSet.add_message`, `_LiveSet.add_ref`). Returns
    how many it indexed; the rest of `batch` is for `_index_batch`. Almost every record of
    a journal is one of the two: compiled, this is the open's per-record loop (issue 23
    item 4). A message and its one reference go into `pack` (`seg`'s), as two slots:
    no `_Loc`, no `items` or `keep` entry (issue 23, seventh pass), and into the compact
    index: no dict entry either (tenth pass; `store/locs.py`)."""
    items = seg.items  # (`live.add_message`, not a bound method in a local: compiled, a
    # direct call of a native method, not a call through Python's protocol)
    spans = pack.spans
    kept = pack.kept
    compact = live.compact
    assert compact is not None  # (the file journal's)
    messages = live.messages
    assert kept is not None  # (the open's: `state()` has not read them yet)
    base = pack.number << PACK_SHIFT
    # The pairs' spans, put into `spans` with one `frombytes` (compiled, an array's
    # `append` is a method call by name, ~1.2k instructions, and `extend` parses each int
    # generically): before any record that could kill one of them (the rules of an
    # unpaired record), and at the end.
    pending = bytearray()
    slot = len(spans)
    added = 0  # live bytes (the `_on_dead` calls meanwhile subtract theirs)
    done = 0
    count = len(batch)
    msg_id: int
    while done < count:
        record, offset, size = batch[done]
        if isinstance(record, tuple) and len(record) != 3 and done + 1 < count:
            # A message and then its one reference, as the broker writes them: into the
            # compact index when its id is above every id there (and so new: no rule
            # has met it), with no call of the rules (issue 23, tenth pass).
            row, ref_offset, ref_size = batch[done + 1]
            msg_id = record[0]
            if (
                isinstance(row, tuple)
                and len(row) == 3
                and row[0] == msg_id
                and msg_id > compact.top
                and msg_id not in messages
            ):
                if slot + 2 > _SLOT_MASK:  # (a 4 GiB segment of pairs: not met)
                    break
                compact_add(compact, pack, msg_id, row[1])
                unread.append(base | slot)
                span = offset << _SPAN_SHIFT | size
                pending += _PAIR(span, ref_offset << _SPAN_SHIFT | ref_size)
                kept[slot] = record
                # The reference's count alone, if not 0: its id and queue are in the
                # pack (the row, a tuple and an id, ~96 B a message at the peak: issue
                # 23, eighth pass).
                if row[2]:
                    kept[slot + 1] = row[2]
                slot += 2
                added += size + ref_size
                done += 2
                continue
        if pending:  # (the rules below may kill a packed record: its span must be there)
            spans.frombytes(pending)
            pending = bytearray()
        if isinstance(record, tuple):
            item = _Loc(seg, offset, size)
            note_foreign(pack, compact.top, record[0])  # (not a pair: the rules' path)
            if len(record) == 3:  # an AddRef's row
                ref: Any = record
                if not live.add_ref_of(ref[1], ref[0], item):
                    done += 1
                    continue
            else:
                live.add_message(record[0], item)
                unread.append(item)
        elif type(record) is AddRef:
            item = _Loc(seg, offset, size)
            note_foreign(pack, compact.top, record.msg_id)
            if not live.add_ref(record, item):
                done += 1
                continue
        else:
            break
        # The span itself: one int object per record, not two (`Any`: compiled code would
        # unbox an `int` attribute and box it again as the key, a new object).
        loc: Any = item
        items[loc.span] = item
        keep[item] = record
        added += size
        done += 1
    if pending:
        spans.frombytes(pending)
    seg.live_bytes += added
    return done


def read_unread(
    data: codec.Data, unread: list[Item], keep: dict[_Loc, Kept], pack: _Pack, budget: int
) -> int:
    """Copy out the AddMessages of `unread` that are still live (their layouts in `keep`,
    or in `pack` for a handle), from the segment `data` they were read from, as
    `codec.MessageRow`s, while `budget` bytes of bodies remain (< 0: no limit):
    `_Opening._read_unread`. Past it a message keeps its layout (no body: recovery leaves
    it in the journal, issue 23 "memory bounded during recovery"): a packed one keeps
    not even that: no entry in `pack.kept`, its body size in `pack.sizes` (issue 23,
    ninth and tenth passes: no object a message past the budget, 4 bytes). The budget
    left."""
    kept = pack.kept
    sizes = pack.sizes
    assert kept is not None
    layout: Any
    for item in unread:
        if isinstance(item, int):
            slot = item & _SLOT_MASK
            layout = kept.get(slot)
        else:
            layout = keep.get(item)
        if layout is not None:
            if budget >= 0:
                size: int = layout[4] - layout[3]
                if size > budget:
                    budget = 0
                    if isinstance(item, int):
                        slot = item & _SLOT_MASK
                        pair = slot >> 1
                        if len(sizes) <= pair:  # zeros up to the pack's last pair
                            sizes.frombytes(bytes((len(pack.ids) - len(sizes)) * 4))
                        sizes[pair] = size
                        expiration: int = layout[5]
                        if expiration and (not pack.expiring or expiration < pack.expiring):
                            pack.expiring = expiration
                        del kept[slot]
                    continue
                budget -= size
            row = codec.message_row(data, layout)  # (a direct call, compiled)
            if isinstance(item, int):
                kept[item & _SLOT_MASK] = row
            else:
                keep[item] = row
    if len(kept) < len(pack.ids) // 2:
        # Most were left in the file: a dict keeps the table its entries had (~40 bytes
        # a message) until rebuilt.
        pack.kept = dict(kept)
    return budget


# Bytes of a segment a rebuild reads in one step (its pages go back after each, as the
# open's do: `opening._STEP`).
_RELOAD_STEP: Final = 4 << 20


def reload_pack(pack: _Pack) -> None:
    """Rebuild an unloaded pack's arrays from its segment (`locs.Compact.loader`): the
    AddMessage and AddRef of each of its pairs are the frames of the segment, up to what
    the open read (`pack.limit`), with an id in its range, but those of a mixed pack's
    messages its segment acks after them (`_reload`; `locs.pack_settle` unloaded it only
    if that gives back exactly its pairs). Raises `JournalError` if what it finds is not
    what the open packed (`pack.digest`), or if the file cannot be read (a file changed
    or removed since the open: the ninth attack pass; `store/backlog.py` passes such a
    pack's references as lost)."""
    path = pack.seg.path
    try:
        ids, spans, sizes = _rebuilt(pack)
    except (OSError, ValueError) as e:  # removed, unreadable, or empty (mmap's ValueError)
        raise JournalError(
            f"journal segment {path}: its index could not be rebuilt from the file ({e})"
        ) from e
    if len(ids) != pack.count or pack_digest(ids, spans) != pack.digest:
        raise JournalError(
            f"journal segment {path}: its index could not be rebuilt from the file "
            f"({len(ids)} of {pack.count} messages found)"
        )
    out = bytearray(len(ids))
    for i in pack.taken:  # (the rules' changes since the open: `locs._summarized`)
        out[i] = 1
    for slot in pack.dead:
        spans[slot] = ~spans[slot]
    pack.ids = ids
    pack.spans = spans
    pack.sizes = sizes
    pack.out = out


def rebuilds(pack: _Pack) -> bool:
    """Whether a rebuild of the mixed pack `pack` (its summary set, its arrays still
    loaded) gives back its arrays (`locs.Compact.checker`): the open asks once, before
    unloading it, so that a later rebuild cannot fail for a record of its segment the
    walk mistakes for a pair (issue 23, twelfth pass)."""
    ids, spans, _ = _rebuilt(pack)
    return ids == pack.ids and spans == pack.spans


def _rebuilt(pack: _Pack) -> tuple[array[int], array[int], array[int]]:
    """The arrays `_reload` finds in the pack's segment (empty: it found no pairs)."""
    with open(pack.seg.path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _reload(data, pack)
    except (IndexError, struct.error):  # (a frame cut short: not what the open read)
        return array("q"), array("q"), array("I")
    finally:
        with contextlib.suppress(BufferError):  # (a view left by an error: unmapped later)
            data.close()


def _reload(data: mmap.mmap, pack: _Pack) -> tuple[array[int], array[int], array[int]]:
    """`reload_pack`'s walk over the mapped segment `data`: the frames' headers alone,
    and of an AddMessage or AddRef its id (and an AddMessage's body size), without the
    crc or the layout the open checked (a rebuild trusts the open; `pack.digest` checks
    what it finds). Any other record is passed over: none has an id in the pack's range
    (`locs.pack_settle`), but in a mixed pack an AckRef, whose pair of the segment is
    dropped (a message added and acked in the segment: the open indexed none of it)."""
    limit = min(pack.limit, len(data))
    ids: array[int] = array("q")
    spans: array[int] = array("q")
    sizes: array[int] = array("I")
    lo: int = pack.first
    hi: int = pack.last
    mixed = pack.mixed
    drop = bytearray()  # per pair of a mixed pack: 1 if acked after it
    unpack = _UNPACK
    head = codec._UNPACK_HEAD
    u32 = codec._UNPACK_U32
    tag_int = _TAG_INT_AT
    pending = bytearray()
    want = -1  # the id of the AddMessage waiting for its AddRef
    want_span = 0
    length: int
    type_id: int
    msg_id: int
    address_len: int
    pos = HEADER_BYTES
    given = 0
    while limit - pos >= _HEAD:
        length, _, type_id, _ = unpack(data, pos)
        end = pos + _HEAD + length
        if end > limit:
            break
        if type_id == _ADD_MESSAGE:
            _, _, msg_id, _, address_len = head(data, pos + _HEAD)
            if lo <= msg_id <= hi:
                if want != -1:
                    return array("q"), array("q"), array("I")
                want = msg_id
                want_span = pos << _SPAN_SHIFT | (end - pos)
                # (the body's length: after the address, the durable byte and its tag)
                sizes.append(u32(data, pos + _HEAD + codec._HEAD_SIZE + address_len + 2)[0])
        elif type_id == _ADD_REF:
            start = pos + _HEAD
            msg_id = tag_int(data, start + 6 + u32(data, start + 2)[0])[1]
            if lo <= msg_id <= hi:
                if msg_id != want or (mixed and ids and msg_id <= ids[-1]):
                    return array("q"), array("q"), array("I")
                ids.append(msg_id)
                pending += _PAIR(want_span, pos << _SPAN_SHIFT | (end - pos))
                want = -1
        elif mixed and type_id == _ACK_REF:
            # (its payload as the AddRef's: a queue name, then the id; ids increasing)
            start = pos + _HEAD
            msg_id = tag_int(data, start + 6 + u32(data, start + 2)[0])[1]
            if lo <= msg_id <= hi:
                i = bisect_left(ids, msg_id)
                if i < len(ids) and ids[i] == msg_id:
                    if len(drop) <= i:
                        drop.extend(bytes(len(ids) - len(drop)))
                    drop[i] = 1
        pos = end
        if pos - given >= _RELOAD_STEP:
            spans.frombytes(pending)
            pending = bytearray()
            edge = pos - pos % mmap.PAGESIZE
            data.madvise(mmap.MADV_DONTNEED, given, edge - given)
            given = edge
    spans.frombytes(pending)
    if want != -1:
        return array("q"), array("q"), array("I")
    if drop:
        return _kept_pairs(ids, spans, sizes, drop)
    return ids, spans, sizes


def _kept_pairs(
    ids: array[int], spans: array[int], sizes: array[int], drop: bytearray
) -> tuple[array[int], array[int], array[int]]:
    """The pairs of `ids` (and their spans and sizes) whose `drop` byte is not 1, by
    stretches (the dropped ones are few between long stretches of the backlog's)."""
    kept_ids: array[int] = array("q")
    kept_spans: array[int] = array("q")
    kept_sizes: array[int] = array("I")
    count = len(ids)
    drop.extend(bytes(count - len(drop)))
    i = 0
    while i < count:
        j = drop.find(1, i)
        if j < 0:
            j = count
        kept_ids.extend(ids[i:j])
        kept_spans.extend(spans[2 * i : 2 * j])
        kept_sizes.extend(sizes[i:j])
        i = j + 1
    return kept_ids, kept_spans, kept_sizes
