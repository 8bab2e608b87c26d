"""A recovered queue's messages left in the journal: `JournalBacklog` (issue 23).

Theory of operation
-------------------
A restart with more durable messages in the journal than `global-max-size` would fill
memory with all of them (a backlog larger than memory could never come back). Recovery
(`store/recovery.py`) puts messages into memory up to the limit; the rest of each queue
stays where it is, in the journal, and the queue holds only this: per reference its
message id, persisted delivery count (B-095), scheduled time (B-065), body size, first
timestamp and expiration, in flat arrays (~48 bytes a reference, no object per message);
or, for the usual stretch of references the file journal's compact index holds (a
message and its one reference, count 0, `store/locs.py` `Run`), the run alone: their ids
and sizes are the pack's, their first timestamps and expirations in the files (no bytes a
reference here; issue 23, tenth pass).

To the queue it is a page store (`core.paging.PageStore`): its references come back, in
order, as the queue's memory drains, read from the journal (`FileJournal.read_message`)
a step at a time, exactly as paged messages come back from page files; the page files
the queue had, or opens later (new messages while this is not empty page, to keep the
order, B-014), come after (`tail`). What differs is the journal: these references are
journaled already (AddMessage and AddRef), so a read back writes nothing (`restored`
tells `Queue._depage`), and one that leaves without being delivered (expired as read,
purged, removed by management) is acknowledged in the journal (`ack`; one a management
walk takes is marked in `gone` and passed, the array is not rebuilt). The journal keeps
their records live meanwhile: compaction moves them, and `read_message` finds them where
its index says.
"""

from __future__ import annotations

import logging
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Union

from amqpbroker.core.model import Message
from amqpbroker.core.paging import PageStore
from amqpbroker.store.api import JournalError
from amqpbroker.store.codec import MessageRow
from amqpbroker.store.locs import Run, pack_ids, pack_sizes, run_bytes, run_summary_bytes

__all__ = ["JournalBacklog"]

log = logging.getLogger(__name__)

Position = tuple[int, int]
_HEAD = -1  # the page number of a position in the journal's part (never a page file)
_WIDTH = 6  # longs a reference in `JournalBacklog.refs`: id, count, at, size, first, expiry
_COUNT, _AT, _SIZE, _FIRST, _EXPIRY = 1, 2, 3, 4, 5
# A part of the journal's references (`JournalBacklog._parts`): rows (`_WIDTH` longs a
# reference) from the `lo`-th, or a run of the compact index's.
Part = Union["tuple[array[int], int]", Run]
_FIRST_TS = 5  # a `MessageRow`'s first_ts
# The id of a reference whose run's pack cannot be rebuilt from its segment (`_run_ids`):
# read back as nothing, counted as lost.
_UNREADABLE = -1


class JournalBacklog:
    """One queue's references left in the journal, then its page files (`tail`)."""

    def __init__(
        self,
        *,
        read: Callable[[int], MessageRow | None],
        materialise: Callable[[MessageRow], Message],
        ack: Callable[[list[int]], None],
        open_tail: Callable[[], PageStore],
    ) -> None:
        self._read = read
        self._materialise = materialise
        self._ack = ack
        self._open_tail = open_tail
        self.tail: PageStore | None = None
        # per reference, in order: id, delivery count, scheduled at, body size, first_ts,
        # expiration (`_WIDTH` longs: one flat array, appended to once per reference):
        # the rows recovery adds; `_parts` (then `_starts`, where each part's references
        # begin) are the journal's part in order, these rows among them (`added`)
        self.refs = array("q")
        self._parts: list[Part] = []
        self._starts: list[int] = []
        self._total = 0
        self._oldest: tuple[int, int] = (-1, 0)  # (index, first_ts) read from a run's file
        self._next = 0  # index of the next reference to read back
        self._gone = bytearray()  # 1: a management walk took it (`skip`), made on first use
        self._gone_ahead = 0  # of those, how many are at or after `_next`
        self._head_bytes = 0
        self._head_expiring = 0
        # (delivery count, scheduled at ms) of each message the last `read` returned, when
        # they came from the journal (None: from the page files)
        self.restored: list[tuple[int, int]] | None = None
        self.messages = 0
        self.size_bytes = 0
        self.lost = 0
        self._lost_here = 0  # references of unreadable runs passed (`_run_ids`)
        # The packs (by number) whose segment could not give their arrays back.
        self._unreadable: set[int] = set()
        self.epoch = 0
        self.expiring_ms = 0
        self._epoch_base = 0

    # -- recovery -------------------------------------------------------------------------
    def add(
        self,
        msg_id: int,
        delivery_count: int,
        scheduled_at_ms: int,
        size: int,
        first_ts: int,
        expiration_ms: int,
    ) -> None:
        """A recovered reference, after those added before (recovery, append order; it
        extends `refs` itself, the same six values). `added` once all are in."""
        self.refs.extend((msg_id, delivery_count, scheduled_at_ms, size, first_ts, expiration_ms))

    def adopt(self, refs: array[int], start: int) -> None:
        """Take `refs` (`_WIDTH` longs a reference, as `add` writes them) as the
        references from its `start`-th on, after those added so far: recovery hands over
        its rows of a queue's references (`JournalState.ref_parts`, the same six values)
        rather than copying them (issue 23, ninth pass: 48 bytes a reference less at the
        peak). Not changed here: read, passed, then dropped whole (`_reset`)."""
        self._close_rows()
        if start * _WIDTH < len(refs):
            self._parts.append((refs, start))

    def adopt_run(self, run: Run) -> None:
        """Take a run of the compact index's references as the next ones (tenth pass)."""
        self._close_rows()
        if len(run):
            self._parts.append(run)

    def _close_rows(self) -> None:
        if self.refs:
            self._parts.append((self.refs, 0))
            self.refs = array("q")

    def added(self) -> None:
        """Recovery added every reference: the parts' starts and the totals, once."""
        self._close_rows()
        total = 0
        head_bytes = 0
        expiring = 0
        for part in self._parts:
            self._starts.append(total)
            if isinstance(part, Run):
                total += len(part)
                head_bytes += run_bytes(part)  # (its pack's summary: no load)
                later = part.expiring
            else:
                refs, lo = part
                total += len(refs) // _WIDTH - lo
                head_bytes += sum(refs[lo * _WIDTH + _SIZE :: _WIDTH])
                later = min((e for e in refs[lo * _WIDTH + _EXPIRY :: _WIDTH] if e), default=0)
            if later and (not expiring or later < expiring):
                expiring = later
        self._total = total
        self._head_bytes = head_bytes
        self._head_expiring = expiring
        self._sync()

    def _count(self) -> int:
        """References in the journal's part, read back or not."""
        return self._total

    def _locate(self, i: int) -> tuple[Part, int]:
        """The part of the `i`-th reference, and its index there (a run's: in its pack)."""
        k = bisect_right(self._starts, i) - 1
        part = self._parts[k]
        if isinstance(part, Run):
            return part, part.start + i - self._starts[k]
        return part, part[1] + i - self._starts[k]

    def _run_ids(self, run: Run) -> array[int] | None:
        """The ids of `run`'s pack, None if its segment cannot give them back (changed,
        cut or removed since the open: `reload_pack`'s JournalError; ninth attack pass).
        Such a run's references read back as nothing and are counted as lost, as a damaged
        page file's are (`PageFiles`): the queue goes on with the rest. Their records stay
        in the journal, and a restart's open checks that segment and says what it holds."""
        pack = run.pack
        if pack.number in self._unreadable:
            return None
        try:
            return pack_ids(pack)
        except JournalError as e:
            self._unreadable.add(pack.number)
            log.error(
                "journal backlog: %s; its %d messages in this queue's backlog are passed "
                "as lost (their records stay in the journal: keep a copy of the journal "
                "before the next start, which checks that segment)",
                e,
                len(run),
            )
            return None

    def _id(self, i: int) -> int:
        part, j = self._locate(i)
        if isinstance(part, Run):
            ids = self._run_ids(part)
            return _UNREADABLE if ids is None else ids[j]
        return part[0][j * _WIDTH]

    def _size(self, i: int) -> int:
        part, j = self._locate(i)
        if isinstance(part, Run):
            if self._run_ids(part) is None:
                return self._unreadable_size(part, j)
            return pack_sizes(part.pack)[j]
        return part[0][j * _WIDTH + _SIZE]

    @staticmethod
    def _unreadable_size(run: Run, j: int) -> int:
        """A share of an unreadable run's bytes (its pack's summary's, the last reference
        the remainder), so that the head's bytes still come to 0 as it drains."""
        total = run_summary_bytes(run)  # (never a load: the pack's cannot be rebuilt)
        if total < 0:  # (a part of a queue run: its sizes are in the file)
            return 0
        share = total // len(run)
        return share if j < run.end - 1 else total - share * (len(run) - 1)

    def _counts(self, i: int) -> tuple[int, int, int]:
        """Id, persisted delivery count and scheduled time of the `i`-th reference."""
        part, j = self._locate(i)
        if isinstance(part, Run):
            ids = self._run_ids(part)
            return _UNREADABLE if ids is None else ids[j], 0, 0
        refs = part[0]
        at = j * _WIDTH
        return refs[at], refs[at + _COUNT], refs[at + _AT]

    def open_tail(self) -> None:
        """The page files a restart found for the queue: read after the journal's part."""
        if self.tail is None:
            self.tail = self._open_tail()
        self._sync()

    def _sync(self) -> None:
        tail = self.tail
        head = self._count() - self._next - self._gone_ahead
        self.messages = head + (tail.messages if tail is not None else 0)
        self.size_bytes = self._head_bytes + (tail.size_bytes if tail is not None else 0)
        self.lost = self._lost_here + (tail.lost if tail is not None else 0)
        self.epoch = self._epoch_base + (tail.epoch if tail is not None else 0)
        expiring = self._head_expiring if head else 0
        later = tail.expiring_ms if tail is not None else 0
        self.expiring_ms = min(expiring, later) if expiring and later else expiring or later

    # -- the core's PageStore ---------------------------------------------------------------
    @property
    def files(self) -> int:
        return self.tail.files if self.tail is not None else 0

    @property
    def position(self) -> Position:
        if self._next < self._count() or self.tail is None:
            return (_HEAD, self._next)
        return self.tail.position

    @property
    def committed(self) -> Position:
        return self.tail.committed if self.tail is not None else (0, 0)

    @property
    def cursor(self) -> Position | None:
        """The page files' cursor, journaled as theirs; the journal's part has none."""
        return self.tail.cursor if self.tail is not None else None

    @property
    def releasable(self) -> bool:
        return self.tail is not None and self.tail.releasable

    def release(self, position: Position) -> None:
        if self.tail is not None:
            self.tail.release(position)

    def destroy(self) -> None:
        """The queue is deleted (its references die with its DeleteQueue)."""
        self._reset()
        if self.tail is not None:
            self.tail.destroy()
        self._sync()

    def write(self, message: Message) -> None:
        if self.tail is None:
            self.tail = self._open_tail()
        self.tail.write(message)
        self._sync()

    @property
    def end(self) -> Position:
        """Where the next message written starts (a management walk's `until`, issue 23):
        in the page files; the journal's part's end while the queue has none."""
        if self.tail is not None:
            return self.tail.end
        return (_HEAD, self._count())

    def read(
        self, *, max_bytes: int, max_messages: int, until: Position | None = None
    ) -> list[Message]:
        end = self._count()
        if until is not None and until[0] == _HEAD:
            end = min(end, until[1])  # a walk that began before any page file
        if self._next >= end:
            self.restored = None
            if self.tail is None or (until is not None and until[0] == _HEAD):
                return []
            messages = self.tail.read(max_bytes=max_bytes, max_messages=max_messages, until=until)
            self._sync()
            return messages
        out: list[Message] = []
        restored: list[tuple[int, int]] = []
        size = 0
        i = self._next
        gone = self._gone
        while i < end and (
            not out
            or (
                (max_bytes < 0 or size < max_bytes)
                and (max_messages < 0 or len(out) < max_messages)
            )
        ):
            if gone and gone[i]:  # taken by a walk: counted out and acknowledged then
                self._gone_ahead -= 1
                i += 1
                continue
            msg_id, count, at_ms = self._counts(i)
            message = self._message_of(msg_id, at_ms)
            self._head_bytes -= self._size(i)
            i += 1
            if message is None:
                if msg_id == _UNREADABLE:
                    self._lost_here += 1
                continue
            size += message.size
            out.append(message)
            restored.append((count, at_ms))
        self._next = i
        if i >= self._count():
            self._reset()
        self.restored = restored
        self._sync()
        return out

    def _message(self, i: int) -> Message | None:
        msg_id, _, at_ms = self._counts(i)
        return self._message_of(msg_id, at_ms)

    def _message_of(self, msg_id: int, at_ms: int) -> Message | None:
        if msg_id == _UNREADABLE:
            return None
        row = self._read(msg_id)
        if row is None:  # not live in the journal any more: nothing to bring back
            return None
        message = self._materialise(row)
        message.deliver_at_ms = at_ms
        return message

    def _drop_parts(self) -> None:
        self.refs = array("q")
        self._parts = []
        self._starts = []
        self._total = 0
        self._oldest = (-1, 0)

    def _reset(self) -> None:
        """Nothing is left in the journal's part: its arrays go."""
        self._drop_parts()
        self._next = 0
        self._gone = bytearray()
        self._gone_ahead = 0
        self._head_bytes = 0
        self._head_expiring = 0
        self._epoch_base += 1  # head positions from before are void

    def oldest_ts(self) -> int | None:
        i = self._next
        if i < self._count():
            part, j = self._locate(i)
            if not isinstance(part, Run):
                first: int = part[0][j * _WIDTH + _FIRST]
                if first:
                    return first
            # A run's is in its file, and a row's whose open kept none (0): read once
            # per head.
            if self._oldest[0] != i:
                msg_id = self._id(i)
                row = None if msg_id == _UNREADABLE else self._read(msg_id)
                first_ts = 0 if row is None else row[_FIRST_TS]
                assert isinstance(first_ts, int)
                self._oldest = (i, first_ts)
            return self._oldest[1]
        return self.tail.oldest_ts() if self.tail is not None else None

    def browse(self) -> Iterator[Message]:
        for message, _ in self.browse_from(self.position):
            yield message

    def browse_from(self, position: Position) -> Iterator[tuple[Message, Position]]:
        if position[0] == _HEAD:
            i = position[1]
            while i < self._count():
                if self._gone and self._gone[i]:
                    i += 1
                    continue
                message = self._message(i)
                i += 1
                if message is not None:
                    yield message, (_HEAD, i)
            if self.tail is None:
                return
            position = self.tail.position
        if self.tail is not None:
            yield from self.tail.browse_from(position)

    def skip(self, taken: list[tuple[Position, int]]) -> None:
        """Remove the references a management walk took (positions as `browse_from`
        gives them): those of the journal's part are acknowledged now (in the walk's
        step) and passed by reads; those of the page files are the tail's (`skip`)."""
        tail: list[tuple[Position, int]] = []
        acked: list[int] = []
        count = self._count()
        for position, size in taken:
            if position[0] != _HEAD:
                tail.append((position, size))
                continue
            i = position[1] - 1
            if not self._next <= i < count:
                continue
            if not self._gone:
                self._gone = bytearray(count)
            if self._gone[i]:
                continue
            self._gone[i] = 1
            self._gone_ahead += 1
            self._head_bytes -= self._size(i)
            msg_id = self._id(i)
            if msg_id != _UNREADABLE:
                acked.append(msg_id)
        gone = self._gone
        i = self._next
        while i < count and gone and gone[i]:  # the next ones: passed now
            self._gone_ahead -= 1
            i += 1
        if i >= count and i > self._next:  # the journal's part is done: its arrays go,
            self._drop_parts()  # positions after it (the page files') stay valid
            self._next = 0
            self._gone = bytearray()
            self._gone_ahead = 0
            self._head_bytes = 0
            self._head_expiring = 0
        else:
            self._next = i
        if acked:
            self._ack(acked)
        if tail and self.tail is not None:
            self.tail.skip(tail)
        self._sync()

    def journal_skips(self) -> list[tuple[int, tuple[int, ...]]]:
        return self.tail.journal_skips() if self.tail is not None else []

    def clear(self) -> None:
        gone = [
            msg_id
            for i in range(self._next, self._count())
            if not (self._gone and self._gone[i]) and (msg_id := self._id(i)) != _UNREADABLE
        ]
        self._reset()
        if gone:
            self._ack(gone)
        if self.tail is not None:
            self.tail.clear()
        self._sync()
