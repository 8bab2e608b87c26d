"""The file journal's failure and retry: taking back a failed pass, probing the disk.

Theory of operation
-------------------
A write, fsync or roll error (disk full, out of file descriptors, EIO) fails the journal
(`_fail`): the pass is truncated off the current segment (its records are never
indexed), and appends with a callback get `JournalFailed` until the journal works again;
appends nobody waits for are held (`store/file_journal.py`). The writer then retries by
itself with backoff (`_retry`, `RETRY_FIRST_SECONDS` doubling up to `retry_max_seconds`):
it checks that the current segment ends where the index says (truncating again if need
be), then writes and fsyncs a probe block in the prepared next segment and fsyncs the
directory (`_probe`). When that works `failure` is None and the `on_resume` callbacks run
(writer thread). One warning when it fails, one info when it resumes, at most one warning
a minute in between. `_Failure` is a part of `FileJournal` (a mixin): it declares the
journal state it uses, which `FileJournal.__init__` sets.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from amqpbroker.store.api import (
    JournalFailed,
)
from amqpbroker.store.segments import (
    HEADER_BYTES,
    _Pending,
    _Segment,
    _write_fd,
)

log = logging.getLogger("amqpbroker.store.journal")  # one logger for the journal

RETRY_FIRST_SECONDS = 0.1  # first retry after a failure; doubles up to retry_max_seconds
FAILURE_LOG_EVERY_SECONDS = 60.0  # "still failing" at most this often
_PROBE = bytes(4096)  # what a retry writes (and truncates off) to test the disk


class _Failure:
    """`FileJournal`'s failure and retry (see the module docstring)."""

    directory: Path
    retry_max_seconds: float
    errors: int
    _lock: threading.Lock
    _segments: list[_Segment]
    _mark: tuple[_Segment | None, int, int, int]
    _unindexed: list[tuple[_Segment, list[tuple[_Pending, int]]]]
    _synced_unindexed: int
    _unsynced_bytes: int
    _failure: JournalFailed | None
    _failed_at: float
    _logged_at: float
    _retry_at: float
    _retry_delay: float
    _fd: int
    _dir_fd: int
    _fsync: Callable[[int], None]
    _held: list[_Pending]
    _held_dropped: int
    _resumed: list[Callable[[], None]]
    _next: tuple[int, Path, int] | None

    def _prepare_next(self, number: int) -> None:
        raise NotImplementedError  # FileJournal's

    def _drop_next(self) -> None:
        raise NotImplementedError  # FileJournal's

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
