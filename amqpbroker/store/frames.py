"""Reading a segment's frames at recovery speed (issue 23 item 4).

The open reads millions of frames; almost all are sound and of the layouts the broker
writes per message. `read_batches` checks those (length, flags, crc, payload layout)
as `segments._check_frame` and `codec.decode` do, in one loop without a call per check,
and stops at the first frame it does not take: the end of the data, a bad frame, or a
record of another type or layout, which the caller reads with the full checks (and their
reasons). An AddMessage comes back as its `codec.MessageLayout` (no body copied).

A plain module (not a part of `FileJournal`), so that mypyc can compile it (setup.py).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import amqpbroker.store.codec as codec
from amqpbroker.core.records import Record, RecordType
from amqpbroker.store.segments import _FLAGS_KNOWN, _FRAME, _MAX_PAYLOAD, BATCH_END, FRAME_BYTES

# A record read (or an AddMessage's layout), its offset and its frame's size.
Entry = tuple[Record | codec.MessageLayout, int, int]

_ADD_MESSAGE = int(RecordType.ADD_MESSAGE)
_ACK_REF = int(RecordType.ACK_REF)


def read_batches(
    data: bytes, pos: int, batch: list[Entry], top: int, batches: list[tuple[list[Entry], int]]
) -> tuple[int, list[Entry], int, int]:
    """Read frames from `pos` on, adding to `batch` (the records of an unfinished append,
    whose largest message id is `top`); each complete append goes to `batches` with its
    largest message id. Returns where it stopped (the end of `data`, or a frame for the
    full checks), the unfinished append with its largest id, and how many AckRefs it
    read (none: no message can have died meanwhile)."""
    size = len(data)
    view = memoryview(data)
    unpack = _FRAME.unpack_from
    crc32 = zlib.crc32
    layout_of = codec.add_message_layout
    decoders = codec._FAST_DECODE_AT
    acks = 0
    while size - pos >= FRAME_BYTES:
        length, crc, type_id, flags = unpack(data, pos)
        end = pos + FRAME_BYTES + length
        if (
            end > size
            or flags & ~_FLAGS_KNOWN
            or length > _MAX_PAYLOAD
            or crc32(view[pos + 8 : end], crc32(view[pos : pos + 4])) != crc
        ):
            break
        record: Any = None
        if type_id == _ADD_MESSAGE:
            record = layout_of(data, pos + FRAME_BYTES, end)
            if record is None:
                break
            msg_id = record[0]
        else:
            decoder = decoders.get(type_id)
            if decoder is None:
                break
            try:
                record = decoder(data, pos + FRAME_BYTES, end)
            except (IndexError, struct.error, UnicodeError):
                break
            if record is None:
                break
            msg_id = record.msg_id
            if type_id == _ACK_REF:
                acks += 1
        if msg_id > top:
            top = msg_id
        batch.append((record, pos, end - pos))
        pos = end
        if flags & BATCH_END:
            batches.append((batch, top))
            batch = []
            top = 0
    return pos, batch, top, acks
