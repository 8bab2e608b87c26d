"""Address full (B-151): when an address, or the broker, holds too much in memory.

Theory of operation
-------------------
Three limits make an address *full*: its own `max-size-bytes` and `max-size-messages`
(the bytes and messages its queues hold in memory) and the broker-wide `global-max-size`
(the bytes all queues hold in memory; Artemis: half the JVM heap, here a share of the
machine's or the container's memory, worked out by the server). `full_reason` is the one
decision, used when a message arrives (`Broker._has_room`) and when memory is freed
(`Broker._check_unblocked`).

What happens to a message for a full address is the address's `address-full-policy`:
`FAIL` refuses it, `DROP` discards it, `BLOCK` lets it in and withholds producer credit
(the anonymous relay is paced by the broker-wide limit and by the address its last
message went to), `PAGE` writes it to the queue's page files (`QueuePages`, below;
`store/paging.py` keeps the files) instead of memory.

Paging is per queue: each queue bound to a paging address keeps its own page files, so
that a multicast address's subscriptions drain independently (Artemis keeps one page
store per address and a cursor per subscription; a copy per queue costs disk, not memory).
Once a queue has paged messages, every new message for it goes to the pages too, until
they are read back: that keeps the queue's order (B-014). `Queue.dispatch` reads pages
back (`max-read-page-bytes` / `max-read-page-messages`, Artemis's names and defaults) when
the queue's in-memory part has room for them; a message read back is an ordinary
reference from then on (priorities, delivery counts, redelivery, expiry, filters and
dead letters as for any other). Counts include paged messages (Artemis messageCount).
A drain (B-037) is not answered while paged messages it could take remain: with memory
at the read limits, a step is read beyond them for it, up to the draining consumers'
credit (`Queue._drain_allowance`, docs/decisions.md).

Reading back happens on the event loop, so it goes in steps of at most
`READ_STEP_BYTES` / `READ_STEP_MESSAGES` per call (memory still fills up to
max-read-page-bytes, a step at a time): one read of max-read-page-bytes (20 MiB) of
1 KiB messages held the loop ~0.2 s.

Expiry (B-084/B-085): a paged message whose time is up is expired as it is read back,
never enqueued or delivered: it goes to the expiry address. Without a consumer, the
queue reads back when its earliest paged expiration (`PageStore.expiring_ms`) is due and
at each expiry scan, a step per loop turn while steps find expired messages, so that
counts do not report expired paged messages forever (docs/decisions.md: Artemis expires
paged messages only once depaged).

A browser (B-031) sees the paged messages too, after the in-memory ones, read from the
page files as its credit allows (never all held): its `PageMark` counts the paged
messages it was sent and where the next one starts, so that those the queue reads back
later (they get new places in memory) are not sent to it again. It walks at most a read
step of page files per loop turn, as the read back does, however few messages its
selector takes (`Queue._browse_pages`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from amqpbroker.core.model import Message
from amqpbroker.core.settings import ResolvedSettings

__all__ = [
    "READ_STEP_BYTES",
    "READ_STEP_MESSAGES",
    "PageMark",
    "PageStore",
    "PageStores",
    "Tailed",
    "full_reason",
]

Position = tuple[int, int]  # a place in a queue's page files: (page number, offset)

# The most one read back takes from the page files (issue 23: measured ~1.7 ms for 256
# messages of 1 KiB, against ~190 ms for 20 MiB at once).
READ_STEP_BYTES = 256 * 1024
READ_STEP_MESSAGES = 256


def full_reason(
    settings: ResolvedSettings,
    *,
    address_bytes: int,
    address_messages: int | None,
    memory_bytes: int,
    global_max_size: int,
) -> str | None:
    """Which limit makes the address full ("max-size-bytes=N", ...), or None when it has
    room. `address_messages` is None when `max-size-messages` is off (not counted)."""
    limit = settings.max_size_bytes
    if 0 <= limit <= address_bytes:
        return f"max-size-bytes={limit}"
    limit = settings.max_size_messages
    if limit >= 0 and address_messages is not None and address_messages >= limit:
        return f"max-size-messages={limit}"
    if 0 <= global_max_size <= memory_bytes:
        return f"global-max-size={global_max_size}"
    return None


class PageStore(Protocol):
    """One queue's page files, as the core needs them (`store/paging.py` implements it).

    Messages come back in the order they were written. `messages` / `size_bytes` count
    what is written and not yet read back or removed; `files` the page files on disk.
    """

    messages: int
    size_bytes: int
    lost: int  # paged messages lost to damaged page files (counted and logged, not held)
    epoch: int  # changes when a removal rewrites the files (older positions are void)
    # No paged message expires before this (epoch ms; 0: none expires). A lower bound:
    # exact after a removal or a restart, kept (early) as messages are read back.
    expiring_ms: int
    # (delivery count, scheduled at ms) of each message the last `read` returned when
    # they are journaled already (a recovered queue's part left in the journal,
    # `store/backlog.py`): enqueued with them, nothing written; None: from page files.
    restored: list[tuple[int, int]] | None

    @property
    def files(self) -> int: ...

    @property
    def committed(self) -> tuple[int, int]:
        """Where the last copy a management walk paged here ends (`records.PageCursor`)."""

    @property
    def cursor(self) -> tuple[int, int] | None:
        """The page files' read cursor to journal (`records.PageCursor`); None: none."""

    @property
    def position(self) -> tuple[int, int]:
        """The read cursor, journaled for a durable queue (`records.PageCursor`)."""

    @property
    def releasable(self) -> bool:
        """Whether page files would go once a cursor at `position` is durable."""

    def release(self, position: tuple[int, int]) -> None:
        """A cursor at `position` is durable: the page files before it may go."""

    def destroy(self) -> None:
        """The queue is deleted: remove its page files."""

    def write(self, message: Message) -> None:
        """Append `message` (durable ones survive a crash once the step is flushed)."""

    @property
    def end(self) -> tuple[int, int]:
        """Where the next message written will start (a walk's `until`)."""

    def read(
        self, *, max_bytes: int, max_messages: int, until: tuple[int, int] | None = None
    ) -> list[Message]:
        """Take the oldest messages, at least one when any, up to the limits (< 0: none)
        and, with `until` (an `end` of the same `epoch`), none written after it."""

    def oldest_ts(self) -> int | None:
        """`first_ts` of the paged message at the read cursor (the next read back), or
        None when there is none."""

    def browse(self) -> Iterator[Message]:
        """Every paged message, oldest first, without taking them."""

    def browse_from(self, position: Position) -> Iterator[tuple[Message, Position]]:
        """The paged messages from `position` (`position`, or one this returned in the
        same `epoch`) on, each with the position after it, read as they are consumed."""

    def skip(self, taken: list[tuple[Position, int]]) -> None:
        """Remove the paged messages that end at these positions (`browse_from`'s, of the
        current `epoch`), each with its size: a management walk took them. Nothing is
        rewritten (positions stay valid); the cursor moves past those that are next."""

    def journal_skips(self) -> list[tuple[int, tuple[int, ...]]]:
        """The skips since the last call, per page file, for the journal (`PageSkip`)."""

    def clear(self) -> None:
        """Remove every paged message (purge, delete)."""


@runtime_checkable
class Tailed(Protocol):
    """A page store whose page files come after another part (`store/backlog.py`)."""

    def open_tail(self) -> None:
        """Page files a restart found for the queue: open them, after the other part."""


class PageStores(Protocol):
    """Opens the page files of a queue (the server hands the broker one)."""

    # True while a moved copy is routed (a management move, a dead letter, an expiry): a
    # durable queue pages it so that a restart can pass it if its move's append was lost
    moving: bool

    def open(self, *, address: str, queue: str, durable: bool) -> PageStore:
        """The queue's page files; `durable`: its cursor is journaled (kept on restart)."""

    def flush(self) -> None:
        """Make this step's durable page writes durable (once per loop step)."""


class PageMark:
    """How far a browser (B-031) has read a queue's page files: how many paged messages,
    counted from the read cursor, it has been sent (`seen`), and where the next one
    starts (`position`, valid in the store's `epoch`).

    Paged messages are always behind every in-memory one (routing pages everything while
    a queue has paged messages), so a browser reads the page files only once it has seen
    all the queue holds in memory; when the queue reads paged messages back, the first
    `seen` of them are ones the browser has seen (`read`)."""

    __slots__ = ("epoch", "position", "seen", "walking")

    def __init__(self, pages: PageStore) -> None:
        self.seen = 0
        self.walking = False  # stopped at a read step with more to walk (next loop turn)
        self.epoch = pages.epoch
        self.position = pages.position

    def start(self, pages: PageStore) -> Position:
        """Where the browser's next paged message starts. After the files changed under it
        (a purge, the journal's part of a recovered queue read to its end), found again by
        walking `seen` messages."""
        if self.epoch != pages.epoch:
            self.epoch = pages.epoch
            self.position = pages.position
            for _, end in itertools.islice(pages.browse_from(pages.position), self.seen):
                self.position = end
        return self.position

    def removed(self, positions: Iterable[Position]) -> None:
        """A walk removed the paged messages ending at `positions` (`PageStore.skip`):
        those the browser was sent leave `seen`."""
        if self.seen:
            self.seen -= sum(1 for at in positions if at <= self.position)

    def read(self, seqs: Sequence[int]) -> int:
        """The queue read `len(seqs)` paged messages back, in order, as references
        with `seqs` (-1: not kept, expired as read). The largest seq among those the
        browser was sent (its `browsed_seq` from now on), or -1."""
        n = min(len(seqs), self.seen)
        self.seen -= n
        return max(seqs[:n], default=-1)
