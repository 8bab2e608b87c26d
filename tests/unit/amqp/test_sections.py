"""The section codec (amqp/sections.py), checked against Qpid Proton as the oracle.

Proton encodes the messages, splits them into sections and decodes what we produce; our
codec must agree with it on boundaries, field values and exact AMQP types.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import struct
import uuid
from typing import Any

import proton
import pytest
from proton import UNDESCRIBED, Data

from amqpbroker.amqp.sections import (
    KEEP,
    MAX_DEPTH,
    READER,
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float32,
    Header,
    Int,
    Long,
    Scanned,
    SectionError,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    _check_nesting,
    _flat,
    _walk,
    decode_value,
    encode_annotations,
    encode_header,
    encode_value,
    head_end,
    rebuild,
    scan,
    with_delivery_count,
)

HEADER, DA, MA, PROPS, AP, DATA, SEQUENCE, VALUE, FOOTER = range(0x70, 0x79)
_SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DA,
    "amqp:message-annotations:map": MA,
    "amqp:properties:list": PROPS,
    "amqp:application-properties:map": AP,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": SEQUENCE,
    "amqp:amqp-value:*": VALUE,
    "amqp:footer:map": FOOTER,
}
PROPERTY_NAMES = (
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


# -- Proton as the oracle -------------------------------------------------------------------


def _materialize(value: Any) -> Any:
    """Copy proton's binaries out of its buffer: its memoryviews dangle once Data is freed."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, proton.Described):
        return proton.Described(_materialize(value.descriptor), _materialize(value.value))
    if isinstance(value, proton.Array):
        return proton.Array(value.descriptor, value.type, *map(_materialize, value.elements))
    if isinstance(value, dict):
        return {_materialize(k): _materialize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_materialize(item) for item in value]
    return value


def _proton_decode(encoded: bytes) -> Any:
    """Proton's decoding of one value, which must fill `encoded` exactly."""
    data = Data()
    assert data.decode(encoded) == len(encoded)
    data.rewind()
    data.next()
    return _materialize(data.get_object())


def _proton_encode(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def _section(code: int, value: Any) -> bytes:
    """A section encoded by proton (smallulong descriptor)."""
    return _proton_encode(proton.Described(proton.ulong(code), value))


def _split(raw: bytes) -> list[tuple[int, bytes]]:
    """Proton's view of `raw`: its sections as (code, encoded bytes)."""
    sections = []
    pos = 0
    while pos < len(raw):
        data = Data()
        used = data.decode(raw[pos:])
        data.rewind()
        data.next()
        descriptor = data.get_object().descriptor
        code = _SECTION_NAMES[descriptor] if isinstance(descriptor, str) else int(descriptor)
        sections.append((code, raw[pos : pos + used]))
        pos += used
    return sections


def _section_value(section: bytes) -> Any:
    return _proton_decode(section).value


def _proton_message(raw: bytes) -> proton.Message:
    message = proton.Message()
    message.decode(raw)
    return message


_PROTON_TYPES: dict[type[Any], type[Any]] = {
    proton.symbol: Symbol,
    proton.ulong: ULong,
    proton.uint: UInt,
    proton.ushort: UShort,
    proton.ubyte: UByte,
    proton.byte: Byte,
    proton.short: Short,
    proton.int32: Int,
    proton.float32: Float32,
    proton.timestamp: Timestamp,
    proton.char: Char,
    proton.decimal32: Decimal32,
    proton.decimal64: Decimal64,
    proton.decimal128: Decimal128,
    proton.Described: Described,
    proton.Array: Array,
    proton.AnnotationDict: dict,
    proton.PropertyDict: dict,
    uuid.UUID: uuid.UUID,
    int: int,
    float: float,
    str: str,
    bytes: bytes,
    bool: bool,
    type(None): type(None),
    list: list,
    dict: dict,
}
_PROTON_ELEMENT_TYPES: dict[int, type[Any]] = {
    Data.NULL: type(None),
    Data.BOOL: bool,
    Data.UBYTE: UByte,
    Data.BYTE: Byte,
    Data.USHORT: UShort,
    Data.SHORT: Short,
    Data.UINT: UInt,
    Data.INT: Int,
    Data.CHAR: Char,
    Data.ULONG: ULong,
    Data.LONG: int,
    Data.TIMESTAMP: Timestamp,
    Data.FLOAT: Float32,
    Data.DOUBLE: float,
    Data.DECIMAL32: Decimal32,
    Data.DECIMAL64: Decimal64,
    Data.DECIMAL128: Decimal128,
    Data.UUID: uuid.UUID,
    Data.BINARY: bytes,
    Data.STRING: str,
    Data.SYMBOL: Symbol,
    Data.LIST: list,
    Data.MAP: dict,
    Data.ARRAY: Array,
}


def _assert_like(mine: Any, theirs: Any) -> None:
    """`mine` has proton's value and the same AMQP type, all the way down."""
    assert type(mine) is _PROTON_TYPES[type(theirs)], (mine, theirs)
    if isinstance(theirs, proton.Described):
        _assert_like(mine.descriptor, theirs.descriptor)
        _assert_like(mine.value, theirs.value)
    elif isinstance(theirs, proton.Array):
        assert mine.element_type is _PROTON_ELEMENT_TYPES[theirs.type]
        if theirs.descriptor is UNDESCRIBED:
            assert mine.descriptor is None
        else:
            _assert_like(mine.descriptor, theirs.descriptor)
        assert len(mine) == len(theirs.elements)
        for m, t in zip(mine, theirs.elements, strict=True):
            _assert_like(m, t)
    elif isinstance(theirs, dict):
        assert len(mine) == len(theirs)
        for (mk, mv), (tk, tv) in zip(mine.items(), theirs.items(), strict=True):
            _assert_like(mk, tk)
            _assert_like(mv, tv)
    elif isinstance(theirs, list):
        assert len(mine) == len(theirs)
        for m, t in zip(mine, theirs, strict=True):
            _assert_like(m, t)
    elif isinstance(theirs, proton.decimal32 | proton.decimal64 | proton.decimal128):
        # proton keeps decimal32/64 as int and decimal128 as bytes; we keep all as bytes.
        assert (bytes(mine) if isinstance(theirs, bytes) else int.from_bytes(mine)) == theirs
    else:
        assert mine == theirs


# -- Values -----------------------------------------------------------------------------------

_ZOO: list[Any] = [
    None,
    True,
    False,
    proton.ubyte(0),
    proton.ubyte(255),
    proton.byte(-128),
    proton.byte(127),
    proton.ushort(65535),
    proton.short(-32768),
    proton.uint(0),
    proton.uint(200),
    proton.uint(2**32 - 1),
    proton.int32(-1),
    proton.int32(1000),
    proton.int32(-(2**31)),
    proton.ulong(0),
    proton.ulong(255),
    proton.ulong(2**64 - 1),
    0,
    -1,
    127,
    -129,
    2**63 - 1,
    -(2**63),
    proton.float32(1.5),
    2.25,
    proton.timestamp(1_700_000_000_123),
    proton.char("é"),
    proton.char("\U0001f600"),
    proton.decimal32(1),
    proton.decimal64(2),
    proton.decimal128(3),
    uuid.UUID(int=0x1234_5678),
    b"",
    b"\x00\xff" * 200,
    "",
    "héllo wörld",
    "x" * 300,
    proton.symbol(""),
    proton.symbol("a" * 300),
    [],
    [1, "a", None, [proton.uint(2)]],
    list(range(300)),
    {},
    {"a": 1, proton.symbol("b"): [proton.uint(1)], 3: None},
    {str(i): i for i in range(100)},
    proton.Described(proton.symbol("apache.org:selector-filter:string"), "a = 1"),
    proton.Described(proton.ulong(0x1234), proton.Described(proton.ulong(1), "nested")),
    proton.Array(UNDESCRIBED, Data.SYMBOL, proton.symbol("a"), proton.symbol("b")),
    proton.Array(UNDESCRIBED, Data.STRING, "x" * 300, "y"),
    proton.Array(UNDESCRIBED, Data.INT, *[proton.int32(i) for i in range(300)]),
    proton.Array(UNDESCRIBED, Data.LONG),
    proton.Array(UNDESCRIBED, Data.BOOL, True, False),
    proton.Array(UNDESCRIBED, Data.UINT, proton.uint(0), proton.uint(300)),
    proton.Array(UNDESCRIBED, Data.ULONG, proton.ulong(7)),
    proton.Array(UNDESCRIBED, Data.TIMESTAMP, proton.timestamp(5)),
    proton.Array(UNDESCRIBED, Data.UUID, uuid.UUID(int=1)),
    proton.Array(UNDESCRIBED, Data.BINARY, b"a", b""),
    proton.Array(UNDESCRIBED, Data.MAP, {"a": 1}),
    proton.Array(UNDESCRIBED, Data.LIST, [1], []),
    proton.Array(UNDESCRIBED, Data.NULL, None, None),
    proton.Array(UNDESCRIBED, Data.ARRAY, proton.Array(UNDESCRIBED, Data.INT, proton.int32(1))),
    proton.Array(proton.symbol("desc"), Data.STRING, "a"),
    proton.Array(UNDESCRIBED, Data.CHAR, proton.char("z")),
    proton.Array(UNDESCRIBED, Data.DOUBLE, 0.5),
]


def _id(value: Any) -> str:
    return repr(value)[:40]


@pytest.mark.parametrize("value", _ZOO, ids=_id)
def test_decoded_value_matches_proton(value: Any) -> None:
    """Every AMQP type decodes to proton's value, with the wrapper for its exact type."""
    encoded = _proton_encode(value)
    _assert_like(decode_value(encoded), _proton_decode(encoded))


@pytest.mark.parametrize("value", _ZOO, ids=_id)
def test_decoded_value_encodes_back_to_the_same_amqp_type(value: Any) -> None:
    """decode -> encode_value keeps type and value, so a copied annotation is unchanged."""
    mine = decode_value(_proton_encode(value))
    _assert_like(mine, _proton_decode(encode_value(mine)))


@pytest.mark.parametrize("value", _ZOO, ids=_id)
def test_value_is_skipped_by_its_size_fields(value: Any) -> None:
    """An amqp-value body of any type ends exactly where proton says: the footer follows."""
    ap = _section(AP, {"k": "v"})
    body = _section(VALUE, value)
    footer = _section(FOOTER, {proton.symbol("f"): 1})
    scanned = scan(ap + body + footer)
    assert (scanned.application_properties, scanned.body_start) == ((0, len(ap)), len(ap))
    assert scan(ap + body).body_start == len(ap)
    with pytest.raises(SectionError):
        scan(ap + body + footer[:-1])


@pytest.mark.parametrize(
    ("value", "amqp_type"),
    [
        ("s", Data.STRING),
        ("x" * 300, Data.STRING),
        (Symbol("x-opt-ORIG-QUEUE"), Data.SYMBOL),
        (5, Data.LONG),
        (2**40, Data.LONG),
        (Long(1), Data.LONG),
        (True, Data.BOOL),
        (1.5, Data.DOUBLE),
        (b"b", Data.BINARY),
        (None, Data.NULL),
        ({"a": 1}, Data.MAP),
        ([1], Data.LIST),
        (UInt(0), Data.UINT),
        (UInt(7), Data.UINT),
        (UInt(2**32 - 1), Data.UINT),
        (ULong(0), Data.ULONG),
        (ULong(2**64 - 1), Data.ULONG),
        (Byte(1), Data.BYTE),
        (UByte(200), Data.UBYTE),
        (Short(-2), Data.SHORT),
        (UShort(2), Data.USHORT),
        (Int(-1), Data.INT),
        (Int(2**31 - 1), Data.INT),
        (Timestamp(1_700_000_000_000), Data.TIMESTAMP),
        (Float32(0.5), Data.FLOAT),
        (Char("c"), Data.CHAR),
        (uuid.UUID(int=9), Data.UUID),
        (Decimal32(b"\x00" * 4), Data.DECIMAL32),
        (Decimal64(b"\x00" * 8), Data.DECIMAL64),
        (Decimal128(b"\x00" * 16), Data.DECIMAL128),
        (Described(Symbol("d"), 1), Data.DESCRIBED),
        (Array([Symbol("a")], element_type=Symbol), Data.ARRAY),
    ],
    ids=_id,
)
def test_encode_value_writes_the_amqp_type(value: Any, amqp_type: int) -> None:
    """Plain Python types map to their natural AMQP type; wrappers name theirs (B-090)."""
    data = Data()
    encoded = encode_value(value)
    assert data.decode(encoded) == len(encoded)
    data.rewind()
    assert data.next() == amqp_type
    assert decode_value(encoded) == value


def test_tuple_is_not_encoded_as_list() -> None:
    """Only list is an AMQP list; a tuple is a programming error (Described aside)."""
    with pytest.raises(TypeError):
        encode_value((1, 2))


@pytest.mark.parametrize(
    "value",
    [
        UInt(-1),
        UInt(2**32),
        ULong(-1),
        Byte(128),
        UByte(256),
        Short(2**15),
        Int(2**31),
        2**63,
        Timestamp(2**63),
        Symbol("é"),
        Decimal32(b"12"),
        Char("ab"),
    ],
    ids=repr,
)
def test_out_of_range_value_is_a_value_error(value: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError; the point is not struct.error
        encode_value(value)


@pytest.mark.parametrize("value", [object(), {1, 2}, 1j], ids=["object()", "{1, 2}", "1j"])
def test_value_without_amqp_type_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        encode_value(value)


def test_annotation_keys_are_symbols_or_ulongs() -> None:
    """Annotation maps need symbol (or ulong) keys, whatever str/int the caller used."""
    data = Data()
    data.decode(encode_annotations({"x-opt-a": 1, Symbol("x-opt-b"): 2, 7: 3}))
    data.rewind()
    data.next()
    data.enter()
    key_types = []
    while data.next() is not None:
        key_types.append(data.type())
        data.next()
    assert key_types == [Data.SYMBOL, Data.SYMBOL, Data.ULONG]


def test_wrappers_compare_equal_to_plain_values() -> None:
    assert UInt(5) == 5
    assert Symbol("a") == "a"
    assert {Symbol("k"): 1}["k"] == 1
    assert Array([1], element_type=int) == [1]
    assert repr(UInt(5)) == "UInt(5)"


# -- Messages: scan and SectionReader against proton --------------------------------------------

_HEADERS: dict[str, dict[str, Any] | None] = {
    "no-header": None,
    "empty-header": {},
    "durable": {"durable": True},
    "full-header": {
        "durable": True,
        "priority": 7,
        "ttl": 2.5,
        "first_acquirer": True,
        "delivery_count": 3,
    },
}
_PROPERTIES: dict[str, dict[str, Any] | None] = {
    "no-properties": None,
    "some-properties": {"id": "m-1", "address": "orders", "subject": "s"},
    "all-properties": {
        "id": uuid.UUID(int=42),
        "user_id": b"alice",
        "address": "orders",
        "subject": "subj",
        "reply_to": "replies",
        "correlation_id": 7,
        "content_type": "text/plain",
        "content_encoding": "gzip",
        "expiry_time": 1_700_000_000.5,
        "creation_time": 1_600_000_000.25,
        "group_id": "g",
        "group_sequence": 9,
        "reply_to_group_id": "rg",
    },
}
_DELIVERY_ANNOTATIONS = {"none": None, "da": {proton.symbol("x-opt-da"): "drop me", 1: 2}}
_MESSAGE_ANNOTATIONS = {
    "none": None,
    "ma": {
        proton.symbol("x-opt-routing-type"): proton.byte(1),
        proton.symbol("x-opt-sym"): proton.symbol("s"),
        proton.symbol("x-opt-uint"): proton.uint(5),
        proton.symbol("x-opt-delivery-time"): 1_700_000_000_000,
    },
}
_APPLICATION_PROPERTIES = {
    "none": None,
    "ap": {"a": 1, "b": "two", "c": None, "d": 2.5, "e": True, "f": b"bin", "g": proton.uint(3)},
}
# (body, inferred, extra data sections, footer)
_BODIES: list[tuple[Any, bool, int, bool]] = [
    ("text", False, 0, False),
    (b"bytes", True, 0, False),
    (b"first", True, 2, True),  # three data sections and a footer
    ([1, "a"], True, 0, False),  # amqp-sequence
    ({"k": "v"}, False, 0, True),
    (None, False, 0, False),  # no body at all
    ("x" * 5000, False, 0, True),  # str32, and big enough for the memoryview paths
]
_COMBINATIONS = list(
    itertools.product(
        _HEADERS, _PROPERTIES, _DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS, _APPLICATION_PROPERTIES
    )
)


def _message(
    header: str, properties: str, da: str, ma: str, ap: str, body_index: int
) -> tuple[bytes, list[tuple[int, bytes]]]:
    """A proton-encoded message and proton's list of its sections."""
    body, inferred, extra_data, footer = _BODIES[body_index]
    message = proton.Message(body=body, inferred=inferred, **(_HEADERS[header] or {}))
    for name, value in (_PROPERTIES[properties] or {}).items():
        setattr(message, name, value)
    message.instructions = _DELIVERY_ANNOTATIONS[da]
    message.annotations = _MESSAGE_ANNOTATIONS[ma]
    message.properties = _APPLICATION_PROPERTIES[ap]
    sections = _split(bytes(message.encode()))
    # Proton always writes a header and a properties section: drop them for "absent".
    if _HEADERS[header] is None:
        sections = [s for s in sections if s[0] != HEADER]
    if _PROPERTIES[properties] is None:
        sections = [s for s in sections if s[0] != PROPS]
    sections += [(DATA, _section(DATA, b"more %d" % i)) for i in range(extra_data)]
    if footer:
        sections.append((FOOTER, _section(FOOTER, {proton.symbol("x-opt-hash"): b"\x01"})))
    return b"".join(s for _, s in sections), sections


def _offsets(sections: list[tuple[int, bytes]]) -> dict[int, tuple[int, int]]:
    """(start, end) of the first section of each code."""
    offsets: dict[int, tuple[int, int]] = {}
    pos = 0
    for code, encoded in sections:
        offsets.setdefault(code, (pos, pos + len(encoded)))
        pos += len(encoded)
    return offsets


@pytest.mark.parametrize(
    ("header", "properties", "da", "ma", "ap", "body_index"),
    [(*combo, i % len(_BODIES)) for i, combo in enumerate(_COMBINATIONS)],
)
def test_scan_agrees_with_proton(
    header: str, properties: str, da: str, ma: str, ap: str, body_index: int
) -> None:
    """Boundaries, header fields and the three readable sections match proton (B-013, B-016)."""
    raw, sections = _message(header, properties, da, ma, ap, body_index)
    scanned = scan(raw)
    expected = _proton_message(raw)

    # B-017: delivery annotations are cut out, nothing else changes, no copy without them.
    kept = [s for s in sections if s[0] != DA]
    assert scanned.data == b"".join(encoded for _, encoded in kept)
    if da == "none":
        assert scanned.data is raw
    assert _proton_message(scanned.data).instructions is None

    offsets = _offsets(kept)
    assert scanned.header_end == (offsets[HEADER][1] if HEADER in offsets else 0)
    assert scanned.message_annotations == offsets.get(MA)
    assert scanned.properties == offsets.get(PROPS)
    assert scanned.application_properties == offsets.get(AP)
    body_starts = [offsets[code][0] for code in (DATA, SEQUENCE, VALUE, FOOTER) if code in offsets]
    assert scanned.body_start == min(body_starts, default=len(scanned.data))

    assert scanned.durable is expected.durable
    assert scanned.priority == expected.priority
    assert scanned.ttl == (round(expected.ttl * 1000) if expected.ttl else None)
    assert bool(scanned.first_acquirer) is expected.first_acquirer
    assert scanned.delivery_count == expected.delivery_count
    expiry_ms = round(expected.expiry_time * 1000) if expected.expiry_time else None
    assert scanned.absolute_expiry_time == expiry_ms

    for data in (raw, scanned.data):  # the reader copes with delivery annotations too
        props = READER.properties(data)
        if PROPS in offsets:
            fields = _section_value(dict(kept)[PROPS])
            theirs = {n: v for n, v in zip(PROPERTY_NAMES, fields, strict=False) if v is not None}
            _assert_like(props, theirs)
        else:
            assert props == {}
        _assert_like(READER.application_properties(data), _materialize(expected.properties or {}))
        _assert_like(READER.message_annotations(data), _materialize(expected.annotations or {}))


def test_properties_have_amqp_field_names() -> None:
    """Keys are the AMQP names the core and filters use; timestamps are epoch ms."""
    raw, _ = _message("durable", "all-properties", "none", "none", "none", 0)
    assert READER.properties(raw) == {
        "message-id": uuid.UUID(int=42),
        "user-id": b"alice",
        "to": "orders",
        "subject": "subj",
        "reply-to": "replies",
        "correlation-id": 7,
        "content-type": "text/plain",
        "content-encoding": "gzip",
        "absolute-expiry-time": 1_700_000_000_500,
        "creation-time": 1_600_000_000_250,
        "group-id": "g",
        "group-sequence": 9,
        "reply-to-group-id": "rg",
    }


def test_missing_sections_read_as_empty() -> None:
    raw = _section(VALUE, "body")
    assert READER.properties(raw) == {}
    assert READER.application_properties(raw) == {}
    assert READER.message_annotations(raw) == {}
    assert READER.header(raw) is None


def test_no_header_means_defaults() -> None:
    """B-013/B-016: no header is non-durable, priority 4, no ttl, count 0."""
    scanned = scan(_section(VALUE, "body"))
    assert scanned == Scanned(
        data=scanned.data,
        header_end=0,
        durable=False,
        priority=4,
        ttl=None,
        delivery_count=0,
        first_acquirer=None,
        message_annotations=None,
        properties=None,
        application_properties=None,
        body_start=0,
        absolute_expiry_time=None,
    )
    assert scanned.header() is None


def test_empty_input_is_an_empty_message() -> None:
    assert scan(b"").body_start == 0


def test_priority_is_reported_as_sent() -> None:
    """B-013 caps the effective priority at 9; scan reports the wire value."""
    raw = _section(HEADER, [None, proton.ubyte(200)]) + _section(VALUE, "x")
    assert scan(raw).priority == 200


@pytest.mark.parametrize(
    "descriptor",
    [
        b"\x80" + struct.pack(">Q", 0x77),
        b"\xa3\x11amqp:amqp-value:*",
        b"\xb3" + struct.pack(">I", 17) + b"amqp:amqp-value:*",
    ],
    ids=["ulong", "sym8", "sym32"],
)
def test_long_descriptor_forms_are_understood(descriptor: bytes) -> None:
    """Sections may use a ulong or symbolic descriptor instead of a smallulong."""
    header = b"\x00\x80" + struct.pack(">Q", 0x70) + b"\xc0\x02\x01\x41"
    props = b"\x00\xa3\x14amqp:properties:list" + encode_value(["id-1"])
    body = b"\x00" + descriptor + b"\xa1\x02hi"
    raw = header + props + body
    scanned = scan(raw)
    assert scanned.durable is True
    assert scanned.header_end == len(header)
    assert scanned.properties == (len(header), len(header) + len(props))
    assert scanned.body_start == len(header) + len(props)
    assert READER.properties(raw) == {"message-id": "id-1"}
    assert decode_value(raw[scanned.body_start + len(descriptor) + 1 :]) == "hi"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_section(MA, {}) + _section(HEADER, []), "out of order"),
        (_section(HEADER, []) + _section(HEADER, []), "out of order"),
        (_section(AP, {}) + _section(PROPS, []), "out of order"),
        (_section(VALUE, 1) + _section(VALUE, 2), "out of order"),
        (_section(DATA, b"a") + _section(SEQUENCE, []), "out of order"),
        (_section(DATA, b"a") + _section(VALUE, 1), "out of order"),
        (_section(DATA, b"a") + _section(AP, {}), "out of order"),
        (_section(FOOTER, {}) + _section(DATA, b"a"), "out of order"),
        (_section(FOOTER, {}) + _section(FOOTER, {}), "out of order"),
        (_section(0x79, 1), "unknown section"),
        (_section(0x6F, 1), "unknown section"),
        (b"\x00\x80" + struct.pack(">Q", 2**40 + 0x70) + b"\x45", "unknown section"),
        (b"\x00\xa3\x03abc\x40", "unknown section"),
        (b"\x00\x44\x40", "descriptor"),
        (b"\x53\x70\x45", "expected a section"),
        (_section(HEADER, {}), "value of type"),
        (_section(AP, []), "value of type"),
        (_section(DATA, "not binary"), "value of type"),
        (_section(SEQUENCE, "not a list"), "value of type"),
        (_section(HEADER, [proton.uint(1)]), "durable is not a boolean"),
        (_section(HEADER, [True, proton.uint(300)]), "priority"),
        (_section(HEADER, [True, None, -1]), "ttl"),
        (_section(HEADER, [True, None, None, "yes"]), "first-acquirer"),
        (_section(HEADER, [True, None, None, None, proton.ulong(2**32)]), "delivery-count"),
        (_section(PROPS, [None] * 8 + ["soon"]), "absolute-expiry-time"),
        # Issue 15 attack: a ulong past a timestamp failed the journal for good.
        (_section(PROPS, [None] * 8 + [proton.ulong(2**63)]), "timestamp range"),
        (_section(PROPS, [None] * 8 + [proton.ulong(2**64 - 1)]), "timestamp range"),
        (b"\x00\x53\x77\x00" * 5000, "deeper than 32 levels"),  # described in described
        (b"\x00\x53\x77\xff", "invalid constructor"),
        (b"\x00\x53\x77\xb0\xff\xff\xff\xff", "past the end"),
    ],
)
def test_malformed_message_is_a_section_error(raw: bytes, message: str) -> None:
    with pytest.raises(SectionError, match=message):
        scan(raw)


def test_lenient_header_integer_types_are_accepted() -> None:
    """Some clients send priority or counts with a wider integer type: read the value."""
    raw = _section(HEADER, [None, proton.uint(5), proton.ulong(1000), None, 3]) + _section(
        VALUE, "x"
    )
    scanned = scan(raw)
    assert (scanned.priority, scanned.ttl, scanned.delivery_count) == (5, 1000, 3)


def test_reader_rejects_malformed_section_content() -> None:
    """scan reads sizes only; the reader finds what is wrong inside when it decodes."""
    bad_map = b"\x00\x53\x74\xc1\x03\x02\xa1\x05"  # a key whose string runs past the map
    with pytest.raises(SectionError):
        READER.application_properties(bad_map)
    odd = b"\x00\x53\x74\xc1\x02\x01\x41"  # a map with one element
    with pytest.raises(SectionError, match="odd"):
        READER.application_properties(odd)
    unhashable = b"\x00\x53\x72" + bytes((0xC1, 3, 2, 0x45, 0x40))  # a list as a key
    with pytest.raises(SectionError, match="unhashable"):
        READER.message_annotations(unhashable)
    not_a_map = b"\x00\x53\x72\x45"
    with pytest.raises(SectionError, match="value of type"):
        READER.message_annotations(not_a_map)


# -- Truncation and garbage ---------------------------------------------------------------------


def _rich_message() -> tuple[bytes, list[tuple[int, bytes]]]:
    return _message("full-header", "all-properties", "da", "ma", "ap", 2)


def _exercise(raw: bytes) -> None:
    """Everything the broker may call on received bytes."""
    scanned = scan(raw)
    for read in (READER.properties, READER.application_properties, READER.message_annotations):
        read(scanned.data)
    READER.header(scanned.data)
    # What the broker writes from bytes it accepted must be well-formed in turn.
    assert scan(with_delivery_count(scanned.data, scanned.header_end, 2)).delivery_count == 2
    copy = rebuild(
        raw,
        header=Header(durable=True),
        message_annotations={"x-opt-ORIG-QUEUE": "q"},
        properties_update={"absolute-expiry-time": None},
    )
    assert scan(copy).absolute_expiry_time is None


def test_every_truncation_is_a_section_error_or_a_shorter_message() -> None:
    """Only cuts at section boundaries leave a well-formed message."""
    raw, sections = _rich_message()
    boundaries = set(itertools.accumulate((len(s) for _, s in sections), initial=0))
    for cut in range(len(raw)):
        truncated = raw[:cut]
        if cut in boundaries:
            _exercise(truncated)
        else:
            with pytest.raises(SectionError):
                scan(truncated)
            with pytest.raises(SectionError):
                rebuild(truncated, header=None)


def test_truncated_header_given_to_with_delivery_count_is_a_section_error() -> None:
    raw, _ = _rich_message()
    header_end = scan(raw).header_end
    for cut in range(1, header_end):
        with pytest.raises(SectionError):
            with_delivery_count(raw[:cut], header_end, 2)
    with pytest.raises(SectionError):
        with_delivery_count(raw, header_end - 1, 2)
    with pytest.raises(SectionError):
        with_delivery_count(_section(VALUE, "not a header"), 6, 2)


def test_corrupted_bytes_raise_only_section_errors() -> None:
    """Random single-byte corruption: each call succeeds or raises SectionError."""
    raw, _ = _rich_message()
    rng = random.Random(20240617)
    for _ in range(3000):
        corrupt = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        with contextlib.suppress(SectionError):
            _exercise(bytes(corrupt))


def test_random_garbage_raises_only_section_errors() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        for attempt in (garbage, b"\x00\x53\x77" + garbage, b"\x00\x53\x74" + garbage):
            with contextlib.suppress(SectionError):
                _exercise(attempt)
            with contextlib.suppress(SectionError):
                decode_value(attempt)


def test_huge_element_counts_are_refused_without_looping() -> None:
    """A few bytes claiming 2**32 elements must not make the decoder spin."""
    nulls = b"\xf0" + struct.pack(">II", 5, 2**32 - 1) + b"\x40"
    with pytest.raises(SectionError, match="claims"):
        decode_value(nulls)
    big_list = b"\xd0" + struct.pack(">II", 5, 2**32 - 1) + b"\x40"
    with pytest.raises(SectionError, match="claims"):
        decode_value(big_list)


# -- Redelivery header (B-050) -------------------------------------------------------------------


@pytest.mark.parametrize("header", list(_HEADERS))
@pytest.mark.parametrize("delivery_count", [0, 1, 4, 300, 2**32 - 1])
@pytest.mark.parametrize("body_index", [0, 6])
def test_with_delivery_count_changes_only_the_header(
    header: str, delivery_count: int, body_index: int
) -> None:
    """B-050: count rewritten; durable, priority, ttl kept; first-acquirer true -> false."""
    raw, _ = _message(header, "all-properties", "da", "ma", "ap", body_index)
    scanned = scan(raw)
    out = with_delivery_count(scanned.data, scanned.header_end, delivery_count)
    before, after = _proton_message(scanned.data), _proton_message(out)

    assert after.delivery_count == delivery_count
    assert after.durable is before.durable
    assert after.priority == before.priority
    assert after.ttl == before.ttl
    expected_first_acquirer = before.first_acquirer and delivery_count == 0
    assert after.first_acquirer is expected_first_acquirer
    for name in ("id", "address", "expiry_time", "annotations", "properties", "body"):
        assert getattr(after, name) == getattr(before, name), name

    rescanned = scan(out)
    assert out[rescanned.header_end :] == scanned.data[scanned.header_end :]
    if scanned.header_end == 0 and delivery_count == 0:
        assert out is scanned.data  # no header already says delivery-count 0
    assert rescanned.delivery_count == delivery_count


def test_redelivery_of_a_message_without_header_fields_prepends_its_count_alone() -> None:
    """B-050, issue 20: the prebuilt headers of the fast paths (no header or an empty one,
    a small count) are what the general path builds, for every count around its bound."""
    body = _section(VALUE, "x")
    empty = bytes.fromhex("00537045")  # an empty header (list0), as proton encodes one
    for count in range(1, 40):
        for header in (b"", empty):
            out = with_delivery_count(header + body, len(header), count)
            assert out == encode_header(Header(delivery_count=count)) + body
            assert scan(out).delivery_count == count
            assert out[scan(out).header_end :] == body
    with pytest.raises(SectionError):
        with_delivery_count(bytes.fromhex("00537040") + body, 4, 1)  # null is not a header


def test_redelivery_header_is_compact() -> None:
    """list8, smalluint count, true/false constructors, trailing defaults left out."""
    durable = _section(HEADER, [True]) + _section(VALUE, "x")
    header_end = scan(durable).header_end
    out = with_delivery_count(durable, header_end, 1)
    assert out == bytes.fromhex("005370c00705414040425201") + durable[header_end:]
    out = with_delivery_count(durable, header_end, 0)
    assert out == bytes.fromhex("005370c0020141") + durable[header_end:]
    no_header = _section(VALUE, "x")
    out = with_delivery_count(no_header, 0, 2)
    assert out == bytes.fromhex("005370c00705424040425202") + no_header
    assert encode_header(Header()) == bytes.fromhex("00537045")
    assert encode_header(Header(ttl=0)) == bytes.fromhex("005370c00403424043")
    assert encode_header(Header(priority=9, delivery_count=256)) == bytes.fromhex(
        "005370c00b0542500940427000000100"
    )


@pytest.mark.parametrize(
    "header", [Header(priority=256), Header(ttl=-1), Header(delivery_count=2**32)], ids=repr
)
def test_out_of_range_header_is_a_value_error(header: Header) -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_header(header)


def test_with_delivery_count_accepts_a_long_form_header_descriptor() -> None:
    header = b"\x00\x80" + struct.pack(">Q", 0x70) + b"\xc0\x04\x02\x41\x50\x07"
    raw = header + _section(VALUE, "x")
    out = with_delivery_count(raw, len(header), 3)
    message = _proton_message(out)
    assert (message.durable, message.priority, message.delivery_count) == (True, 7, 3)


# -- The moved copy (B-076, B-083, B-090) ---------------------------------------------------------


def _map_types(section: bytes) -> dict[str, tuple[int, int]]:
    """key -> (AMQP type of the key, AMQP type of the value), read with proton.Data."""
    data = Data()
    data.decode(section)
    data.rewind()
    data.next()
    data.enter()
    data.next()  # descriptor
    data.next()  # the map
    data.enter()
    types = {}
    while data.next() is not None:
        key_type, key = data.type(), data.get_object()
        data.next()
        types[str(key)] = (key_type, data.type())
    return types


def _original_for_copy() -> tuple[bytes, bytes]:
    """A message with every section (and a footer); also its AP + body + footer bytes."""
    tail = (
        _section(AP, {"color": "red", "n": 1})
        + _section(DATA, b"payload")
        + _section(DATA, b"more")
        + _section(FOOTER, {proton.symbol("x-opt-crc"): proton.uint(9)})
    )
    raw = (
        _section(HEADER, [True, proton.ubyte(7), proton.uint(60_000), True, proton.uint(2)])
        + _section(DA, {proton.symbol("x-opt-da"): 1})
        + _section(
            MA,
            {
                proton.symbol("x-opt-ORIG-QUEUE"): "older",
                proton.symbol("x-opt-routing-type"): proton.byte(1),
                proton.symbol("x-opt-custom"): proton.symbol("kept"),
                proton.symbol("x-opt-count"): proton.uint(5),
                proton.symbol("x-opt-list"): proton.Array(
                    UNDESCRIBED, Data.SYMBOL, proton.symbol("a")
                ),
            },
        )
        + _section(
            PROPS,
            [
                "msg-1",
                None,
                "orders",
                None,
                None,
                proton.ulong(77),
                None,
                None,
                proton.timestamp(1_700_000_060_000),
                proton.timestamp(1_700_000_000_000),
                "group",
            ],
        )
        + tail
    )
    return raw, tail


def test_dead_letter_copy_has_exact_annotation_types() -> None:
    """B-076/B-079/B-090: the copy as the dead-letter move builds it, checked with proton."""
    raw, tail = _original_for_copy()
    scanned = scan(raw)
    original_header = scanned.header()
    assert original_header is not None
    annotations = {
        k: v
        for k, v in READER.message_annotations(raw).items()
        if not k.startswith(("x-opt-ORIG-", "x-opt-DLQ-")) and k != "x-opt-routing-type"
    }
    annotations.update(
        {
            "x-opt-ORIG-QUEUE": "orders",
            "x-opt-ORIG-ADDRESS": "orders",
            "x-opt-ORIG-MESSAGE-ID": Long(12345),
            "x-opt-ORIG-ROUTING-TYPE": Byte(1),
            "x-opt-ACTUAL-EXPIRY": Long(1_700_000_070_000),
            "x-opt-DLQ-REASON": "rejected",
            "x-opt-DLQ-ERROR-CONDITION": Symbol("amqp:internal-error"),
            "x-opt-DLQ-DELIVERY-COUNT": UInt(3),
        }
    )
    copy = rebuild(
        raw,
        header=original_header._replace(ttl=None, delivery_count=0),
        message_annotations=annotations,
        properties_update={"absolute-expiry-time": None},
    )

    assert copy.endswith(tail)  # application-properties, body and footer byte for byte
    message = _proton_message(copy)
    assert (message.durable, message.priority, message.ttl) == (True, 7, 0)
    assert (message.delivery_count, message.first_acquirer) == (0, True)
    assert message.instructions is None
    assert (message.id, message.address, message.correlation_id) == ("msg-1", "orders", 77)
    assert message.expiry_time == 0
    assert message.creation_time == 1_700_000_000
    assert message.group_id == "group"
    assert message.properties == {"color": "red", "n": 1}

    ma_start, ma_end = scan(copy).message_annotations or (0, 0)
    types = _map_types(copy[ma_start:ma_end])
    sym = Data.SYMBOL
    assert types == {
        "x-opt-custom": (sym, Data.SYMBOL),
        "x-opt-count": (sym, Data.UINT),
        "x-opt-list": (sym, Data.ARRAY),
        "x-opt-ORIG-QUEUE": (sym, Data.STRING),
        "x-opt-ORIG-ADDRESS": (sym, Data.STRING),
        "x-opt-ORIG-MESSAGE-ID": (sym, Data.LONG),
        "x-opt-ORIG-ROUTING-TYPE": (sym, Data.BYTE),
        "x-opt-ACTUAL-EXPIRY": (sym, Data.LONG),
        "x-opt-DLQ-REASON": (sym, Data.STRING),
        "x-opt-DLQ-ERROR-CONDITION": (sym, Data.SYMBOL),
        "x-opt-DLQ-DELIVERY-COUNT": (sym, Data.UINT),
    }
    assert message.annotations["x-opt-ORIG-MESSAGE-ID"] == 12345
    assert list(message.annotations["x-opt-list"].elements) == ["a"]


def test_rebuild_keeps_everything_by_default_but_delivery_annotations() -> None:
    raw, _ = _original_for_copy()
    assert rebuild(raw) == scan(raw).data


def test_rebuild_can_drop_and_create_sections() -> None:
    """None removes a section; a properties update creates the section if needed (B-083)."""
    raw = _section(HEADER, [True]) + _section(MA, {proton.symbol("a"): 1}) + _section(DATA, b"x")
    copy = rebuild(
        raw,
        header=None,
        message_annotations=None,
        properties_update={"absolute-expiry-time": 1_700_000_000_000, "to": "dla"},
    )
    scanned = scan(copy)
    assert (scanned.header_end, scanned.message_annotations) == (0, None)
    assert scanned.absolute_expiry_time == 1_700_000_000_000
    assert READER.properties(copy) == {"to": "dla", "absolute-expiry-time": 1_700_000_000_000}
    assert type(READER.properties(copy)["absolute-expiry-time"]) is Timestamp
    assert copy.endswith(_section(DATA, b"x"))

    # Setting the expiration to 0 removes absolute-expiry-time; nothing left: no section.
    cleared = rebuild(copy, properties_update={"absolute-expiry-time": None, "to": None})
    assert cleared == _section(DATA, b"x")


def test_rebuild_adds_annotations_to_a_message_without_them() -> None:
    """B-090: the message-annotations section is created if the original had none."""
    raw = _section(PROPS, ["id"]) + _section(VALUE, "body")
    copy = rebuild(raw, message_annotations={"x-opt-ORIG-ADDRESS": "a"})
    message = _proton_message(copy)
    assert message.annotations == {"x-opt-ORIG-ADDRESS": "a"}
    assert (message.id, message.body) == ("id", "body")
    assert _split(copy)[0][0] == MA  # in AMQP order: before properties


def test_properties_update_keeps_other_fields_as_encoded() -> None:
    """Fields not updated are copied byte for byte, even in a non-minimal encoding."""
    wide_id = b"\x80" + struct.pack(">Q", 5)  # ulong 5 in its 8-byte form
    props = b"\x00\x53\x73\xd0" + struct.pack(">II", 4 + len(wide_id), 1) + wide_id
    copy = rebuild(props, properties_update={"group-sequence": 4})
    assert wide_id in copy
    assert READER.properties(copy) == {"message-id": 5, "group-sequence": 4}
    assert type(READER.properties(copy)["group-sequence"]) is UInt


@pytest.mark.parametrize(
    ("update", "error"),
    [
        ({"no-such-field": 1}, ValueError),
        ({"to": 5}, TypeError),
        ({"absolute-expiry-time": "soon"}, TypeError),
        ({"message-id": 1.5}, TypeError),
        ({"group-sequence": -1}, ValueError),
    ],
)
def test_bad_properties_update_is_refused(update: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        rebuild(_section(VALUE, "x"), properties_update=update)


def test_rebuild_keep_marker_is_the_default() -> None:
    raw = _section(HEADER, [True]) + _section(VALUE, "x")
    assert rebuild(raw, header=KEEP, message_annotations=KEEP) == raw


def test_the_widest_header_fits_the_cores_allowance() -> None:
    """core.queue.MAX_HEADER_BYTES bounds a re-encoded header (issue 16 item 3)."""
    from amqpbroker.amqp import sections
    from amqpbroker.core.queue import MAX_HEADER_BYTES

    widest = sections.Header(
        durable=True, priority=255, ttl=2**32 - 1, first_acquirer=True, delivery_count=2**32 - 1
    )
    assert len(sections.encode_header(widest)) == MAX_HEADER_BYTES


# -- Nesting depth (issue 15): bounded everywhere we decode ----------------------------------


def _nest(kind: str, depth: int) -> Any:
    """A value whose innermost leaf sits `depth` levels down (each wrapper is one level)."""
    value: Any = "leaf"
    for _ in range(depth):
        if kind == "list":
            value = [value]
        elif kind == "map":
            value = {"k": value}
        elif kind == "array":
            if isinstance(value, str):
                value = Array([Symbol(value)], element_type=Symbol)
            else:
                value = Array([value], element_type=Array)
        else:
            value = Described(Symbol("d"), value)
    return value


@pytest.mark.parametrize("kind", ["list", "map", "array", "described"])
@pytest.mark.parametrize("code", [VALUE, SEQUENCE, AP, MA, FOOTER])
def test_nesting_deeper_than_the_limit_is_refused_at_scan(kind: str, code: int) -> None:
    """Issue 15: a transfer nesting 33 levels is malformed (rejected at the door with
    amqp:decode-error); 32 levels still pass, so legitimate messages are unaffected."""
    assert MAX_DEPTH == 32
    for depth, ok in ((MAX_DEPTH, True), (MAX_DEPTH + 1, False)):
        value = _nest(kind, depth)
        if code in (AP, MA, FOOTER):
            value = {Symbol("k"): value}
            depth += 1
            if depth > MAX_DEPTH:
                ok = False
        if code == SEQUENCE and type(value) is not list:
            continue
        raw = b"\x00\x53" + bytes((code,)) + encode_value(value)
        if ok:
            scan(raw)
            assert decode_value(raw[3:]) == value
        else:
            with pytest.raises(SectionError, match="deeper than 32 levels"):
                scan(raw)
            with pytest.raises(SectionError, match="deeper than 32 levels"):
                decode_value(raw[3:])


def test_reader_refuses_deep_nesting_without_recursion_error() -> None:
    """Issue 15: stored bytes (recovered from an older journal) are bounded too."""
    deep = encode_annotations({"x-opt-deep": _nest("list", 100)})
    raw = b"\x00\x53\x72" + deep + b"\x00\x53\x77\x40"
    with pytest.raises(SectionError, match="deeper than 32 levels"):
        READER.message_annotations(raw)


def test_shallow_value_full_of_nesting_bytes_is_accepted() -> None:
    """The cheap byte count only triggers the walk: zero bytes in longs are not levels."""
    value = [Long(i) for i in range(200)] + [{"m": [1, [2, [3]]]}]
    raw = b"\x00\x53\x77" + encode_value(value)
    assert scan(raw).body_start == 0


def test_a_value_shorter_than_the_limit_is_not_counted() -> None:
    """Issue 20 (durable path): a durable message's header (a list of a few bytes) cannot
    nest 33 levels, so the nesting check returns before counting its bytes, per message;
    a longer value is still counted (and a deep one refused, tests above)."""
    read: list[Any] = []

    class Spy(bytes):
        def __getitem__(self, key: Any) -> Any:  # counting reads every byte (or a slice)
            read.append(key)
            return super().__getitem__(key)

    header = Spy(encode_value([True, None, None, None, 0]))  # durable=true, first levels
    _check_nesting(header, 0, len(header))
    assert len(read) <= 1  # its constructor only
    read.clear()
    long_list = Spy(encode_value([Long(2**40 + i) for i in range(10)]))
    _check_nesting(long_list, 0, len(long_list))
    assert len(read) > 1 or type(_check_nesting).__name__ != "function"  # compiled: no spying


_BENCH_MAP = encode_value({"bench-sq": Long(1), "bench-ts": Long(2)})
_NESTED_MAP = encode_value({"k": "v" * 40, "m": [1, [2, [3]]]})


def _as32(value: bytes) -> bytes:
    """A list8 or map8 (`value`) as its list32 or map32, as proton-c writes compounds."""
    size, count = value[1], value[2]
    return bytes((value[0] + 0x10,)) + struct.pack(">II", size + 3, count) + value[3:]


_BENCH_MAP32 = _as32(_BENCH_MAP)


@pytest.mark.parametrize(
    ("value", "flat"),
    [
        (_BENCH_MAP, True),  # the load generator's application-properties
        (encode_value([Long(2**40 + i) for i in range(10)]), True),
        (encode_value({"s" * 10: "v" * 300, "b": b"x" * 20}), True),  # a str32: map32
        (encode_value({"k": "v" * 40, "n": None, "t": True, "u": UInt(7)}), True),
        (_NESTED_MAP, False),  # nesting: counted and walked
        (encode_value({"k": Described(Symbol("d"), "v" * 40)}), False),  # described
        (_BENCH_MAP[:1] + bytes((_BENCH_MAP[1] + 1,)) + _BENCH_MAP[2:] + b"\x40", False),
        (_BENCH_MAP[:2] + bytes((_BENCH_MAP[2] + 1,)) + _BENCH_MAP[3:], False),  # count
        (_BENCH_MAP[:-9] + b"\xb1\x00\x00\x00\x04abcd", False),  # an element past the end
        (_BENCH_MAP32, True),  # the generator's map as proton-c encodes it
        (_as32(encode_value([Long(2**40 + i) for i in range(10)])), True),
        (_as32(_NESTED_MAP), False),
        (_BENCH_MAP32[:8] + bytes((_BENCH_MAP32[8] + 1,)) + _BENCH_MAP32[9:], False),  # count
        (_BENCH_MAP32[:4] + bytes((_BENCH_MAP32[4] + 1,)) + _BENCH_MAP32[5:] + b"\x40", False),
        (b"\xd1\x00\x00\x00\x02\x00\x00" + b"\x40" * 40, False),  # size below its count
    ],
)
def test_a_flat_list_or_map_is_one_level_as_its_walk_finds(value: bytes, flat: bool) -> None:
    """Issue 20: `_flat` (an element at a time instead of a count of every byte) says
    True only for a list or map (8- or 32-bit) of scalars that the walk reads exactly to
    its end, one level deep; the rest goes to the count and the walk as before."""
    assert _flat(value, 0, len(value)) is flat
    if flat:
        assert _walk(value, 0, 0) == len(value)
        _check_nesting(value, 0, len(value))


def test_head_end_is_the_scanned_methods() -> None:
    """Issue 20: the module function the hot path calls agrees with `Scanned.head_end`."""
    for raw in (
        _section(HEADER, [True]) + _section(DATA, b"x"),
        _section(HEADER, [True]) + _section(MA, {proton.symbol("x-a"): 1}) + _section(DATA, b"x"),
        _section(MA, {proton.symbol("x-a"): 1}) + _section(PROPS, ["id"]) + _section(DATA, b"x"),
    ):
        scanned = scan(raw)
        assert head_end(scanned) == scanned.head_end() > 0


@pytest.mark.parametrize("kind", ["list", "described"])
def test_a_deep_value_is_refused_whichever_way_its_bytes_are_counted(kind: str) -> None:
    """Issue 20: up to 128 bytes the nesting constructors are counted by a loop, above by
    `translate`; a value 33 levels deep is refused either way (lists: ~100 bytes, the
    loop; described values: over 128 bytes, `translate`)."""
    value = encode_value(_nest(kind, MAX_DEPTH + 1))
    assert (len(value) <= 128) == (kind == "list")
    with pytest.raises(SectionError, match="deeper than 32 levels"):
        scan(b"\x00\x53\x77" + value)
    with pytest.raises(SectionError, match="deeper than 32 levels"):
        _check_nesting(value, 0, len(value))
    scan(b"\x00\x53\x77" + encode_value(_nest(kind, MAX_DEPTH)))


def test_only_the_compiled_build_counts_nesting_bytes_by_a_loop() -> None:
    """Issue 20: the per-byte loop is cheap compiled (~70 instructions a byte) and dear
    interpreted (~350: a pure-Python `scan` went from 39k to 56k instructions a message
    with it), so interpreted code always counts with `translate`."""
    from amqpbroker.amqp import sections

    compiled = type(sections.scan).__name__ != "function"
    assert sections._compiled() is compiled
    expected = 128 if compiled else 0
    loop_max = sections._COUNT_BY_LOOP
    assert loop_max == expected
