"""Opening a file journal: the directory lock, and reading every segment back in.

Theory of operation
-------------------
Segments are read in order and every frame is checked (length, crc, decodable payload).
In the last segment, a bad frame with nothing valid after it is a torn tail: a write the
crash cut short (a frame running past the end of the file), zeros, or a damaged last
record. The segment is truncated to the end of the last complete append (records of an
append without its `BATCH_END` go too) and a warning says how many bytes and records were
lost: never silently. A bad frame followed by valid ones, or any bad frame in an earlier
segment (sealed segments were synced before the roll), is corruption in the middle:
`JournalCorrupt` names the file and offset, and the broker should refuse to start. So is
a frame whose checksum is right but whose type or payload this version cannot read (a
newer writer): it is never truncated. With `skip_corrupt=True` the bad bytes are skipped
to the next valid frame, with an error log. Compaction temp files (`*.compact`) and the
spare next segment (`*.seg.next`) left by a crash are deleted; a message left without
references is dead (as in `JournalState`).

The frame format and checks are in `store/segments.py`. `_Opening` is a part of
`FileJournal` (a mixin): it declares the journal state it uses, which
`FileJournal.__init__` sets.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import amqpbroker.store.codec as codec
from amqpbroker.core.records import (
    Record,
)
from amqpbroker.store.api import (
    JournalCorrupt,
    JournalError,
)
from amqpbroker.store.frames import Entry, Kept, index_plain, read_batches, read_unread
from amqpbroker.store.liveness import _WITH_MSG_ID, _LiveSet, _short_lived
from amqpbroker.store.locs import Item, Packs, _Pack, note_foreign, pack_settle
from amqpbroker.store.segments import (
    _FILE_HEADER,
    _FRAME,
    _NEXT_SUFFIX,
    _SEGMENT_GLOB,
    _TEMP_SUFFIX,
    BATCH_END,
    FRAME_BYTES,
    GAVE_UP,
    HEADER_BYTES,
    MAGIC,
    VERSION,
    SearchBudget,
    _Bad,
    _check_frame,
    _decode_at,
    _Loc,
    _next_sound_frame,
    _Segment,
    _segment_number,
    _segment_path,
    _sync_directory,
    _write_fd,
)

log = logging.getLogger("amqpbroker.store.journal")  # one logger for the journal


class _Opening:
    """`FileJournal`'s opening (see the module docstring)."""

    directory: Path
    read_only: bool
    skip_corrupt: bool
    _segments: list[_Segment]
    _live: _LiveSet[Item]
    _opened_live: dict[_Loc, Kept] | None
    _unread: list[Item]
    _packs: Packs
    _settled: list[_Pack]  # packs to unload once `state()` read the open's records
    _opened_max_id: int
    _body_budget: int  # bytes of bodies the open still copies out (< 0: all)
    _search_budget: SearchBudget  # the segment being scanned's (`_next_sound_frame`)

    def _on_dead(self, item: Item, needs_tombstone: bool) -> None:
        raise NotImplementedError  # FileJournal's

    def _index_batch(
        self,
        seg: _Segment,
        batch: Iterable[Entry],
        keep: dict[_Loc, Kept] | None = None,
    ) -> None:
        raise NotImplementedError  # FileJournal's

    def _lock_directory(self) -> int:
        if self.read_only:
            if not self.directory.is_dir():
                raise JournalError(f"no journal at {self.directory}")
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "journal.lock"
        flags = os.O_RDONLY if self.read_only and path.exists() else os.O_RDWR | os.O_CREAT
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            if self.read_only and e.errno in (errno.EACCES, errno.EROFS):
                return -1  # a read-only copy of a journal: nobody can be writing it
            raise
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(
                f"journal {self.directory} is in use by another process (is the broker running?)"
            ) from None
        return fd

    def _open_segments(self) -> None:
        paths = sorted(
            (n, p)
            for p in self.directory.glob(_SEGMENT_GLOB)
            if (n := _segment_number(p)) is not None
        )
        if not self.read_only:
            for leftover in self.directory.glob("*" + _TEMP_SUFFIX):
                log.warning("journal %s: deleting unfinished compaction file", leftover)
                leftover.unlink()
            for spare in self.directory.glob("*.seg" + _NEXT_SUFFIX):
                spare.unlink()  # an unused spare segment: made again below
        for i, (number, path) in enumerate(paths):
            self._scan_segment(number, path, last=i == len(paths) - 1)
        # A message with no reference after replay is dead (JournalState drops it too):
        # its references went with segments compaction deleted, or never made it to disk.
        live = self._live
        for msg_id, count in list(live.ref_counts.items()):
            if not count:
                del live.ref_counts[msg_id]
                self._on_dead(live.messages.pop(msg_id), False)
        if not self._segments and not self.read_only:
            self._segments.append(self._create_segment(1))

    def _create_segment(self, number: int) -> _Segment:
        path = _segment_path(self.directory, number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_fd(fd, _FILE_HEADER.pack(MAGIC, VERSION, 0, number))
            os.fsync(fd)
        finally:
            os.close(fd)
        _sync_directory(self.directory)
        return _Segment(number, path, HEADER_BYTES)

    def _index_opened(self, seg: _Segment, batch: list[Entry], top: int) -> None:
        """Index a batch read at open, keeping the records it made live for `state()`;
        `top` is the batch's largest message id. Its leading AddMessages and AddRefs (the
        whole batch, as a broker writes them) go through `index_plain`."""
        keep = self._opened_live
        done = (
            0
            if keep is None
            else index_plain(seg, batch, self._live, keep, self._unread, seg.packs[-1])
        )
        if done < len(batch):
            rest = batch[done:] if done else batch
            compact = self._live.compact
            if compact is not None:  # (records a rebuild of the pack must tell apart)
                pack = seg.packs[-1]
                for record, _, _ in rest:
                    msg_id = _msg_id(record)
                    if msg_id:
                        note_foreign(pack, compact.top, msg_id)
            self._index_batch(seg, rest, keep)
        if top > self._opened_max_id:
            self._opened_max_id = top

    def _index_read(
        self,
        seg: _Segment,
        done: list[tuple[list[Entry], int]],
        acks: int,
        held: int = 0,
        before: set[int] | None = None,
    ) -> set[int] | None:
        """Index appends `read_batches` read, in order, but the records of the messages
        added and acknowledged among them (`_short_lived`, as the writer's index does):
        a message consumed soon after it was stored costs the open no index entry and no
        body (issue 23 item 4). Only when there are acks to look for. The last `held`
        appends are only looked at (the next step indexes them: `_CARRY`), and the
        records of `before` (the messages the step before found so) are left out too.
        The messages found short-lived, for the next step if `held`."""
        gone = (
            _short_lived([r for entries, _ in done for r, _, _ in entries], self._live)
            if acks
            else None
        )
        if before:
            gone = before | gone if gone else before
        for entries, top in done[: len(done) - held] if held else done:
            if gone:
                entries = [e for e in entries if _msg_id(e[0]) not in gone]
            self._index_opened(seg, entries, top)
        compact = self._live.compact
        if gone and compact is not None:  # (their frames are in the file all the same)
            pack = seg.packs[-1]
            for msg_id in gone:
                note_foreign(pack, compact.top, msg_id)
        return gone if held else None

    def _read_unread(self, seg: _Segment | None, data: codec.Data) -> None:
        """Decode the AddMessages of the segment just read (`seg`, `data`) that are still
        live: the open indexed them by id alone (issue 23 item 4: a message consumed
        before the end of its segment costs no body copy, no record)."""
        keep = self._opened_live
        if keep is not None and seg is not None and self._unread:
            self._body_budget = read_unread(
                data, self._unread, keep, seg.packs[-1], self._body_budget
            )
        self._unread = []
        compact = self._live.compact
        # Its pairs are all in: their arrays go if a rebuild can give them back (issue 23,
        # eleventh pass), so the open holds one segment's at a time.
        if seg is not None and compact is not None and pack_settle(compact, seg.packs[-1]):
            self._settled.append(seg.packs[-1])  # (once `state()` read its records)

    def _scan_segment(self, number: int, path: Path, *, last: bool) -> None:
        """Scan the segment's pages mapped, not read into a new buffer: no copy of it,
        and no fresh pages to fault in and zero for each (issue 23 item 4: reading 1 GiB
        of segments cost ~1.1 s of system time, mapping them ~0.05 s). A torn tail is cut
        off the file while it is mapped: only what is before the cut is read after."""
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:  # (an empty file cannot be mapped)
                self._scan_data(number, path, b"", last=last)
                return
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            data.madvise(mmap.MADV_SEQUENTIAL)
            seg: _Segment | None = None
            try:
                seg = self._scan_data(number, path, data, last=last)
            finally:
                self._read_unread(seg, data)
        finally:
            with contextlib.suppress(BufferError):  # (a view left by an error: unmapped later)
                data.close()

    def _scan_data(
        self, number: int, path: Path, data: codec.Data, *, last: bool
    ) -> _Segment | None:
        """Read one segment into the index; the segment (None: none was kept)."""
        seg = _Segment(number, path, len(data))
        # its messages' usual pairs (`index_plain`)
        pack = _Pack(len(self._packs), seg, self._live.compact)
        seg.packs.append(pack)
        self._search_budget = SearchBudget(len(data))
        if len(data) < HEADER_BYTES or data[:HEADER_BYTES] == bytes(HEADER_BYTES):
            if not last:
                raise JournalCorrupt(path, 0, "file header missing")
            # A crash while the segment was being created: it holds nothing.
            log.warning("journal %s: segment header incomplete (crash while rolling)", path)
            if self.read_only:
                return None
            path.unlink()
            self._segments.append(self._create_segment(number))
            return None
        magic, version, _, header_number = _FILE_HEADER.unpack_from(data)
        if magic != MAGIC:
            raise JournalCorrupt(path, 0, "not a journal segment (bad magic)")
        if version != VERSION:
            raise JournalCorrupt(path, 0, f"segment version {version}, this broker reads 1")
        if header_number != number:
            raise JournalCorrupt(path, 0, f"header says segment {header_number}")
        self._segments.append(seg)
        self._packs.append(pack)
        # Records of an unfinished append; an AddMessage as its layout (see `_read_unread`).
        batch: list[Entry] = []
        batch_start = pos = HEADER_BYTES
        top = 0  # the batch's largest message id
        size = len(data)
        done: list[tuple[list[Entry], int]] = []
        acked = 0  # AckRefs in `done` (none: no message there can be short-lived)
        gone: set[int] | None = None  # short-lived in the appends held for the next step
        mapped = data if isinstance(data, mmap.mmap) else None
        given = 0  # of a mapped segment, the pages before this went back (`_give_back`)
        while pos < size:
            # The usual frames in bulk, `_STEP` bytes at a time (their entries, and the
            # pages of the file read, are a step's, not the whole segment's: issue 23,
            # ninth pass); the frame it stops at gets the full checks here.
            start, limit = pos, pos + _STEP
            pos, batch, top, acks = read_batches(data, pos, batch, top, done, limit)
            acked += acks
            stepped = (
                pos < size
                and pos > start
                and size - pos >= FRAME_BYTES
                and _frame_end(data, pos) > limit
            )
            if done:
                # At a step's end, its last appends (from `_CARRY` bytes before it) are
                # indexed with the next step's, and looked at with this step's: a message
                # acked soon after it was stored, across the step's end, is short-lived
                # all the same (issue 23, twelfth pass).
                held = _carried(done, limit - _CARRY) if stepped else 0
                if held < len(done):
                    gone = self._index_read(seg, done, acked, held, gone)
                    del done[: len(done) - held]
                    if not held:
                        acked = 0
                batch_start = done[0][0][0][1] if done else batch[0][1] if batch else pos
            if mapped is not None and batch_start - given >= _STEP:
                given = _give_back(mapped, given, batch_start)
            if pos >= size:
                break
            if stepped:
                continue  # stopped at the step's end: the next step reads on from there
            if done:  # (the slow frame below is indexed after them)
                gone = self._index_read(seg, done, acked, 0, gone)
                done.clear()
                acked = 0
            checked = _check_frame(data, pos)
            record = checked if isinstance(checked, _Bad) else _decode_at(data, pos, *checked[:2])
            if isinstance(record, _Bad):
                if last and self._is_tail(data, pos, record):
                    self._truncate_tail(seg, data, batch_start, pos, record, len(batch))
                    return seg
                if not self.skip_corrupt:
                    raise JournalCorrupt(path, pos, record.reason)
                pos = self._skip(seg, data, pos, record)
                continue
            assert not isinstance(checked, _Bad)
            end, _, flags = checked
            if isinstance(record, _WITH_MSG_ID) and record.msg_id > top:
                top = record.msg_id
            batch.append((record, pos, end - pos))
            pos = end
            if flags & BATCH_END:
                self._index_opened(seg, batch, top)
                batch = []
                batch_start = pos
                top = 0
        if batch and last:
            self._truncate_tail(seg, data, batch_start, pos, None, len(batch))
        elif batch:
            self._index_opened(seg, batch, top)
        return seg

    def _is_tail(self, data: codec.Data, pos: int, bad: _Bad) -> bool:
        """Whether a bad frame in the last segment is its tail rather than its middle.
        A search for a sound frame after it that runs out of budget says middle: the
        open stops there (or skips, with skip_corrupt) rather than cut what it could not
        look at."""
        if bad.intact:
            return False
        if bad.end > len(data) or data[pos:].count(0) == len(data) - pos:
            return True  # cut short by a crash, or zeros the crash left
        if bad.end >= 0:
            if bad.end == len(data):
                return True  # the last record is damaged
            if not isinstance(_check_frame(data, bad.end), _Bad):
                return False  # a sound frame follows where this one ends
        found = _next_sound_frame(data, pos + 1, self._search_budget)
        if found == GAVE_UP:
            log.error(
                "journal: a search for sound frames after offset %d gave up (too many "
                "frame headers claiming long lengths: crafted?); not taken for a torn tail",
                pos,
            )
            return False
        return found < 0

    def _truncate_tail(
        self, seg: _Segment, data: codec.Data, keep: int, bad_at: int, bad: _Bad | None, whole: int
    ) -> None:
        lost = len(data) - keep
        what = f"{whole} complete record(s) of an unfinished append"
        if bad is not None:
            what += f" and a damaged record at offset {bad_at} ({bad.reason})"
        if self.read_only:
            log.warning(
                "journal %s: torn tail: ignoring the last %d bytes (%s); read-only, not truncated",
                seg.path,
                lost,
                what,
            )
        else:
            log.warning(
                "journal %s: torn tail: truncated to offset %d, losing %d bytes (%s)",
                seg.path,
                keep,
                lost,
                what,
            )
            with open(seg.path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        seg.size_bytes = keep

    def _skip(self, seg: _Segment, data: codec.Data, pos: int, bad: _Bad) -> int:
        if 0 <= bad.end <= len(data) and (
            bad.end == len(data) or not isinstance(_check_frame(data, bad.end), _Bad)
        ):
            resume = bad.end
        else:
            resume = _next_sound_frame(data, pos + 1, self._search_budget)
            if resume < 0:  # none, or the search gave up: the rest of the segment goes
                resume = len(data)
        log.error(
            "journal %s: skipping %d corrupt bytes at offset %d (%s): skip_corrupt is set; "
            "the records there are lost",
            seg.path,
            resume - pos,
            pos,
            bad.reason,
        )
        seg.skips.append((pos, resume))
        return resume


# Bytes of a segment read in one step of the open (`_scan_data`).
_STEP = 4 << 20
# The appends a step leaves to the next, by the bytes before its end they start at
# (`_scan_data`): bounded, so a step's entries stay a step's and a little.
_CARRY = 1 << 20


def _carried(done: list[tuple[list[Entry], int]], edge: int) -> int:
    """How many of the last appends of `done` start at or after `edge`."""
    held = 0
    for k in range(len(done) - 1, -1, -1):
        entries = done[k][0]
        if not entries or entries[0][1] < edge:
            break
        held += 1
    return held


def _frame_end(data: codec.Data, pos: int) -> int:
    """Where the frame at `pos` says it ends (its length field alone: not checked)."""
    length: int = _FRAME.unpack_from(data, pos)[0]
    return pos + FRAME_BYTES + length


def _give_back(mapped: mmap.mmap, given: int, upto: int) -> int:
    """Unmap the pages of a mapped segment from `given` to `upto` (rounded down to a
    page): the open is past them, so the process's RSS does not grow by a whole segment
    read (64 MiB by default; the pages stay in the page cache, and a later read of them,
    a body copied out at the segment's end, maps them again). Where it is now."""
    end = upto - upto % mmap.PAGESIZE
    if end > given:
        mapped.madvise(mmap.MADV_DONTNEED, given, end - given)
        return end
    return given


def _msg_id(record: Record | codec.MessageLayout | codec.RefRow) -> int:
    """The message id of a record `read_batches` reads (each has one; a row's first)."""
    return record[0] if isinstance(record, tuple) else getattr(record, "msg_id", 0)
