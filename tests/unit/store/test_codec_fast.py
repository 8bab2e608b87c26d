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


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_fast_decoders_equal_the_general_decoder(record: Record) -> None:
    """Issue 23 item 4: the per-message decoders (recovery's hot path) read what the
    general decoder reads, the general encoder's bytes included."""
    payload = codec.encode_generic(record)
    fast = codec._FAST_DECODE[record.type_id](payload)
    assert fast == record
    assert fast == codec.decode_generic(record.type_id, payload)


def test_an_add_message_of_an_older_journal_decodes_without_the_scan_fields() -> None:
    """AddMessage before issue 23 had 7 fields: it still decodes (header_end -1: recovery
    scans the message), on the fast path and the general one alike."""
    record = AddMessage(msg_id=3, address="q", data=b"d", first_ts=4)
    payload = codec.encode_generic(record)
    old = bytes([7]) + payload[1 : -3 * 9]  # the 7 fields of then
    assert codec.decode(record.type_id, old) == record
    assert codec._FAST_DECODE[record.type_id](old) == record


def test_a_payload_the_fast_decoder_does_not_expect_falls_back() -> None:
    """A layout the fast path does not know (here: an AddRef field of another type) goes
    to the general decoder, which says what is wrong."""
    payload = codec.encode_generic(AddRef(queue="q", msg_id=1, delivery_count=0))
    odd = payload[:-9] + bytes([0])  # delivery_count None
    assert codec._FAST_DECODE[AddRef.type_id](odd) is None
    with pytest.raises(codec.CodecError):
        codec.decode(AddRef.type_id, odd + b"\x00")


def test_the_fast_decoders_sizes_are_their_structs() -> None:
    """The decoders' sizes are constants (compiled: no attribute read per frame, issue 23
    item 4): each must be its struct's."""
    assert codec._ADD_MESSAGE_HEAD.size == codec._HEAD_SIZE
    assert codec._BOOL_TAG_LEN.size == codec._BOOL_TAG_LEN_SIZE
    assert codec._THREE_INTS.size == codec._THREE_INTS_SIZE
    assert codec._TWO_INTS.size == codec._TWO_INTS_SIZE
