"""Record payloads: a compact, self-describing binary encoding of `core.records` values.

The journal frames each record as `type id + payload` (see `store/journal.py`); this module
makes the payload. A payload is the record's fields in declaration order, each a tagged
value, so any payload can be read back without knowing the record type (`decode_values`),
and a field appended to a record type later is simply absent from older payloads (the
decoder fills in the field's default) or ignored by older decoders.

Payload layout (little-endian)::

    payload := u8 field_count, value * field_count
    value   := u8 tag, body
      tag 0 None      (no body)
      tag 1 False     (no body)
      tag 2 True      (no body)
      tag 3 int       i64
      tag 4 str       u32 length, UTF-8 bytes
      tag 5 bytes     u32 length, raw bytes
      tag 6 list      u32 count, value * count      (tuples are written as lists)
      tag 7 dict      u32 count, (value key, value value) * count
      tag 8 float     f64

Enum members are written as their value; the decoder turns values back into the enum the
field is declared with (`AddQueue.routing_type`, `AddAddress.routing_types`). No pickle:
nothing in a journal file can make the decoder run code.
"""

from __future__ import annotations

import enum
import mmap
import struct
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, Final

from amqpbroker.core.model import QueueConfig, RoutingType
from amqpbroker.core.records import (
    RECORD_CLASSES,
    AckRef,
    AddMessage,
    AddQueue,
    AddRef,
    Record,
    RecordType,
    UpdateDeliveryCount,
)

__all__ = ["CodecError", "decode", "decode_at", "decode_values", "encode"]


class CodecError(ValueError):
    """A value cannot be encoded, or a payload is not a valid encoding."""


# Final: mypyc makes them C statics (a plain module global costs a compiled function a
# dict lookup per use, where the interpreter caches it: issue 23 item 4).
_NONE: Final = 0
_FALSE: Final = 1
_TRUE: Final = 2
_INT: Final = 3
_STR: Final = 4
_BYTES: Final = 5
_LIST: Final = 6
_DICT: Final = 7
_FLOAT: Final = 8
_TAG_INT: Final = struct.Struct("<Bq")
_TAG_LEN: Final = struct.Struct("<BI")
_TAG_FLOAT: Final = struct.Struct("<Bd")
_I64: Final = struct.Struct("<q")
_U32: Final = struct.Struct("<I")
_F64: Final = struct.Struct("<d")
_B_NONE, _B_FALSE, _B_TRUE = bytes([_NONE]), bytes([_FALSE]), bytes([_TRUE])


def _encode_value(parts: list[bytes], value: object) -> None:
    kind = type(value)
    if kind is int:
        try:
            parts.append(_TAG_INT.pack(_INT, value))
        except struct.error:
            raise CodecError(f"integer out of the i64 range: {value}") from None
    elif kind is str:
        data = value.encode()  # type: ignore[attr-defined]
        parts.append(_TAG_LEN.pack(_STR, len(data)))
        parts.append(data)
    elif kind is bytes:
        parts.append(_TAG_LEN.pack(_BYTES, len(value)))  # type: ignore[arg-type]
        parts.append(value)  # type: ignore[arg-type]
    elif kind is bool:
        parts.append(_B_TRUE if value else _B_FALSE)
    elif value is None:
        parts.append(_B_NONE)
    elif isinstance(value, enum.Enum):
        _encode_value(parts, value.value)
    elif isinstance(value, tuple | list):
        parts.append(_TAG_LEN.pack(_LIST, len(value)))
        for item in value:
            _encode_value(parts, item)
    elif isinstance(value, dict):
        parts.append(_TAG_LEN.pack(_DICT, len(value)))
        for key, item in value.items():
            _encode_value(parts, key)
            _encode_value(parts, item)
    elif kind is float:
        parts.append(_TAG_FLOAT.pack(_FLOAT, value))
    elif isinstance(value, bool):
        _encode_value(parts, bool(value))
    elif isinstance(value, int):
        _encode_value(parts, int(value))
    elif isinstance(value, str):
        _encode_value(parts, str(value))
    elif isinstance(value, bytes | bytearray | memoryview):
        _encode_value(parts, bytes(value))
    else:
        raise CodecError(f"cannot encode a {kind.__name__} in a journal record")


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in RECORD_CLASSES.values()
}


def encode(record: Record) -> bytes:
    """The payload of `record` (without its type id, which the frame carries)."""
    fast = _FAST.get(type(record))
    if fast is not None:
        try:
            return fast(record)
        except struct.error:
            pass  # an int outside i64: the general encoder names the problem
    return encode_generic(record)


def encode_generic(record: Record) -> bytes:
    """`encode` for any record, field by field (the fast paths must equal this)."""
    names = _FIELD_NAMES[type(record)]
    parts = [bytes((len(names),))]
    for name in names:
        _encode_value(parts, getattr(record, name))
    return b"".join(parts)


# Fast paths for the records written per message (the journal's hot path): the same bytes
# as `encode_generic`, with the names' encodings cached. tests/unit/store checks equality.
_NAMES: dict[str, bytes] = {}
_TWO_INTS: Final = struct.Struct("<BqBq")
_THREE_INTS: Final = struct.Struct("<BqBqBq")


def _name(text: str) -> bytes:
    encoded = _NAMES.get(text)
    if encoded is None:
        data = text.encode()
        encoded = _TAG_LEN.pack(_STR, len(data)) + data
        if len(_NAMES) < 10_000:
            _NAMES[text] = encoded
    return encoded


def _fast_add_ref(record: Any) -> bytes:  # also UpdateDeliveryCount: the same fields
    return b"".join(
        (
            b"\x03",
            _name(record.queue),
            _TWO_INTS.pack(_INT, record.msg_id, _INT, record.delivery_count),
        )
    )


def _fast_ack_ref(record: Any) -> bytes:
    return b"".join((b"\x02", _name(record.queue), _TAG_INT.pack(_INT, record.msg_id)))


def _fast_add_message(record: Any) -> bytes:
    data = record.data
    if type(data) is not bytes or type(record.durable) is not bool:
        return encode_generic(record)
    return b"".join(
        (
            b"\x0a",
            _TAG_INT.pack(_INT, record.msg_id),
            _name(record.address),
            _B_TRUE if record.durable else _B_FALSE,
            _TAG_LEN.pack(_BYTES, len(data)),
            data,
            _THREE_INTS.pack(
                _INT, record.expiration_ms, _INT, record.first_ts, _INT, record.priority
            ),
            _THREE_INTS.pack(
                _INT, record.header_end, _INT, record.head_end, _INT, record.header_count
            ),
        )
    )


_FAST: dict[type[Any], Callable[[Any], bytes]] = {
    cls: fn
    for cls, fn in (
        (RECORD_CLASSES[RecordType.ADD_REF], _fast_add_ref),
        (RECORD_CLASSES[RecordType.ACK_REF], _fast_ack_ref),
        (RECORD_CLASSES[RecordType.UPDATE_DELIVERY_COUNT], _fast_add_ref),
        (RECORD_CLASSES[RecordType.ADD_MESSAGE], _fast_add_message),
    )
}


def _decode_value(buf: bytes, pos: int) -> tuple[Any, int]:
    tag = buf[pos]
    pos += 1
    if tag == _INT:
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if tag in (_STR, _BYTES):
        (length,) = _U32.unpack_from(buf, pos)
        pos += 4
        end = pos + length
        if end > len(buf):
            raise CodecError("string or bytes value runs past the end of the payload")
        raw = buf[pos:end]
        return (raw.decode() if tag == _STR else raw), end
    if tag == _NONE:
        return None, pos
    if tag == _FALSE:
        return False, pos
    if tag == _TRUE:
        return True, pos
    if tag == _LIST:
        (count,) = _U32.unpack_from(buf, pos)
        pos += 4
        items = []
        for _ in range(count):
            item, pos = _decode_value(buf, pos)
            items.append(item)
        return tuple(items), pos
    if tag == _DICT:
        (count,) = _U32.unpack_from(buf, pos)
        pos += 4
        result = {}
        for _ in range(count):
            key, pos = _decode_value(buf, pos)
            result[key], pos = _decode_value(buf, pos)
        return result, pos
    if tag == _FLOAT:
        return _F64.unpack_from(buf, pos)[0], pos + 8
    raise CodecError(f"unknown value tag {tag}")


def decode_values(payload: bytes) -> tuple[Any, ...]:
    """The field values of any payload, in order, without interpreting them."""
    try:
        count = payload[0]
        pos = 1
        values = []
        for _ in range(count):
            value, pos = _decode_value(payload, pos)
            values.append(value)
    except (IndexError, struct.error, UnicodeDecodeError, RecursionError) as e:
        raise CodecError(f"malformed payload: {e}") from None
    if pos != len(payload):
        raise CodecError(f"{len(payload) - pos} bytes left over after the last field")
    return tuple(values)


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    """How to turn a decoded plain value back into the declared field type, if needed."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        if item is not None:
            return lambda values: tuple(item(v) for v in values)
    return None


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded (and converted) value is of a record field's declared type. A
    record whose crc is right may still hold a value of another tag (a flipped byte the
    crc did not see, or a journal written by hand): a name that is bytes, an int that is
    a string. Recovery handed such values on and failed later with a TypeError traceback
    (eighth attack pass); they are a decode error instead (`CodecError`)."""
    if hint is Any or hint is type:  # `type`: mypyc's runtime annotation of a union
        return True  # (a compiled class's `str | None`), checked by construction instead
    if isinstance(hint, type):
        if hint is int or hint is float:  # a bool is an int (as the general decoder
            return isinstance(value, int) or type(value) is hint  # always read it)
        if issubclass(hint, enum.Enum):
            return isinstance(value, hint)
        return type(value) is hint
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return type(value) is tuple and all(_conforms(item, args[0]) for item in value)
    if origin is dict:
        return type(value) is dict and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
        )
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, arg) for arg in args)
    return True  # (no other hint in core/records.py)


# An AddQueue's `extra` holds the rest of the queue's QueueConfig fields by name
# (`Persistence.queue_added`); recovery passes them to QueueConfig as keywords, so each
# must be of its field's type, and none may be one the record holds itself.
_QUEUE_HINTS: Final = typing.get_type_hints(QueueConfig)
_ADD_QUEUE_OWN: Final = frozenset(
    f.name for f in fields(RECORD_CLASSES[RecordType.ADD_QUEUE]) if f.name != "extra"
)  # (`extra` under `extra`: the queue's own extra settings, QueueConfig.extra)


def _queue_extra_problem(extra: dict[str, Any]) -> str | None:
    for key, value in extra.items():
        if key in _ADD_QUEUE_OWN:
            return f"extra repeats the field {key!r}"
        hint = _QUEUE_HINTS.get(key)
        if hint is None:
            continue
        if not _conforms(value, hint):
            return f"extra {key!r} is a {type(value).__name__}, not {hint}"
        if hint is type:
            # The compiled build's QueueConfig (core/model.py, a native class) keeps no
            # union annotation (`_conforms`' `type`) but checks each field's type when
            # built, as recovery builds it (`store/recovery._queue_config`).
            try:
                QueueConfig(name="", address="", routing_type=RoutingType.ANYCAST, **{key: value})
            except (TypeError, ValueError) as e:
                return f"extra {key!r} is a {type(value).__name__}: {e}"
    return None


class _Schema:
    __slots__ = ("cls", "converters", "defaults", "hints", "names")

    def __init__(self, cls: type[Any]) -> None:
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.names = _FIELD_NAMES[cls]
        self.hints = {n: hints[n] for n in self.names}
        self.converters = {n: c for n in self.names if (c := _converter(hints[n])) is not None}
        self.defaults = {
            f.name
            for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING
        }


_SCHEMAS = {type_id: _Schema(cls) for type_id, cls in RECORD_CLASSES.items()}


# Fast decoders for the same records (recovery replays millions of them, issue 23 item
# 4): the layout `_fast_*` writes, checked byte for byte; anything else (an older or newer
# writer, a field out of the usual types) goes to the general decoder.
# What the decoders read from: a segment's bytes, or its pages mapped (`mmap`: the open
# maps each segment instead of reading it into a new buffer, issue 23 item 4).
Data = bytes | mmap.mmap
_STRINGS: Final[dict[bytes, str]] = {}  # queue and address names repeat: decode each once
_ADD_MESSAGE_HEAD: Final = struct.Struct("<BBqBI")  # count, tag, msg_id, tag, address length
_BOOL_TAG_LEN: Final = struct.Struct("<BBI")  # durable, the body's tag and length
_SIX_INTS: Final = struct.Struct("<BqBqBqBqBqBq")  # an issue-23 AddMessage's last six fields
# The same, bound and sized once (compiled: a call of a C static, not a method looked up
# by name per call; a size that is a constant, not an attribute read).
_UNPACK_HEAD: Final = _ADD_MESSAGE_HEAD.unpack_from
_UNPACK_BOOL_TAG_LEN: Final = _BOOL_TAG_LEN.unpack_from
_UNPACK_SIX_INTS: Final = _SIX_INTS.unpack_from
_UNPACK_TWO_INTS: Final = _TWO_INTS.unpack_from
_UNPACK_U32: Final = _U32.unpack_from
_HEAD_SIZE: Final = 15  # _ADD_MESSAGE_HEAD.size
_BOOL_TAG_LEN_SIZE: Final = 6  # _BOOL_TAG_LEN.size
_THREE_INTS_SIZE: Final = 27  # _THREE_INTS.size
_TWO_INTS_SIZE: Final = 18  # _TWO_INTS.size


# Records built without the dataclass's keyword call (a third of its cost, as
# `core/persistence.py` builds them); each sets every field its class declares
# (tests/unit/store/test_codec_fast.py compares with the general decoder's records).
_new: Final = object.__new__


def _string(raw: bytes) -> str:
    text = _STRINGS.get(raw)
    if text is None:
        text = raw.decode()
        if len(_STRINGS) < 10_000:
            _STRINGS[raw] = text
    return text


def _fast_decode_ref(cls: type[Any]) -> Callable[[Data, int, int], Any]:
    def decode(buf: Data, start: int, stop: int) -> Any:
        if buf[start] != 3 or buf[start + 1] != _STR:
            return None
        end = start + 6 + _U32.unpack_from(buf, start + 2)[0]
        if stop != end + _TWO_INTS.size:
            return None
        tag1, msg_id, tag2, count = _TWO_INTS.unpack_from(buf, end)
        if tag1 != _INT or tag2 != _INT:
            return None
        record = _new(cls)
        record.queue = _string(buf[start + 6 : end])
        record.msg_id = msg_id
        record.delivery_count = count
        return record

    return decode


def _fast_decode_ack(buf: Data, start: int, stop: int) -> Any:
    if buf[start] != 2 or buf[start + 1] != _STR:
        return None
    end = start + 6 + _U32.unpack_from(buf, start + 2)[0]
    if stop != end + _TAG_INT.size:
        return None
    tag, msg_id = _TAG_INT.unpack_from(buf, end)
    if tag != _INT:
        return None
    record: AckRef = _new(AckRef)
    record.queue = _string(buf[start + 6 : end])
    record.msg_id = msg_id
    return record


# An AddMessage's fields but its body, which is (data_start, data_end) of the buffer it
# was read from: what recovery's open keeps until it knows the message is live.
MessageLayout = tuple[int, str, bool, int, int, int, int, int, int, int, int]


def add_message_layout(buf: Data, start: int, stop: int) -> MessageLayout | None:
    """The fields of the AddMessage payload at `buf[start:stop]`, checked as the fast
    decoder checks them, without copying its body; None: a layout for `decode`."""
    # Declared: compiled, native ints rather than objects (see `frames.read_batches`).
    count: int
    tag: int
    msg_id: int
    address_tag: int
    address_len: int
    durable: int
    data_tag: int
    data_len: int
    try:
        count, tag, msg_id, address_tag, address_len = _UNPACK_HEAD(buf, start)
        if count not in (7, 10) or tag != _INT or address_tag != _STR:  # 7: before issue 23
            return None
        scanned = count == 10
        pos = start + _HEAD_SIZE + address_len
        address = _string(buf[start + _HEAD_SIZE : pos])
        durable, data_tag, data_len = _UNPACK_BOOL_TAG_LEN(buf, pos)
        data_start = pos + _BOOL_TAG_LEN_SIZE
        end = data_start + data_len
        if (
            durable not in (_TRUE, _FALSE)
            or data_tag != _BYTES
            or stop != end + _THREE_INTS_SIZE * (2 if scanned else 1)
        ):
            return None
        if scanned:  # the six ints in one unpack
            (
                tag1,
                expiration_ms,
                tag2,
                first_ts,
                tag3,
                priority,
                tag4,
                header_end,
                tag5,
                head_end,
                tag6,
                header_count,
            ) = _UNPACK_SIX_INTS(buf, end)
            if not tag1 == tag2 == tag3 == tag4 == tag5 == tag6 == _INT:
                return None
        else:
            tag1, expiration_ms, tag2, first_ts, tag3, priority = _THREE_INTS.unpack_from(buf, end)
            if not tag1 == tag2 == tag3 == _INT:
                return None
            header_end, head_end, header_count = -1, 0, -1
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return (
        msg_id,
        address,
        durable == _TRUE,
        data_start,
        end,
        expiration_ms,
        first_ts,
        priority,
        header_end,
        head_end,
        header_count,
    )


def add_message_of(buf: Data, layout: MessageLayout) -> AddMessage:
    """The AddMessage whose `add_message_layout` in `buf` is `layout`."""
    record: AddMessage = _new(AddMessage)
    record.msg_id = layout[0]
    record.address = layout[1]
    record.durable = layout[2]
    record.data = buf[layout[3] : layout[4]]
    record.expiration_ms = layout[5]
    record.first_ts = layout[6]
    record.priority = layout[7]
    record.header_end = layout[8]
    record.head_end = layout[9]
    record.header_count = layout[10]
    return record


# An AddMessage as a plain tuple, its body copied out (`message_row`): what the open keeps
# of a live message for recovery, which reads it by index (compiled, a tuple's item is a
# C read where a record's attribute is a Python attribute lookup, issue 23 item 4).
# (msg_id, address, durable, data, expiration_ms, first_ts, priority, header_end,
# head_end, header_count): `AddMessage`'s fields in its order.
MessageRow = tuple[int, str, bool, bytes, int, int, int, int, int, int]


def message_row(buf: Data, layout: MessageLayout) -> MessageRow:
    """The `MessageRow` whose `add_message_layout` in `buf` is `layout`."""
    return (
        layout[0],
        layout[1],
        layout[2],
        buf[layout[3] : layout[4]],
        layout[5],
        layout[6],
        layout[7],
        layout[8],
        layout[9],
        layout[10],
    )


def add_message_of_row(row: MessageRow) -> AddMessage:
    """The AddMessage a `MessageRow` stands for."""
    record: AddMessage = _new(AddMessage)
    (
        record.msg_id,
        record.address,
        record.durable,
        record.data,
        record.expiration_ms,
        record.first_ts,
        record.priority,
        record.header_end,
        record.head_end,
        record.header_count,
    ) = row
    return record


def row_of_add_message(record: AddMessage) -> MessageRow:
    """The `MessageRow` of an AddMessage record (`add_message_of_row` undone)."""
    return (
        record.msg_id,
        record.address,
        record.durable,
        record.data,
        record.expiration_ms,
        record.first_ts,
        record.priority,
        record.header_end,
        record.head_end,
        record.header_count,
    )


# An AddRef read at open as (msg_id, queue, delivery_count) (`add_ref_row`): no record
# object for the one record every queued message has (issue 23 item 4); the message id
# first, as in a `MessageLayout`, so that `row[0]` is the message id of either.
RefRow = tuple[int, str, int]


def add_ref_row(buf: Data, start: int, stop: int) -> RefRow | None:
    """The AddRef payload at `buf[start:stop]` as a `RefRow`, checked as the fast decoder
    checks it; None: for the full decoder."""
    try:
        if buf[start] != 3 or buf[start + 1] != _STR:
            return None
        end = start + 6 + _UNPACK_U32(buf, start + 2)[0]
        if stop != end + _TWO_INTS_SIZE:
            return None
        tag1: int
        msg_id: int
        tag2: int
        count: int
        tag1, msg_id, tag2, count = _UNPACK_TWO_INTS(buf, end)
        if tag1 != _INT or tag2 != _INT:
            return None
        return (msg_id, _string(buf[start + 6 : end]), count)
    except (IndexError, struct.error, UnicodeDecodeError):
        return None


def add_ref_of_row(row: RefRow) -> AddRef:
    """The AddRef a `RefRow` stands for."""
    return AddRef(queue=row[1], msg_id=row[0], delivery_count=row[2])


def _fast_decode_add_message(buf: Data, start: int, stop: int) -> Any:
    layout = add_message_layout(buf, start, stop)
    return None if layout is None else add_message_of(buf, layout)


_FAST_DECODE_AT: dict[int, Callable[[Data, int, int], Any]] = {
    RecordType.ADD_REF: _fast_decode_ref(AddRef),
    RecordType.UPDATE_DELIVERY_COUNT: _fast_decode_ref(UpdateDeliveryCount),
    RecordType.ACK_REF: _fast_decode_ack,
    RecordType.ADD_MESSAGE: _fast_decode_add_message,
}


def _whole(fast: Callable[[Data, int, int], Any]) -> Callable[[bytes], Any]:
    return lambda payload: fast(payload, 0, len(payload))


_FAST_DECODE: dict[int, Callable[[bytes], Any]] = {
    type_id: _whole(fast) for type_id, fast in _FAST_DECODE_AT.items()
}


def decode_at(type_id: int, buf: Data, start: int, stop: int) -> Record:
    """`decode(type_id, buf[start:stop])` without copying the payload out first (recovery
    reads records straight from a segment's bytes)."""
    fast = _FAST_DECODE_AT.get(type_id)
    if fast is not None:
        try:
            found: Record | None = fast(buf, start, stop)
        except (IndexError, struct.error, UnicodeDecodeError):
            found = None
        if found is not None:
            return found
    return decode_generic(type_id, buf[start:stop])


def decode(type_id: int, payload: bytes) -> Record:
    """The record of type `type_id` whose payload is `payload`.

    Raises:
        CodecError: unknown type id, malformed payload, or a required field is missing.
    """
    return decode_at(type_id, payload, 0, len(payload))


def decode_generic(type_id: int, payload: bytes) -> Record:
    """`decode` field by field, for any record (the fast paths must equal this)."""
    try:
        schema = _SCHEMAS[RecordType(type_id)]
    except ValueError:
        raise CodecError(f"unknown record type {type_id}") from None
    values = decode_values(payload)
    names = schema.names
    missing = [n for n in names[len(values) :] if n not in schema.defaults]
    if missing:
        raise CodecError(f"{schema.cls.__name__} payload lacks {', '.join(missing)}")
    kwargs = dict(zip(names, values, strict=False))  # extra trailing fields: a newer writer
    try:
        for name, convert in schema.converters.items():
            if name in kwargs:
                kwargs[name] = convert(kwargs[name])
        record: Record = schema.cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CodecError(f"bad {schema.cls.__name__} payload: {e}") from None
    for name, value in kwargs.items():
        if name in schema.hints and not _conforms(value, schema.hints[name]):
            kind = type(value).__name__
            raise CodecError(f"bad {schema.cls.__name__} payload: {name} is a {kind}")
    if isinstance(record, AddQueue) and (problem := _queue_extra_problem(record.extra)):
        raise CodecError(f"bad AddQueue payload: {problem}")
    return record
