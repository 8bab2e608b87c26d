"""DATA_DIR/message-ids: the end of the last reserved block of message ids (issue 16 item 2).

`core.ids.MessageIds` calls `write_reserved` before it hands out the first id of a block;
a restart reads it back and starts there. The file is replaced atomically (write, fsync,
rename, fsync the directory), so it holds either the old or the new end, never a torn one.
It is kept whether persistence is enabled or not: non-durable messages are named in the
event log and redrive lists too.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

FILE_NAME = "message-ids"
_HEADER = "amqpbroker message-id reservation v1"
# Message ids are journaled as signed 64-bit numbers: an end past this (a file altered on
# disk) made every durable send fail, and one of 5,000 digits raised ValueError (int's
# digit limit) at the start instead of this module's error (third attack pass). 2^62
# ids is ~146 years at a billion a second.
MAX_RESERVED = 1 << 62
_READ_LIMIT = 256  # the header and 19 digits are 58 bytes


class IdBlockError(Exception):
    """The reservation file exists but does not say what it should."""


def read_reserved(path: Path) -> int:
    """The end a previous run reserved (no id at or above it was used); 0 for no file."""
    try:
        text = _read_small(path).decode("ascii")
    except FileNotFoundError:
        return 0
    except (OSError, UnicodeDecodeError) as e:
        raise IdBlockError(f"cannot read {path}: {e}") from e
    lines = text.split("\n")
    if (
        len(lines) < 2
        or lines[0] != _HEADER
        or not lines[1].isdigit()
        or len(lines[1]) > 19
        or int(lines[1]) > MAX_RESERVED
    ):
        raise IdBlockError(f"{path} is not a message-id reservation: {text[:80]!r}")
    return int(lines[1])


def _read_small(path: Path) -> bytes:
    """The first `_READ_LIMIT` bytes of `path`, a regular file (fourth attack pass: a FIFO
    in its place hung the start on the read, and a file of gigabytes was read whole)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        return os.read(fd, _READ_LIMIT)
    finally:
        os.close(fd)


def write_reserved(path: Path, end: int) -> None:
    """Make `end` the reserved end, durably, before any id below it is used. OSError."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{_HEADER}\n{end}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
