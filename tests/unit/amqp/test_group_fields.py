"""`sections.scan(...).group`: properties.group-id / group-sequence for message groups
(B-127), read in the same walk as absolute-expiry-time."""

from __future__ import annotations

import pytest
from proton import Message

from amqpbroker.amqp import sections
from amqpbroker.amqp.sections import UInt


def _group(message: Message) -> tuple[str, int] | None:
    return sections.scan(bytes(message.encode())).group  # proton encodes a bytearray


def _with_properties(fields: list[object]) -> bytes:
    return b"\x00\x53\x73" + sections.encode_value(fields) + b"\x00\x53\x77\xa1\x01x"


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


def test_group_and_expiry_are_read_together() -> None:
    """B-080 and B-127 from one walk over the list."""
    scanned = sections.scan(bytes(Message(body="x", expiry_time=5.0, group_id="g").encode()))
    assert (scanned.absolute_expiry_time, scanned.group) == (5000, ("g", 0))


@pytest.mark.parametrize(
    "message",
    [
        Message(body="x"),
        Message(body="x", id="m"),
        Message(body="x", id="m", creation_time=5.0),
        Message(body="x", id="m", reply_to_group_id="r"),
    ],
    ids=["no-properties", "id-only", "list-ends-before-group-id", "only-reply-to-group"],
)
def test_no_group_id_is_none(message: Message) -> None:
    """A properties list without a group-id has no group."""
    assert _group(message) is None


def test_a_group_id_that_is_not_a_string_is_no_group() -> None:
    """Hostile peer: a group-id of another type is ignored, as Artemis reads it; the
    message itself is fine."""
    scanned = sections.scan(_with_properties([None] * 10 + [UInt(5), UInt(1)]))
    assert (scanned.group, scanned.body_start > 0) == (None, True)


def test_a_group_id_that_does_not_decode_is_no_group() -> None:
    """Hostile peer: a str8 group-id of invalid UTF-8 is no group, not a refused message."""
    fields = sections.encode_value([None] * 10 + ["g"])
    bad = fields.replace(b"\xa1\x01g", b"\xa1\x01\xff")
    scanned = sections.scan(b"\x00\x53\x73" + bad + b"\x00\x53\x77\xa1\x01x")
    assert scanned.group is None


def test_a_sequence_that_is_not_a_uint_counts_as_zero() -> None:
    """Hostile peer: group-sequence of the wrong type counts as 0, the group stands."""
    scanned = sections.scan(_with_properties([None] * 10 + ["g", "not-a-number"]))
    assert scanned.group == ("g", 0)
