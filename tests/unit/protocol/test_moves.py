"""The moved copy's annotations: one list of names (`core.MOVE_ANNOTATIONS`), typed by the
codec (B-076, B-079, B-090; issue 18 item 4: one table per policy)."""

from __future__ import annotations

from proton import Data
from proton import Message as ProtonMessage
from support.annotations import annotation_types

from amqpbroker.amqp import sections
from amqpbroker.core import Message, MoveAnnotations
from amqpbroker.core.moves import MOVE_ANNOTATIONS, move_annotation_values
from amqpbroker.protocol.moves import COPIER

EVERY_FIELD = MoveAnnotations(
    orig_address="a",
    orig_queue="q",
    orig_message_id=7,
    orig_routing_type=1,
    actual_expiry=1_700_000_000_000,
    dlq_reason="rejected",
    dlq_error_condition="app:e",
    dlq_error_description="why",
    dlq_delivery_count=3,
    routing_type=0,
)


def test_a_copy_carries_every_move_annotation_with_its_amqp_type() -> None:
    """B-090: long ids and expiry, byte routing types, a symbol condition, a uint count."""
    original = ProtonMessage(body="x", annotations={"keep": "me", "x-opt-DLQ-REASON": "old"})
    data = bytes(original.encode())  # proton encodes a bytearray
    scanned = sections.scan(data)
    message = Message(data, header_end=scanned.header_end, reader=sections.READER)
    copy = COPIER.copy(message, EVERY_FIELD)
    found = annotation_types(copy.data)
    assert found == {
        "keep": (Data.STRING, "me"),
        "x-opt-ORIG-QUEUE": (Data.STRING, "q"),
        "x-opt-ORIG-ADDRESS": (Data.STRING, "a"),
        "x-opt-ORIG-MESSAGE-ID": (Data.LONG, 7),
        "x-opt-ORIG-ROUTING-TYPE": (Data.BYTE, 1),
        "x-opt-ACTUAL-EXPIRY": (Data.LONG, 1_700_000_000_000),
        "x-opt-DLQ-REASON": (Data.STRING, "rejected"),
        "x-opt-DLQ-ERROR-CONDITION": (Data.SYMBOL, "app:e"),
        "x-opt-DLQ-ERROR-DESCRIPTION": (Data.STRING, "why"),
        "x-opt-DLQ-DELIVERY-COUNT": (Data.UINT, 3),
        "x-opt-routing-type": (Data.BYTE, 0),
    }
    # in the table's order, after what the original kept
    assert list(found)[1:] == [name for name, _, _ in MOVE_ANNOTATIONS]


def test_plain_values_leave_out_the_absent_ones() -> None:
    move = MoveAnnotations(orig_address="a", orig_queue=None, orig_message_id=1)
    assert move_annotation_values(move) == {"x-opt-ORIG-ADDRESS": "a", "x-opt-ORIG-MESSAGE-ID": 1}


def _message(original: ProtonMessage) -> Message:
    data = bytes(original.encode())  # proton encodes a bytearray
    scanned = sections.scan(data)
    return Message(
        data,
        durable=original.durable,
        priority=original.priority,
        header_end=scanned.header_end,
        head_end=scanned.head_end(),
        reader=sections.READER,
    )


def test_ingress_time_is_a_long_annotation_next_to_the_others() -> None:
    """B-018 (d) enable-ingress-timestamp: x-opt-ingress-time (long, epoch ms) added; the
    other annotations, header and body kept; the size follows the new bytes."""
    message = _message(ProtonMessage(body="x", durable=True, annotations={"keep": "me"}))
    COPIER.set_ingress_time(message, 1_700_000_000_123)
    assert annotation_types(message.data) == {
        "keep": (Data.STRING, "me"),
        "x-opt-ingress-time": (Data.LONG, 1_700_000_000_123),
    }
    decoded = ProtonMessage()
    decoded.decode(message.data)
    assert (decoded.body, decoded.durable, message.size) == ("x", True, len(message.data))


def test_with_priority_rewrites_the_header_of_a_new_message_only() -> None:
    """B-161 changeMessagesPriority: a header is made when there was none; the original
    message object (other queues may hold it) is unchanged."""
    original = _message(ProtonMessage(body="x"))
    original.msg_id = 42
    changed = COPIER.with_priority(original, 9)
    decoded = ProtonMessage()
    decoded.decode(changed.data)
    assert (decoded.priority, decoded.body, changed.msg_id, changed.priority) == (9, "x", 42, 9)
    assert sections.scan(original.data).priority == 4
