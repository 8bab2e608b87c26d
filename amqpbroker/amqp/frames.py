"""AMQP 1.0 frames (part 2.3): the protocol headers and the 8-byte frame header.

The broker writes a frame itself only where proton does not: SASL before the engine exists
(`protocol/sasl.py`) and a close the engine will not send (`protocol/connection.py`).
"""

from __future__ import annotations

import struct
from typing import Final

from amqpbroker.amqp import sections

__all__ = ["AMQP_FRAME", "AMQP_HEADER", "FRAME_HEADER", "SASL_FRAME", "SASL_HEADER", "frame"]

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
AMQP_FRAME: Final = 0
SASL_FRAME: Final = 1
# size (uint, the whole frame), data offset (in 4-byte words: 2, no extended header),
# type, channel
FRAME_HEADER: Final = struct.Struct(">IBBH")


def frame(code: int, fields: list[object], *, kind: int = AMQP_FRAME, channel: int = 0) -> bytes:
    """One frame whose body is the performative `code` described list of `fields`."""
    body = sections.encode_value(sections.Described(sections.ULong(code), fields))
    return FRAME_HEADER.pack(8 + len(body), 2, kind, channel) + body
