"""The one frame format between the broker and its event-log writer process, both ways.

A frame is a 4-byte little-endian length, then `marshal.dumps(value)`. marshal runs at C
speed and writes a message's bytes once per frame however many of its events hold them.

* broker -> writer process (its stdin): `(first_seq, now_ms, events)`, `events` a list of
  `core.lifecycle.RawEvent` tuples numbered from `first_seq`; a message part's data is
  `KNOWN` (0) when an event at most KNOWN_WINDOW earlier carried the message's bytes;
* writer process -> broker (its stdout): `(written_total, dropped_total, failed, files,
  logs)`, `files` the disk figures (`child.ChildWriter.stats()`), `logs` `(level, text)`
  records for the broker to log.

Standard library only: the writer process imports it without loading the broker.
"""

from __future__ import annotations

import marshal
import struct
from typing import Any, Final

__all__ = ["KNOWN_WINDOW", "LENGTH", "dumps", "framed", "take"]

LENGTH: Final = struct.Struct("<I")
# The writer process remembers what it read from a message's bytes (amqp_message_id,
# props, body_hash) for at least this many events (`seq`) after an event that carried
# them, so the broker's later events of the message carry `core.lifecycle.KNOWN` instead
# of the bytes (`Emitter.part`; issue 20): a message's bytes cross the pipe once, not once
# a frame. Two generations of this many events: ~2 x 32k entries of ~0.3 KB at most.
KNOWN_WINDOW: Final = 1 << 15


def dumps(value: Any) -> bytes:
    """`value` marshalled; str/int subclasses (AMQP symbols, typed ints) as plain types."""
    try:
        return marshal.dumps(value)
    except ValueError:  # a str or int subclass somewhere: rare, so checked only now
        return marshal.dumps(_plain(value))


def framed(payload: bytes) -> bytes:
    """A frame carrying `payload` (the output of `dumps`)."""
    return LENGTH.pack(len(payload)) + payload


def take(buf: bytearray) -> list[Any]:
    """The values of the whole frames at the start of `buf`, removed from it (a partial
    frame at the end stays for the next read)."""
    values = []
    pos = 0
    end = len(buf)
    with memoryview(buf) as view:
        while end - pos >= LENGTH.size:
            (size,) = LENGTH.unpack_from(view, pos)
            start = pos + LENGTH.size
            if end - start < size:
                break
            values.append(marshal.loads(view[start : start + size]))
            pos = start + size
    del buf[:pos]
    return values


def _plain(value: Any) -> Any:
    """`value` with str/int subclasses as the plain types marshal accepts."""
    if value is None or type(value) in (str, int, bool, bytes):
        return value
    if isinstance(value, tuple | list):
        return tuple([_plain(v) for v in value])
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value)
