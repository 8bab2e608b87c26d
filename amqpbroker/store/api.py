"""What a journal is: the `Journal` protocol, its errors and `CompactionResult`.

Theory of operation
-------------------
The broker describes every durable change as a record (`core/records.py`) and appends
records to a `Journal`. Nothing is ever updated in place: the state after a restart is
what `JournalState` (`store/state.py`) computes by applying `replay()` in order. One
`append()` call is atomic: after a crash either all of its records come back or none do.
Write a message's `AddMessage` with its `AddRef`s in one append, and a move's `AckRef`
with the new `AddRef`. Two implementations: `MemoryJournal` (`store/memory.py`) and
`FileJournal` (`store/file_journal.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from amqpbroker.core.records import (
    Record,
)


class JournalError(Exception):
    """Base of the journal's own errors."""


class JournalCorrupt(JournalError):
    """A record in the middle of the journal is damaged; the journal was not opened."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"journal corrupt: {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalFailed(JournalError):
    """The journal could not write or sync (disk full, I/O error); `__cause__` says why."""


class JournalClosed(JournalError):
    """`append()` after `close()`."""


OnDurable = Callable[[JournalFailed | None], None]
"""Called once per append: with None when the records are as durable as asked, else
with the failure. `FileJournal` calls it on its writer thread: marshal it to your loop."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    segments_deleted: int = 0
    segments_rewritten: int = 0
    size_bytes_before: int = 0
    size_bytes_after: int = 0


class Journal(Protocol):
    """Append-only durable storage of records (STYLE.md section 7)."""

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnDurable | None = None
    ) -> None:
        """Queue `records` as one atomic append; never blocks on the disk.

        `sync=True`: `on_durable(None)` once they are on disk (after fsync). `sync=False`:
        once they are written, not waiting for a sync. On failure `on_durable(error)`.
        The callback may run before `append` returns, and on another thread.
        """
        ...

    def replay(self) -> Iterator[Record]:
        """Every record still held, in append order (for recovery and export)."""
        ...

    def compact(self) -> CompactionResult:
        """Drop records that are no longer live; may do disk I/O (not on the loop)."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything appended so far is on disk; raise `JournalFailed`."""
        ...

    def close(self) -> None:
        """Flush and release the journal; later appends raise `JournalClosed`."""
        ...

    @property
    def size_bytes(self) -> int:
        """Bytes the journal holds (on disk, for the file journal)."""
        ...

    @property
    def failure(self) -> JournalFailed | None:
        """Why the journal stopped accepting appends, or None while it works."""
        ...

    def on_resume(self, callback: Callable[[], None]) -> None:
        """Call `callback()` each time the journal works again after a failure (for
        `FileJournal` on its writer thread: marshal it to your loop)."""
        ...
