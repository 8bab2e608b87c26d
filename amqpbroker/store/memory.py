"""`MemoryJournal`: the records in a list (tests; a broker without persistence).

Theory of operation
-------------------
Each appended record goes through the codec (`store/codec.py`) both ways, so a record the
file journal could not write fails here too, and liveness (`store/liveness.py`) decides
what `compact()` drops, as on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import amqpbroker.store.codec as codec
from amqpbroker.core.records import (
    Record,
)
from amqpbroker.store.api import CompactionResult, JournalClosed, JournalFailed, OnDurable
from amqpbroker.store.liveness import _LiveSet
from amqpbroker.store.segments import FRAME_BYTES

# --- memory journal ------------------------------------------------------------------


class _MemItem:
    __slots__ = ("alive",)

    def __init__(self) -> None:
        self.alive = False


def _through_codec(record: Record) -> tuple[Record, int]:
    """`record` as a file journal would replay it, and its size there."""
    payload = codec.encode(record)
    return codec.decode(record.type_id, payload), FRAME_BYTES + len(payload)


class MemoryJournal:
    """A journal in a list: the same contract as `FileJournal`, without the disk.

    Records go through the codec, so replay returns what a file journal would. Callbacks
    run inside `append` (nothing to wait for). `fail()` makes it behave like a file
    journal whose disk filled up, and `resume()` like one that got space back, for broker
    tests: appends without a callback made meanwhile are held and kept on resume.
    """

    # One thread: the caller's.

    def __init__(self) -> None:
        self._entries: list[tuple[Record, _MemItem, int]] = []
        self._live: _LiveSet[_MemItem] = _LiveSet(self._dead)
        self._size_bytes = 0
        self._failure: JournalFailed | None = None
        self._closed = False
        self._held: list[tuple[Record, int]] = []  # (record, size) appended while failed
        self._resumed: list[Callable[[], None]] = []

    @staticmethod
    def _dead(item: _MemItem, needs_tombstone: bool) -> None:
        item.alive = False

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnDurable | None = None
    ) -> None:
        if self._closed:
            raise JournalClosed("append to a closed journal")
        # Through the codec, so that replay returns exactly what a file journal would.
        encoded = [_through_codec(r) for r in records]
        if self._failure is None:
            self._keep(encoded)
        elif on_durable is None:  # nobody waits: written once the journal works again
            self._held.extend(encoded)
        if on_durable is not None:
            on_durable(self._failure)

    def _keep(self, encoded: Iterable[tuple[Record, int]]) -> None:
        for record, size in encoded:
            item = _MemItem()
            item.alive = self._live.apply(record, item)
            self._entries.append((record, item, size))
            self._size_bytes += size

    def replay(self) -> Iterator[Record]:
        return iter([record for record, _, _ in self._entries])

    def compact(self) -> CompactionResult:
        before = self._size_bytes
        # Dropping every dead record at once keeps the state: each tombstone goes with
        # the records it cancelled.
        self._entries = [entry for entry in self._entries if entry[1].alive]
        self._size_bytes = sum(size for _, _, size in self._entries)
        return CompactionResult(size_bytes_before=before, size_bytes_after=self._size_bytes)

    def flush(self, timeout: float | None = None) -> None:
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        self._closed = True

    def fail(self, error: OSError) -> None:
        """From now on every append fails with `error`, like a full disk."""
        failure = JournalFailed(f"journal write failed: {error}")
        failure.__cause__ = error
        self._failure = failure

    def resume(self) -> None:
        """The "disk" works again: write what was held, tell the `on_resume` callbacks."""
        if self._failure is None:
            return
        self._failure = None
        held, self._held = self._held, []
        self._keep(held)
        for callback in self._resumed:
            callback()

    def on_resume(self, callback: Callable[[], None]) -> None:
        self._resumed.append(callback)

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def failure(self) -> JournalFailed | None:
        return self._failure
