"""Page files: the messages of a paging queue, on disk in order (B-151 PAGE, issue 23).

Theory of operation
-------------------
Each queue that pages has a directory `DATA_DIR/paging/<address>/<queue>/` (names made
safe for the file system by `_safe`) of page files `<n>.page`, n increasing; a file rolls
to n+1 when it would pass the address's `page-size-bytes`. A page file is frames::

    frame := u32 body length | u32 crc32(body) | body
    body  := u8 kind, payload
      kind 1 message: u8 durable, i64 msg_id, i64 first_ts, i64 expiration_ms,
                      i64 deliver_at_ms, u8 priority, u16 address length, address, data
      kind 2 marker:  u64 n   (the next n message frames are copies: see `remove`)
      kind 3 moved:   as kind 1 (a copy a management walk routed here: see below)

all little-endian. Messages are read back in order from a *cursor* (page, offset). For a
durable queue the cursor is journaled (`PageCursor`, with the `AddMessage`/`AddRef` of
the messages read back, in one append: after a crash a message is either still paged or
in the journal, never both, never neither), and a page file is deleted only once a cursor
past it is on disk (`release`). A non-durable queue's files go as soon as they are read.

Removing some paged messages (management purge, move, retry with a filter, by ids)
records their positions as *skips* (`skip`): nothing is rewritten, a read back passes
them, and when they are the next ones the cursor moves past them. A durable queue
journals each step's skips (`PageSkip`, with the step's moved copies and `PageCursor`, in
one append: a crash in the middle of a walk repeats no move and loses none); they are
kept, a few bytes each, until the cursor passes them (issue 23). Files written before
this may hold a removal's marker and copies of the messages kept: a reader that meets a
marker *by reading* (a cursor before it was never journaled) skips the copies after it.

Recovery (`PageFiles.recover`) opens the cursors the journal holds and scans the files
from there (counting, not keeping: memory does not grow with the backlog); a torn or
corrupt frame ends the files there, as in the journal (what was lost is logged). Paged
non-durable messages are not recovered (as Artemis): the scan and reads skip them.

A moved copy (a management move or retry, a dead letter, an expiry) routed to a paging
durable queue is written as kind 3 (`PageFiles.moving`): its frame is synced before the
journal append that removes its original (an `AckRef`, a `PageSkip`, a read's
`PageCursor`), and the append carries this queue's `PageCursor` with the end of its
copies (`committed`). A restart passes the kind 3 frames
after the journaled `committed` (`_scan`: skipped, and the skips journaled): the append
that would have removed their originals was lost, so the originals are still where they
were, and the copies would be duplicates (issue 23).

A page file found damaged or unreadable while reading back (`_damaged`, issue 23) is
handled as the journal handles damage, never by raising into dispatch: a torn tail of
the last page file is cut (a warning), any other damage skips the rest of that file (an
error naming the file and the offset); either way the messages lost are counted
(`lost`, from the per-file counts `_held`), not left in the queue's count, and reading
goes on with what follows. A purge takes the messages by reading them back, so that
its count of lost ones is the same.

Loop thread only; the I/O is synchronous (buffered writes, one fsync per loop step that
paged durable messages, `PageFiles.flush`).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import hashlib
import logging
import os
import shutil
import stat
import struct
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, cast

from amqpbroker.amqp import sections
from amqpbroker.core.errors import ResourceLimitExceeded
from amqpbroker.core.model import Message, priority_level

log = logging.getLogger(__name__)

__all__ = ["PageFiles", "QueuePages"]

_FRAME = struct.Struct("<II")
_MESSAGE = struct.Struct("<BqqqqBH")
_MARKER = struct.Struct("<Q")
_KIND_MESSAGE = 1
_KIND_MOVED = 3  # a moved copy's message frame (`PageFiles.moving`: module doc)
_KIND_MARKER = 2
_MAX_BODY = 1 << 31
_SUFFIX = ".page"
MAX_WRITERS = 64  # page files open for writing at once (`PageFiles.writing`)

MessageOf = Callable[[sections.Scanned], Message]
Position = tuple[int, int]  # (page number, offset)


# Fourth attack pass: a page file is only ever a regular file, opened without following a
# link and without blocking. A FIFO put in a page file's place hung the start (the scan's
# open waited for a writer forever); a link made the broker read, append to and truncate
# (a "torn tail") whatever file it named.
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _open_page(path: Path, flags: int, mode: str, buffering: int = -1) -> BinaryIO:
    """`path` opened with `flags` (os.O_*) as a file object in `mode`, refused (OSError)
    unless it is a regular file, never through a link (`ELOOP`)."""
    fd = os.open(path, flags | _NOFOLLOW, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"not a regular file: {path}")
        os.set_blocking(fd, True)
        return cast(BinaryIO, os.fdopen(fd, mode, buffering=buffering))
    except BaseException:
        os.close(fd)
        raise


def _truncate(path: Path, size: int) -> None:
    """Cut the page file `path` to `size` bytes, and sync (never through a link)."""
    with _open_page(path, os.O_WRONLY, "wb", 0) as f:
        f.truncate(size)
        os.fsync(f.fileno())


def _safe(name: str, *, legacy: bool = False) -> str:
    """A file-system-safe, reversible directory name for an address or queue name: only
    lower-case ASCII letters, digits, `-` and `_` are kept, every other byte is `%XX`.
    Upper-case letters are escaped too (fourth attack pass): on a case-insensitive file
    system (macOS, Windows) queues `Orders` and `orders` shared one directory, so one
    queue's restart read the other's messages. `legacy`: the names written before, kept
    upper-case letters (`PageFiles.recover` renames such directories)."""
    out = []
    for byte in name.encode():
        char = chr(byte)
        if char.isascii() and (
            char.isdigit() or char in "-_" or char.islower() or (legacy and char.isupper())
        ):
            out.append(char)
        else:
            out.append(f"%{byte:02X}")
    safe = "".join(out) or "%"
    if len(safe) > 200:  # file name limits: keep it unique with a digest (a crc32 can
        # be made to collide by a peer that names queues, and two queues would share files)
        safe = f"{safe[:160]}~{hashlib.sha256(name.encode()).hexdigest()[:40]}"
    return safe


def _encode(message: Message, kind: int = _KIND_MESSAGE) -> bytes:
    """A message frame. Raises ResourceLimitExceeded for an address of 64 KiB or more,
    which the frame cannot hold: it was cut to 65,535 bytes (mid-character too), and the
    message came back with another address (issue 15 attack)."""
    address = message.address.encode()
    if len(address) > 0xFFFF:
        raise ResourceLimitExceeded(
            f"cannot page message {message.msg_id}: its address is over 65535 bytes"
        )
    head = _MESSAGE.pack(
        1 if message.durable else 0,
        message.msg_id,
        message.first_ts,
        message.expiration_ms,
        message.deliver_at_ms,
        message.priority,
        len(address),
    )
    body = b"".join((bytes([kind]), head, address, message.data))
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _marker(copies: int) -> bytes:
    body = bytes([_KIND_MARKER]) + _MARKER.pack(copies)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _sound(body: bytes) -> bool:
    """Whether a frame body whose checksum matched is one `_encode`/`_marker` wrote: a
    zero-filled tail (a crash after the file grew, before its data reached the disk)
    reads as length 0 with the checksum of nothing, which matches."""
    if not body:
        return False
    if body[0] == _KIND_MARKER:
        return len(body) == 1 + _MARKER.size
    if (body[0] == _KIND_MESSAGE or body[0] == _KIND_MOVED) and len(body) >= 1 + _MESSAGE.size:
        return len(body) >= 1 + _MESSAGE.size + int(_MESSAGE.unpack_from(body, 1)[-1])
    return False


class _Frame:
    """One frame read back: where it ends, and what it holds."""

    __slots__ = ("body", "end", "kind")

    def __init__(self, kind: int, body: bytes, end: Position) -> None:
        self.kind = kind
        self.body = body
        self.end = end

    @property
    def durable(self) -> bool:
        return self.body[1] == 1

    @property
    def size(self) -> int:
        """The message's data size (what the queue accounts)."""
        address_len: int = _MESSAGE.unpack_from(self.body, 1)[-1]
        return len(self.body) - 1 - _MESSAGE.size - address_len

    @property
    def msg_id(self) -> int:
        return int(_MESSAGE.unpack_from(self.body, 1)[1])

    @property
    def expiration_ms(self) -> int:
        return int(_MESSAGE.unpack_from(self.body, 1)[3])


class _Damaged(OSError):
    """A page file read back stops before its end: a torn or corrupt frame at `offset`
    (`io` False), or an I/O error (`io` True: not a torn tail, never cut)."""

    def __init__(self, path: Path, offset: int, reason: str, *, io: bool) -> None:
        super().__init__(f"{path} at byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.io = io


def _skip_damaged(page: int, error: _Damaged) -> bool:
    """A `_frames` damage handler for a second walk: the first logged (and counted) it."""
    return True


def _before(until: Position, end: Position) -> Position:
    """The earlier of a walk's `until` and `_end()` (whose offset -1 is a file's end)."""
    if until[0] < end[0] or (until[0] == end[0] and (end[1] < 0 or until[1] < end[1])):
        return until
    return end


def _earlier(expiring_ms: int, expiration_ms: int) -> int:
    """The earlier of two expiration times, 0 meaning never."""
    if not expiring_ms or (expiration_ms and expiration_ms < expiring_ms):
        return expiration_ms
    return expiring_ms


class QueuePages:
    """One queue's page files (`core.paging.PageStore`). Loop thread only."""

    def __init__(
        self,
        directory: Path,
        *,
        message_of: MessageOf,
        page_size_bytes: Callable[[], int],
        journaled: bool,
        cursor: Position | None,
        owner: PageFiles,
        skips: dict[int, list[int]] | None = None,
        committed: Position | None = (0, 0),
    ) -> None:
        self.directory = directory
        self._message_of = message_of
        self._page_size_bytes = page_size_bytes
        self.journaled = journaled  # the cursor goes to the journal; files wait for it
        self._owner = owner
        self.messages = 0
        self.size_bytes = 0
        self.epoch = 0  # + 1 when a removal rewrites the files: older positions are void
        self.expiring_ms = 0  # no paged message expires before this (0: none expires)
        self.durable_written = False  # since the last flush
        self.lost = 0  # paged messages lost to a damaged page file (`_damaged`)
        self.restored: list[tuple[int, int]] | None = None  # never journaled when read
        # page number -> [messages, bytes] of it counted in `messages` / `size_bytes`:
        # what a damaged file loses is counted, not left in the queue's count
        self._held: dict[int, list[int]] = {}
        self._browse_damaged: set[int] = set()  # page files a browse logged as damaged
        # page number -> sorted end offsets of the messages removed ahead of the cursor
        # (`skip`), and those not journaled yet (`journal_skips`)
        self._skips: dict[int, array[int]] = {
            page: array("q", offsets) for page, offsets in (skips or {}).items()
        }
        self._new_skips: dict[int, list[int]] = {}
        # the end of the last copy a management walk wrote here (kind 3), journaled with
        # this queue's cursor in the walk's append (a restart passes those after it)
        self.committed: Position = committed or (0, 0)
        self._check_moved = committed is not None  # (None: not known, every copy kept)
        directory.mkdir(parents=True, exist_ok=True)
        # only the names `_path` writes: `1.page` would read as page 1 from another file
        pages = sorted(
            int(p.stem)
            for p in directory.glob("*" + _SUFFIX)
            if p.stem.isascii() and p.stem.isdigit() and p.name == self._path(int(p.stem)).name
        )
        first = cursor[0] if cursor is not None else min(pages[0], 1) if pages else 1
        self._cursor: Position = cursor if cursor is not None else (first, 0)
        for number in pages:
            if number < self._cursor[0]:  # read before the crash, or skipped as damaged
                try:
                    self._path(number).unlink(missing_ok=True)
                except OSError as e:  # a directory in its place (issue 23 fix 4: the start
                    # failed on a file the read back had already skipped and counted)
                    log.error("paging %s: cannot delete a read page file: %s", directory, e)
        pages = self._in_sequence([n for n in pages if n >= self._cursor[0]])
        if not pages and self._cursor[1]:  # its files were deleted by hand: a new file
            # from byte 0 read from the cursor's offset would lose (or strand) messages
            self._cursor = (self._cursor[0] + 1, 0)
        self._write_page = pages[-1] if pages else self._cursor[0]
        self._writer: BinaryIO | None = None
        self._write_offset = 0
        self._released = self._cursor[0]  # files below this page are gone
        self._recovered_end: Position = (0, 0)  # non-durable before this: not recovered
        self._prune_skips()
        if pages:
            self._scan(pages)

    # -- files --------------------------------------------------------------------------
    def _path(self, page: int) -> Path:
        return self.directory / f"{page:012d}{_SUFFIX}"

    def _in_sequence(self, pages: list[int]) -> list[int]:
        """The page files from the cursor's on, renamed where needed to follow each other
        from the cursor's (the one after it when the cursor is inside a missing file).
        The broker writes them so; a gap is damage or a crafted file, and the files are
        walked page number by page number: one numbered 10^9 held the start in a billion
        `stat`s, one past a Java long made the journaled cursor unencodable (issue 15
        attack). Ascending renames never replace a file: each target is below every file
        not yet renamed."""
        if not pages:
            return pages
        page, offset = self._cursor
        start = page if pages[0] == page or not offset else page + 1
        if pages[-1] == start + len(pages) - 1:
            return pages
        log.error(
            "paging %s: page files %s do not follow each other; renumbered from %d",
            self.directory,
            pages if len(pages) <= 8 else f"{pages[:4]}...{pages[-4:]}",
            start,
        )
        renamed = []
        for target, number in enumerate(pages, start):
            if number != target:
                try:
                    self._path(number).rename(self._path(target))
                except OSError as e:  # left as it is, stray (the start goes on)
                    log.error("paging %s: cannot renumber a page file: %s", self.directory, e)
                    break
            renamed.append(target)
        return renamed

    @property
    def files(self) -> int:
        """Page files on disk."""
        return self._write_page - self._released + 1 if self._has_files() else 0

    def _has_files(self) -> bool:
        return self._writer is not None or self._path(self._write_page).exists()

    def _open_writer(self) -> BinaryIO:
        if self._writer is None:
            self._owner.writing(self)
            path = self._path(self._write_page)
            # unbuffered: a full disk is met by the write of the message that does not
            # fit (refused, its part taken back), not later by a read or the flush
            self._writer = _open_page(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "ab", 0)
            self._write_offset = self._writer.tell()
        return self._writer

    def close_writer(self) -> None:
        """Write out (fsync what is durable) and close the page file being written; the
        next write opens it again (`PageFiles.writing` keeps descriptors bounded)."""
        if self._writer is not None:
            self.flush(sync=self._owner.sync)
            self._writer.close()
            self._writer = None
        self._owner.dirty.discard(self)

    # -- the core's PageStore -----------------------------------------------------------
    @property
    def position(self) -> Position:
        """The cursor: where the next read starts (journaled for a durable queue)."""
        return self._cursor

    @property
    def cursor(self) -> Position:
        return self._cursor

    def write(self, message: Message) -> None:
        moved = self._owner.moving and message.durable and self.journaled
        frame = _encode(message, _KIND_MOVED if moved else _KIND_MESSAGE)
        try:
            self._append(frame)
        except OSError as e:  # disk full, no descriptors: the producer is told, not killed
            log.warning("paging %s: cannot write a page file: %s", self.directory, e)
            raise ResourceLimitExceeded(f"cannot page message {message.msg_id}: {e}") from e
        self.messages += 1
        self.size_bytes += message.size
        self._hold(self._write_page, 1, message.size)
        if moved:
            self.committed = (self._write_page, self._write_offset)
        self.expiring_ms = _earlier(self.expiring_ms, message.expiration_ms)
        if message.durable and self.journaled:
            self.durable_written = True
            self._owner.dirty.add(self)

    def _append(self, frame: bytes) -> None:
        writer = self._open_writer()
        if self._write_offset and self._write_offset + len(frame) > self._page_size_bytes():
            writer.flush()
            if self.journaled and self._owner.sync:  # the step's flush syncs only the
                os.fsync(writer.fileno())  # file open then: this one is done now
            writer.close()
            self._writer = None
            self._write_page += 1
            writer = self._open_writer()
        view, written = memoryview(frame), 0
        try:
            while written < len(frame):
                written += writer.write(view[written:]) or 0
        except OSError:
            if written:  # the part that fitted would be a torn frame amid sound ones
                with contextlib.suppress(OSError):
                    os.ftruncate(writer.fileno(), self._write_offset)
            raise
        self._write_offset += len(frame)

    @property
    def end(self) -> Position:
        """Where the next message written will start: what a management walk started
        now covers (`read`'s and `browse_from`'s `until`; issue 23, sliced walks)."""
        if self._writer is not None:
            return (self._write_page, self._write_offset)
        return (self._write_page, self._file_size(self._write_page))

    def read(
        self, *, max_bytes: int, max_messages: int, until: Position | None = None
    ) -> list[Message]:
        taken: list[Message] = []
        taken_bytes = 0
        first_page = self._cursor[0]
        end = self._end() if until is None else _before(until, self._end())
        for frame in self._frames(self._cursor, end, damaged=self._damaged):
            self._cursor = frame.end
            if frame.kind != _KIND_MESSAGE:
                continue
            try:
                message = self._message(frame)
            except sections.SectionError as e:
                self._undecodable(frame, e)
                continue
            self.messages -= 1
            self.size_bytes -= message.size
            self._hold(frame.end[0], -1, -message.size)
            taken.append(message)
            taken_bytes += message.size
            if (0 <= max_bytes <= taken_bytes) or (0 <= max_messages <= len(taken)):
                break
        self._roll_cursor()
        for page in range(first_page, self._cursor[0]):
            if page in self._held:  # passed, yet not all read: the file went missing
                self._lose(page, "missing or cut short", self._path(page), 0)
        if self._skips and first_page != self._cursor[0]:
            self._prune_skips()
        if not self.messages:
            self.expiring_ms = 0
        if not self.journaled:
            self.release(self._cursor)
        return taken

    def _hold(self, page: int, messages: int, size: int) -> None:
        held = self._held.get(page)
        if held is None:
            self._held[page] = [messages, size]
        else:
            held[0] += messages
            held[1] += size
            if held[0] <= 0:
                del self._held[page]

    def _undecodable(self, frame: _Frame, error: sections.SectionError) -> None:
        """A frame whose checksum is right and whose message does not decode (no broker
        wrote it: the file was written by something else): lost, counted and logged, and
        the read goes on after it. It raised out of the read (fifth attack pass): the
        messages read before it in that step were taken from the files and never queued,
        and the error went up through the queue's dispatch to whichever connection's
        step had asked for it."""
        page, offset = frame.end
        size = frame.size
        self.messages -= 1
        self.size_bytes -= size
        self._hold(page, -1, -size)
        self.lost += 1
        log.error(
            "paging %s: page file %s: the message ending at byte %d does not decode (%s): lost",
            self.directory,
            self._path(page),
            offset,
            error,
        )

    def _lose(self, page: int, what: str, path: Path, offset: int) -> None:
        """The unread messages of `page` are lost: counted and logged, never silently."""
        messages, size = self._held.pop(page, (0, 0))
        self.messages -= messages
        self.size_bytes -= size
        self.lost += messages
        log.error(
            "paging %s: page file %s %s at byte %d: %d paged messages (%d bytes) lost",
            self.directory,
            path,
            what,
            offset,
            messages,
            size,
        )

    def _damaged(self, page: int, error: _Damaged) -> bool:
        """A read back met damage in `page` (`_frames`). The torn tail of the last page
        file is cut there (the journal's rule) and writing goes on after the last sound
        frame; otherwise the rest of the file is skipped (and the file being written, if
        it is the one, is left for a new one). Whether to skip to the next file."""
        if page == self._write_page and not error.io:
            log.warning(
                "paging %s: the last page file %s is torn at byte %d; truncating it",
                self.directory,
                error.path,
                error.offset,
            )
            try:
                _truncate(error.path, error.offset)
            except OSError as e:
                log.error("paging %s: cannot truncate %s: %s", self.directory, error.path, e)
            else:
                self._write_offset = error.offset
                self._lose(page, f"torn ({error})", error.path, error.offset)
                return False
        self._lose(page, f"damaged, skipped ({error})", error.path, error.offset)
        if page == self._write_page:  # new messages go to a new file, after the cursor
            if self._writer is not None:
                with contextlib.suppress(OSError):
                    self._writer.close()
                self._writer = None
                self._owner.writers.pop(self, None)
                self._owner.dirty.discard(self)
            self._write_page += 1
            self._write_offset = 0
        return True

    def oldest_ts(self) -> int | None:
        """`first_ts` of the next paged message, from its frame's header (the message
        is not decoded); a damaged file is passed as a browse passes it, silently (the
        read back logs and counts it)."""
        if not self.messages:
            return None
        for frame in self._frames(self._cursor, self._end(), damaged=_skip_damaged):
            if frame.kind == _KIND_MESSAGE:
                return int(_MESSAGE.unpack_from(frame.body, 1)[2])
        return None

    def browse(self) -> Iterator[Message]:
        for message, _ in self.browse_from(self._cursor):
            yield message

    def browse_from(self, position: Position) -> Iterator[tuple[Message, Position]]:
        """The paged messages from `position` (a cursor or a position this returned,
        of the current `epoch`) on, each with the position after it; read lazily. The
        rest of a damaged page file is skipped, as the read back skips it (a browser or a
        listing sees what a consumer will get), logged once a file: every dispatch walks
        a browser on from its position, and it would log again each time (nothing is
        taken or counted here: the read back does that)."""

        def skip(page: int, error: _Damaged) -> bool:
            if page not in self._browse_damaged:
                self._browse_damaged.add(page)
                log.error(
                    "paging %s: cannot read a page file to browse, the rest of it skipped: %s",
                    self.directory,
                    error,
                )
            return True

        for frame in self._frames(position, self._end(), damaged=skip):
            if frame.kind == _KIND_MESSAGE:
                try:
                    message = self._message(frame)
                except sections.SectionError:
                    continue  # the read back counts and logs it (`_undecodable`)
                yield message, frame.end

    def skip(self, taken: list[tuple[Position, int]]) -> None:
        """Remove the paged messages that end at these positions (each with its size), as
        a management walk took them: they leave the counts now, a read back passes them,
        and the cursor moves past those that are the next ones (O(taken), nothing
        rewritten: the walk goes on reading the files, and messages paged meanwhile stay
        where they are)."""
        if not taken:
            return
        for (page, _), size in self._skip_positions(taken):
            self.messages -= 1
            self.size_bytes -= size
            self._hold(page, -1, -size)
        journaled = self.journaled
        position = self._cursor
        try:  # past the removed ones that are next: as a read would pass them
            for frame in self._frames(self._cursor, self._end()):
                if frame.kind == _KIND_MESSAGE:
                    break
                position = frame.end
        except _Damaged:  # the read back handles it (`_damaged`), in its turn
            pass
        if position != self._cursor:
            self._cursor = position
            self._roll_cursor()
            self._prune_skips()
        if not self.messages:
            self.expiring_ms = 0
        if not journaled:
            self.release(self._cursor)

    def _skip_positions(self, taken: list[tuple[Position, int]]) -> list[tuple[Position, int]]:
        """Record `taken` as skips (to be journaled); those that were not skips yet."""
        new = []
        for (page, offset), size in taken:
            offsets = self._skips.get(page)
            if offsets is None:
                offsets = self._skips[page] = array("q")
            if not offsets or offsets[-1] < offset:
                offsets.append(offset)
            else:
                i = bisect.bisect_left(offsets, offset)
                if i < len(offsets) and offsets[i] == offset:
                    continue  # taken before (never met: a taken reference is GONE)
                offsets.insert(i, offset)
            if self.journaled:
                self._new_skips.setdefault(page, []).append(offset)
            new.append(((page, offset), size))
        return new

    def journal_skips(self) -> list[tuple[int, tuple[int, ...]]]:
        """The skips since the last call, per page file (`PageSkip` records: journaled
        with the step that took those messages)."""
        if not self._new_skips:
            return []
        new, self._new_skips = self._new_skips, {}
        return [(page, tuple(offsets)) for page, offsets in sorted(new.items())]

    def _prune_skips(self) -> None:
        """Forget the skips the cursor has passed."""
        page, offset = self._cursor
        for number in [n for n in self._skips if n < page]:
            del self._skips[number]
        offsets = self._skips.get(page)
        if offsets is not None and offsets and offsets[0] <= offset:
            del offsets[: bisect.bisect_right(offsets, offset)]
            if not offsets:
                del self._skips[page]

    def remove(self, doomed: set[int]) -> None:
        """Drop the paged messages in `doomed`: a marker, then copies of the rest (how
        removals were written before `skip`; kept for what its files look like, which a
        reader and a restart must still handle: tests/unit/store/test_paging.py). A
        damaged page file is handled as the read back handles it (`_damaged`: its part
        lost, counted, logged) by the first walk, and skipped alike by the second: the
        caller has already taken `doomed` (killed or moved), so raising here would leave
        them in the files too (a 500 from the API, moved messages delivered twice)."""
        kept = sum(
            1
            for f in self._frames(self._cursor, self._end(), damaged=self._damaged)
            if f.kind == _KIND_MESSAGE and f.msg_id not in doomed
        )
        self._open_writer()
        end = self._end()  # after `_damaged` (a cut tail, a new file), the writer open
        undo: Position = (self._write_page, self._write_offset)
        messages = size = expiring = 0
        durable = False
        held, self._held = self._held, {}
        try:
            self._append(_marker(kept))
            after_marker = (self._write_page, self._write_offset)
            for frame in self._frames(self._cursor, end, damaged=_skip_damaged):
                if frame.kind == _KIND_MESSAGE and frame.msg_id not in doomed:
                    body = frame.body
                    self._append(_FRAME.pack(len(body), zlib.crc32(body)) + body)
                    self._hold(self._write_page, 1, frame.size)
                    messages += 1
                    size += frame.size
                    durable = durable or frame.durable
                    expiring = _earlier(expiring, frame.expiration_ms)
        except OSError:  # a marker without all its copies would make a reader skip
            self._undo(undo)  # later messages: the removal did not happen
            self._held = held
            raise
        self.messages, self.size_bytes, self.expiring_ms = messages, size, expiring
        self.epoch += 1
        self._cursor = after_marker
        self._roll_cursor()
        if durable and self.journaled:
            self.durable_written = True
            self._owner.dirty.add(self)
        if not self.journaled:
            self.release(self._cursor)

    def _undo(self, to: Position) -> None:
        """Cut the files back to `to` (the end of the files before a failed removal)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with contextlib.suppress(OSError):
            _truncate(self._path(to[0]), to[1])
        for page in range(to[0] + 1, self._write_page + 1):
            self._path(page).unlink(missing_ok=True)
        self._write_page = to[0]

    def clear(self) -> None:
        self._cursor = self._end()
        self.messages = self.size_bytes = self.expiring_ms = 0
        self._held = {}
        self._skips, self._new_skips = {}, {}
        self.epoch += 1
        self._roll_cursor()
        if not self.journaled:
            self.release(self._cursor)

    @property
    def releasable(self) -> bool:
        """Whether a journaled cursor at `position` would let page files go."""
        return self._cursor[0] > self._released

    def release(self, position: Position) -> None:
        """A cursor at `position` is durable: delete the page files before it."""
        while self._released < position[0]:
            try:
                self._path(self._released).unlink(missing_ok=True)
            except OSError as e:  # a damaged file skipped (`_damaged`): the queue goes on
                log.error("paging %s: cannot delete a page file: %s", self.directory, e)
            self._released += 1

    def flush(self, *, sync: bool) -> None:
        if self._writer is not None:
            self._writer.flush()
            if sync and self.durable_written:
                os.fsync(self._writer.fileno())
        self.durable_written = False

    def close(self) -> None:
        """Close the open files (written out; the data stays)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._owner.dirty.discard(self)
        self._owner.opened.discard(self)
        self._owner.writers.pop(self, None)

    def destroy(self) -> None:
        """The queue is gone: its page files too."""
        self.close()
        # a late `release` (the journal's fsync of a cursor) must not delete the page
        # files of a queue of the same name created since, in the same directory
        self._released = 1 << 62
        shutil.rmtree(self.directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.directory.parent.rmdir()  # the address's, when it was the last queue
        self.messages = self.size_bytes = 0
        self._held = {}
        self._skips, self._new_skips = {}, {}

    # -- reading ------------------------------------------------------------------------
    def _end(self) -> Position:
        if self._writer is not None:
            self._writer.flush()  # what the reader reads must be in the file
        return (self._write_page, self._write_offset if self._writer is not None else -1)

    def _roll_cursor(self) -> None:
        """At the end of a complete page file the cursor moves to the next file."""
        page, offset = self._cursor
        while page < self._write_page and offset >= self._file_size(page):
            page, offset = page + 1, 0
        self._cursor = (page, offset)

    def _file_size(self, page: int) -> int:
        try:
            return self._path(page).stat().st_size
        except FileNotFoundError:
            return 0

    def _frames(
        self,
        start: Position,
        end: Position,
        *,
        damaged: Callable[[int, _Damaged], bool] | None = None,
    ) -> Iterator[_Frame]:
        """Sound frames from `start` to `end` (offset -1: the end of that file), copies
        after a marker met by reading skipped, and non-durable messages written before a
        restart skipped, and so are those removed ahead of the cursor (`skip`). A file
        damaged before its end raises `_Damaged`, or, with
        `damaged`, is handed to it: when it says so, the rest of that file is skipped (a
        frame with nothing to hand out, ending at the next file, is yielded for it)."""
        skip = 0
        page, offset = start
        while page <= end[0]:
            limit = end[1] if page == end[0] else -1
            skips = self._skips.get(page) if self._skips else None
            try:
                for frame in self._file_frames(page, offset, limit):
                    offset = frame.end[1]
                    if skips is not None and frame.kind == _KIND_MESSAGE and not skip:
                        i = bisect.bisect_left(skips, offset)
                        if i < len(skips) and skips[i] == offset:
                            yield _Frame(0, b"", frame.end)  # removed (`skip`)
                            continue
                    if frame.kind == _KIND_MARKER:
                        skip = _MARKER.unpack_from(frame.body, 1)[0]
                        yield frame
                        continue
                    if skip:
                        skip -= 1
                        yield _Frame(0, b"", frame.end)  # consumed, nothing to hand out
                        continue
                    if not frame.durable and (page, offset) <= self._recovered_end:
                        yield _Frame(0, b"", frame.end)
                        continue
                    yield frame
            except _Damaged as e:
                if damaged is None:
                    raise
                if not damaged(page, e):
                    return
                yield _Frame(0, b"", (page + 1, 0))
            page, offset = page + 1, 0

    def _file_frames(self, page: int, offset: int, limit: int) -> Iterator[_Frame]:
        """The sound frames of one file from `offset` to `limit` (-1: its end); a frame
        that is not sound before there raises `_Damaged` (a missing file holds none)."""
        path = self._path(page)
        try:
            f = _open_page(path, os.O_RDONLY, "rb")
        except FileNotFoundError:
            return
        except OSError as e:  # a directory in its place, no permission, an I/O error
            raise _Damaged(path, offset, str(e), io=True) from e
        with f:
            try:
                size = os.fstat(f.fileno()).st_size
                end = limit if limit >= 0 else size
                f.seek(offset)
                while offset < end:
                    head = f.read(_FRAME.size)
                    if len(head) < _FRAME.size:
                        break
                    length, crc = _FRAME.unpack(head)
                    # A length past the file's end is torn (or lies): not read, since
                    # `f.read(n)` allocates n bytes first (2 GiB for one lying frame: a
                    # MemoryError out of the start under an address-space limit).
                    if length > size - offset - _FRAME.size:
                        break
                    body = f.read(length) if 0 < length < _MAX_BODY else b""
                    if len(body) != length or zlib.crc32(body) != crc or not _sound(body):
                        break
                    offset += _FRAME.size + length
                    kind = body[0] if body[0] != _KIND_MOVED else _KIND_MESSAGE
                    yield _Frame(kind, body, (page, offset))
            except OSError as e:
                raise _Damaged(path, offset, str(e), io=True) from e
        if offset < end:
            raise _Damaged(path, offset, "a torn or corrupt frame", io=False)

    def _message(self, frame: _Frame) -> Message:
        body = frame.body
        durable, msg_id, first_ts, expiration, deliver_at, priority, address_len = (
            _MESSAGE.unpack_from(body, 1)
        )
        start = 1 + _MESSAGE.size
        address = body[start : start + address_len].decode(errors="replace")
        message = self._message_of(sections.scan(body[start + address_len :]))
        message.msg_id = msg_id
        message.address = address
        message.first_ts = first_ts
        message.expiration_ms = expiration  # computed once (B-080/B-083)
        message.ttl_ms = None
        message.deliver_at_ms = deliver_at
        message.priority = priority_level(priority)  # a ubyte: up to 255
        message.durable = bool(durable)
        return message

    # -- opening --------------------------------------------------------------------------
    def _scan(self, pages: list[int]) -> None:
        """Count what a restart finds from the cursor on; cut a torn or corrupt tail."""
        messages = size = 0
        page, offset = self._cursor
        good: Position = self._cursor
        marker: Position = good  # where the last removal's marker starts
        copies = 0  # of its copies, how many the files do not hold
        moved: list[Position] = []  # copies of a walk whose append was lost
        for number in pages:
            start = offset if number == page else 0
            good = (number, start)
            try:
                for frame in self._file_frames(number, start, -1):
                    if (
                        frame.body[0] == _KIND_MOVED
                        and frame.end > self.committed
                        and self._check_moved
                    ):
                        moved.append(frame.end)
                    if frame.kind == _KIND_MARKER:
                        marker, copies = good, _MARKER.unpack_from(frame.body, 1)[0]
                    elif copies:
                        copies -= 1
                    good = frame.end
            except _Damaged as e:
                if e.io or number != pages[-1]:  # not a torn tail: as the read back does
                    # (`_damaged`), the rest of this file is skipped, the later files kept;
                    # an unreadable one too (issue 23 fix 4: the start failed, on a file a
                    # crash had kept the read back's skip of from the journal)
                    log.error(
                        "paging %s: page file %s damaged, the rest of it skipped: %s",
                        self.directory,
                        e.path,
                        e,
                    )
                    if e.io and number == pages[-1]:
                        good = (number + 1, 0)  # new messages go to a new file
                    continue
                # a torn tail: cut below
            size_on_disk = self._file_size(number)
            if good[1] != size_on_disk:
                self._cut(number, good[1], size_on_disk, pages)
                break
        if copies:  # a removal the crash cut short (its cursor never journaled): undone,
            # or a reader meeting the marker would skip messages written after it
            self._cut(marker[0], marker[1], self._file_size(marker[0]), pages)
            good = marker
        self._recovered_end = good
        self._write_page = good[0]
        lost_moves = [(at, 0) for at in moved if at <= good]
        if lost_moves:  # their originals are still in their queues: passed, and journaled
            log.warning(
                "paging %s: %d moved copies (a move, dead letter or expiry) whose journal "
                "append was lost are passed (their originals were not moved)",
                self.directory,
                len(lost_moves),
            )
            self._skip_positions(lost_moves)
        for frame in self._frames(self._cursor, (good[0], good[1]), damaged=_skip_damaged):
            if frame.kind == _KIND_MESSAGE:
                messages += 1
                size += frame.size
                self._hold(frame.end[0], 1, frame.size)
                self.expiring_ms = _earlier(self.expiring_ms, frame.expiration_ms)
        self.messages, self.size_bytes = messages, size
        self._write_offset = good[1]
        log.info(
            "paging %s: %d paged messages (%d bytes) in %d files",
            self.directory,
            messages,
            size,
            self.files,
        )

    def _cut(self, page: int, good: int, size: int, pages: list[int]) -> None:
        later = [n for n in pages if n > page]
        log.warning(
            "paging %s: page %d is torn or corrupt at byte %d of %d; truncating it%s "
            "(the paged messages there are lost)",
            self.directory,
            page,
            good,
            size,
            f" and removing {len(later)} later page files" if later else "",
        )
        _truncate(self._path(page), good)
        for n in later:
            self._path(n).unlink(missing_ok=True)


def _unlinked(path: Path) -> bool:
    """Fourth attack pass: a link below `DATA_DIR/paging` (an address or queue directory
    the broker would walk, read, write and delete in) is removed, never followed; a link
    as an address directory made the start delete every directory in the one it named as
    an unknown queue's. `DATA_DIR/paging` itself may be a link (another volume)."""
    if not path.is_symlink():
        return False
    log.warning("paging: %s is a link, not a directory the broker made: removing the link", path)
    with contextlib.suppress(OSError):
        path.unlink()
    return True


class PageFiles:
    """Every queue's page files under `DATA_DIR/paging` (`core.paging.PageStores`)."""

    def __init__(
        self,
        directory: Path,
        *,
        message_of: MessageOf,
        page_size_bytes: Callable[[str], int],
        sync: bool = True,
        max_writers: int = MAX_WRITERS,
    ) -> None:
        self.directory = directory
        self.max_writers = max_writers
        # queues with a page file open for writing, least recently opened first
        self.writers: OrderedDict[QueuePages, None] = OrderedDict()
        self._message_of = message_of
        self._page_size_bytes = page_size_bytes
        self.sync = sync
        self.dirty: set[QueuePages] = set()
        self.opened: set[QueuePages] = set()
        self._cursors: dict[str, Position] = {}
        self._skips: dict[str, dict[int, list[int]]] = {}
        self._commits: dict[str, Position] | None = {}
        # True while a moved copy is routed (`core/moving.py` `_route_copy`): a durable
        # queue's page files then write it as kind 3 (module doc)
        self.moving = False
        self._known: dict[str, str] = {}  # recovered durable queue -> address

    def recover(
        self,
        queues: dict[str, str],
        cursors: dict[str, Position],
        skips: dict[str, dict[int, list[int]]] | None = None,
        commits: dict[str, Position] | None = None,
    ) -> list[str]:
        """Start-up: keep the page files of the durable queues in `queues` (name ->
        address), with their journaled cursors and skips; remove the rest (non-durable
        queues' pages are not recovered). The names of the queues that have paged
        messages."""
        self._cursors = dict(cursors)
        self._skips = dict(skips or {})
        self._commits = None if commits is None else dict(commits)
        keep = {(_safe(address), _safe(name)): name for name, address in queues.items()}
        legacy = {
            (_safe(address, legacy=True), _safe(name, legacy=True)): name
            for name, address in queues.items()
        }
        found = []
        if self.directory.is_dir():
            for address_dir in list(self.directory.iterdir()):
                if _unlinked(address_dir):
                    continue
                for queue_dir in list(address_dir.iterdir()) if address_dir.is_dir() else ():
                    pair = (address_dir.name, queue_dir.name)
                    name = keep.get(pair)
                    if _unlinked(queue_dir):
                        continue
                    if name is None and (name := legacy.get(pair)) is not None:
                        name = self._rename_legacy(queue_dir, name, queues[name])
                    if name is None:
                        shutil.rmtree(queue_dir, ignore_errors=True)
                    elif name not in self._known:  # (a renamed one may be met again)
                        found.append(name)
                        self._known[name] = queues[name]
                with contextlib.suppress(OSError):
                    address_dir.rmdir()
        return found

    def _rename_legacy(self, queue_dir: Path, name: str, address: str) -> str | None:
        """A queue directory named as before upper-case letters were escaped (`_safe`):
        moved to its name now. None: it cannot be (logged; its files are then removed,
        as an unknown queue's)."""
        target = self.directory / _safe(address) / _safe(name)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            queue_dir.rename(target)
        except OSError as e:
            log.error("paging: cannot rename %s to %s: %s", queue_dir, target, e)
            return None
        log.info("paging: %s renamed to %s (upper-case letters escaped)", queue_dir, target)
        return name

    def open(self, *, address: str, queue: str, durable: bool) -> QueuePages:
        pages = QueuePages(
            self.directory / _safe(address) / _safe(queue),
            message_of=self._message_of,
            page_size_bytes=lambda: self._page_size_bytes(address),
            journaled=durable,
            cursor=self._cursors.pop(queue, None) if durable else None,
            owner=self,
            skips=self._skips.pop(queue, None) if durable else None,
            committed=self._committed(queue) if durable else (0, 0),
        )
        self.opened.add(pages)
        return pages

    def _committed(self, queue: str) -> Position | None:
        """The journaled end of the copies walks paged to `queue`; None when `recover`
        was not told (its kind 3 frames are then all kept)."""
        return None if self._commits is None else self._commits.pop(queue, (0, 0))

    def writing(self, pages: QueuePages) -> None:
        """`pages` opens its page file for writing: past `max_writers` open ones, the
        oldest is closed, so that thousands of paging queues do not hold thousands of
        descriptors (connections and the journal need them)."""
        self.writers[pages] = None
        self.writers.move_to_end(pages)
        while len(self.writers) > self.max_writers:
            oldest = next(iter(self.writers))
            del self.writers[oldest]
            oldest.close_writer()

    def close(self) -> None:
        """Shutdown: write out and close every page file."""
        self.flush()
        for pages in list(self.opened):
            pages.close()

    def flush(self) -> None:
        """Write this step's pages out; fsync those with durable messages (`sync`)."""
        error: OSError | None = None
        while self.dirty:
            try:
                self.dirty.pop().flush(sync=self.sync)
            except OSError as e:  # the others are still synced; the caller hears of it
                error = e
        if error is not None:
            raise error
