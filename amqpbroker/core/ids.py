"""Broker message ids that are never given out twice, across restarts too (issue 16 item 2).

The event log, `x-opt-ORIG-MESSAGE-ID`, the management API and `redrive.jsonl` name
messages by these ids, so an id handed out again after a restart would name a different
message. As Artemis's `BatchingIDGenerator`, ids come from blocks: before the first id of a
block is used, `reserve(end)` must have made `end` durable (the server writes and fsyncs a
small file), and a restart starts at the last reserved end, above every id a previous run
could have used. The journal's largest id is a floor too (durable messages kept across a
lost reservation file).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterator

from amqpbroker.core.errors import ResourceLimitExceeded

ID_BLOCK_SIZE = 1 << 16  # one fsync'd reservation per 65,536 messages
_UNBOUNDED = sys.maxsize  # without a `reserve` callback: no block end


class MessageIds:
    """An iterator of message ids (`next(ids)`), reserving a block ahead when told how.

    Without a `reserve` callback (tests, embedding without a data dir) ids simply count
    up from the floor. `ready` iterates the ids of the reserved block at C speed: the hot
    path takes `next(ids.ready, 0) or next(ids)` (0: the block is used up, and `next(ids)`
    reserves the next one), a `range` iterator's step where a Python `__next__` per
    message cost a call (issue 20). Loop thread only.
    """

    __slots__ = ("_end", "_limit", "_reserve", "block", "ready")

    def __init__(self, *, block: int = ID_BLOCK_SIZE) -> None:
        self._end: int | None = None  # ids below it are reserved; None: nothing to reserve
        self._reserve: Callable[[int], None] | None = None
        self.block = block
        self._limit = _UNBOUNDED
        self.ready: Iterator[int] = iter(())
        self._hand_out(1, _UNBOUNDED)

    def __iter__(self) -> MessageIds:
        return self

    def __next__(self) -> int:
        n = next(self.ready, 0)
        if n:
            return n
        self._reserve_from(self._next)  # raises: nothing handed out, the next call retries
        return next(self.ready)

    @property
    def _next(self) -> int:
        """The id handed out next."""
        return self._limit - operator.length_hint(self.ready)

    def _hand_out(self, start: int, limit: int) -> None:
        """Hand out `start`, `start + 1`, ... below `limit` (none when `start >= limit`)."""
        self._limit = max(start, limit)
        self.ready = iter(range(start, limit))

    def start_above(self, used: int) -> None:
        """No id at or below `used` is given out (recovery: the journal's largest id)."""
        if used >= self._next:
            self._hand_out(used + 1, _UNBOUNDED if self._end is None else self._end)

    def reserve_with(self, reserve: Callable[[int], None], reserved: int) -> None:
        """From now on reserve each block with `reserve(end)` before using it; `reserved` is
        the end a previous run reserved (0 for none). Reserves the first block now, so a
        store that cannot be written fails at start-up (OSError), not on a message."""
        self.start_above(reserved - 1)
        self._reserve = reserve
        self._reserve_from(self._next, wrap=False)

    def wait_for_room(self) -> None:
        """The first block could not be reserved (a full disk at start-up): hand out
        nothing until a `next` reserves one; until then each message is refused with
        `ResourceLimitExceeded`, as when a block runs out on a full disk, while what is
        already stored can be consumed (which is what frees the disk). Crash pass."""
        assert self._reserve is not None
        start = self._next
        self._hand_out(start, start)

    @property
    def reserved_end(self) -> int | None:
        return self._end

    def _reserve_from(self, n: int, *, wrap: bool = True) -> None:
        assert self._reserve is not None
        end = n + self.block
        try:
            self._reserve(end)
        except OSError as e:
            if not wrap:
                raise
            # Nothing is handed out unreserved: this message is refused and the next one
            # tries again (the journal is most likely failing too).
            raise ResourceLimitExceeded(f"cannot reserve message ids: {e}") from e
        self._end = end
        self._hand_out(n, end)
