"""The codec's per-message fast paths write exactly what the general encoder writes."""

from __future__ import annotations

import pytest

from amqpbroker.core.records import AckRef, AddMessage, AddRef, Record, UpdateDeliveryCount
from amqpbroker.store import codec

SAMPLES: list[Record] = [
    AddRef(queue="orders", msg_id=1, delivery_count=0),
    AddRef(queue="DLQ.ünïcode", msg_id=2**62, delivery_count=11),
    AckRef(queue="q", msg_id=7),
    UpdateDeliveryCount(queue="q", msg_id=7, delivery_count=3),
    AddMessage(msg_id=9, address="a.b", data=b"\x00Sp" * 50, expiration_ms=0, first_ts=5),
    AddMessage(msg_id=10, address="x", durable=False, data=b"", priority=9, expiration_ms=-1),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_fast_path_equals_the_general_encoding(record: Record) -> None:
    assert codec.encode(record) == codec.encode_generic(record)
    assert codec.decode(record.type_id, codec.encode(record)) == record


def test_an_out_of_range_int_still_gets_the_clear_error() -> None:
    with pytest.raises(codec.CodecError, match="i64"):
        codec.encode(AddRef(queue="q", msg_id=2**64, delivery_count=0))
