"""`FileJournal`: the journal on disk (segments in `store/segments.py`).

Theory of operation
-------------------
A directory of segment files, `journal-<n>.seg`, plus `journal.lock` (an flock: one
broker per directory; read-only opens share it); the format is in `store/segments.py`.

Writing and group commit
~~~~~~~~~~~~~~~~~~~~~~~~
`append()` encodes and frames on the caller's thread (so a record that cannot be encoded
raises there), queues the bytes and returns at once: the event loop never waits for the
disk. One writer thread takes *everything* queued, writes it with one `write()`, makes it
durable with one fsync (`fdatasync`) if any of it was a `sync=True` append, and then calls
the `on_durable` callbacks of the whole pass, on the writer thread. While it syncs, new
appends queue up and share the next fsync: that is the group commit. `sync=False` appends
(acks, delivery-count updates the caller need not wait for) are written in the same order
and synced by the next pass that syncs, or `lazy_sync_seconds` later, whichever is first.
`sync_seconds` (e.g. a Prometheus histogram's `observe`) is called with each fsync's
duration. The queue is not bounded here: the broker's flow control (credit, settling
durable sends only in `on_durable`) bounds what is in flight.

Failure and recovery (issue 15)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A write, fsync or roll error (disk full, out of file descriptors, EIO) fails the journal.
What the journal reported done stays; what it reports failed is taken back: the pass is
truncated off the current segment (its records are never indexed), appends with a
callback get `JournalFailed` (the `OSError` is its `__cause__`), and so does every such
append until the journal works again. Appends nobody waits for (acks, counts, queues:
no callback) are *held* in order, up to `HELD_MAX_BYTES`, and written first once it
does; past that they are dropped (at-least-once: an ack lost is a redelivery).

The writer retries by itself with backoff (`RETRY_FIRST_SECONDS`, doubling up to
`retry_max_seconds`): it checks that the current segment ends where the index says
(truncating again if need be), then writes and fsyncs a probe block in the prepared next
segment and fsyncs the directory. When that works the journal is back: `failure` is None,
the `on_resume` callbacks run (on the writer thread), held appends are written. One
warning is logged when it fails, one info when it resumes, and at most one warning a
minute in between; `errors` counts every error met (metrics).

Descriptors: the journal holds the directory open and keeps the *next* segment created
and open ahead of need (`journal-<n>.seg.next`, renamed into place at the roll), so a
roll needs no new descriptor: a process that ran out of them (idle sockets) cannot make
the journal fail at a roll. The spare is made again after each roll, when it can be.

Recovery (opening a `FileJournal`)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
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

Compaction
~~~~~~~~~~
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

Thread rules are at the top of each class. `replay()` is for recovery and export: call it
before the broker starts appending. While a replay is being read, `compact()` does nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import amqpbroker.store.codec as codec
from amqpbroker.core.records import (
    Record,
)
from amqpbroker.store.api import (
    CompactionResult,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFailed,
    OnDurable,
)
from amqpbroker.store.liveness import _WITH_MSG_ID, _LiveSet, _short_lived
from amqpbroker.store.segments import (
    _FILE_HEADER,
    _FRAME,
    _NEXT_SUFFIX,
    _SEGMENT_GLOB,
    _TEMP_SUFFIX,
    BATCH_END,
    FRAME_BYTES,
    HEADER_BYTES,
    MAGIC,
    VERSION,
    _Bad,
    _check_frame,
    _decode_at,
    _default_fsync,
    _frame,
    _Loc,
    _next_sound_frame,
    _Segment,
    _segment_number,
    _segment_path,
    _sync_directory,
    _write_fd,
)

log = logging.getLogger("amqpbroker.store.journal")  # one logger for the journal

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
RETRY_FIRST_SECONDS = 0.1  # first retry after a failure; doubles up to retry_max_seconds
FAILURE_LOG_EVERY_SECONDS = 60.0  # "still failing" at most this often
HELD_MAX_BYTES = 16 * 1024 * 1024  # unwaited appends kept while failed; beyond: dropped
_PROBE = bytes(4096)  # what a retry writes (and truncates off) to test the disk


class _Pending:
    __slots__ = ("callback", "data", "records", "sizes", "sync")

    def __init__(
        self,
        records: tuple[Record, ...],
        data: bytes,
        sizes: list[int],
        sync: bool,
        callback: OnDurable | None,
    ) -> None:
        self.records = records
        self.data = data
        self.sizes = sizes
        self.sync = sync
        self.callback = callback


# How many syncs the index may lag behind (see `FileJournal._index_synced`).
INDEX_EVERY_SYNCS = 8


class FileJournal:
    """The journal in segment files, with group commit and compaction (see module doc).

    Args:
        directory: where the segments live (created if missing).
        max_segment_bytes: roll to a new segment past this size.
        skip_corrupt: skip corrupt records in the middle instead of raising.
        fsync: how to make written data durable (`os.fdatasync`); tests count calls.
        sync_seconds: called with each fsync's duration, on the writer thread.
        read_only: open for replay only (export): no truncation, no writer, shared lock.
        auto_compact: compact on a background thread after each segment roll.
        compact_live_ratio: rewrite a sealed segment when less than this share is live.
        lazy_sync_seconds: longest time `sync=False` records stay written but unsynced.
        commit_delay_seconds: under heavy load (a pass finds `commit_delay_bytes` or more
            waiting), wait this long before writing so that more appends share the
            fsync. Fewer passes also mean fewer times the writer thread needs the GIL
            while the event loop holds it, which is what a busy broker pays most for
            (`docs/durability.md`). Light load (a few synchronous senders) never waits.
        commit_delay_bytes: the backlog that counts as heavy load.
        retry_max_seconds: the longest wait between two retries of a failed journal.

    Raises:
        JournalCorrupt: a corrupt record in the middle (and not `skip_corrupt`).
        JournalError: the directory is in use by another process, or not a journal.
    """

    # Any thread may append, flush and close. The writer thread writes, syncs and runs
    # the callbacks; compact() runs on its caller's thread (or the compactor thread).
    # `_lock` guards the index and the segment list; `_cond` the queue of appends.

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        skip_corrupt: bool = False,
        fsync: Callable[[int], None] = _default_fsync,
        sync_seconds: Callable[[float], None] | None = None,
        read_only: bool = False,
        auto_compact: bool = True,
        compact_live_ratio: float = 0.25,
        lazy_sync_seconds: float = 0.05,
        commit_delay_seconds: float = 0.0,
        commit_delay_bytes: int = 16 * 1024,
        retry_max_seconds: float = 5.0,
    ) -> None:
        self.directory = Path(directory)
        self.max_segment_bytes = max(max_segment_bytes, HEADER_BYTES + FRAME_BYTES)
        self.skip_corrupt = skip_corrupt
        self.read_only = read_only
        self.compact_live_ratio = compact_live_ratio
        self.lazy_sync_seconds = lazy_sync_seconds
        self.commit_delay_seconds = commit_delay_seconds
        self.commit_delay_bytes = commit_delay_bytes
        self.retry_max_seconds = max(retry_max_seconds, RETRY_FIRST_SECONDS)
        self._fsync = fsync
        self._sync_seconds = sync_seconds
        self.syncs = 0  # data fsyncs by the writer (group commits and rolls)
        self.bytes_written = 0

        self._lock = threading.Lock()
        self._live: _LiveSet[_Loc] = _LiveSet(self._on_dead)
        self._segments: list[_Segment] = []
        self._targeted_by: dict[_Segment, set[_Loc]] = {}
        self._applying: _Segment | None = None
        self._kill_targets: set[_Segment] = set()
        self._late_kill = False
        self._late_tombstones: list[_Loc] = []

        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Pending] = []
        self._closed = False
        self._failure: JournalFailed | None = None
        self._fd = -1
        self._unsynced_bytes = 0
        self._unsynced_since = 0.0
        self._unindexed: list[tuple[_Segment, list[tuple[_Pending, int]]]] = []
        self._unindexed_syncs = 0  # syncs since the last `_index_synced`
        self._synced_unindexed = 0  # how many `_unindexed` entries are on disk
        self._compact_lock = threading.Lock()
        self._readers = 0  # replays in progress: compaction waits for them
        self._compact_wanted = threading.Event()
        self._stopping = False
        # Failure and recovery (writer thread; see the module doc).
        self.errors = 0  # write, sync, roll and retry errors met (a metric)
        # What a failure takes back: (segment, its size, len(_unindexed), unsynced bytes).
        self._mark: tuple[_Segment | None, int, int, int] = (None, 0, 0, 0)
        self._unsealed: _Pending | None = None  # this pass's first entry after its last roll
        self._failed_at = self._logged_at = self._retry_at = 0.0
        self._retry_delay = RETRY_FIRST_SECONDS
        self._held: list[_Pending] = []  # unwaited appends kept while failed
        self._held_bytes = 0
        self._held_dropped = 0
        self._resumed: list[Callable[[], None]] = []
        self._dir_fd = -1
        self._next: tuple[int, Path, int] | None = None  # spare next segment: n, path, fd

        self._lock_fd = self._lock_directory()
        try:
            self._open_segments()
        except BaseException:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            raise
        self._writer: threading.Thread | None = None
        self._compactor: threading.Thread | None = None
        if not read_only:
            current = self._segments[-1]
            self._fd = os.open(current.path, os.O_WRONLY | os.O_APPEND)
            self._dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                self._prepare_next(current.number + 1)
            except OSError as e:  # made at the first roll, if it can be by then
                log.warning("journal %s: cannot make a spare segment: %s", self.directory, e)
            self._writer = threading.Thread(
                target=self._write_loop, name=f"journal-writer {self.directory}", daemon=True
            )
            self._writer.start()
            if auto_compact:
                self._compactor = threading.Thread(
                    target=self._compact_loop, name=f"journal-compactor {self.directory}"
                )
                self._compactor.daemon = True
                self._compactor.start()

    # --- opening and recovery ---

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
        for msg_id, slot in list(self._live.messages.items()):
            if not slot.refs:
                del self._live.messages[msg_id]
                self._on_dead(slot.item, False)
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

    def _scan_segment(self, number: int, path: Path, *, last: bool) -> None:
        data = path.read_bytes()
        seg = _Segment(number, path, len(data))
        if len(data) < HEADER_BYTES or data[:HEADER_BYTES] == bytes(HEADER_BYTES):
            if not last:
                raise JournalCorrupt(path, 0, "file header missing")
            # A crash while the segment was being created: it holds nothing.
            log.warning("journal %s: segment header incomplete (crash while rolling)", path)
            if self.read_only:
                return
            path.unlink()
            self._segments.append(self._create_segment(number))
            return
        magic, version, _, header_number = _FILE_HEADER.unpack_from(data)
        if magic != MAGIC:
            raise JournalCorrupt(path, 0, "not a journal segment (bad magic)")
        if version != VERSION:
            raise JournalCorrupt(path, 0, f"segment version {version}, this broker reads 1")
        if header_number != number:
            raise JournalCorrupt(path, 0, f"header says segment {header_number}")
        self._segments.append(seg)
        batch: list[tuple[Record, int, int]] = []  # records of an unfinished append
        batch_start = pos = HEADER_BYTES
        while pos < len(data):
            checked = _check_frame(data, pos)
            record: Record | _Bad = (
                checked if isinstance(checked, _Bad) else _decode_at(data, pos, *checked[:2])
            )
            if isinstance(record, _Bad):
                if last and self._is_tail(data, pos, record):
                    self._truncate_tail(seg, data, batch_start, pos, record, len(batch))
                    return
                if not self.skip_corrupt:
                    raise JournalCorrupt(path, pos, record.reason)
                pos = self._skip(seg, data, pos, record)
                continue
            assert not isinstance(checked, _Bad)
            end, _, flags = checked
            batch.append((record, pos, end - pos))
            pos = end
            if flags & BATCH_END:
                self._index_batch(seg, batch)
                batch = []
                batch_start = pos
        if batch and last:
            self._truncate_tail(seg, data, batch_start, pos, None, len(batch))
        elif batch:
            self._index_batch(seg, batch)

    @staticmethod
    def _is_tail(data: bytes, pos: int, bad: _Bad) -> bool:
        """Whether a bad frame in the last segment is its tail rather than its middle."""
        if bad.intact:
            return False
        if bad.end > len(data) or data.count(0, pos) == len(data) - pos:
            return True  # cut short by a crash, or zeros the crash left
        if bad.end >= 0:
            if bad.end == len(data):
                return True  # the last record is damaged
            if not isinstance(_check_frame(data, bad.end), _Bad):
                return False  # a sound frame follows where this one ends
        return _next_sound_frame(data, pos + 1) < 0

    def _truncate_tail(
        self, seg: _Segment, data: bytes, keep: int, bad_at: int, bad: _Bad | None, whole: int
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

    def _skip(self, seg: _Segment, data: bytes, pos: int, bad: _Bad) -> int:
        if 0 <= bad.end <= len(data) and (
            bad.end == len(data) or not isinstance(_check_frame(data, bad.end), _Bad)
        ):
            resume = bad.end
        else:
            resume = _next_sound_frame(data, pos + 1)
            if resume < 0:
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

    # --- the index ---

    def _on_dead(self, item: _Loc, needs_tombstone: bool) -> None:
        seg = item.seg
        if seg.items.pop(item.offset, None) is item:
            seg.live_bytes -= item.size
        applying = self._applying
        if needs_tombstone and applying is not None and seg.number < applying.number:
            self._kill_targets.add(seg)
            if item.copying:
                self._late_kill = True

    def _index_batch(self, seg: _Segment, batch: Iterable[tuple[Record, int, int]]) -> None:
        """Apply written records at (offset, size) of `seg` to the index. Holds `_lock`."""
        self._applying = seg
        kill_targets = self._kill_targets
        for record, offset, size in batch:
            item = _Loc(seg, offset, size)
            kill_targets.clear()
            self._late_kill = False
            if self._live.apply(record, item):
                seg.items[offset] = item
                seg.live_bytes += size
            elif kill_targets:
                item.targets = set(kill_targets)
                seg.items[offset] = item
                seg.live_bytes += size
                for target in kill_targets:
                    self._targeted_by.setdefault(target, set()).add(item)
                if self._late_kill:
                    self._late_tombstones.append(item)
        self._applying = None

    def _retire(self, seg: _Segment) -> None:
        """`seg`'s dead records are gone from disk: tombstones aimed at it may go too."""
        for tombstone in self._targeted_by.pop(seg, ()):
            targets = tombstone.targets
            assert targets is not None
            targets.discard(seg)
            if not targets:
                home = tombstone.seg
                if home.items.pop(tombstone.offset, None) is tombstone:
                    home.live_bytes -= tombstone.size

    # --- appending ---

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnDurable | None = None
    ) -> None:
        parts = []
        sizes = []
        last = len(records) - 1
        for i, record in enumerate(records):
            frame = _frame(record.type_id, BATCH_END if i == last else 0, codec.encode(record))
            parts.append(frame)
            sizes.append(len(frame))
        pending = _Pending(tuple(records), b"".join(parts), sizes, sync, on_durable)
        with self._cond:
            if self._closed or self.read_only:
                raise JournalClosed(f"journal {self.directory} is closed or read-only")
            self._queue.append(pending)
            self._cond.notify()

    def flush(self, timeout: float | None = None) -> None:
        done = threading.Event()
        outcome: list[JournalFailed | None] = []

        def flushed(error: JournalFailed | None) -> None:
            outcome.append(error)
            done.set()

        self.append((), sync=True, on_durable=flushed)
        if not done.wait(timeout):
            raise TimeoutError(f"journal {self.directory}: flush took over {timeout}s")
        if outcome[0] is not None:
            raise outcome[0]

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    if self._failure is not None:  # wait for the next retry
                        left = self._retry_at - time.monotonic()
                    elif self._unsynced_bytes:
                        left = self._unsynced_since + self.lazy_sync_seconds - time.monotonic()
                    else:
                        self._cond.wait()
                        continue
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch, self._queue = self._queue, []
                closing = self._closed
            if self._failure is not None and time.monotonic() >= self._retry_at and self._retry():
                batch[:0] = self._held  # held first: they were appended first
                self._held, self._held_bytes = [], 0
            if (
                self.commit_delay_seconds > 0
                and not closing
                and len(batch) > 1
                and sum(len(p.data) for p in batch) >= self.commit_delay_bytes
            ):
                # Group commit under load: let the appends of the next few ms join in.
                time.sleep(self.commit_delay_seconds)
                with self._cond:
                    batch += self._queue
                    self._queue = []
                    closing = self._closed
            if batch:
                self._write_batch(batch)
            elif self._unsynced_bytes:
                self._sync_or_fail()
            if closing and not batch:
                if self._held:
                    log.warning(
                        "journal %s: closed while failed: %d appends nobody waited for "
                        "(acknowledgements, counts) were never written",
                        self.directory,
                        len(self._held),
                    )
                return

    def _sync_or_fail(self) -> bool:
        if self._failure is not None:
            return False
        self._mark_clean()
        try:
            self._sync()
        except Exception as e:
            self._fail(e)
            return False
        return True

    def _sync(self, *, index_all: bool = False) -> None:
        started = time.perf_counter()
        self._fsync(self._fd)
        elapsed = time.perf_counter() - started
        self.syncs += 1
        self._unsynced_bytes = 0
        self._unindexed_syncs += 1
        with self._lock:
            self._synced_unindexed = len(self._unindexed)  # all written is on disk now
            if index_all or self._unindexed_syncs >= INDEX_EVERY_SYNCS:
                self._index_synced()
        if self._sync_seconds is not None:
            try:
                self._sync_seconds(elapsed)
            except Exception:
                log.exception("journal %s: sync_seconds observer failed", self.directory)

    def _index_synced(self) -> None:
        """Index what is written and synced. Only ever what is on disk: compaction may act
        on what the index says (delete the segment of a message acked here), and must never
        outrun the disk. Deferred for a few syncs (INDEX_EVERY_SYNCS) because a message's
        add and its ack then usually meet in one batch, and `_short_lived` skips both;
        never past a roll: a sealed segment is always fully indexed, and only sealed
        segments are compacted; `compact()` indexes first. Holds `_lock`."""
        self._unindexed_syncs = 0
        synced = self._synced_unindexed
        window = self._unindexed[:synced]
        segments = dict.fromkeys(seg for seg, _ in window)  # in write order
        for seg in segments:
            placed = [p for s, entries in window if s is seg for p in entries]
            gone = _short_lived([r for entry, _ in placed for r in entry.records], self._live)
            batch = []
            for entry, offset in placed:
                for record, size in zip(entry.records, entry.sizes, strict=True):
                    if (
                        not gone
                        or not isinstance(record, _WITH_MSG_ID)
                        or record.msg_id not in gone
                    ):
                        batch.append((record, offset, size))
                    offset += size
            self._index_batch(seg, batch)
        del self._unindexed[:synced]
        self._synced_unindexed = 0

    def _write_batch(self, batch: list[_Pending]) -> None:
        if self._failure is not None:
            self._refuse(batch)
            return
        try:
            self._write_entries(batch)
        except Exception as e:  # OSError, or a bug: either way no callback may be lost
            self._fail(e)
            done = 0 if self._unsealed is None else batch.index(self._unsealed)
            self._answer(batch[:done])  # in segments this pass sealed: on disk
            self._refuse(batch[done:])
            return
        self._answer(batch)

    def _answer(self, entries: list[_Pending]) -> None:
        for entry in entries:
            if entry.callback is not None:
                try:
                    entry.callback(None)
                except Exception:
                    log.exception("journal %s: on_durable callback failed", self.directory)

    def _refuse(self, entries: list[_Pending]) -> None:
        """While failed: fail what is waited for, hold the rest (see the module doc)."""
        failure = self._failure
        for entry in entries:
            if entry.callback is None:
                if self._held_bytes + len(entry.data) <= HELD_MAX_BYTES:
                    self._held.append(entry)
                    self._held_bytes += len(entry.data)
                else:
                    self._held_dropped += 1
                continue
            try:
                entry.callback(failure)
            except Exception:
                log.exception("journal %s: on_durable callback failed", self.directory)

    def _mark_clean(self) -> None:
        """What a failure from here on takes back: nothing written so far."""
        seg = self._segments[-1]
        self._mark = (seg, seg.size_bytes, len(self._unindexed), self._unsynced_bytes)

    def _write_entries(self, batch: list[_Pending]) -> None:
        seg = self._segments[-1]
        self._mark_clean()
        self._unsealed = None
        chunk: list[bytes] = []
        placed: list[tuple[_Pending, int]] = []
        end = seg.size_bytes
        for entry in batch:
            size = len(entry.data)
            if end + size > self.max_segment_bytes and end > HEADER_BYTES:
                self._write_chunk(seg, chunk, placed)
                if self._unsynced_bytes:
                    self._sync(index_all=True)  # a sealed segment: on disk, all indexed
                else:
                    with self._lock:
                        self._index_synced()
                self._unsealed = entry  # what came before is on disk
                self._mark_clean()
                seg = self._roll(seg)
                self._mark_clean()
                chunk, placed, end = [], [], seg.size_bytes
            if size:
                chunk.append(entry.data)
                placed.append((entry, end))
                end += size
        self._write_chunk(seg, chunk, placed)
        if self._unsynced_bytes and (
            any(entry.sync for entry in batch) or self.lazy_sync_seconds <= 0
        ):
            self._sync()

    def _write_chunk(
        self, seg: _Segment, chunk: list[bytes], placed: list[tuple[_Pending, int]]
    ) -> None:
        if not chunk:
            return
        data = b"".join(chunk)
        _write_fd(self._fd, data)
        if not self._unsynced_bytes:
            self._unsynced_since = time.monotonic()
        self._unsynced_bytes += len(data)
        self.bytes_written += len(data)
        with self._lock:
            seg.size_bytes += len(data)
            self._unindexed.append((seg, placed))

    def _roll(self, old: _Segment) -> _Segment:
        """Seal `old` (already synced) and start the next segment: the spare one, renamed
        into place, so that a roll needs no new file descriptor."""
        number = old.number + 1
        if self._next is None or self._next[0] != number:
            self._drop_next()
            self._prepare_next(number)  # no spare: make it now (may fail: EMFILE, ENOSPC)
        assert self._next is not None
        _, spare, fd = self._next
        self._next = None
        new = _Segment(number, _segment_path(self.directory, number), HEADER_BYTES)
        try:
            os.rename(spare, new.path)
        except BaseException:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        with self._lock:
            self._segments.append(new)
        self._compact_wanted.set()
        # The new name is durable before anything is written in it (if this fails, the
        # journal fails, and a retry syncs the directory before writing again).
        os.fsync(self._dir_fd)
        try:
            self._prepare_next(number + 1)
        except OSError as e:  # made again at the next roll (or retry)
            log.debug("journal %s: no spare segment for now: %s", self.directory, e)
        return new

    def _prepare_next(self, number: int) -> None:
        """Create segment `number` under a spare name, header synced, and keep it open."""
        path = _segment_path(self.directory, number)
        spare = path.with_name(path.name + _NEXT_SUFFIX)
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            _write_fd(fd, _FILE_HEADER.pack(MAGIC, VERSION, 0, number))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                spare.unlink()
            raise
        self._next = (number, spare, fd)

    def _drop_next(self) -> None:
        if self._next is not None:
            _, spare, fd = self._next
            self._next = None
            os.close(fd)
            with contextlib.suppress(OSError):
                spare.unlink()

    def _fail(self, error: Exception) -> None:
        """Take back what this pass wrote and refuse appends until a retry works."""
        seg, size, unindexed, unsynced = self._mark
        assert seg is not None  # set before anything is written
        with self._lock:
            del self._unindexed[unindexed:]  # not on disk, so never indexed
            self._synced_unindexed = min(self._synced_unindexed, len(self._unindexed))
            seg.size_bytes = size
        self._unsynced_bytes = unsynced
        failure = JournalFailed(f"journal {self.directory}: write failed: {error}")
        failure.__cause__ = error
        self._failure = failure
        self.errors += 1
        now = time.monotonic()
        self._failed_at = self._logged_at = now
        self._retry_delay = RETRY_FIRST_SECONDS
        self._retry_at = now + RETRY_FIRST_SECONDS
        log.log(
            logging.WARNING if isinstance(error, OSError) else logging.ERROR,
            "journal failed: %s: %s; appends waited for are refused and the others held "
            "until it can write again (records synced before are kept); retrying with backoff",
            self.directory,
            error,
            exc_info=not isinstance(error, OSError),
        )
        if seg is self._segments[-1]:
            try:  # drop the partial write, so the file ends on a whole record
                os.ftruncate(self._fd, size)
            except OSError as e:
                log.warning(
                    "journal %s: could not drop the partial write yet: %s", self.directory, e
                )

    def _retry(self) -> bool:
        """Whether the journal works again (writer thread, while failed)."""
        now = time.monotonic()
        try:
            seg = self._segments[-1]
            if os.fstat(self._fd).st_size != seg.size_bytes:
                os.ftruncate(self._fd, seg.size_bytes)  # what the failed pass left
            self._probe()
        except Exception as e:
            self.errors += 1
            self._retry_delay = min(self._retry_delay * 2, self.retry_max_seconds)
            self._retry_at = time.monotonic() + self._retry_delay
            if now - self._logged_at >= FAILURE_LOG_EVERY_SECONDS:
                self._logged_at = now
                log.warning(
                    "journal %s: still failing after %.0f s: %s (%d appends held, %d dropped); "
                    "retrying every %.1f s",
                    self.directory,
                    now - self._failed_at,
                    e,
                    len(self._held),
                    self._held_dropped,
                    self._retry_delay,
                )
            return False
        log.info(
            "journal %s: writing again after %.1f s (%d errors); appends are accepted, "
            "%d held appends written, %d dropped while failed (those may be redelivered "
            "after a restart)",
            self.directory,
            now - self._failed_at,
            self.errors,
            len(self._held),
            self._held_dropped,
        )
        self._held_dropped = 0
        for callback in self._resumed:
            try:
                callback()
            except Exception:
                log.exception("journal %s: on_resume callback failed", self.directory)
        # Last: whoever reads `failure` as None finds the callbacks already posted.
        self._failure = None
        return True

    def _probe(self) -> None:
        """Write and sync a block in the spare segment, then take it back: the disk takes
        writes, and a descriptor was there for the spare if it had to be made again."""
        if self._next is None:
            self._prepare_next(self._segments[-1].number + 1)
        assert self._next is not None
        fd = self._next[2]
        try:
            _write_fd(fd, _PROBE)
            self._fsync(fd)
            os.ftruncate(fd, HEADER_BYTES)
            os.fsync(self._dir_fd)
        except BaseException:
            self._drop_next()
            raise

    def on_resume(self, callback: Callable[[], None]) -> None:
        self._resumed.append(callback)

    @property
    def failure(self) -> JournalFailed | None:
        return self._failure

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(seg.size_bytes for seg in self._segments)

    @property
    def segment_count(self) -> int:
        with self._lock:
            return len(self._segments)

    # --- replay ---

    def replay(self) -> Iterator[Record]:
        if not self.read_only:
            self.flush()
        with self._compact_lock, self._lock:  # no compaction runs, none starts
            self._readers += 1
            plan = [(seg.path, seg.size_bytes, list(seg.skips)) for seg in self._segments]
        try:
            yield from self._replay(plan)
        finally:
            with self._lock:
                self._readers -= 1

    @staticmethod
    def _replay(plan: list[tuple[Path, int, list[tuple[int, int]]]]) -> Iterator[Record]:
        for path, size, skips in plan:
            with open(path, "rb") as f:
                data = f.read(size)
            skip_at = dict(skips)
            pos = HEADER_BYTES
            while pos < size:
                if pos in skip_at:
                    pos = skip_at[pos]
                    continue
                checked = _check_frame(data, pos)
                if isinstance(checked, _Bad):
                    raise JournalCorrupt(path, pos, checked.reason)
                end, type_id, _ = checked
                record = _decode_at(data, pos, end, type_id)
                if isinstance(record, _Bad):
                    raise JournalCorrupt(path, pos, record.reason)
                yield record
                pos = end

    # --- compaction ---

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
                    rewritten += self._rewrite(run)
                deleted += self._delete_dead()
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
            snapshot = [(seg, sorted(seg.items.items())) for seg in run]
            for _, items in snapshot:
                for _, item in items:
                    item.copying = True
        temp = last.path.with_name(last.path.name + _TEMP_SUFFIX)
        copied: list[tuple[_Loc, int]] = []
        try:
            parts = [_FILE_HEADER.pack(MAGIC, VERSION, 0, last.number)]
            offset = HEADER_BYTES
            for seg, items in snapshot:
                with open(seg.path, "rb") as f:
                    data = f.read(seg.size_bytes)
                for item_offset, item in items:
                    frame = data[item_offset : item_offset + item.size]
                    checked = _check_frame(frame, 0)
                    if isinstance(checked, _Bad):
                        raise JournalCorrupt(seg.path, item_offset, checked.reason)
                    parts.append(frame)
                    copied.append((item, offset))
                    offset += item.size
            if copied:  # end on a whole append, as every sealed segment does
                _, _, type_id, flags = _FRAME.unpack_from(parts[-1])
                if not flags & BATCH_END:
                    parts[-1] = _frame(type_id, flags | BATCH_END, parts[-1][FRAME_BYTES:])
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_fd(fd, b"".join(parts))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, last.path)
        except BaseException:
            with self._lock:
                for _, items in snapshot:
                    for _, item in items:
                        item.copying = False
                self._late_tombstones.clear()
            temp.unlink(missing_ok=True)
            raise
        # The rename is the commit point: from here on the index describes the new file.
        with self._lock:
            new = _Segment(last.number, last.path, offset)
            for item, new_offset in copied:
                item.copying = False
                if item.seg.items.get(item.offset) is item:  # still live (or needed)
                    del item.seg.items[item.offset]
                    item.seg = new
                    item.offset = new_offset
                    new.items[new_offset] = item
                    new.live_bytes += item.size
            for _, items in snapshot:
                for _, item in items:
                    item.copying = False
            # Tombstones written while we copied, for records we copied: they must now
            # outlive the new file.
            for tombstone in self._late_tombstones:
                assert tombstone.targets is not None
                tombstone.targets.add(new)
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

    # --- closing ---

    def close(self) -> None:
        """Write and sync what is queued, stop the threads, release the directory."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self._stopping = True
        self._compact_wanted.set()
        if self._compactor is not None:
            self._compactor.join()
        if self._writer is not None:
            self._writer.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._drop_next()
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> FileJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
