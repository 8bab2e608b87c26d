"""Where the file journal's live records are: `_Segment` and `_Loc` (issue 23 item 4).

A plain module that mypyc compiles (setup.py HOT_MODULES), apart from `segments.py`:
the open makes two `_Loc`s per queued durable message, millions at recovery, and the
compiled read path (`store/frames.py`) then builds them as native objects and reads their
fields directly, not through an interpreted `__init__` and Python's attribute protocol.
`segments.py` re-exports both names (the journal's parts import them from there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final


class _Segment:
    __slots__ = ("items", "live_bytes", "number", "path", "size_bytes", "skips")

    def __init__(self, number: int, path: Path, size_bytes: int) -> None:
        self.number = number
        self.path = path
        self.size_bytes = size_bytes  # bytes on disk, header included
        self.live_bytes = 0  # of live records and needed tombstones
        self.items: dict[int, _Loc] = {}  # `_Loc.span` -> live record or needed tombstone
        self.skips: list[tuple[int, int]] = []  # corrupt ranges skipped (skip_corrupt)

    def __repr__(self) -> str:
        return f"<segment {self.number} {self.size_bytes}B live={self.live_bytes}B>"


_SPAN_SHIFT: Final = 33  # `_Loc.span`: offset << _SPAN_SHIFT | size
_SIZE_MASK: Final = (1 << _SPAN_SHIFT) - 1


class _Loc:
    """Where one live record (or needed tombstone) is. Two per queued durable message:
    nothing else on it (a tombstone's targets and compaction's copying are kept by the
    journal, issue 20). `span` is offset and size in one int (`offset << 33 | size`: a
    frame is at most 2**32 + 11 bytes): one int object where two were, also the key in
    `_Segment.items` (so in offset order)."""

    __slots__ = ("seg", "span")

    # `Any`, not `int`: compiled, an `int` field is stored unboxed and boxed again, a new
    # int object, at each read (a `_Segment.items` key is the span object itself).
    span: Any

    def __init__(self, seg: _Segment, offset: int, size: int) -> None:
        self.seg = seg
        self.span = offset << _SPAN_SHIFT | size

    @property
    def offset(self) -> int:
        offset: int = self.span >> _SPAN_SHIFT
        return offset

    @property
    def size(self) -> int:
        size: int = self.span & _SIZE_MASK
        return size
