"""`frame_records` (issue 20, durable path): exactly the frames the per-record path wrote.

The journal's format is unchanged (`store/segments.py`): each record's frame is
`_frame(type, flags, codec.encode(record))`, the last one flagged BATCH_END. The
one-pass framer must write those bytes for every record (cached prefixes, crc32 chained
over the pieces), and keep the codec's errors for what it cannot encode.
"""

from __future__ import annotations

import pytest

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteQueue,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.store import codec
from amqpbroker.store.framing import frame_records
from amqpbroker.store.segments import BATCH_END, _check_frame, _decode_at, _frame

SAMPLES: list[Record] = [
    AddMessage(msg_id=9, address="a.b", data=b"\x00Sp" * 50, expiration_ms=0, first_ts=5),
    AddRef(queue="orders", msg_id=9, delivery_count=0),
    AddRef(queue="DLQ.ünïcode", msg_id=2**62, delivery_count=11),
    AckRef(queue="orders", msg_id=9),
    UpdateDeliveryCount(queue="q", msg_id=7, delivery_count=3),
    AddMessage(msg_id=10, address="x", durable=False, data=b"", priority=9, expiration_ms=-1),
    AddMessage(msg_id=11, address="ü", data=b"d", header_end=5, head_end=60, header_count=2),
    ScheduledDelivery(queue="q", msg_id=7, at_ms=123),
    AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST, extra={"a": (1,)}),
    DeleteQueue(name="q"),
]


def _expected(records: list[Record]) -> tuple[bytes, list[int]]:
    frames = [
        _frame(r.type_id, BATCH_END if i == len(records) - 1 else 0, codec.encode(r))
        for i, r in enumerate(records)
    ]
    return b"".join(frames), [len(f) for f in frames]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_one_record_is_framed_as_before(record: Record) -> None:
    assert frame_records([record]) == _expected([record])
    assert frame_records([record, record]) == _expected([record, record])  # cache hit


def test_a_mixed_append_is_framed_as_before_and_reads_back() -> None:
    records = SAMPLES * 3
    data, sizes = frame_records(records)
    assert (data, sizes) == _expected(records)
    pos, read = 0, []
    while pos < len(data):
        checked = _check_frame(data, pos)
        assert isinstance(checked, tuple), checked
        end, type_id, _ = checked
        read.append(_decode_at(data, pos, end, type_id))
        pos = end
    assert read == records


def test_nothing_to_frame() -> None:
    assert frame_records([]) == (b"", [])


def test_unusual_field_types_go_through_the_codec() -> None:
    """A bytearray body or a str subclass name: the codec's general encoding, as before."""

    class Name(str):
        pass

    records: list[Record] = [
        AddMessage(msg_id=1, address="a", data=bytearray(b"xy")),  # type: ignore[arg-type]
        AddRef(queue=Name("q"), msg_id=1),
        AckRef(queue=Name("q"), msg_id=1),
    ]
    assert frame_records(records) == _expected(records)


@pytest.mark.parametrize(
    "record",
    [
        AddRef(queue="q", msg_id=2**64, delivery_count=0),
        AckRef(queue="q", msg_id=-(2**64)),
        AddMessage(msg_id=2**70, address="a", data=b""),
    ],
    ids=lambda r: type(r).__name__,
)
def test_an_out_of_range_int_gets_the_codec_error(record: Record) -> None:
    with pytest.raises(codec.CodecError, match="i64"):
        frame_records([record])
