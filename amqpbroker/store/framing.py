"""Framing an append's records in one pass: the journal's hot path on the event loop.

Theory of operation
-------------------
`frame_records` returns the bytes `FileJournal.append` queues for its writer: each
record's frame (`store/segments.py`: length, crc32, type, flags, payload) in order, the
last one flagged `BATCH_END`. The bytes are exactly those of `segments._frame(type,
flags, codec.encode(record))` per record (tests/unit/store/test_framing.py checks that):
only the work differs. The records written per durable message (`AddMessage`, `AddRef`,
`AckRef`, `UpdateDeliveryCount`) are framed in one loop without a Python call per record,
and what never changes between two frames of one queue or address is computed once and
cached: a reference record's payload up to its integers with the crc32 of the frame fields
and that prefix (crc32 is incremental: `crc32(b, crc32(a)) == crc32(a + b)`), and for an
`AddMessage` a `struct` that packs its frame fields and payload head in crc order. Before
(issue 20): ~13k instructions per record under callgrind, through five Python calls
(`encode`, the fast encoder, `_name`, `_frame`, `_crc`) and as many `bytes` built and
joined. Any other record, or a field of an unusual type, still goes through
`codec.encode`, which also names what cannot be encoded.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

import amqpbroker.store.codec as codec
from amqpbroker.core.records import AckRef, AddMessage, AddRef, Record, UpdateDeliveryCount
from amqpbroker.store.segments import BATCH_END, FRAME_BYTES, _frame

__all__ = ["frame_records"]

_FRAME = struct.Struct("<IIHH")  # payload length, crc32, record type, flags (segments.py)
_CRC_FIELDS = struct.Struct("<IHH")  # what the crc covers before the payload
_TWO_INTS = struct.Struct("<BqBq")  # AddRef, UpdateDeliveryCount: msg_id, delivery_count
_ONE_INT = struct.Struct("<Bq")  # AckRef: msg_id
_MESSAGE_TAIL = struct.Struct("<BqBqBqBqBqBq")  # AddMessage's six ints after the data
_STR, _BYTES, _INT = 4, 5, 3  # codec's value tags
_TAG_LEN = struct.Struct("<BI")
_ADD_REF = int(AddRef.type_id)
_ACK_REF = int(AckRef.type_id)
_COUNT = int(UpdateDeliveryCount.type_id)
_REF_TYPE_IDS: dict[type[Any], int] = {
    AddRef: _ADD_REF,
    AckRef: _ACK_REF,
    UpdateDeliveryCount: _COUNT,
}
_ADD_MESSAGE = int(AddMessage.type_id)
_CACHE_MAX = 10_000  # names cached (like codec's); beyond: framed without the cache

# (type id, flags, queue name) -> (payload length, prefix, crc32 of fields and prefix)
_Prefix = tuple[int, bytes, int]
_PREFIXES: dict[tuple[int, int, str], _Prefix] = {}
_Head = tuple[struct.Struct, bytes, int]
_HEADS: dict[str, _Head] = {}  # address -> `_head(address)`


def _prefix(type_id: int, flags: int, queue: str) -> _Prefix:
    """The constant part of a reference record's frame for `queue` (cached)."""
    name = queue.encode()
    count = b"\x02" if type_id == _ACK_REF else b"\x03"  # field count
    prefix = count + _TAG_LEN.pack(_STR, len(name)) + name
    length = len(prefix) + (_ONE_INT.size if type_id == _ACK_REF else _TWO_INTS.size)
    entry = (
        length,
        prefix,
        zlib.crc32(prefix, zlib.crc32(_CRC_FIELDS.pack(length, type_id, flags))),
    )
    if len(_PREFIXES) < _CACHE_MAX:
        _PREFIXES[(type_id, flags, queue)] = entry
    return entry


def _head(address: str) -> _Head:
    """How an AddMessage to `address` starts (cached): the struct of its frame fields and
    payload up to the data in crc order, the address's encoding, the payload's length
    without the data."""
    encoded = _TAG_LEN.pack(_STR, len(address.encode())) + address.encode()
    block = struct.Struct(f"<IHHBBq{len(encoded)}sBBI")
    entry = (block, encoded, block.size - _CRC_FIELDS.size + _MESSAGE_TAIL.size)
    if len(_HEADS) < _CACHE_MAX:
        _HEADS[address] = entry
    return entry


def frame_records(records: Sequence[Record]) -> tuple[bytes, list[int]]:
    """The frames of `records` as one `bytes`, and each frame's size (see module doc).

    Raises:
        codec.CodecError: a record cannot be encoded (as `codec.encode` says).
    """
    parts: list[bytes] = []
    sizes: list[int] = []
    last = len(records) - 1
    prefixes = _PREFIXES
    crc32 = zlib.crc32
    pack_frame = _FRAME.pack
    heads = _HEADS
    append = parts.append
    for i, record in enumerate(records):
        flags = BATCH_END if i == last else 0
        kind: Any = type(record)
        rec: Any = record
        try:
            if kind is AddRef or kind is AckRef or kind is UpdateDeliveryCount:
                queue: Any = rec.queue
                if type(queue) is str:
                    type_id = _REF_TYPE_IDS[kind]
                    entry = prefixes.get((type_id, flags, queue)) or _prefix(type_id, flags, queue)
                    length, prefix, crc = entry
                    ints = (
                        _ONE_INT.pack(_INT, rec.msg_id)
                        if type_id == _ACK_REF
                        else _TWO_INTS.pack(_INT, rec.msg_id, _INT, rec.delivery_count)
                    )
                    append(pack_frame(length, crc32(ints, crc), type_id, flags))
                    append(prefix)
                    append(ints)
                    sizes.append(length + FRAME_BYTES)
                    continue
            elif kind is AddMessage:
                data: Any = rec.data
                durable: Any = rec.durable
                address: Any = rec.address
                if type(data) is bytes and type(durable) is bool and type(address) is str:
                    block, encoded, fixed = heads.get(address) or _head(address)
                    length = fixed + len(data)
                    # The frame fields and the payload up to the data, in crc order.
                    crc_head = block.pack(
                        length,
                        _ADD_MESSAGE,
                        flags,
                        10,
                        _INT,
                        rec.msg_id,
                        encoded,
                        2 if durable else 1,
                        _BYTES,
                        len(data),
                    )
                    tail = _MESSAGE_TAIL.pack(
                        _INT,
                        rec.expiration_ms,
                        _INT,
                        rec.first_ts,
                        _INT,
                        rec.priority,
                        _INT,
                        rec.header_end,
                        _INT,
                        rec.head_end,
                        _INT,
                        rec.header_count,
                    )
                    crc = crc32(tail, crc32(data, crc32(crc_head)))
                    head = crc_head[_CRC_FIELDS.size :]
                    append(pack_frame(length, crc, _ADD_MESSAGE, flags))
                    append(head)
                    append(data)
                    append(tail)
                    sizes.append(length + FRAME_BYTES)
                    continue
        except struct.error:
            pass  # an int outside i64: the general encoder names the problem
        frame = _frame(record.type_id, flags, codec.encode(record))
        append(frame)
        sizes.append(len(frame))
    return b"".join(parts), sizes
