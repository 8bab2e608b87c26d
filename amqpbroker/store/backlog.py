"""A recovered queue's messages left in the journal: `JournalBacklog` (issue 23).

Theory of operation
-------------------
A restart with more durable messages in the journal than `global-max-size` would fill
memory with all of them (a backlog larger than memory could never come back). Recovery
(`store/recovery.py`) puts messages into memory up to the limit; the rest of each queue
stays where it is, in the journal, and the queue holds only this: per reference its
message id, persisted delivery count (B-095), scheduled time (B-065), body size, first
timestamp and expiration, in flat arrays (~48 bytes a reference, no object per message).

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

from array import array
from collections.abc import Callable, Iterator

from amqpbroker.core.model import Message
from amqpbroker.core.paging import PageStore
from amqpbroker.store.codec import MessageRow

__all__ = ["JournalBacklog"]

Position = tuple[int, int]
_HEAD = -1  # the page number of a position in the journal's part (never a page file)
_WIDTH = 6  # longs a reference in `JournalBacklog.refs`: id, count, at, size, first, expiry
_COUNT, _AT, _SIZE, _FIRST, _EXPIRY = 1, 2, 3, 4, 5


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
        # expiration (`_WIDTH` longs: one flat array, appended to once per reference)
        self.refs = array("q")
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
        references from its `start`-th on, before any other is added: recovery hands over
        its rows of a queue's references (`JournalState.ref_arrays`, the same six values)
        rather than copying them (issue 23, ninth pass: 48 bytes a reference less at the
        peak). Not changed here: read, passed, then dropped whole (`_reset`)."""
        assert not self.refs, "adopt before any add"
        self.refs = refs
        self._next = start

    def added(self) -> None:
        """Recovery added every reference: the totals, once."""
        refs = self.refs
        first = self._next * _WIDTH
        self._head_bytes = sum(refs[first + _SIZE :: _WIDTH])
        self._head_expiring = min((e for e in refs[first + _EXPIRY :: _WIDTH] if e), default=0)
        self._sync()

    def _count(self) -> int:
        """References in the journal's part, read back or not."""
        return len(self.refs) // _WIDTH

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
        self.lost = tail.lost if tail is not None else 0
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
        refs = self.refs
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
            at = i * _WIDTH
            if gone and gone[i]:  # taken by a walk: counted out and acknowledged then
                self._gone_ahead -= 1
                i += 1
                continue
            message = self._message(i)
            self._head_bytes -= refs[at + _SIZE]
            i += 1
            if message is None:
                continue
            size += message.size
            out.append(message)
            restored.append((refs[at + _COUNT], refs[at + _AT]))
        self._next = i
        if i >= self._count():
            self._reset()
        self.restored = restored
        self._sync()
        return out

    def _message(self, i: int) -> Message | None:
        at = i * _WIDTH
        row = self._read(self.refs[at])
        if row is None:  # not live in the journal any more: nothing to bring back
            return None
        message = self._materialise(row)
        message.deliver_at_ms = self.refs[at + _AT]
        return message

    def _reset(self) -> None:
        """Nothing is left in the journal's part: its array goes."""
        self.refs = array("q")
        self._next = 0
        self._gone = bytearray()
        self._gone_ahead = 0
        self._head_bytes = 0
        self._head_expiring = 0
        self._epoch_base += 1  # head positions from before are void

    def oldest_ts(self) -> int | None:
        if self._next < self._count():
            return self.refs[self._next * _WIDTH + _FIRST]
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
            self._head_bytes -= self.refs[i * _WIDTH + _SIZE]
            acked.append(self.refs[i * _WIDTH])
        gone = self._gone
        i = self._next
        while i < count and gone and gone[i]:  # the next ones: passed now
            self._gone_ahead -= 1
            i += 1
        if i >= count and i > self._next:  # the journal's part is done: its array goes,
            self.refs = array("q")  # positions after it (the page files') stay valid
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
        gone = list(self.refs[self._next * _WIDTH :: _WIDTH])
        self._reset()
        if gone:
            self._ack(gone)
        if self.tail is not None:
            self.tail.clear()
        self._sync()
