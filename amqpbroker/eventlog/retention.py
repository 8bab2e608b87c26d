"""Event-log retention: which finished event files to delete, and the disk limits (issue 17).

Pure decisions, no I/O: the writer process (`child.py`) lists the directory,
asks `decide_retention` and deletes what it answers. Standard library only, as the writer
process imports it.

Rules:
* Only finished files (`.jsonl`, `.jsonl.gz`) are ever deleted, oldest first (by last
  write, then name). A `.part` file (the one being written, or one a dead writer left)
  is never deleted, but its bytes count toward `max-total-bytes`.
* A file whose last write is more than `max-age` ms old goes, and so do the oldest files
  while the total is above `max-total-bytes`.
* With `keep-until-analyzed`, a file that no `amqpbroker analyze` run has compacted (the
  `.compacted.json` marker it writes into the events directory, `COMPACTED_MARKER`) is
  never deleted, whatever the limits say.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Written into the events directory by `amqpbroker analyze` after a compaction: a JSON
# object whose "files" lists the names of the event files its store holds.
COMPACTED_MARKER = ".compacted.json"
# The defaults a missing key gets (docs/decisions.md says why): whichever is smaller.
AUTO_TOTAL_FRACTION = 0.10  # of the data directory's file system
AUTO_TOTAL_BYTES = 2 << 30
AUTO_FREE_FRACTION = 0.05
AUTO_FREE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class EventFile:
    """One file of the events directory, as retention sees it."""

    name: str
    size_bytes: int
    mtime_ms: int  # last write, epoch ms
    finished: bool  # .jsonl / .jsonl.gz; False: a .part file, never deleted
    compacted: bool = False  # an analyze run has compacted it (COMPACTED_MARKER)


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    """`event-log.max-total-bytes`, `max-age` (ms) and `keep-until-analyzed`; -1: no limit."""

    max_total_bytes: int = -1
    max_age_ms: int = -1
    keep_until_analyzed: bool = False


def decide_retention(
    files: Iterable[EventFile], limits: RetentionLimits, *, now_ms: int
) -> list[EventFile]:
    """The files to delete, oldest first: too old, or the oldest while over the total."""
    files = list(files)
    total = sum(f.size_bytes for f in files)
    doomed: list[EventFile] = []
    for f in sorted((f for f in files if f.finished), key=lambda f: (f.mtime_ms, f.name)):
        if limits.keep_until_analyzed and not f.compacted:
            continue
        too_old = limits.max_age_ms >= 0 and now_ms - f.mtime_ms > limits.max_age_ms
        too_big = limits.max_total_bytes >= 0 and total > limits.max_total_bytes
        if too_old or too_big:
            doomed.append(f)
            total -= f.size_bytes
    return doomed


def auto_limit(configured: int | None, *, fs_bytes: int, fraction: float, cap: int) -> int:
    """A configured limit, or (None) the default: `fraction` of the file system, at most
    `cap` bytes."""
    if configured is not None:
        return configured
    return min(int(fs_bytes * fraction), cap)
