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

Written for mypyc (issue 20, second pass: ~37k -> ~?k instructions per durable message,
AddMessage + AddRef + AckRef): every module constant and imported class is `Final` (a C
static, not a lookup in the module's dict), the structs' `pack` methods are bound once,
the prefix caches are keyed by the queue alone (one dict per record type and flag, no
key tuple), and the records' fields are read as objects (no unboxing and boxing again).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Final

import amqpbroker.store.codec as codec
from amqpbroker.core.records import AckRef, AddMessage, AddRef, Record, UpdateDeliveryCount
from amqpbroker.store.segments import BATCH_END, FRAME_BYTES, _frame

__all__ = ["frame_records"]

_Pack = Callable[..., bytes]
_FRAME: Final = struct.Struct("<IIHH")  # payload length, crc32, record type, flags
_PACK_FRAME: Final[_Pack] = _FRAME.pack
_CRC_FIELDS: Final = struct.Struct("<IHH")  # what the crc covers before the payload
_CRC_FIELDS_SIZE: Final = _CRC_FIELDS.size
_TWO_INTS: Final = struct.Struct("<BqBq")  # AddRef, UpdateDeliveryCount: msg_id, count
_PACK_TWO_INTS: Final[_Pack] = _TWO_INTS.pack
_ONE_INT: Final = struct.Struct("<Bq")  # AckRef: msg_id
_PACK_ONE_INT: Final[_Pack] = _ONE_INT.pack
_MESSAGE_TAIL: Final = struct.Struct("<BqBqBqBqBqBq")  # AddMessage's six ints after the data
_PACK_MESSAGE_TAIL: Final[_Pack] = _MESSAGE_TAIL.pack
_MESSAGE_TAIL_SIZE: Final = _MESSAGE_TAIL.size
# The crc of every frame written: `_framescan.c`'s (carry-less multiplication where the
# CPU has it, the recovery's own), ~3x faster than zlib's on a 1 KiB message; zlib's in
# the pure-Python build. Both are zlib's crc32, value for value (tests/unit/store).
_Crc = Callable[[bytes, int], int]
_fast_crc: _Crc | None
try:
    from amqpbroker.store._framescan import crc32 as _fast_crc
except ImportError:  # the pure-Python build (editable installs, no C compiler)
    _fast_crc = None
_CRC32: Final[_Crc] = _fast_crc or zlib.crc32
_STRUCT_ERROR: Final = struct.error
_STR: Final = 4  # codec's value tags
_BYTES: Final = 5
_INT: Final = 3
_TAG_LEN: Final = struct.Struct("<BI")
_BATCH_END: Final = BATCH_END
_FRAME_BYTES: Final = FRAME_BYTES
_AddRef: Final = AddRef
_AckRef: Final = AckRef
_UpdateDeliveryCount: Final = UpdateDeliveryCount
_AddMessage: Final = AddMessage
_ADD_REF: Final = int(AddRef.type_id)
_ACK_REF: Final = int(AckRef.type_id)
_COUNT: Final = int(UpdateDeliveryCount.type_id)
_ADD_MESSAGE: Final = int(AddMessage.type_id)
_CACHE_MAX: Final = 10_000  # names cached per kind (like codec's); beyond: not cached

# The constant part of a reference record's frame for a queue: payload length, prefix,
# crc32 of the frame fields and that prefix. One cache per (type, flags), keyed by queue.
_Prefix = tuple[int, bytes, int]
_ADD_REF_PREFIXES: Final[tuple[dict[str, _Prefix], dict[str, _Prefix]]] = ({}, {})
_ACK_REF_PREFIXES: Final[tuple[dict[str, _Prefix], dict[str, _Prefix]]] = ({}, {})
_COUNT_PREFIXES: Final[tuple[dict[str, _Prefix], dict[str, _Prefix]]] = ({}, {})
# How an AddMessage to an address starts: `pack` of the struct of its frame fields and
# payload up to the data in crc order, the address's encoding, the payload's length
# without the data.
_Head = tuple[_Pack, bytes, int]
_HEADS: Final[dict[str, _Head]] = {}


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
    caches = (
        _ACK_REF_PREFIXES
        if type_id == _ACK_REF
        else _ADD_REF_PREFIXES
        if type_id == _ADD_REF
        else _COUNT_PREFIXES
    )
    cache = caches[1 if flags else 0]
    if len(cache) < _CACHE_MAX:
        cache[queue] = entry
    return entry


def _head(address: str) -> _Head:
    """How an AddMessage to `address` starts (cached; see `_HEADS`)."""
    encoded = _TAG_LEN.pack(_STR, len(address.encode())) + address.encode()
    block = struct.Struct(f"<IHHBBq{len(encoded)}sBBI")
    entry = (block.pack, encoded, block.size - _CRC_FIELDS.size + _MESSAGE_TAIL.size)
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
    n = len(records)
    crc32 = _CRC32
    for i in range(n):
        record = records[i]
        last = i == n - 1
        flags = _BATCH_END if last else 0
        kind: object = type(record)
        rec: Any = record
        try:
            if kind is _AckRef:
                queue: object = rec.queue
                if type(queue) is str:
                    length, prefix, crc = _ACK_REF_PREFIXES[1 if last else 0].get(queue) or _prefix(
                        _ACK_REF, flags, queue
                    )
                    ints = _PACK_ONE_INT(_INT, rec.msg_id)
                    parts.append(_PACK_FRAME(length, crc32(ints, crc), _ACK_REF, flags))
                    parts.append(prefix)
                    parts.append(ints)
                    sizes.append(length + _FRAME_BYTES)
                    continue
            elif kind is _AddRef or kind is _UpdateDeliveryCount:
                queue = rec.queue
                if type(queue) is str:
                    adding = kind is _AddRef
                    type_id = _ADD_REF if adding else _COUNT
                    cache = (_ADD_REF_PREFIXES if adding else _COUNT_PREFIXES)[1 if last else 0]
                    length, prefix, crc = cache.get(queue) or _prefix(type_id, flags, queue)
                    ints = _PACK_TWO_INTS(_INT, rec.msg_id, _INT, rec.delivery_count)
                    parts.append(_PACK_FRAME(length, crc32(ints, crc), type_id, flags))
                    parts.append(prefix)
                    parts.append(ints)
                    sizes.append(length + _FRAME_BYTES)
                    continue
            elif kind is _AddMessage:
                data: object = rec.data
                durable: object = rec.durable
                address: object = rec.address
                if type(data) is bytes and type(durable) is bool and type(address) is str:
                    pack_head, encoded, fixed = _HEADS.get(address) or _head(address)
                    length = fixed + len(data)
                    # The frame fields and the payload up to the data, in crc order.
                    crc_head = pack_head(
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
                    tail = _PACK_MESSAGE_TAIL(
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
                    crc = crc32(tail, crc32(data, crc32(crc_head, 0)))
                    parts.append(_PACK_FRAME(length, crc, _ADD_MESSAGE, flags))
                    parts.append(crc_head[_CRC_FIELDS_SIZE:])
                    parts.append(data)
                    parts.append(tail)
                    sizes.append(length + _FRAME_BYTES)
                    continue
        except _STRUCT_ERROR:
            pass  # an int outside i64: the general encoder names the problem
        frame = _frame(record.type_id, flags, codec.encode(record))
        parts.append(frame)
        sizes.append(len(frame))
    return b"".join(parts), sizes
