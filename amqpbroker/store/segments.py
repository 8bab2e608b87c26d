"""The segment file format: frames, their checks, and the helpers that write them.

Theory of operation
-------------------
A directory of segment files, `journal-<n>.seg` (n zero-padded, increasing), plus
`journal.lock` (an flock: one broker per directory; read-only opens share it). Replay
reads the segments in order of n. A segment is::

    file header (16 bytes): magic b"AMQPBJNL", u16 version (1), u16 flags (0), u32 n
    frame*:  u32 payload length | u32 crc32 | u16 record type | u16 flags | payload

all little-endian. The crc32 (zlib) covers the frame except the crc field itself: length,
type, flags and payload, in that order. Flag bit 0 (`BATCH_END`) marks the last record of
an `append()` call. The payload is `store/codec.py`'s encoding of the record's fields. Only
the last segment is ever appended to; it rolls to n+1 (after an fsync of the old one) when
the next append would take it past `max_segment_bytes`. An append is never split across
segments, so an append bigger than the limit gets a segment of its own.

Reading checks every frame (`_check_frame`: length, crc, known type and flags); a bad
frame is `_Bad`, and `_next_sound_frame` finds where valid frames start again. What a bad
frame means (a torn tail or corruption) is the file journal's call (`store/file_journal.py`).
`_Pending` and (`store/locs.py`, re-exported here) `_Segment` and `_Loc` are the small
structures the journal's parts share.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path

import amqpbroker.store.codec as codec
from amqpbroker.core.records import (
    RECORD_CLASSES,
    Record,
)
from amqpbroker.store.api import OnDurable
from amqpbroker.store.locs import _SIZE_MASK as _SIZE_MASK  # re-exported
from amqpbroker.store.locs import _SPAN_SHIFT as _SPAN_SHIFT
from amqpbroker.store.locs import _Loc as _Loc
from amqpbroker.store.locs import _Segment as _Segment

MAGIC = b"AMQPBJNL"
VERSION = 1
BATCH_END = 0x1
_FLAGS_KNOWN = BATCH_END
_FILE_HEADER = struct.Struct("<8sHHI")
_FRAME = struct.Struct("<IIHH")  # payload length, crc32, record type, flags
_CRC_FIELDS = struct.Struct("<IHH")  # what the crc covers before the payload
HEADER_BYTES = _FILE_HEADER.size
FRAME_BYTES = _FRAME.size
_MAX_PAYLOAD = 1 << 30
_KNOWN_TYPES = frozenset(int(t) for t in RECORD_CLASSES)
_SEGMENT_GLOB = "journal-*.seg"
_TEMP_SUFFIX = ".compact"
_NEXT_SUFFIX = ".next"  # the spare next segment, opened ahead of need


class _Pending:
    """One `append()` waiting for the writer: its records, their framed bytes, sizes."""

    __slots__ = ("callback", "data", "records", "sizes", "sync")

    def __init__(
        self,
        records: tuple[Record, ...],
        data: bytes,
        sizes: list[int],
        sync: bool,
        callback: OnDurable | None,
    ) -> None:
        self.records = records
        self.data = data
        self.sizes = sizes
        self.sync = sync
        self.callback = callback


def _crc(length: int, type_id: int, flags: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(length, type_id, flags)))


def _frame(type_id: int, flags: int, payload: bytes) -> bytes:
    n = len(payload)
    return _FRAME.pack(n, _crc(n, type_id, flags, payload), type_id, flags) + payload


def _segment_path(directory: Path, number: int) -> Path:
    return directory / f"journal-{number:08d}.seg"


def _segment_number(path: Path) -> int | None:
    digits = path.name[len("journal-") : -len(".seg")]
    return int(digits) if digits.isdigit() else None


def _write_fd(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data` (tests replace this to simulate a full disk)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _default_fsync(fd: int) -> None:
    # fdatasync also syncs the file size, all an append needs; macOS has only fsync.
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Bad:
    """Why the frame at an offset is unusable; `end` is where it claims to end, or -1.

    `intact`: the checksum matches, so the bytes are what a writer wrote (a newer version,
    or a bug): never a torn write, never truncated.
    """

    __slots__ = ("end", "intact", "reason")

    def __init__(self, reason: str, end: int, *, intact: bool = False) -> None:
        self.reason = reason
        self.end = end
        self.intact = intact


def _check_frame(data: codec.Data, pos: int) -> tuple[int, int, int] | _Bad:
    """(end, type id, flags) of a sound frame at `pos`, or why it is not one."""
    if len(data) - pos < FRAME_BYTES:
        return _Bad("truncated frame header", -1)
    length, crc, type_id, flags = _FRAME.unpack_from(data, pos)
    if flags & ~_FLAGS_KNOWN or length > _MAX_PAYLOAD:
        return _Bad("implausible frame header", -1)
    end = pos + FRAME_BYTES + length
    if end > len(data):
        return _Bad(f"frame of {length} bytes runs past the end of the file", end)
    # The crc covers the length field, then type, flags and payload: `_crc` over the
    # frame's own bytes, without packing the fields again (recovery checks millions).
    view = memoryview(data)
    if zlib.crc32(view[pos + 8 : end], zlib.crc32(view[pos : pos + 4])) != crc:
        return _Bad("checksum mismatch", end)
    if type_id not in _KNOWN_TYPES:
        return _Bad(
            f"unknown record type {type_id} (written by a newer amqpbroker?)", end, intact=True
        )
    return end, type_id, flags


# What bytes 8..11 of a frame (type id, flags) can be: candidates for `_next_sound_frame`.
_TYPE_AND_FLAGS = re.compile(
    b"(?:"
    + b"|".join(re.escape(struct.pack("<H", t)) for t in sorted(_KNOWN_TYPES))
    + b")[\\x00\\x01]\\x00"
)


# `_next_sound_frame` checks each candidate's crc over the bytes it claims; candidates
# that each claim most of the rest make that quadratic (a crafted 200 KB tail took 0.8 s,
# a few MB would hold the open for hours; issue 15 attack). What one open may checksum
# while searching, per segment: this many times the segment, plus the slack.
SEARCH_FACTOR = 16
SEARCH_SLACK = 64 << 20
GAVE_UP = -2  # `_next_sound_frame`: the budget ran out before the search could say


class SearchBudget:
    """The bytes `_next_sound_frame` may still checksum in one segment."""

    __slots__ = ("left",)

    def __init__(self, size: int) -> None:
        self.left = SEARCH_FACTOR * size + SEARCH_SLACK


def _next_sound_frame(data: codec.Data, start: int, budget: SearchBudget | None = None) -> int:
    """Offset of the first sound frame at or after `start`, -1 when there is none, or
    GAVE_UP when `budget` ran out first (each candidate costs the bytes it claims)."""
    offset = FRAME_BYTES - 4  # of the type id in a frame
    for match in _TYPE_AND_FLAGS.finditer(data, start + offset):
        pos = match.start() - offset
        if budget is not None and pos >= 0:
            budget.left -= _FRAME.unpack_from(data, pos)[0]
            if budget.left < 0:
                return GAVE_UP
        if not isinstance(_check_frame(data, pos), _Bad):
            return pos
    return -1


def _decode_at(data: codec.Data, pos: int, end: int, type_id: int) -> Record | _Bad:
    try:
        return codec.decode_at(type_id, data, pos + FRAME_BYTES, end)
    except codec.CodecError as e:
        return _Bad(f"undecodable record: {e}", end, intact=True)
