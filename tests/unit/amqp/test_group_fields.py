"""`sections.group_fields`: properties.group-id / group-sequence for message groups (B-127)."""

from __future__ import annotations

import pytest
from proton import Message

from amqpbroker.amqp import sections
from amqpbroker.amqp.sections import UInt


def _group(message: Message) -> tuple[str, int] | None:
    scanned = sections.scan(message.encode())
    assert scanned.properties is not None
    return sections.group_fields(scanned.data, scanned.properties)


def test_group_id_and_sequence_are_read() -> None:
    """B-127: the AMQP properties group-id and group-sequence."""
    assert _group(Message(body="x", id="m", group_id="orders", group_sequence=7)) == (
        "orders",
        7,
    )


def test_group_sequence_minus_one_is_read_as_the_uint() -> None:
    """B-127: -1 travels as the uint 0xFFFFFFFF (the core treats both as "close")."""
    message = Message(body="x", group_id="g", group_sequence=0xFFFFFFFF)
    assert _group(message) == ("g", 0xFFFFFFFF)


@pytest.mark.parametrize(
    "message",
    [Message(body="x", id="m"), Message(body="x", id="m", creation_time=5.0)],
    ids=["id-only", "list-ends-before-group-id"],
)
def test_no_group_id_is_none(message: Message) -> None:
    """A properties list that ends before field 10 has no group (the O(1) common case)."""
    assert _group(message) is None


def test_a_group_id_that_is_not_a_string_is_no_group() -> None:
    """Hostile peer: a group-id of another type is ignored, as Artemis reads it."""
    fields = [None] * 10 + [UInt(5), UInt(1)]
    data = b"\x00\x53\x73" + sections.encode_value(fields) + b"\x00\x53\x77\xa1\x01x"
    scanned = sections.scan(data)
    assert scanned.properties is not None
    assert sections.group_fields(scanned.data, scanned.properties) is None


def test_a_sequence_that_is_not_a_uint_counts_as_zero() -> None:
    """Hostile peer: group-sequence of the wrong type counts as 0, the group stands."""
    fields = [None] * 10 + ["g", "not-a-number"]
    data = b"\x00\x53\x73" + sections.encode_value(fields) + b"\x00\x53\x77\xa1\x01x"
    scanned = sections.scan(data)
    assert scanned.properties is not None
    assert sections.group_fields(scanned.data, scanned.properties) == ("g", 0)
