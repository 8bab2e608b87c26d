"""The records `Persistence` builds per durable message without the dataclass's keyword
call (issue 20, durable path) equal what the constructor builds, every field set: a
field added to a record later and forgotten there fails here, not at recovery."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import pytest

from amqpbroker.core.model import Message
from amqpbroker.core.persistence import _ack_ref, _add_message, _add_ref
from amqpbroker.core.records import AckRef, AddMessage, AddRef


def _every_field_set(record: Any) -> None:
    for f in fields(record):
        getattr(record, f.name)  # AttributeError: a slot never set


def _message(header: dict[str, Any] | None) -> Message:
    message = Message(b"\x00Sp\xc0\x01\x00body", durable=True, priority=7, header=header)
    message.msg_id, message.address, message.first_ts = 12, "orders", 1795632222001
    message.expiration_ms, message.header_end, message.head_end = 99, 5, 9
    return message


@pytest.mark.parametrize("header", [None, {"delivery-count": 3}, {}])
def test_add_message_equals_the_constructor(header: dict[str, Any] | None) -> None:
    message = _message(header)
    built = _add_message(message)
    _every_field_set(built)
    expected = AddMessage(
        msg_id=12,
        address="orders",
        data=message.data,
        expiration_ms=99,
        first_ts=1795632222001,
        priority=7,
        header_end=5,
        head_end=9,
        header_count=-1 if header is None else header.get("delivery-count", 0),
    )
    assert built == expected
    assert asdict(built) == asdict(expected)


def test_add_ref_and_ack_ref_equal_the_constructor() -> None:
    ref = _add_ref("q", 7, 2)
    ack = _ack_ref("q", 7)
    _every_field_set(ref)
    _every_field_set(ack)
    assert ref == AddRef(queue="q", msg_id=7, delivery_count=2)
    assert ack == AckRef(queue="q", msg_id=7)
