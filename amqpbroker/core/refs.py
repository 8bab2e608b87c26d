"""A message's place in one queue (`Ref`) and its states.

Its own module so that `persistence.py`, which journals references, and `queue.py`, which
holds them and calls persistence, do not import each other (issue 18).
"""

from __future__ import annotations

from typing import Final

from amqpbroker.core.model import ConsumerId, Message

__all__ = ["DELIVERING", "GONE", "PAGED", "READY", "SCHEDULED", "PagedRef", "Ref"]

# `Final` literals: compiled (setup.py), each use is a C constant, not a lookup in this
# module's dictionary (~130 instructions each, several a redelivery; issue 20).
READY: Final = 0
SCHEDULED: Final = 1
DELIVERING: Final = 2
GONE: Final = 3
# In the queue's page files (B-151 PAGE): a management operation's view of it.
PAGED: Final = 4


class Ref:
    """A message's place in one queue, with its per-queue broker delivery count `n`.

    `state` is READY, SCHEDULED, DELIVERING or GONE. A reference removed from the middle
    of the queue (expired by the scanner) is only marked GONE; `_pop_next` and `tick`
    drop such references when they reach them (lazy removal keeps removal O(1)).
    """

    __slots__ = ("blocked", "delivery_count", "message", "seq", "state", "stored_count")

    def __init__(self, message: Message, seq: int, delivery_count: int = 0) -> None:
        self.message = message
        self.seq = seq
        self.delivery_count = delivery_count
        self.state = READY
        self.blocked: set[ConsumerId] | None = None  # undeliverable-here links (B-045)
        # The count last written to the journal; None: not a durable reference (B-095).
        self.stored_count: int | None = None

    def __lt__(self, other: Ref) -> bool:
        return self.seq < other.seq

    def __hash__(self) -> int:
        """By identity, as `object`'s: non-destructive queues key dicts by references.
        Explicit because a class compiled by mypyc that defines `__lt__` has no hash
        otherwise (CPython inherits the hash only with the comparisons)."""
        return id(self) >> 4

    @property
    def waiting(self) -> bool:
        """Ready, scheduled or paged: in the queue, not out with a consumer, not gone."""
        return self.state == READY or self.state == SCHEDULED or self.state == PAGED


class PagedRef(Ref):
    """A paged message as a management walk sees it (state PAGED): `at` is where it ends
    in the queue's page files, what `Queue.take` hands to `PageStore.skip` (issue 23)."""

    __slots__ = ("at",)

    def __init__(self, message: Message, at: tuple[int, int]) -> None:
        super().__init__(message, -1)
        self.state = PAGED
        self.at = at
