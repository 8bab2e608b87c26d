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

The index
~~~~~~~~~
The file journal keeps an index of where each live record is (`_Loc`: segment, offset,
size), and per segment the bytes of live records and needed tombstones. The writer
updates it once records are synced, never before: compaction must not delete a message's
segment on the strength of an ack that is not on disk yet. It may lag a few syncs behind
(`_index_synced`), so that a message added and acked within the window costs the index
nothing (`_short_lived`); a segment is fully indexed before it is sealed, and `compact()`
indexes what is synced first.

The journal's other parts are mixins in their own modules: opening and the recovery of a
torn tail (`_Opening`, `store/opening.py`), failure and retry (`_Failure`,
`store/failure.py`), compaction (`_Compaction`, `store/compaction.py`, on the caller's
thread or on the compactor thread after each segment roll when `auto_compact=True`).

Thread rules are at the top of each class. `replay()` is for recovery and export: call it
before the broker starts appending.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import cast

import amqpbroker.store.codec as codec
from amqpbroker.core.records import AddMessage, Record, RecordType
from amqpbroker.store.api import (
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFailed,
    OnDurable,
)
from amqpbroker.store.compaction import _Compaction
from amqpbroker.store.failure import RETRY_FIRST_SECONDS, _Failure
from amqpbroker.store.frames import Entry, Kept, rebuilds, reload_pack
from amqpbroker.store.framing import frame_records
from amqpbroker.store.indexing import short_lived, survivors
from amqpbroker.store.liveness import _LiveSet
from amqpbroker.store.locs import (
    Compact,
    Item,
    Packs,
    _Pack,
    compact_find,
    pack_kill,
    pack_unload,
    pack_where,
)
from amqpbroker.store.opening import _Opening
from amqpbroker.store.segments import (
    _FILE_HEADER,
    _NEXT_SUFFIX,
    _SIZE_MASK,
    FRAME_BYTES,
    HEADER_BYTES,
    MAGIC,
    VERSION,
    _Bad,
    _check_frame,
    _decode_at,
    _default_fsync,
    _Loc,
    _Pending,
    _Segment,
    _segment_path,
    _write_fd,
)
from amqpbroker.store.state import JournalState
from amqpbroker.store.sysmem import trim_once

log = logging.getLogger("amqpbroker.store.journal")  # one logger for the journal

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
HELD_MAX_BYTES = 16 * 1024 * 1024  # unwaited appends kept while failed; beyond: dropped
_ADD_MESSAGE = int(RecordType.ADD_MESSAGE)


# How far the index may lag behind the disk (see `FileJournal._index_synced`): so many
# syncs, or so many bytes written, whichever comes first. Wide enough that under a steady
# load a message is added and acked within it (then the index skips it): with 8 syncs about
# half the messages of the durable benchmark were indexed and killed again (issue 20).
INDEX_EVERY_SYNCS = 64
INDEX_EVERY_BYTES = 4 * 1024 * 1024


# Packed records the open kept for `state()` from which dropping them is worth a trim
# (`sysmem.trim_once`): ~50k messages, some 10 MB of freed heap.
_TRIM_SLOTS = 100_000


class FileJournal(_Opening, _Failure, _Compaction):
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
        body_budget: int = -1,
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
        self._live: _LiveSet[Item] = _LiveSet(self._on_dead)
        # The open's packed records (`store/locs.py` `_Pack`), by number (0: none).
        self._packs: Packs = [None]
        self._settled: list[_Pack] = []  # (`_Opening._read_unread`, `_drop_opened`)
        # The open's pairs no liveness dict holds (`store/locs.py`, issue 23, tenth pass).
        self._live.compact = Compact(self._packs)
        # (an untouched pack's arrays are rebuilt from its file when wanted: issue 23,
        # eleventh pass)
        self._live.compact.loader = reload_pack
        self._live.compact.checker = rebuilds  # (a mixed pack's: issue 23, twelfth pass)
        self._live.first_of = {}
        self._segments: list[_Segment] = []
        self._targeted_by: dict[_Segment, set[_Loc]] = {}
        self._targets: dict[_Loc, set[_Segment]] = {}  # tombstone: segments it must outlive
        self._copying: set[_Segment] = set()  # what compaction is copying (its snapshot)
        self._applying: _Segment | None = None
        self._kill_targets: set[_Segment] = set()
        self._late_kill = False
        self._late_tombstones: list[_Loc] = []

        self._queue_lock = threading.Lock()
        self._cond = threading.Condition(self._queue_lock)
        self._queue: list[_Pending] = []
        self._writer_waits = False  # in `_cond.wait()`: an append must notify (`_queue_lock`)
        self._closed = False
        self._failure: JournalFailed | None = None
        self._fd = -1
        self._unsynced_bytes = 0
        self._unsynced_since = 0.0
        self._unindexed: list[tuple[_Segment, list[tuple[_Pending, int]]]] = []
        self._unindexed_syncs = 0  # syncs since the last `_index_synced`
        self._unindexed_bytes = 0  # bytes written since then (about: a bound, not a count)
        self._synced_unindexed = 0  # how many `_unindexed` entries are on disk
        # Messages the last window found gone whose records may still wait in the newer
        # half it left for the next (see `_index_synced`): skipped there too.
        self._carried_gone: set[int] = set()
        self._compact_lock = threading.Lock()
        self._passed_runs: set[str] = set()
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

        # The record of each location the open's index made live, for `state()` while
        # nothing was appended since (issue 23 item 4: recovery decodes the journal once).
        # Records that die are dropped as they die; an AddMessage is kept as its layout
        # (`codec.add_message_layout`) until its segment is read, then decoded if live.
        self._opened_live: dict[_Loc, Kept] | None = {}
        self._unread: list[Item] = []  # AddMessages of this segment kept as layouts
        self._opened_max_id = 0
        # Bytes of live bodies the open copies out for `state()`; the rest stay in the
        # files (their rows are layouts) and `read_message` reads them when wanted: a
        # backlog larger than memory is recoverable (issue 23). < 0: every body.
        self._body_budget = body_budget
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

    # opening and recovery: `_Opening` (store/opening.py)

    # --- the index ---

    def _on_dead(self, item: Item, needs_tombstone: bool) -> None:
        if isinstance(item, int):  # a packed record's handle (`store/locs.py`)
            packed = pack_kill(self._packs, item)
            if packed is None:
                return
            seg = packed
        else:
            opened = self._opened_live
            if opened is not None:
                opened.pop(item, None)
            seg = item.seg
            span = item.span
            if seg.items.pop(span, None) is item:
                seg.live_bytes -= span & _SIZE_MASK
        applying = self._applying
        if needs_tombstone and applying is not None and seg.number < applying.number:
            self._kill_targets.add(seg)
            if seg in self._copying:
                self._late_kill = True

    def _index_batch(
        self,
        seg: _Segment,
        batch: Iterable[Entry],
        keep: dict[_Loc, Kept] | None = None,
    ) -> None:
        """Apply written records at (offset, size) of `seg` to the index. Holds `_lock`.
        `keep` (at open) gets the record of each location made live; an AddMessage may
        come as its layout (read at open without its body: see `_opened_live`), an AddRef
        as its row (`codec.RefRow`)."""
        self._applying = seg
        kill_targets = self._kill_targets
        live, rules, items = self._live, self._live.rules, seg.items
        unread = self._unread
        added = 0  # live bytes (the `_on_dead` calls meanwhile subtract theirs)
        for entry, offset, size in batch:
            item = _Loc(seg, offset, size)
            record: Record
            if not isinstance(entry, tuple):
                record = entry
            elif len(entry) == 3:  # an AddRef's row, read at open
                record = codec.add_ref_of_row(entry)
            else:  # an AddMessage's layout: always live, and kills no tombstone target
                live.add_message(entry[0], item)
                items[item.span] = item
                added += size
                if keep is not None:
                    keep[item] = entry
                    unread.append(item)
                continue
            if kill_targets:
                kill_targets.clear()
            self._late_kill = False
            if rules[type(record)](record, item):
                items[item.span] = item
                added += size
                if keep is not None:
                    keep[item] = record
            elif kill_targets:
                self._targets[item] = set(kill_targets)
                items[item.span] = item
                added += size
                for target in kill_targets:
                    self._targeted_by.setdefault(target, set()).add(item)
                if self._late_kill:
                    self._late_tombstones.append(item)
        seg.live_bytes += added
        self._applying = None

    def _retire(self, seg: _Segment) -> None:
        """`seg`'s dead records are gone from disk: tombstones aimed at it may go too."""
        for tombstone in self._targeted_by.pop(seg, ()):
            targets = self._targets[tombstone]
            targets.discard(seg)
            if not targets:
                del self._targets[tombstone]
                home = tombstone.seg
                if home.items.pop(tombstone.span, None) is tombstone:
                    home.live_bytes -= tombstone.size

    # --- appending ---

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnDurable | None = None
    ) -> None:
        data, sizes = frame_records(records)  # one pass, no Python call per record
        pending = _Pending(tuple(records), data, sizes, sync, on_durable)
        # The condition's lock itself (a C call), and a notify only when the writer waits:
        # while it writes or syncs, appends just queue (issue 20: ~2k instructions each).
        with self._queue_lock:
            if self._closed or self.read_only:
                raise JournalClosed(f"journal {self.directory} is closed or read-only")
            if records and self._opened_live is not None:
                self._drop_opened()  # the state moved on: `state()` replays the files
            self._queue.append(pending)
            if self._writer_waits:
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
                        self._writer_waits = True
                        self._cond.wait()
                        self._writer_waits = False
                        continue
                    if left <= 0:
                        break
                    self._writer_waits = True
                    self._cond.wait(left)
                    self._writer_waits = False
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
            if (
                index_all
                or self._unindexed_syncs >= INDEX_EVERY_SYNCS
                or self._unindexed_bytes >= INDEX_EVERY_BYTES
            ):
                self._index_synced(final=index_all)
        if self._sync_seconds is not None:
            try:
                self._sync_seconds(elapsed)
            except Exception:
                log.exception("journal %s: sync_seconds observer failed", self.directory)

    def _index_synced(self, *, final: bool = True) -> None:
        """Index what is written and synced. Only ever what is on disk: compaction may act
        on what the index says (delete the segment of a message acked here), and must never
        outrun the disk. Deferred for a few syncs or MiB (INDEX_EVERY_SYNCS, _BYTES) because
        a message's add and its ack then usually meet in one window, and `short_lived` skips
        both. Not `final` (the periodic pass): only the older half of the window is indexed,
        and the newer half waits for the next window, so that a message added late in a
        window and acked early in the next still costs the index nothing (issue 20: such
        messages, indexed and killed, made the durable benchmark vary by ~8k instructions
        per message from run to run). Final, never past a roll: a sealed segment is always
        fully indexed, and only sealed segments are compacted; `compact()` indexes first.
        Holds `_lock`."""
        self._unindexed_syncs = self._unindexed_bytes = 0
        synced = self._synced_unindexed
        window = self._unindexed[:synced]
        done = synced if final else (synced + 1) // 2
        carried = self._carried_gone
        known = self._live.messages
        compact = self._live.compact
        floor = 0 if compact is None else compact.top
        gone_here: set[int] = set()
        for seg in dict.fromkeys(seg for seg, _ in window):  # in write order
            records: list[Record] = []
            older: list[tuple[_Pending, int]] = []
            for k, (s, entries) in enumerate(window):
                if s is seg:
                    for entry, _ in entries:
                        records.extend(entry.records)
                    if k < done:
                        older.extend(entries)
            gone = short_lived(records, known, floor)  # over the whole window (compiled)
            if older:
                # The carried messages are gone too: their adds were skipped last time.
                self._index_batch(seg, survivors(older, gone | carried if carried else gone))
            gone_here |= gone
        del self._unindexed[:done]
        self._synced_unindexed = synced - done
        self._carried_gone = gone_here if done < synced else set()

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
        for entry in batch:  # written: the index needs records and sizes, not the bytes
            entry.data = b""
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
        self._unindexed_bytes += len(data)
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

    def _drop_opened(self) -> None:
        """Forget the open's records (`_opened_live`, the packs' `kept`): read once."""
        self._opened_live = None
        self._live.first_of = None
        for pack in self._packs:
            if pack is not None:
                pack.kept = None
        compact = self._live.compact
        if compact is not None:
            for pack in self._settled:
                pack_unload(compact, pack)
        self._settled = []

    def state(self) -> JournalState:
        """The state `replay()` describes: from the index the open built, while nothing
        was appended since (issue 23 item 4: liveness applied once, not again by
        `JournalState.of`), else by replaying the files. Once: the open's records go."""
        with self._lock:
            live = self._opened_live
            if live is not None:
                # Every layout was read when its segment was: records and rows only.
                records = cast(dict[_Loc, Record], live)
                packed = [None if pack is None else pack.kept for pack in self._packs]
                try:
                    return JournalState._from_live(
                        self._live, records.__getitem__, self._opened_max_id, packed, self._packs
                    )
                finally:
                    opened = sum(len(kept) for kept in packed if kept is not None)
                    self._drop_opened()
                    del records, packed, live
                    # The open's records, freed in one go, are heap the allocator keeps
                    # for later (issue 23: RSS bounded during recovery): back now, when
                    # they were many (a trim walks the heap: not for every small open).
                    if opened >= _TRIM_SLOTS:
                        trim_once()
        return JournalState.of(self.replay())

    def read_message(self, msg_id: int) -> codec.MessageRow | None:
        """The live AddMessage `msg_id` as a `codec.MessageRow`, read from its segment
        (None: not live, or not an AddMessage the fast layout reads). Loop thread, any
        time after the open: the file is read without the index lock held, so compaction
        may move the record meanwhile (its rename comes before its index update): the
        frame read is checked (crc, type, id) and, if it is not the message, looked up
        and read again."""
        for _ in range(8):
            with self._lock:
                loc = self._live.messages.get(msg_id)
                if loc is None:
                    compact = self._live.compact
                    handle = -1 if compact is None else compact_find(compact, msg_id)
                    if handle < 0:
                        return None
                    loc = handle
                if isinstance(loc, int):
                    path, offset, size = pack_where(self._packs, loc)
                else:
                    path, offset, size = loc.seg.path, loc.offset, loc.size
            try:
                with open(path, "rb") as f:
                    data = os.pread(f.fileno(), size, offset)
            except FileNotFoundError:
                continue  # compacted away meanwhile: the index names its new place
            checked = _check_frame(data, 0)
            if isinstance(checked, _Bad) or checked[1] != _ADD_MESSAGE:
                continue
            layout = codec.add_message_layout(data, FRAME_BYTES, checked[0])
            if layout is not None:
                if layout[0] == msg_id:
                    return codec.message_row(data, layout)
                continue
            record = _decode_at(data, 0, checked[0], checked[1])  # an older layout
            if isinstance(record, AddMessage) and record.msg_id == msg_id:
                return codec.row_of_add_message(record)
        raise JournalError(f"journal {self.directory}: message {msg_id} could not be read back")

    def replay(self) -> Iterator[Record]:
        if not self.read_only:
            self.flush()
        with self._compact_lock, self._lock:  # no compaction runs, none starts
            self._drop_opened()
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

    # compaction: `_Compaction` (store/compaction.py)

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
