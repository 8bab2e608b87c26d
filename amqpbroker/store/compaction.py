"""Compaction of the file journal: deleting dead segments, rewriting mostly dead runs.

Theory of operation
-------------------
The file journal keeps an index of where each live record is (`_Loc`: segment, offset,
size), and per segment the bytes of live records and needed tombstones. The writer
updates it once records are synced, never before: compaction must not delete a message's
segment on the strength of an ack that is not on disk yet. It may lag a few syncs behind
(`_index_synced`), so that a message added and acked within the window costs the index
nothing (`_short_lived`); a segment is fully indexed before it is sealed, and `compact()`
indexes what is synced first. `compact()` (on the caller's
thread, or on the compactor thread after each segment roll when `auto_compact=True`):

1. deletes every sealed segment with no live bytes (repeating: a deleted segment can make
   the tombstones aimed at it unnecessary, and their segment dead);
2. rewrites runs of adjacent sealed segments that are mostly dead (live bytes below
   `compact_live_ratio` of their records) or small: their live records and needed
   tombstones, copied verbatim in order, go to a temp file, which is fsynced and renamed
   over the run's *last* segment; then the run's other segments are deleted. Replay order
   is preserved, so queue order survives compaction (copying live records into the
   current segment instead would reorder them, and could put an old tombstone after a
   newer add of the same key). A crash between the rename and the deletes leaves records
   twice, in the same order, which replays to the same state.

The current segment is never compacted. Compaction reads only sealed segments, so the
writer keeps appending meanwhile; the index is shared under a lock, held only briefly.

While a replay is being read, `compact()` does nothing. `_Compaction` is a part of
`FileJournal` (a mixin): it declares the journal state it reads, which
`FileJournal.__init__` sets.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import sys
import threading
from pathlib import Path
from typing import TypeVar

from amqpbroker.store.api import (
    CompactionResult,
    JournalCorrupt,
    JournalError,
    JournalFailed,
)
from amqpbroker.store.locs import Item, Packs, compact_drop, pack_entries, pack_move
from amqpbroker.store.segments import (
    _FILE_HEADER,
    _FRAME,
    _SIZE_MASK,
    _SPAN_SHIFT,
    _TEMP_SUFFIX,
    BATCH_END,
    FRAME_BYTES,
    HEADER_BYTES,
    MAGIC,
    VERSION,
    _Bad,
    _check_frame,
    _frame,
    _Loc,
    _Segment,
    _sync_directory,
    _write_fd,
)

log = logging.getLogger("amqpbroker.store.journal")  # one logger for the journal

# What a rewrite copies in one write, and the pages of a segment it maps at a time.
_COPY_STEP = 8 << 20


def _copy_records(
    fd: int,
    seg: _Segment,
    items: list[tuple[int, Item]],
    tail: bytes,
    offset: int,
    copied: list[tuple[Item, int, int]],
) -> tuple[bytes, int]:
    """Copy the records `items` (spans in file order) of `seg` to `fd` after `tail` (the
    frame copied last, held back), each checked: adjacent ones in one write, straight
    from the mapped file, its pages given back as the copy passes them (issue 23: a
    rewrite had read each segment whole and copied every frame into a list and then
    into one joined buffer, ~2.5 times the bytes it copied: a drain's peak RSS went up
    by a segment's worth and more, and the heap the small copies left was not given
    back). Each record goes to `copied` with its new offset; the last one's bytes are
    held back (the new tail). The new tail and the offset after it."""
    with open(seg.path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        data.madvise(mmap.MADV_SEQUENTIAL)
        size_bytes = min(len(data), seg.size_bytes)
        with memoryview(data) as view:
            start = end = given = 0  # the run of adjacent records not written yet
            last = len(items) - 1
            for k, (span, item) in enumerate(items):
                item_offset, size = span >> _SPAN_SHIFT, span & _SIZE_MASK
                stop = item_offset + size
                checked = (
                    _check_frame(data, item_offset)
                    if stop <= size_bytes
                    else _Bad("truncated frame", -1)
                )
                if not isinstance(checked, _Bad) and checked[0] > stop:
                    checked = _Bad("frame longer than its index entry", -1)
                if isinstance(checked, _Bad):
                    raise JournalCorrupt(seg.path, item_offset, checked.reason)
                if item_offset != end or end - start >= _COPY_STEP:
                    if tail:
                        _write_fd(fd, tail)
                        tail = b""
                    _write_fd(fd, view[start:end])
                    given = _unmapped(data, given, item_offset)
                    start = item_offset
                if k == last:  # held back: the next segment's records, or BATCH_END
                    if tail:
                        _write_fd(fd, tail)
                    _write_fd(fd, view[start:item_offset])
                    tail = bytes(view[item_offset:stop])
                end = stop
                copied.append((item, offset, size))
                offset += size
    finally:
        with contextlib.suppress(BufferError):
            data.close()
    return tail, offset


_K = TypeVar("_K")
_V = TypeVar("_V")


def _shrunk(table: dict[_K, _V]) -> dict[_K, _V]:
    """`table`, or a copy of it in a table its size if its own is over 64 KiB and four
    times that (~50 bytes an entry when sized to them): a dict's table does not shrink
    when entries go."""
    size = sys.getsizeof(table)
    if size > 65536 and size > 200 * len(table):
        return dict(table)
    return table


def _unmapped(data: mmap.mmap, given: int, upto: int) -> int:
    """Give back the mapped pages of `data` from `given` to `upto` (rounded down to a
    page), as the open does (`opening._give_back`): where it is now."""
    edge = upto - upto % mmap.PAGESIZE
    if edge > given:
        data.madvise(mmap.MADV_DONTNEED, given, edge - given)
        return edge
    return given


class _Compaction:
    """`FileJournal`'s compaction (see the module docstring)."""

    directory: Path
    read_only: bool
    max_segment_bytes: int
    compact_live_ratio: float
    _lock: threading.Lock
    _compact_lock: threading.Lock
    _segments: list[_Segment]
    _packs: Packs
    _late_tombstones: list[_Loc]
    _targeted_by: dict[_Segment, set[_Loc]]
    _targets: dict[_Loc, set[_Segment]]
    _copying: set[_Segment]
    _compact_wanted: threading.Event
    _stopping: bool
    _readers: int
    _failure: JournalFailed | None
    _closed: bool
    _passed_runs: set[str]  # what `compact` said of runs it passed (each said once)

    @property
    def size_bytes(self) -> int:
        raise NotImplementedError  # FileJournal's

    def _retire(self, seg: _Segment) -> None:
        raise NotImplementedError  # FileJournal's

    def _drop_opened(self) -> None:
        raise NotImplementedError  # FileJournal's

    def _index_synced(self) -> None:
        raise NotImplementedError  # FileJournal's

    def _compact_loop(self) -> None:
        while True:
            self._compact_wanted.wait()
            self._compact_wanted.clear()
            if self._stopping:
                return
            try:
                self.compact()
            except Exception:
                log.exception("journal %s: compaction failed", self.directory)

    def compact(self) -> CompactionResult:
        with self._compact_lock:
            before = self.size_bytes
            with self._lock:
                replaying = self._readers > 0
                if not replaying:
                    self._index_synced()  # act on every ack that is on disk
            if replaying or self._failure is not None or self.read_only or self._closed:
                return CompactionResult(size_bytes_before=before, size_bytes_after=before)
            deleted = rewritten = 0
            try:
                deleted += self._delete_dead()
                for run in self._plan_runs():
                    try:
                        rewritten += self._rewrite(run)
                    except JournalError as e:
                        # A segment changed since the open (a damaged record, a pack that
                        # cannot be rebuilt; ninth attack pass): that run stays as it is,
                        # nothing of it was moved, and the others are still compacted.
                        if str(e) not in self._passed_runs:
                            self._passed_runs.add(str(e))
                            log.error(
                                "journal %s: compaction passes segments %s: %s",
                                self.directory,
                                ", ".join(seg.path.name for seg in run),
                                e,
                            )
                deleted += self._delete_dead()
                with self._lock:
                    self._shrink_tables()
            except OSError as e:
                # Every step leaves a journal that replays to the same state, so stopping
                # anywhere is safe; what is left over goes at the next compaction.
                log.error("journal %s: compaction stopped: %s", self.directory, e)
            return CompactionResult(
                segments_deleted=deleted,
                segments_rewritten=rewritten,
                size_bytes_before=before,
                size_bytes_after=self.size_bytes,
            )

    def _shrink_tables(self) -> None:
        """Give back the tables of the index's dicts that emptied (issue 23: memory a
        drain frees comes back): a dict keeps its largest table after its entries go,
        and a drain's tombstones (`_targets`, `_targeted_by`, the current segment's
        `items`) filled them with an entry an ack until compaction deleted what the acks
        killed (~10 MiB left at 300k messages drained). Under the journal's lock."""
        self._targets = _shrunk(self._targets)
        self._targeted_by = _shrunk(self._targeted_by)
        for seg in self._segments:
            seg.items = _shrunk(seg.items)

    def _delete_dead(self) -> int:
        deleted = 0
        while True:
            with self._lock:
                dead = [s for s in self._segments[:-1] if s.live_bytes == 0]
            if not dead:
                return deleted
            for seg in dead:
                seg.path.unlink()
                with self._lock:
                    self._segments.remove(seg)
                    self._retire(seg)
                    for pack in seg.packs:  # all dead: no handle of it is left
                        self._packs[pack.number] = None
                        compact_drop(pack)
                deleted += 1
            _sync_directory(self.directory)

    def _plan_runs(self) -> list[list[_Segment]]:
        small = self.max_segment_bytes // 4
        runs: list[list[_Segment]] = []
        run: list[_Segment] = []
        run_live = 0
        with self._lock:
            for seg in self._segments[:-1]:
                records = seg.size_bytes - HEADER_BYTES
                wanted = seg.live_bytes < self.compact_live_ratio * records or (
                    seg.size_bytes < small
                )
                if not wanted or run_live + seg.live_bytes > self.max_segment_bytes:
                    if run:
                        runs.append(run)
                    run, run_live = [], 0
                if wanted:
                    run.append(seg)
                    run_live += seg.live_bytes
            if run:
                runs.append(run)
        # One segment that is all live gains nothing from a rewrite.
        return [r for r in runs if len(r) > 1 or r[0].live_bytes < r[0].size_bytes - HEADER_BYTES]

    def _rewrite(self, run: list[_Segment]) -> int:
        """Copy the live records of `run` into a file that replaces its last segment."""
        last = run[-1]
        with self._lock:
            # Live records in file order: `_Loc`s and packed ones (their spans sort so).
            snapshot: list[tuple[_Segment, list[tuple[int, Item]]]] = [
                (seg, sorted([*seg.items.items(), *pack_entries(seg)])) for seg in run
            ]
            self._copying.update(run)  # sealed: every item in them is in the snapshot
            # The records move: the places the open's `state()` orders references by
            # (`locs.position`) are the old files' no more; `state()` replays instead.
            self._drop_opened()
        temp = last.path.with_name(last.path.name + _TEMP_SUFFIX)
        copied: list[tuple[Item, int, int]] = []
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_fd(fd, _FILE_HEADER.pack(MAGIC, VERSION, 0, last.number))
                offset = HEADER_BYTES
                tail = b""  # the last frame copied: written last (with BATCH_END set)
                for seg, items in snapshot:
                    if items:
                        tail, offset = _copy_records(fd, seg, items, tail, offset, copied)
                if tail:  # end on a whole append, as every sealed segment does
                    _, _, type_id, flags = _FRAME.unpack_from(tail)
                    if not flags & BATCH_END:
                        tail = _frame(type_id, flags | BATCH_END, tail[FRAME_BYTES:])
                    _write_fd(fd, tail)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, last.path)
        except BaseException:
            with self._lock:
                self._copying.clear()
                self._late_tombstones.clear()
            temp.unlink(missing_ok=True)
            raise
        # The rename is the commit point: from here on the index describes the new file.
        with self._lock:
            new = _Segment(last.number, last.path, offset)
            self._copying.clear()
            for item, new_offset, size in copied:
                if isinstance(item, int):  # packed: moved if still live
                    pack_move(self._packs, item, new, new_offset << _SPAN_SHIFT | size)
                elif item.seg.items.get(item.span) is item:  # still live (or needed)
                    del item.seg.items[item.span]
                    item.seg = new
                    item.span = new_offset << _SPAN_SHIFT | size
                    new.items[item.span] = item
                    new.live_bytes += size
            for seg in run:  # every live record of their packs is in `new` now
                for pack in seg.packs:
                    pack.seg = new
                    new.packs.append(pack)
            # Tombstones written while we copied, for records we copied: they must now
            # outlive the new file.
            for tombstone in self._late_tombstones:
                self._targets[tombstone].add(new)
                self._targeted_by.setdefault(new, set()).add(tombstone)
            self._late_tombstones.clear()
            at = self._segments.index(last)
            self._segments[at] = new
            for seg in run[:-1]:
                self._segments.remove(seg)
            for seg in run:
                self._retire(seg)
        _sync_directory(self.directory)  # the rename is durable before any delete is
        for seg in run[:-1]:
            seg.path.unlink()
        _sync_directory(self.directory)
        log.info(
            "journal %s: compacted segments %s into %s (%d live bytes)",
            self.directory,
            ", ".join(str(s.number) for s in run),
            last.path.name,
            new.live_bytes,
        )
        return len(run)
