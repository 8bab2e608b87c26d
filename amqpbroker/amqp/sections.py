"""Encoded AMQP 1.0 messages: find the sections, decode a few, re-encode the header.

Theory of operation
-------------------
The broker stores and forwards the bytes a producer sent (B-018). An encoded message is a
sequence of sections, each a described value `0x00 <descriptor> <value>`, in this order:
header, delivery-annotations, message-annotations, properties, application-properties,
body (data*, amqp-sequence* or one amqp-value), footer. Section codes 0x70..0x78 grow in
that order, which `scan` checks and `SectionReader` uses to stop early.

* `scan` walks the section boundaries once, reading only constructors and size fields
  (never the bytes of a body), decodes the tiny header list, cuts out delivery
  annotations (B-017) and records where the other sections are.
* `SectionReader` decodes properties, application-properties or message-annotations on
  demand (filters, moves, management); the hot path never calls it.
* `with_delivery_count` re-encodes only the header for a redelivery (B-050) and
  `rebuild` makes the dead-letter/expiry copy (B-076, B-083, B-090); every other byte is
  copied by slicing.

Values decode to plain Python where the AMQP type is unambiguous (string, binary, long,
double, boolean, null, uuid, list, map) and to thin subclasses otherwise (`Symbol` is a
`str`, `UInt` an `int`, ...). They compare equal to plain values, and `encode_value` writes
them back with their original AMQP type, so a decoded annotation survives a copy intact.

Errors: malformed input raises `SectionError` (a `ValueError`), never `IndexError` or
`struct.error`. Encoding a value that has no AMQP type, or is out of range for its
wrapper, raises `TypeError` or `ValueError`: that is a programming error, not bad input.

This module deliberately imports nothing from proton: it runs once per message. It is one
of the modules `setup.py` compiles with mypyc (issue 20): the value wrappers that subclass
built-in types are `native_class=False` there, plain Python classes.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, NamedTuple

from mypy_extensions import mypyc_attr  # a no-op in pure Python; see setup.py (issue 20)

__all__ = [
    "KEEP",
    "MAX_DEPTH",
    "PROPERTY_NAMES",
    "READER",
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Described",
    "Float32",
    "Header",
    "Int",
    "Keep",
    "Long",
    "Scanned",
    "SectionError",
    "SectionReader",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "decode_first",
    "decode_value",
    "delivery_count_header",
    "encode_annotations",
    "encode_header",
    "encode_value",
    "rebuild",
    "scan",
    "with_delivery_count",
]


class SectionError(ValueError):
    """The message bytes are not a well-formed sequence of AMQP sections.

    The producer link answers it with `rejected` and `amqp:decode-error`.
    """


# -- Typed wrappers: the AMQP types Python has no native type for -------------------------


@mypyc_attr(native_class=False)
class Symbol(str):
    """An AMQP symbol (ASCII); plain `str` encodes as an AMQP string."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


@mypyc_attr(native_class=False)
class Char(str):
    """An AMQP char: one Unicode code point."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Char({str.__repr__(self)})"


@mypyc_attr(native_class=False)
class _TypedInt(int):
    """An int that remembers its AMQP integer type; arithmetic gives plain ints."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int.__repr__(self)})"

    def __str__(self) -> str:  # the number, e.g. an event's amqp_message_id "5"
        return int.__repr__(self)


@mypyc_attr(native_class=False)
class UByte(_TypedInt):
    """AMQP ubyte (0..255)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class UShort(_TypedInt):
    """AMQP ushort (0..2**16-1)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class UInt(_TypedInt):
    """AMQP uint (0..2**32-1)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class ULong(_TypedInt):
    """AMQP ulong (0..2**64-1)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Byte(_TypedInt):
    """AMQP byte (-128..127)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Short(_TypedInt):
    """AMQP short (16-bit signed)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Int(_TypedInt):
    """AMQP int (32-bit signed)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Long(_TypedInt):
    """AMQP long, spelled out; a plain `int` encodes as long too and decodes as plain `int`."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Timestamp(_TypedInt):
    """AMQP timestamp: epoch milliseconds."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Float32(float):
    """AMQP float (32-bit); plain `float` encodes as double."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Float32({float.__repr__(self)})"


@mypyc_attr(native_class=False)
class _RawDecimal(bytes):
    """IEEE 754 decimal, kept as its encoded bytes: the broker never computes with it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({bytes.__repr__(self)})"


@mypyc_attr(native_class=False)
class Decimal32(_RawDecimal):
    """AMQP decimal32 (4 bytes)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Decimal64(_RawDecimal):
    """AMQP decimal64 (8 bytes)."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Decimal128(_RawDecimal):
    """AMQP decimal128 (16 bytes)."""

    __slots__ = ()


class Described(NamedTuple):
    """A described value other than a section (e.g. a JMS selector in an annotation)."""

    descriptor: Any
    value: Any


@mypyc_attr(native_class=False)
class Array(list[Any]):
    """An AMQP array: every element has one type, so the type travels with the list.

    `element_type` is a wrapper or Python type (`Symbol`, `int`, `UInt`, `str`, `dict`,
    ...); `descriptor` is set for arrays of described values. Compares equal to a list.
    """

    __slots__ = ("descriptor", "element_type")

    def __init__(self, items: Any = (), *, element_type: type[Any], descriptor: Any = None) -> None:
        super().__init__(items)
        self.element_type = element_type
        self.descriptor = descriptor

    def __repr__(self) -> str:
        described = "" if self.descriptor is None else f", descriptor={self.descriptor!r}"
        return f"Array({list.__repr__(self)}, element_type={self.element_type.__name__}{described})"


# -- Skipping values by their size fields ---------------------------------------------------

_U32: Final = struct.Struct(">I")
_U32X2: Final = struct.Struct(">II")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")

# _KIND[constructor]: >= 0 fixed width; -1 one-byte size; -4 four-byte size;
# -2 described; -3 not a valid constructor.
_FIXED_WIDTHS: Final = {
    **dict.fromkeys((0x40, 0x41, 0x42, 0x43, 0x44, 0x45), 0),
    **dict.fromkeys(range(0x50, 0x57), 1),
    **dict.fromkeys((0x60, 0x61), 2),
    **dict.fromkeys(range(0x70, 0x75), 4),
    **dict.fromkeys(range(0x80, 0x85), 8),
    **dict.fromkeys((0x94, 0x98), 16),
}
_SIZE8_CODES: Final = (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0)
_SIZE32_CODES: Final = (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0)


def _kind(code: int) -> int:
    if code in _FIXED_WIDTHS:
        return _FIXED_WIDTHS[code]
    if code in _SIZE8_CODES:
        return -1
    if code in _SIZE32_CODES:
        return -4
    return -2 if code == 0x00 else -3


_KIND: Final = tuple(_kind(code) for code in range(256))


def _skip(buf: bytes, pos: int, depth: int = 0) -> int:
    """End offset of the value at `pos`, from its constructor and size field alone."""
    kind = _KIND[buf[pos]]
    if kind >= 0:
        end = pos + 1 + kind
    elif kind == -1:
        end = pos + 2 + buf[pos + 1]
    elif kind == -4:  # the size by hand: compiled, C arithmetic (issue 20)
        end = pos + 5 + (buf[pos + 1] << 24 | buf[pos + 2] << 16 | buf[pos + 3] << 8 | buf[pos + 4])
    elif kind == -2:
        if depth >= MAX_DEPTH:
            raise _too_deep(pos)
        return _skip(buf, _skip(buf, pos + 1, depth + 1), depth + 1)
    else:
        raise SectionError(f"invalid constructor 0x{buf[pos]:02x} at offset {pos}")
    if end > len(buf):
        raise SectionError(f"value at offset {pos} runs past the end ({end} > {len(buf)})")
    return end


# -- Decoding values --------------------------------------------------------------------------

# Nesting limit: each list, map, array or described value opens one level; the value of a
# section is at level 0. Deeper input is refused with `SectionError` (issue 15), so no
# decoder, walker or later consumer (management JSON, event log) recurses without bound.
# Real messages nest a few levels; 32 leaves room and keeps recursion far below Python's.
MAX_DEPTH: Final = 32

# (buf, offset after the constructor, nesting level of the value) -> (value, end)
_Decoder = Callable[[bytes, int, int], tuple[Any, int]]


def _too_deep(pos: int) -> SectionError:
    return SectionError(f"value at offset {pos} nests deeper than {MAX_DEPTH} levels")


def _decode(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
    """The value at `pos` (at nesting level `depth`) and the offset after it."""
    decoder = _DECODERS[buf[pos]]
    if decoder is None:
        raise SectionError(f"invalid constructor 0x{buf[pos]:02x} at offset {pos}")
    return decoder(buf, pos + 1, depth)


def decode_first(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """The value at `pos` of `buf` and the offset after it (bytes may follow).

    Raises:
        SectionError: the value is malformed or nests deeper than `MAX_DEPTH`.
    """
    try:
        return _decode(buf, pos)
    except SectionError:
        raise
    except _MALFORMED as e:
        raise SectionError(f"malformed AMQP value: {e!r}") from None


def _constant(value: Any) -> _Decoder:
    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        return value, pos

    return decode


def _fixed(fmt: str, wrap: Callable[[Any], Any] | None) -> _Decoder:
    codec = struct.Struct(fmt)
    unpack, size = codec.unpack_from, codec.size
    if wrap is None:

        def decode_plain(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
            return unpack(buf, pos)[0], pos + size

        return decode_plain

    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        return wrap(unpack(buf, pos)[0]), pos + size

    return decode


def _raw(size: int, wrap: Callable[[bytes], Any]) -> _Decoder:
    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        end = pos + size
        if end > len(buf):
            raise SectionError(f"value at offset {pos - 1} runs past the end")
        return wrap(buf[pos:end]), end

    return decode


def _variable(size_width: int, convert: Callable[[bytes], Any]) -> _Decoder:
    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        if size_width == 1:
            start = pos + 1
            end = start + buf[pos]
        else:
            start = pos + 4
            end = start + _U32.unpack_from(buf, pos)[0]
        if end > len(buf):
            raise SectionError(f"value at offset {pos - 1} runs past the end")
        return convert(buf[start:end]), end

    return decode


def _compound_bounds(buf: bytes, pos: int, size_width: int) -> tuple[int, int, int]:
    """(count, first element offset, end) of a list, map or array; checks the size."""
    if size_width == 1:
        size = buf[pos]
        count = buf[pos + 1]
        first = pos + 2
        end = pos + 1 + size
    else:
        size, count = _U32X2.unpack_from(buf, pos)
        first = pos + 8
        end = pos + 4 + size
    if end > len(buf) or first > end:
        raise SectionError(f"compound at offset {pos - 1} has a bad size {size}")
    return count, first, end


def _elements(buf: bytes, pos: int, count: int, end: int, depth: int) -> list[Any]:
    """`count` values from `pos` at level `depth` + 1 (the compound holding them is at `depth`)."""
    if count > end - pos:  # every element takes at least its constructor byte
        raise SectionError(f"compound at offset {pos} claims {count} elements in {end - pos} bytes")
    if depth >= MAX_DEPTH:
        raise _too_deep(pos)
    items = []
    depth += 1
    for _ in range(count):
        value, pos = _decode(buf, pos, depth)
        items.append(value)
    if pos != end:
        raise SectionError(f"compound ends at offset {pos}, its size says {end}")
    return items


def _list_decoder(size_width: int) -> _Decoder:
    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        count, first, end = _compound_bounds(buf, pos, size_width)
        return _elements(buf, first, count, end, depth), end

    return decode


def _map_decoder(size_width: int) -> _Decoder:
    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        count, first, end = _compound_bounds(buf, pos, size_width)
        if count % 2:
            raise SectionError(f"map at offset {pos - 1} has an odd element count {count}")
        items = _elements(buf, first, count, end, depth)
        try:
            return dict(zip(items[::2], items[1::2], strict=True)), end
        except TypeError:
            raise SectionError(f"map at offset {pos - 1} has an unhashable key") from None

    return decode


def _array_decoder(size_width: int) -> _Decoder:
    def decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
        count, p, end = _compound_bounds(buf, pos, size_width)
        if depth >= MAX_DEPTH:
            raise _too_deep(pos - 1)
        depth += 1
        descriptor = None
        if buf[p] == 0x00:
            descriptor, p = _decode(buf, p + 1, depth)
        code = buf[p]
        decoder = _DECODERS[code]
        if decoder is None or code == 0x00:
            raise SectionError(f"invalid array element constructor 0x{code:02x} at offset {p}")
        p += 1
        # Zero-width elements (null, true, ...) would let a tiny array claim 2**32 of them.
        if count > max(end - p, 0) and (_KIND[code] != 0 or count > 0xFFFF):
            raise SectionError(f"array at offset {pos - 1} claims {count} elements")
        items = []
        for _ in range(count):
            value, p = decoder(buf, p, depth)
            items.append(value)
        if p != end:
            raise SectionError(f"array ends at offset {p}, its size says {end}")
        return Array(items, element_type=_ELEMENT_TYPES[code], descriptor=descriptor), end

    return decode


def _decode_described(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise _too_deep(pos - 1)
    descriptor, pos = _decode(buf, pos, depth + 1)
    value, pos = _decode(buf, pos, depth + 1)
    return Described(descriptor, value), pos


def _char(code_point: int) -> Char:
    return Char(chr(code_point))


def _ascii(raw: bytes) -> Symbol:
    return Symbol(raw.decode("ascii"))


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8")


def _bytes(raw: bytes) -> bytes:
    return bytes(raw)


def _empty_list(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
    return [], pos  # a fresh list each time: callers may mutate what they get


_DECODER_TABLE: Final[dict[int, _Decoder]] = {
    0x00: _decode_described,
    0x40: _constant(None),
    0x41: _constant(True),
    0x42: _constant(False),
    0x43: _constant(UInt(0)),
    0x44: _constant(ULong(0)),
    0x45: _empty_list,
    0x50: _fixed(">B", UByte),
    0x51: _fixed(">b", Byte),
    0x52: _fixed(">B", UInt),
    0x53: _fixed(">B", ULong),
    0x54: _fixed(">b", Int),
    0x55: _fixed(">b", None),
    0x56: _fixed(">?", None),
    0x60: _fixed(">H", UShort),
    0x61: _fixed(">h", Short),
    0x70: _fixed(">I", UInt),
    0x71: _fixed(">i", Int),
    0x72: _fixed(">f", Float32),
    0x73: _fixed(">I", _char),
    0x74: _raw(4, Decimal32),
    0x80: _fixed(">Q", ULong),
    0x81: _fixed(">q", None),
    0x82: _fixed(">d", None),
    0x83: _fixed(">q", Timestamp),
    0x84: _raw(8, Decimal64),
    0x94: _raw(16, Decimal128),
    0x98: _raw(16, lambda raw: uuid.UUID(bytes=bytes(raw))),
    0xA0: _variable(1, _bytes),
    0xA1: _variable(1, _utf8),
    0xA3: _variable(1, _ascii),
    0xB0: _variable(4, _bytes),
    0xB1: _variable(4, _utf8),
    0xB3: _variable(4, _ascii),
    0xC0: _list_decoder(1),
    0xC1: _map_decoder(1),
    0xD0: _list_decoder(4),
    0xD1: _map_decoder(4),
    0xE0: _array_decoder(1),
    0xF0: _array_decoder(4),
}
_DECODERS: Final = tuple(_DECODER_TABLE.get(code) for code in range(256))

_ELEMENT_TYPES: Final[dict[int, type[Any]]] = {
    0x40: type(None),
    **dict.fromkeys((0x41, 0x42, 0x56), bool),
    **dict.fromkeys((0x43, 0x52, 0x70), UInt),
    **dict.fromkeys((0x44, 0x53, 0x80), ULong),
    **dict.fromkeys((0x45, 0xC0, 0xD0), list),
    **dict.fromkeys((0x54, 0x71), Int),
    **dict.fromkeys((0x55, 0x81), int),
    0x50: UByte,
    0x51: Byte,
    0x60: UShort,
    0x61: Short,
    0x72: Float32,
    0x73: Char,
    0x74: Decimal32,
    0x82: float,
    0x83: Timestamp,
    0x84: Decimal64,
    0x94: Decimal128,
    0x98: uuid.UUID,
    **dict.fromkeys((0xA0, 0xB0), bytes),
    **dict.fromkeys((0xA1, 0xB1), str),
    **dict.fromkeys((0xA3, 0xB3), Symbol),
    **dict.fromkeys((0xC1, 0xD1), dict),
    **dict.fromkeys((0xE0, 0xF0), Array),
}

# What malformed input makes the stdlib raise (chr() of a huge char raises OverflowError).
_MALFORMED: Final = (IndexError, struct.error, ValueError, OverflowError, RecursionError)


def decode_value(buf: bytes) -> Any:
    """Decode `buf`, which must hold exactly one AMQP value (typed wrappers where needed)."""
    try:
        value, end = _decode(buf, 0)
    except SectionError:
        raise
    except _MALFORMED as e:
        raise SectionError(f"malformed AMQP value: {e!r}") from None
    if end != len(buf):
        raise SectionError(f"{len(buf) - end} bytes after the value")
    return value


# -- Encoding values --------------------------------------------------------------------------


def _enc_null(value: None) -> bytes:
    return b"\x40"


def _enc_bool(value: bool) -> bytes:
    return b"\x41" if value else b"\x42"


def _enc_long(value: int) -> bytes:
    if -128 <= value <= 127:
        return bytes((0x55, value & 0xFF))
    return b"\x81" + _I64.pack(value)


def _enc_int(value: int) -> bytes:
    if -128 <= value <= 127:
        return bytes((0x54, value & 0xFF))
    return b"\x71" + struct.pack(">i", value)


def _enc_uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if 0 < value < 256:
        return bytes((0x52, value))
    return b"\x70" + _U32.pack(value)


def _enc_ulong(value: int) -> bytes:
    if value == 0:
        return b"\x44"
    if 0 < value < 256:
        return bytes((0x53, value))
    return b"\x80" + _U64.pack(value)


def _packer(code: int, fmt: str) -> Callable[[Any], bytes]:
    prefix, pack = bytes((code,)), struct.Struct(fmt).pack

    def encode(value: Any) -> bytes:
        return prefix + pack(value)

    return encode


def _enc_char(value: str) -> bytes:
    if len(value) != 1:
        raise ValueError(f"a Char is one code point, not {value!r}")
    return b"\x73" + _U32.pack(ord(value))


def _raw_packer(code: int, size: int) -> Callable[[bytes], bytes]:
    prefix = bytes((code,))

    def encode(value: bytes) -> bytes:
        if len(value) != size:
            raise ValueError(f"{type(value).__name__} needs {size} bytes, got {len(value)}")
        return prefix + value

    return encode


def _enc_uuid(value: uuid.UUID) -> bytes:
    return b"\x98" + value.bytes


def _variable_frame(code8: int, code32: int, raw: bytes) -> bytes:
    if len(raw) < 256:
        return bytes((code8, len(raw))) + raw
    return bytes((code32,)) + _U32.pack(len(raw)) + raw


def _enc_binary(value: bytes) -> bytes:
    return _variable_frame(0xA0, 0xB0, bytes(value))


def _enc_string(value: str) -> bytes:
    return _variable_frame(0xA1, 0xB1, value.encode("utf-8"))


def _enc_symbol(value: str) -> bytes:
    return _variable_frame(0xA3, 0xB3, value.encode("ascii"))


def _compound_frame(code8: int, code32: int, count: int, body: bytes) -> bytes:
    if len(body) < 255 and count < 256:
        return bytes((code8, len(body) + 1, count)) + body
    return bytes((code32,)) + _U32X2.pack(len(body) + 4, count) + body


def _enc_list(value: list[Any]) -> bytes:
    if not value:
        return b"\x45"
    return _compound_frame(0xC0, 0xD0, len(value), b"".join(map(_encode, value)))


def _enc_map(value: Mapping[Any, Any]) -> bytes:
    body = b"".join(_encode(k) + _encode(v) for k, v in value.items())
    return _compound_frame(0xC1, 0xD1, 2 * len(value), body)


def _enc_described(value: Described) -> bytes:
    return b"\x00" + _encode(value.descriptor) + _encode(value.value)


def _array_body(element_type: type[Any], items: list[Any]) -> tuple[bytes, bytes]:
    """(element constructor, concatenated elements) of an array of `element_type`."""
    if element_type is type(None):
        return b"\x40", b""
    if element_type is bool:
        return b"\x56", bytes(1 if item else 0 for item in items)
    if element_type in _ARRAY_FIXED:
        code, fmt = _ARRAY_FIXED[element_type]
        pack = struct.Struct(fmt).pack
        if element_type is Char:
            return bytes((code,)), b"".join(pack(ord(item)) for item in items)
        return bytes((code,)), b"".join(pack(item) for item in items)
    if element_type in _ARRAY_RAW:
        code, size = _ARRAY_RAW[element_type]
        raws = [item.bytes if isinstance(item, uuid.UUID) else bytes(item) for item in items]
        if any(len(raw) != size for raw in raws):
            raise ValueError(f"every {element_type.__name__} needs {size} bytes")
        return bytes((code,)), b"".join(raws)
    if element_type in _ARRAY_VARIABLE:
        code8, code32, convert = _ARRAY_VARIABLE[element_type]
        raws = [convert(item) for item in items]
        if all(len(raw) < 256 for raw in raws):
            return bytes((code8,)), b"".join(bytes((len(raw),)) + raw for raw in raws)
        return bytes((code32,)), b"".join(_U32.pack(len(raw)) + raw for raw in raws)
    if element_type in _ARRAY_COMPOUND:
        # Compound elements share one constructor, so all take the 32-bit form.
        code = _ARRAY_COMPOUND[element_type]
        return bytes((code,)), b"".join(_encode_wide(item)[1:] for item in items)
    raise TypeError(f"cannot encode an AMQP array of {element_type.__name__}")


def _encode_wide(value: Any) -> bytes:
    """`value` as list32/map32/array32, the form array elements need."""
    if isinstance(value, Array):
        constructor, body = _array_body(value.element_type, value)
        if value.descriptor is not None:
            constructor = b"\x00" + _encode(value.descriptor) + constructor
        size = len(constructor) + len(body) + 4
        return b"\xf0" + _U32X2.pack(size, len(value)) + constructor + body
    if isinstance(value, list):
        body = b"".join(map(_encode, value))
        return b"\xd0" + _U32X2.pack(len(body) + 4, len(value)) + body
    if isinstance(value, Mapping):
        body = b"".join(_encode(k) + _encode(v) for k, v in value.items())
        return b"\xd1" + _U32X2.pack(len(body) + 4, 2 * len(value)) + body
    raise TypeError(f"array element {value!r} is not a list, map or array")


def _enc_array(value: Array) -> bytes:
    constructor, body = _array_body(value.element_type, value)
    if value.descriptor is not None:
        constructor = b"\x00" + _encode(value.descriptor) + constructor
    return _compound_frame(0xE0, 0xF0, len(value), constructor + body)


_ARRAY_COMPOUND: Final[dict[type[Any], int]] = {list: 0xD0, dict: 0xD1, Array: 0xF0}
_ARRAY_FIXED: Final[dict[type[Any], tuple[int, str]]] = {
    UByte: (0x50, ">B"),
    Byte: (0x51, ">b"),
    UShort: (0x60, ">H"),
    Short: (0x61, ">h"),
    UInt: (0x70, ">I"),
    Int: (0x71, ">i"),
    Float32: (0x72, ">f"),
    Char: (0x73, ">I"),
    ULong: (0x80, ">Q"),
    int: (0x81, ">q"),
    Long: (0x81, ">q"),
    float: (0x82, ">d"),
    Timestamp: (0x83, ">q"),
}
_ARRAY_RAW: Final[dict[type[Any], tuple[int, int]]] = {
    Decimal32: (0x74, 4),
    Decimal64: (0x84, 8),
    Decimal128: (0x94, 16),
    uuid.UUID: (0x98, 16),
}
_ARRAY_VARIABLE: Final[dict[type[Any], tuple[int, int, Callable[[Any], bytes]]]] = {
    bytes: (0xA0, 0xB0, bytes),
    str: (0xA1, 0xB1, lambda item: item.encode("utf-8")),
    Symbol: (0xA3, 0xB3, lambda item: item.encode("ascii")),
}

_ENCODERS: Final[dict[type[Any], Callable[[Any], bytes]]] = {
    type(None): _enc_null,
    bool: _enc_bool,
    int: _enc_long,
    Long: _enc_long,
    float: _packer(0x82, ">d"),
    str: _enc_string,
    bytes: _enc_binary,
    bytearray: _enc_binary,
    list: _enc_list,
    dict: _enc_map,
    Symbol: _enc_symbol,
    Char: _enc_char,
    UByte: _packer(0x50, ">B"),
    UShort: _packer(0x60, ">H"),
    UInt: _enc_uint,
    ULong: _enc_ulong,
    Byte: _packer(0x51, ">b"),
    Short: _packer(0x61, ">h"),
    Int: _enc_int,
    Timestamp: _packer(0x83, ">q"),
    Float32: _packer(0x72, ">f"),
    Decimal32: _raw_packer(0x74, 4),
    Decimal64: _raw_packer(0x84, 8),
    Decimal128: _raw_packer(0x94, 16),
    uuid.UUID: _enc_uuid,
    Described: _enc_described,
    Array: _enc_array,
}


def _encode(value: Any) -> bytes:
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        # Subclasses (IntEnum, OrderedDict, ...) encode as their nearest known base.
        for base in type(value).__mro__[1:]:
            if base in _ENCODERS:
                encoder = _ENCODERS[base]
                break
        else:
            if not isinstance(value, Mapping):
                raise TypeError(f"no AMQP encoding for {type(value).__name__}: {value!r}")
            encoder = _enc_map
    return encoder(value)


def encode_value(value: Any) -> bytes:
    """Encode one value, compactly: plain Python types by their natural AMQP type.

    `str` -> string, `int` -> long, `bool` -> boolean, `float` -> double, `bytes` ->
    binary, `None` -> null, `dict` -> map, `list` -> list, `uuid.UUID` -> uuid; the
    wrappers (`Symbol`, `UInt`, `Timestamp`, `Byte`, ...) say the AMQP type explicitly.

    Raises:
        TypeError: the value has no AMQP type.
        ValueError: it is out of range for its type (`UInt(-1)`, a non-ASCII `Symbol`).
    """
    try:
        return _encode(value)
    except (struct.error, OverflowError) as e:
        raise ValueError(f"cannot encode {value!r}: {e}") from None


def _annotation_key(key: Any) -> Symbol | ULong:
    if isinstance(key, str):
        return key if isinstance(key, Symbol) else Symbol(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return key if isinstance(key, ULong) else ULong(key)
    raise TypeError(f"annotation keys are symbols or ulongs, not {type(key).__name__}")


def encode_annotations(annotations: Mapping[Any, Any]) -> bytes:
    """An annotations map: `str` keys become symbols and `int` keys ulongs, as AMQP requires."""
    return encode_value({_annotation_key(k): v for k, v in annotations.items()})


# -- Sections ---------------------------------------------------------------------------------

# One `Final` each: compiled (setup.py), a C constant; a plain module name was a dict
# lookup at every use, ~17 a message in `scan` (issue 20).
HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74
DATA: Final = 0x75
AMQP_SEQUENCE: Final = 0x76
AMQP_VALUE: Final = 0x77
FOOTER: Final = 0x78

_SECTION_NAMES: Final = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
    b"amqp:amqp-value:*": AMQP_VALUE,
    b"amqp:footer:map": FOOTER,
}
_LISTS: Final = frozenset((0x45, 0xC0, 0xD0))
_MAPS: Final = frozenset((0xC1, 0xD1))
# (section code << 8 | value constructor) of every well-typed section; amqp-value takes any.
_SECTION_VALUES: Final = frozenset(
    code << 8 | constructor
    for code, constructors in (
        (HEADER, _LISTS),
        (DELIVERY_ANNOTATIONS, _MAPS),
        (MESSAGE_ANNOTATIONS, _MAPS),
        (PROPERTIES, _LISTS),
        (APPLICATION_PROPERTIES, _MAPS),
        (DATA, (0xA0, 0xB0)),
        (AMQP_SEQUENCE, _LISTS),
        (AMQP_VALUE, [c for c in range(256) if _KIND[c] != -3]),
        (FOOTER, _MAPS),
    )
    for constructor in constructors
)
# The same as a table indexed by ((code - HEADER) << 8 | constructor): compiled, a byte
# read, where the set's `in` boxes the key and hashes it (issue 20).
_SECTION_VALID: Final = bytes(
    1 if (HEADER + (key >> 8)) << 8 | (key & 0xFF) in _SECTION_VALUES else 0
    for key in range((FOOTER - HEADER + 1) << 8)
)
_SECTION_VALID_SIZE: Final = len(_SECTION_VALID)

PROPERTY_NAMES: Final = (
    "message-id",
    "user-id",
    "to",
    "subject",
    "reply-to",
    "correlation-id",
    "content-type",
    "content-encoding",
    "absolute-expiry-time",
    "creation-time",
    "group-id",
    "group-sequence",
    "reply-to-group-id",
)
_ABSOLUTE_EXPIRY_TIME: Final = PROPERTY_NAMES.index("absolute-expiry-time")


def _section_code(buf: bytes, pos: int) -> tuple[int, int]:
    """(section code, value offset) of the section starting at `pos`, any descriptor form."""
    if buf[pos] != 0x00:
        raise SectionError(f"expected a section (described value) at offset {pos}")
    form = buf[pos + 1]
    if form == 0x53:
        code, vpos = buf[pos + 2], pos + 3
    elif form == 0x80:
        code, vpos = _U64.unpack_from(buf, pos + 2)[0], pos + 10
    elif form in (0xA3, 0xB3):
        end = _skip(buf, pos + 1)
        start = pos + 3 if form == 0xA3 else pos + 6
        name = bytes(buf[start:end])
        code, vpos = _SECTION_NAMES.get(name, -1), end
        if code < 0:
            raise SectionError(f"unknown section descriptor {name!r} at offset {pos}")
    else:
        raise SectionError(f"invalid section descriptor constructor 0x{form:02x} at offset {pos}")
    if not HEADER <= code <= FOOTER:
        raise SectionError(f"unknown section descriptor 0x{code:x} at offset {pos}")
    return code, vpos


class Header(NamedTuple):
    """The header fields, defaults applied (priority 4, B-013; not durable, B-016)."""

    durable: bool = False
    priority: int = 4  # as sent (0..255); the effective priority caps it at 9 (B-013)
    ttl: int | None = None  # ms
    first_acquirer: bool | None = None  # None: absent, which means false
    delivery_count: int = 0


_NO_HEADER: Final = Header()


_CACHE_LIMIT: Final = 1024  # entries; then the cache starts over
_CACHE_MAX_KEY: Final = 48  # bytes; a real header is under 30, a padded one is not cached
# Above this many bytes, join memoryviews instead of concatenating slices: one copy, not two
# (measured: 1 MiB concatenated 1 ms, joined 40 us; 1 KiB concatenated is the faster).
_LARGE: Final = 4096
# Producers send few distinct headers (often just `durable`): memoize both directions.
# `Final`: compiled, the dicts are C statics, not module-dict lookups (issue 20).
_HEADERS: Final[dict[bytes, Header]] = {}  # encoded header list -> its fields
_REDELIVERY_HEADERS: Final[dict[tuple[bytes, int], bytes]] = {}  # (section, count) -> new one


def _decode_header(buf: bytes, vpos: int, end: int) -> Header:
    """The header list at `vpos` (memoized by its bytes)."""
    if buf[vpos] == 0x45:  # list0: every field absent (proton's encoders send one)
        return _NO_HEADER
    key = buf[vpos:end]
    if type(key) is not bytes:
        key = bytes(key)  # a bytearray slice is not hashable
    header = _HEADERS.get(key)
    if header is None:
        header = _parse_header(buf, vpos, end)
        if len(key) <= _CACHE_MAX_KEY:
            if len(_HEADERS) >= _CACHE_LIMIT:
                _HEADERS.clear()
            _HEADERS[key] = header
    return header


def _parse_header(buf: bytes, vpos: int, end: int) -> Header:
    """The header list at `vpos`; field types checked, since the core trusts them."""
    if buf[vpos] == 0x45:
        return _NO_HEADER
    fields, p = _decode(buf, vpos)
    if p != end or type(fields) is not list:
        raise SectionError("the header section is not a list")
    fields.extend((None,) * (5 - len(fields)))  # extra fields (a later AMQP version): ignored
    durable, priority, ttl, first_acquirer, delivery_count = fields[:5]
    if durable is None:
        durable = False
    elif type(durable) is not bool:
        raise SectionError(f"header durable is not a boolean: {durable!r}")
    if first_acquirer is not None and type(first_acquirer) is not bool:
        raise SectionError(f"header first-acquirer is not a boolean: {first_acquirer!r}")
    return Header(
        durable,
        4 if priority is None else _header_int("priority", priority, 0xFF),
        None if ttl is None else _header_int("ttl", ttl, 0xFFFFFFFF),
        first_acquirer,
        0 if delivery_count is None else _header_int("delivery-count", delivery_count, 0xFFFFFFFF),
    )


def _header_int(name: str, value: Any, limit: int) -> int:
    # Lenient about the integer type (some clients send int for ubyte), strict about range.
    if type(value) is bool or not isinstance(value, int) or not 0 <= value <= limit:
        raise SectionError(f"header {name} is not an unsigned integer <= {limit}: {value!r}")
    return int(value)


def encode_header(header: Header) -> bytes:
    """The header section, compactly: list8, defaults null, trailing defaults omitted.

    Raises:
        ValueError: priority is not 0..255, or ttl or delivery-count not a uint.
    """
    durable, priority, ttl, first_acquirer, delivery_count = header
    if delivery_count:
        count = 5
    elif first_acquirer:
        count = 4
    elif ttl is not None:
        count = 3
    elif priority != 4:
        count = 2
    elif durable:
        count = 1
    else:
        return b"\x00\x53\x70\x45"
    try:
        fields = [
            b"\x41" if durable else b"\x42",
            b"\x40" if priority == 4 else b"\x50" + bytes((priority,)),
            b"\x40" if ttl is None else _enc_uint(ttl),
            b"\x41" if first_acquirer else b"\x42",
            _enc_uint(delivery_count),
        ]
    except (struct.error, ValueError) as e:
        raise ValueError(f"header field out of range in {header}: {e}") from None
    body = b"".join(fields[:count])
    return b"\x00\x53\x70\xc0" + bytes((len(body) + 1, count)) + body


class Scanned:
    """What `scan` learned from one pass over the section boundaries.

    Offsets are into `data` (delivery annotations already removed); a section's
    (start, end) covers the whole section, descriptor included, so `data[start:end]` can
    be copied or replaced as a unit.

    A plain class, not a NamedTuple: compiled (setup.py), `scan` makes one with a direct
    call and its readers take a field at an offset, where the NamedTuple cost ~1.1k
    instructions a message to make (`tuple.__new__` of a subclass, issue 20).
    """

    __slots__ = (
        "absolute_expiry_time",
        "application_properties",
        "body_start",
        "data",
        "delivery_count",
        "durable",
        "first_acquirer",
        "group",
        "header_end",
        "message_annotations",
        "priority",
        "properties",
        "ttl",
    )

    def __init__(
        self,
        data: bytes,
        header_end: int,
        durable: bool,
        priority: int,
        ttl: int | None,
        delivery_count: int,
        first_acquirer: bool | None,
        message_annotations: tuple[int, int] | None,
        properties: tuple[int, int] | None,
        application_properties: tuple[int, int] | None,
        body_start: int,
        absolute_expiry_time: int | None,
        group: tuple[str, int] | None = None,
    ) -> None:
        self.data = data  # the message minus delivery annotations (the input object if none)
        self.header_end = header_end  # 0: no header section
        self.durable = durable
        self.priority = priority  # as sent; 4 when absent
        self.ttl = ttl  # ms
        self.delivery_count = delivery_count
        self.first_acquirer = first_acquirer
        self.message_annotations = message_annotations
        self.properties = properties
        self.application_properties = application_properties
        self.body_start = body_start  # the first body section, else the footer, else len(data)
        self.absolute_expiry_time = absolute_expiry_time  # properties field, epoch ms (B-080)
        # properties group-id and group-sequence (B-127), None: no group-id.
        self.group = group

    def fields(self) -> tuple[Any, ...]:
        """Every field, in the order `__init__` takes them."""
        return (
            self.data,
            self.header_end,
            self.durable,
            self.priority,
            self.ttl,
            self.delivery_count,
            self.first_acquirer,
            self.message_annotations,
            self.properties,
            self.application_properties,
            self.body_start,
            self.absolute_expiry_time,
            self.group,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scanned) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        pairs = zip(_SCANNED_FIELDS, self.fields(), strict=True)
        return "Scanned(" + ", ".join(f"{name}={value!r}" for name, value in pairs) + ")"

    def header(self) -> Header | None:
        """The header fields, or None when the message has no header section."""
        if not self.header_end:
            return None
        return Header(
            self.durable, self.priority, self.ttl, self.first_acquirer, self.delivery_count
        )

    def head_end(self) -> int:
        """Where the sections up to properties end: all the event log needs of a message
        (properties.message-id) unless it writes props or body_hash."""
        return head_end(self)


_SCANNED_FIELDS: Final = (
    "data",
    "header_end",
    "durable",
    "priority",
    "ttl",
    "delivery_count",
    "first_acquirer",
    "message_annotations",
    "properties",
    "application_properties",
    "body_start",
    "absolute_expiry_time",
    "group",
)


def head_end(scanned: Scanned) -> int:
    """`Scanned.head_end` as a module function: compiled, a direct call, where a
    NamedTuple's method is a generic method call (~600 instructions, issue 20)."""
    if (properties := scanned.properties) is not None:
        return properties[1]
    if (annotations := scanned.message_annotations) is not None:
        return annotations[1]
    return scanned.header_end


def _list_head(buf: bytes, vpos: int) -> tuple[int, int]:
    """(element count, offset of the first element) of the list at `vpos`; (0, vpos) for
    anything else (list0 or not a list)."""
    code = buf[vpos]
    if code == 0xC0:
        return buf[vpos + 2], vpos + 3
    if code == 0xD0:
        return _U32.unpack_from(buf, vpos + 5)[0], vpos + 9
    return 0, vpos


_TIMESTAMP_MIN: Final = -(2**63)  # an AMQP timestamp: i64 ms
_TIMESTAMP_MAX: Final = 2**63 - 1


def _absolute_expiry_time(buf: bytes, vpos: int, end: int) -> int | None:
    """Field 9 of the properties list, reached by skipping the first 8 (B-080)."""
    count, p = _list_head(buf, vpos)
    if count <= _ABSOLUTE_EXPIRY_TIME:
        return None
    for _ in range(_ABSOLUTE_EXPIRY_TIME):
        p = _skip(buf, p)
    value, p = _decode(buf, p)
    if p > end:
        raise SectionError("the properties list runs past its section")
    if value is None:
        return None
    if type(value) is bool or not isinstance(value, int):
        raise SectionError(f"absolute-expiry-time is not a timestamp: {value!r}")
    if not _TIMESTAMP_MIN <= value <= _TIMESTAMP_MAX:
        # A ulong past a timestamp (i64 ms) failed the journal's encoding, and with it
        # every durable send after it until a restart (issue 15 attack).
        raise SectionError(f"absolute-expiry-time is out of the timestamp range: {value!r}")
    return int(value)


_GROUP_ID: Final = PROPERTY_NAMES.index("group-id")


def _group(buf: bytes, vpos: int, end: int) -> tuple[str, int] | None:
    """(group-id, group-sequence), fields 11 and 12 of the properties list (B-127), or
    None without a group-id. A group-id that is not a string, or does not decode, is no
    group (as Artemis reads it; the message is not refused); a group-sequence that is not
    an integer counts as 0. `scan` calls this only for a list long enough to hold one."""
    count, p = _list_head(buf, vpos)
    if count <= _GROUP_ID:
        return None
    try:
        for _ in range(_GROUP_ID):
            p = _skip(buf, p)
        group_id, p = _decode(buf, p)
        if p > end or not isinstance(group_id, str):
            return None
        sequence = 0
        if count > _GROUP_ID + 1:
            value, p = _decode(buf, p)
            if p <= end and isinstance(value, int) and not isinstance(value, bool):
                sequence = int(value)
    except _MALFORMED:
        return None
    return group_id, sequence


# Constructors that open a nesting level: described, list8/32, map8/32, array8/32.
_NESTING: Final = (0x00, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0)
# Every byte that is not a nesting constructor: deleting them leaves one byte per candidate.
_NOT_NESTING: Final = bytes(b for b in range(256) if b not in _NESTING)
# 1 at each nesting constructor: indexing bytes is a C read when compiled, where `in` on
# the tuple boxes the byte and compares up to seven objects (issue 20).
_IS_NESTING: Final = bytes(1 if b in _NESTING else 0 for b in range(256))


def _compiled() -> bool:
    """Whether this module runs compiled (mypyc): its functions are then not `function`s."""
    return type(_compiled).__name__ != "function"


# Up to this many bytes a value's nesting constructors are counted by a loop when compiled
# (~70 instructions a byte), above it by `translate` (a copy, a table and a pass: ~2.7k
# instructions for a 33-byte application-properties map, issue 20). Interpreted, the loop
# costs ~350 a byte: `translate` always.
_COUNT_BY_LOOP: Final = 128 if _compiled() else 0


def _check_nesting(buf: bytes, vpos: int, end: int) -> None:
    """Refuse a section value that nests deeper than `MAX_DEPTH` (issue 15).

    Each level needs one of the `_NESTING` constructor bytes, so a value with fewer than
    `MAX_DEPTH` of them in its bytes cannot be too deep: counting them is one C pass
    (`translate` deleting every other byte; seven `count` passes cost ~14k instructions a
    message, issue 20), and only the rare value with that many is walked (no decoding).
    """
    if not _IS_NESTING[buf[vpos]] or end - vpos < MAX_DEPTH:  # too short to be too deep
        return  # (a durable message's header: no counting per message, issue 20)
    if _COUNT_BY_LOOP and _flat(buf, vpos, end):
        return  # one level: a list or map of scalars (most application-properties)
    if end - vpos <= _COUNT_BY_LOOP:
        table = _IS_NESTING
        count = 0
        for i in range(vpos, end):
            count += table[buf[i]]
        if count < MAX_DEPTH:
            return
    elif len(buf[vpos:end].translate(None, _NOT_NESTING)) < MAX_DEPTH:
        return
    if _walk(buf, vpos, 0) != end:
        raise SectionError(f"section value at offset {vpos} does not end at {end}")


def _flat(buf: bytes, vpos: int, end: int) -> bool:
    """Whether the value at `vpos` is a list or map (8- or 32-bit) whose elements, read by
    their constructors and sizes, are scalars that end exactly at `end`: one nesting
    level, so not too deep, and well formed as `_walk` would find it. A step an element
    where the count is a step a byte (the load generator's properties map of two strings
    and two longs, a map32 as proton-c writes maps: ~2.4k instructions counted, issue
    20); anything else (nesting, an invalid or truncated element) is False and left to
    the count and the walk."""
    code = buf[vpos]
    if code == 0xC1 or code == 0xC0:
        if vpos + 2 + buf[vpos + 1] != end:
            return False
        count = buf[vpos + 2]
        p = vpos + 3
    elif code == 0xD1 or code == 0xD0:
        size = buf[vpos + 1] << 24 | buf[vpos + 2] << 16 | buf[vpos + 3] << 8 | buf[vpos + 4]
        if vpos + 5 + size != end or size < 4:
            return False
        count = buf[vpos + 5] << 24 | buf[vpos + 6] << 16 | buf[vpos + 7] << 8 | buf[vpos + 8]
        p = vpos + 9
    else:
        return False
    if count > end - p:
        return False  # (every element takes at least its constructor byte)
    kinds, nesting = _KIND, _IS_NESTING
    for _ in range(count):
        if p >= end:
            return False
        element = buf[p]
        kind = kinds[element]
        if kind >= 0:
            p += 1 + kind
        elif kind == -1 and not nesting[element] and p + 1 < end:
            p += 2 + buf[p + 1]
        elif kind == -4 and not nesting[element] and p + 4 < end:
            p += 5 + (buf[p + 1] << 24 | buf[p + 2] << 16 | buf[p + 3] << 8 | buf[p + 4])
        else:
            return False  # described, nesting, invalid or truncated
    return p == end


def _walk(buf: bytes, pos: int, depth: int) -> int:
    """End of the value at `pos` (level `depth`), descending into every nested value."""
    code = buf[pos]
    if code == 0x00:
        if depth >= MAX_DEPTH:
            raise _too_deep(pos)
        return _walk(buf, _walk(buf, pos + 1, depth + 1), depth + 1)
    return _walk_body(buf, pos + 1, code, depth)


def _walk_body(buf: bytes, pos: int, code: int, depth: int) -> int:
    """End of the value of constructor `code` whose bytes start at `pos` (arrays share one)."""
    if code not in _NESTING:
        kind = _KIND[code]
        if kind >= 0:
            end = pos + kind
        elif kind == -1:
            end = pos + 1 + buf[pos]
        elif kind == -4:
            end = pos + 4 + _U32.unpack_from(buf, pos)[0]
        else:
            raise SectionError(f"invalid constructor 0x{code:02x} at offset {pos - 1}")
        if end > len(buf):
            raise SectionError(f"value at offset {pos - 1} runs past the end")
        return end
    count, p, end = _compound_bounds(buf, pos, 1 if code in (0xC0, 0xC1, 0xE0) else 4)
    if depth >= MAX_DEPTH:
        raise _too_deep(pos - 1)
    depth += 1
    if code in (0xE0, 0xF0):
        if buf[p] == 0x00:
            p = _walk(buf, p + 1, depth)
        element = buf[p]
        p += 1
        if _KIND[element] >= 0 and element not in _NESTING:
            p += count * _KIND[element]  # fixed width: no need to visit each one
        elif count > end - p:
            raise SectionError(f"array at offset {pos - 1} claims {count} elements")
        else:
            for _ in range(count):
                p = _walk_body(buf, p, element, depth)
    else:
        if count > end - p:
            raise SectionError(f"compound at offset {pos - 1} claims {count} elements")
        for _ in range(count):
            p = _walk(buf, p, depth)
    if p != end:
        raise SectionError(f"compound at offset {pos - 1} ends at {p}, its size says {end}")
    return end


def scan(raw: bytes) -> Scanned:
    """Find the sections of an incoming message in one pass; decode only the header.

    Delivery annotations are cut out (B-017). Sections must come in the AMQP order, with
    data or amqp-sequence the only repeatable ones and one kind of body.

    Raises:
        SectionError: the bytes are not a well-formed message.
    """
    n = len(raw)
    pos = 0
    # The highest section code seen so far; any body section sets it to AMQP_VALUE, so
    # the only code allowed below it is a repeat of a data or amqp-sequence body.
    rank = 0
    header = _NO_HEADER
    header_end = da_start = da_end = 0
    ma = props = ap = expiry = group = None
    body_start = footer_start = -1
    body_code = 0
    kinds, valid = _KIND, _SECTION_VALID
    try:
        while pos < n:
            if raw[pos + 1] == 0x53 and raw[pos] == 0x00:
                code = raw[pos + 2]
                vpos = pos + 3
            else:
                code, vpos = _section_code(raw, pos)
            constructor = raw[vpos]
            kind = kinds[constructor]
            if kind == -4:
                # The size, big-endian, by hand: compiled, C arithmetic (issue 20), where
                # a struct call was ~850 instructions.
                end = (
                    vpos
                    + 5
                    + (
                        raw[vpos + 1] << 24
                        | raw[vpos + 2] << 16
                        | raw[vpos + 3] << 8
                        | raw[vpos + 4]
                    )
                )
            elif kind == -1:
                end = vpos + 2 + raw[vpos + 1]
            else:
                end = _skip(raw, vpos)
            if end > n:
                raise SectionError(f"section at offset {pos} runs past the end ({end} > {n})")
            key = (code - HEADER) << 8 | constructor
            if not (0 <= key < _SECTION_VALID_SIZE and valid[key]):
                raise _bad_section(code, constructor, pos)
            if code != DATA and _IS_NESTING[constructor] and end - vpos >= MAX_DEPTH:
                _check_nesting(raw, vpos, end)  # (the call only for what could be deep)
            if code > rank:
                if code <= APPLICATION_PROPERTIES:
                    rank = code
                    if code == APPLICATION_PROPERTIES:
                        ap = (pos, end)
                    elif code == HEADER:
                        header = _decode_header(raw, vpos, end)
                        header_end = end
                    elif code == PROPERTIES:
                        props = (pos, end)
                        # A list8 that ends before absolute-expiry-time (most messages:
                        # encoders drop trailing nulls) has none of the fields read here;
                        # one that ends before group-id has no group (B-127).
                        if raw[vpos] != 0xC0 or raw[vpos + 2] > _ABSOLUTE_EXPIRY_TIME:
                            expiry = _absolute_expiry_time(raw, vpos, end)
                            if raw[vpos] != 0xC0 or raw[vpos + 2] > _GROUP_ID:
                                group = _group(raw, vpos, end)
                    elif code == MESSAGE_ANNOTATIONS:
                        ma = (pos, end)
                    else:
                        da_start, da_end = pos, end
                elif code == FOOTER:
                    footer_start = pos
                    rank = FOOTER
                else:
                    body_start, body_code, rank = pos, code, AMQP_VALUE
            elif code != body_code or rank != AMQP_VALUE or code == AMQP_VALUE:
                raise SectionError(f"section 0x{code:x} out of order at offset {pos}")
            pos = end
    except SectionError:
        raise
    except _MALFORMED as e:
        raise SectionError(f"truncated or malformed message: {e!r}") from None
    if body_start < 0:
        body_start = footer_start if footer_start >= 0 else n
    data = raw
    if da_end:
        # Every section after delivery annotations moves back by their length.
        cut = da_end - da_start
        if n > _LARGE:
            view = memoryview(raw)
            data = b"".join((view[:da_start], view[da_end:]))
        else:
            data = raw[:da_start] + raw[da_end:]
        body_start -= cut
        if ma is not None:
            ma = (ma[0] - cut, ma[1] - cut)
        if props is not None:
            props = (props[0] - cut, props[1] - cut)
        if ap is not None:
            ap = (ap[0] - cut, ap[1] - cut)
    durable, priority, ttl, first_acquirer, delivery_count = header
    return Scanned(
        data,
        header_end,
        durable,
        priority,
        ttl,
        delivery_count,
        first_acquirer,
        ma,
        props,
        ap,
        body_start,
        expiry,
        group,
    )


def _bad_section(code: int, constructor: int, pos: int) -> SectionError:
    if not HEADER <= code <= FOOTER:
        return SectionError(f"unknown section descriptor 0x{code:x} at offset {pos}")
    return SectionError(
        f"section 0x{code:x} at offset {pos} has a value of type 0x{constructor:02x}"
    )


def _find_section(data: bytes, wanted: int) -> tuple[int, int] | None:
    """(value offset, end) of the section `wanted`, walking boundaries only."""
    pos, n = 0, len(data)
    while pos < n:
        code, vpos = _section_code(data, pos)
        end = _skip(data, vpos)
        if code == wanted:
            return vpos, end
        if code > wanted:  # sections come in code order: it is not there
            return None
        pos = end
    return None


def _decode_section(data: bytes, wanted: int, allowed: frozenset[int]) -> Any:
    """The decoded value of section `wanted`, or None when the message has none."""
    try:
        found = _find_section(data, wanted)
        if found is None:
            return None
        vpos, end = found
        if data[vpos] not in allowed:
            raise SectionError(f"section 0x{wanted:x} has a value of type 0x{data[vpos]:02x}")
        value, p = _decode(data, vpos)
    except SectionError:
        raise
    except _MALFORMED as e:
        raise SectionError(f"malformed section 0x{wanted:x}: {e!r}") from None
    if p != end:
        raise SectionError(f"section 0x{wanted:x} ends at {p}, its value says {end}")
    return value


class SectionReader:
    """Decodes one section of a stored message on demand (the core's `SectionReader`).

    Filters, moves and management need these values; the hot path does not, which is why
    `scan` leaves them encoded. Values keep their AMQP type through the wrapper classes.
    """

    __slots__ = ()

    def header(self, data: bytes) -> Header | None:
        """The header fields, or None when there is no header section."""
        try:
            found = _find_section(data, HEADER)
            if found is None:
                return None
            if data[found[0]] not in _LISTS:
                raise SectionError("the header section is not a list")
            return _decode_header(data, *found)
        except SectionError:
            raise
        except _MALFORMED as e:
            raise SectionError(f"malformed header: {e!r}") from None

    def properties(self, data: bytes) -> dict[str, Any]:
        """The properties present (non-null), keyed by AMQP field name (`message-id`, ...)."""
        fields = _decode_section(data, PROPERTIES, _LISTS) or ()
        return {
            name: value
            for name, value in zip(PROPERTY_NAMES, fields, strict=False)
            if value is not None
        }

    def application_properties(self, data: bytes) -> dict[str, Any]:
        """The application-properties map ({} when absent)."""
        value: dict[str, Any] = _decode_section(data, APPLICATION_PROPERTIES, _MAPS) or {}
        return value

    def message_annotations(self, data: bytes) -> dict[str, Any]:
        """The message-annotations map ({} when absent); symbol keys are `Symbol` (a str)."""
        value: dict[str, Any] = _decode_section(data, MESSAGE_ANNOTATIONS, _MAPS) or {}
        return value


READER: Final = SectionReader()


# -- Re-encoding ------------------------------------------------------------------------------


def with_delivery_count(data: bytes, header_end: int, delivery_count: int) -> bytes:
    """`data` with its header re-encoded to carry `delivery_count` (B-050).

    `header_end` is `Scanned.header_end` (0: no header; a header holding only the count is
    prepended). durable, priority and ttl stay as the producer sent them; first-acquirer
    too, except that true becomes false on a redelivery (`delivery_count` > 0). Every byte
    after the header is reused as is.

    Raises:
        SectionError: `data[:header_end]` is not a header section.
    """
    new = delivery_count_header(data, header_end, delivery_count)
    if new is None:
        return data
    if len(data) - header_end > _LARGE:
        return b"".join((new, memoryview(data)[header_end:]))
    return new + data[header_end:]


def delivery_count_header(data: bytes, header_end: int, delivery_count: int) -> bytes | None:
    """The header section that replaces `data[:header_end]` for `with_delivery_count`, or
    None when `data` goes as it is (no header and a count of 0). For a sender that writes
    it and `data[header_end:]` one after the other (`pnloop.send_headed`): no joined copy
    of the message (issue 20).

    Raises:
        SectionError: `data[:header_end]` is not a header section.
    """
    if not header_end:
        if not delivery_count:
            return None  # no header already means delivery-count 0
        if delivery_count < _BARE_COUNTS:
            return _BARE_HEADERS[delivery_count]
    elif header_end == 4 and delivery_count < _BARE_COUNTS and data[3] == 0x45:
        # An empty header (00 53 70 45: list0, every field absent), what proton's
        # encoders send for default fields: it becomes the count alone. Issue 20: the
        # general path's cache key (a slice and a tuple) cost ~1k instructions.
        return _BARE_HEADERS[delivery_count]
    old = data[:header_end]
    if type(old) is not bytes:
        old = bytes(old)  # a bytearray slice is not hashable
    key = (old, delivery_count)
    new = _REDELIVERY_HEADERS.get(key)
    if new is None:
        new = _redelivery_header(old, delivery_count)
        if len(old) <= _CACHE_MAX_KEY:
            if len(_REDELIVERY_HEADERS) >= _CACHE_LIMIT:
                _REDELIVERY_HEADERS.clear()
            _REDELIVERY_HEADERS[key] = new
    return new


# The header a message without one gets for a redelivery with count n < _BARE_COUNTS:
# only the count (B-050), as `_redelivery_header(b"", n)` builds it.
_BARE_COUNTS: Final = 16
_BARE_HEADERS: Final[tuple[bytes, ...]] = tuple(
    encode_header(Header(delivery_count=n)) for n in range(_BARE_COUNTS)
)


def _redelivery_header(old: bytes, delivery_count: int) -> bytes:
    """The header section `old` (b"": none) re-encoded with `delivery_count` (B-050)."""
    if not old:
        return encode_header(Header(delivery_count=delivery_count))
    try:
        code, vpos = _section_code(old, 0)
        if code != HEADER or old[vpos] not in _LISTS:
            raise SectionError(f"no header section in the first {len(old)} bytes")
        header = _decode_header(old, vpos, len(old))
    except SectionError:
        raise
    except _MALFORMED as e:
        raise SectionError(f"malformed header: {e!r}") from None
    first_acquirer = header.first_acquirer
    if delivery_count and first_acquirer:
        first_acquirer = False  # B-050: never first-acquirer=true on a redelivery
    durable, priority, ttl = header.durable, header.priority, header.ttl
    return encode_header(Header(durable, priority, ttl, first_acquirer, delivery_count))


class Keep(enum.Enum):
    """Type of `KEEP`: "leave this section as it is" in `rebuild`."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP


def _coerce_message_id(value: Any) -> Any:
    if isinstance(value, (str, bytes, uuid.UUID)) or type(value) is ULong:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return ULong(value)
    raise TypeError(f"a message id is a ulong, uuid, binary or string, not {value!r}")


def _coerce_as(kind: type[Any], base: type[Any]) -> Callable[[Any], Any]:
    def coerce(value: Any) -> Any:
        if type(value) is bool or not isinstance(value, base):
            raise TypeError(f"expected {base.__name__} for an AMQP {kind.__name__}, got {value!r}")
        return value if type(value) is kind else kind(value)

    return coerce


# The AMQP type of each properties field, by position (AMQP 1.0 section 3.2.4).
_PROPERTY_COERCIONS: Final[tuple[Callable[[Any], Any], ...]] = (
    _coerce_message_id,
    _coerce_as(bytes, bytes),
    _coerce_as(str, str),
    _coerce_as(str, str),
    _coerce_as(str, str),
    _coerce_message_id,
    _coerce_as(Symbol, str),
    _coerce_as(Symbol, str),
    _coerce_as(Timestamp, int),
    _coerce_as(Timestamp, int),
    _coerce_as(str, str),
    _coerce_as(UInt, int),
    _coerce_as(str, str),
)


def _property_fields(data: bytes, where: tuple[int, int] | None) -> list[bytes]:
    """The encoded fields of the properties section at `where` (no section: none)."""
    if where is None:
        return []
    try:
        _, vpos = _section_code(data, where[0])
        if data[vpos] == 0x45:
            return []
        count, p, end = _compound_bounds(data, vpos + 1, 1 if data[vpos] == 0xC0 else 4)
        if count > end - p:
            raise SectionError(f"properties list claims {count} fields in {end - p} bytes")
        fields = []
        for _ in range(count):
            field_end = _skip(data, p)
            fields.append(data[p:field_end])
            p = field_end
    except SectionError:
        raise
    except _MALFORMED as e:
        raise SectionError(f"malformed properties section: {e!r}") from None
    if p != end:
        raise SectionError("the properties list does not fill its section")
    return fields


def _updated_properties(
    data: bytes, where: tuple[int, int] | None, update: Mapping[str, Any]
) -> bytes:
    """The properties section with `update` applied; other fields are copied as encoded."""
    fields = _property_fields(data, where)  # later-version extra fields are kept too
    fields.extend([b"\x40"] * (len(PROPERTY_NAMES) - len(fields)))
    for name, value in update.items():
        try:
            index = PROPERTY_NAMES.index(name)
        except ValueError:
            raise ValueError(f"unknown properties field {name!r}") from None
        if value is None:
            fields[index] = b"\x40"
        else:
            fields[index] = encode_value(_PROPERTY_COERCIONS[index](value))
    while fields and fields[-1] == b"\x40":
        fields.pop()
    if not fields:
        return b""  # an all-null properties section says nothing: leave it out
    return b"\x00\x53\x73" + _compound_frame(0xC0, 0xD0, len(fields), b"".join(fields))


def rebuild(
    data: bytes,
    *,
    header: Header | Literal[Keep.KEEP] | None = KEEP,
    message_annotations: Mapping[Any, Any] | Literal[Keep.KEEP] | None = KEEP,
    properties_update: Mapping[str, Any] | None = None,
    application_properties: Mapping[str, Any] | Literal[Keep.KEEP] = KEEP,
) -> bytes:
    """A copy of the message with header, message-annotations or properties fields replaced.

    For the dead-letter/expiry copy (B-076, B-090) and a changed expiration (B-083).
    `header`: new fields, None to drop the section, `KEEP` to copy it. `message_annotations`:
    the complete new map (keys written as symbols), None to drop the section, `KEEP` to
    copy it. `properties_update`: field name -> new value, None removing the field
    (`{"absolute-expiry-time": None}`); the section is created or dropped as needed, other
    fields are copied as encoded. `application_properties`: the complete new map (the
    group-first-key of B-127), or `KEEP`. Delivery annotations are dropped (B-017);
    application-properties (when kept), body and footer are copied byte for byte.

    Raises:
        SectionError: `data` is not a well-formed message.
        TypeError, ValueError: a new value has no AMQP encoding for its field.
    """
    scanned = scan(data)
    data = scanned.data
    parts: list[bytes | memoryview] = []
    if header is KEEP:
        parts.append(data[: scanned.header_end])
    elif header is not None:
        parts.append(encode_header(header))
    ma = scanned.message_annotations
    if message_annotations is KEEP:
        if ma is not None:
            parts.append(data[ma[0] : ma[1]])
    elif message_annotations is not None:
        parts.append(b"\x00\x53\x72" + encode_annotations(message_annotations))
    props = scanned.properties
    if properties_update:
        parts.append(_updated_properties(data, props, properties_update))
    elif props is not None:
        parts.append(data[props[0] : props[1]])
    ap = scanned.application_properties
    if application_properties is KEEP:
        parts.append(memoryview(data)[ap[0] if ap is not None else scanned.body_start :])
    else:
        parts.append(b"\x00\x53\x74" + encode_value(dict(application_properties)))
        parts.append(memoryview(data)[scanned.body_start :])
    return b"".join(parts)
