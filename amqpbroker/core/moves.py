"""What a moved copy says about where it came from, and who writes it.

Theory of operation
-------------------
A dead-letter, expiry or management move routes a *copy* of the message (B-076): the
copy keeps the original's annotations except earlier hops' `x-opt-ORIG-*` / `x-opt-DLQ-*`
entries and `x-opt-routing-type` (`kept_annotations`), and gains the ones a
`MoveAnnotations` describes, in the order of `MOVE_ANNOTATIONS`, the one list of their
names and AMQP types (B-076, B-079, B-090). The core knows only the values: the protocol
codec (`protocol/moves.py`) implements `MessageCopier`, re-encoding the annotations with
their AMQP types; `_BytesCopier` is the fallback for tests without a codec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from amqpbroker.core.model import Message


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveAnnotations:
    """What a moved copy must say about where it came from (B-076, B-079, B-090).

    The protocol codec knows the AMQP type of each annotation; the core only the values.
    """

    orig_address: str
    orig_queue: str | None
    orig_message_id: int
    orig_routing_type: int | None = None  # 0 MULTICAST, 1 ANYCAST
    actual_expiry: int | None = None
    dlq_reason: str | None = None
    dlq_error_condition: str | None = None
    dlq_error_description: str | None = None
    dlq_delivery_count: int | None = None
    routing_type: int | None = None  # x-opt-routing-type on the copy (B-090 exception)


INGRESS_TIME = "x-opt-ingress-time"  # B-018 (d): when the broker accepted it, epoch ms


class MessageCopier(Protocol):
    """Rewrites encoded messages (implemented by the protocol codec)."""

    def copy(self, message: Message, move: MoveAnnotations) -> Message:
        """The copy a dead-letter, expiry or management move routes (B-076)."""
        ...

    def set_expiration(self, message: Message, expiration_ms: int) -> None:
        """B-083: write absolute-expiry-time (or remove it for 0) and drop header.ttl."""
        ...

    def set_ingress_time(self, message: Message, now_ms: int) -> None:
        """B-018 (d) `enable-ingress-timestamp`: annotate `x-opt-ingress-time` (epoch ms)."""
        ...

    def with_priority(self, message: Message, priority: int) -> Message:
        """B-161 changeMessagesPriority: the same message (same id) whose header says
        `priority`; `message` itself is left alone (other queues may hold it)."""
        ...

    def with_property(self, message: Message, key: str, value: Any) -> Message:
        """A copy of `message` whose application-properties also say `key: value` (the
        group-first-key of B-127: for one delivery, the stored message unchanged)."""
        ...


class _BytesCopier:
    """Fallback for tests without a codec: the copy shares the original bytes."""

    def copy(self, message: Message, move: MoveAnnotations) -> Message:
        annotations = kept_annotations(message.get_annotations())
        annotations.update(move_annotation_values(move))
        return Message(
            message.data,
            durable=message.durable,
            priority=message.priority,
            header_end=message.header_end,
            annotations=annotations,
            properties=message.properties,
            application_properties=message.application_properties,
            reader=message.reader,
            group_id=message.group_id,  # the copy stays in its group (B-127)
            group_sequence=message.group_sequence,
        )

    def set_expiration(self, message: Message, expiration_ms: int) -> None:
        message.expiration_ms = expiration_ms

    def set_ingress_time(self, message: Message, now_ms: int) -> None:
        message.annotations = {**message.get_annotations(), INGRESS_TIME: now_ms}

    def with_priority(self, message: Message, priority: int) -> Message:
        return reprioritized(message, message.data, priority, message.header_end)

    def with_property(self, message: Message, key: str, value: Any) -> Message:
        properties = {**message.get_application_properties(), key: value}
        return rebuilt(message, message.data, message.header_end, application_properties=properties)


def reprioritized(message: Message, data: bytes, priority: int, header_end: int) -> Message:
    """`message` with new bytes `data` and `priority`: the same id and fields otherwise."""
    return rebuilt(message, data, header_end, priority=priority)


def rebuilt(
    message: Message,
    data: bytes,
    header_end: int,
    *,
    priority: int | None = None,
    application_properties: dict[str, Any] | None = None,
) -> Message:
    """`message` with new bytes `data` (and the priority or application-properties they
    now say): the same id and fields otherwise (B-161 priority, B-127 group-first-key)."""
    copy = Message(
        data,
        msg_id=message.msg_id,
        durable=message.durable,
        priority=message.priority if priority is None else priority,
        expiration_ms=message.expiration_ms,
        header_end=header_end,
        header=message.header,
        annotations=message.annotations,
        properties=message.properties,
        application_properties=message.application_properties
        if application_properties is None
        else application_properties,
        address=message.address,
        first_ts=message.first_ts,
        origin_container=message.origin_container,
        reader=message.reader,
        ttl_ms=message.ttl_ms,
        deliver_at_ms=message.deliver_at_ms,
        group_id=message.group_id,
        group_sequence=message.group_sequence,
    )
    copy.stored = message.stored
    return copy


def kept_annotations(annotations: dict[Any, Any]) -> dict[Any, Any]:
    """The annotations a moved copy keeps: all but earlier hops' `x-opt-ORIG-*` /
    `x-opt-DLQ-*` entries and `x-opt-routing-type` (B-076, B-079, B-090)."""
    return {
        key: value
        for key, value in annotations.items()
        if not (isinstance(key, str) and key.startswith(("x-opt-ORIG-", "x-opt-DLQ-")))
        and key != "x-opt-routing-type"
    }


# The names the broker itself reads back from a moved message (retry, hop, filters).
ORIG_QUEUE = "x-opt-ORIG-QUEUE"
ORIG_ADDRESS = "x-opt-ORIG-ADDRESS"
ORIG_ROUTING_TYPE = "x-opt-ORIG-ROUTING-TYPE"

# The annotations of a moved copy (B-076, B-079, B-090), in the order they are written:
# (name, `MoveAnnotations` field, AMQP type). The one list of their names; the protocol
# codec maps the type names to its wrappers (`protocol/moves.py`), the selector their
# `_AMQ_*` property names (`INTERNAL_PROPERTIES`).
MOVE_ANNOTATIONS: tuple[tuple[str, str, str], ...] = (
    (ORIG_QUEUE, "orig_queue", "string"),
    (ORIG_ADDRESS, "orig_address", "string"),
    ("x-opt-ORIG-MESSAGE-ID", "orig_message_id", "long"),
    (ORIG_ROUTING_TYPE, "orig_routing_type", "byte"),
    ("x-opt-ACTUAL-EXPIRY", "actual_expiry", "long"),
    ("x-opt-DLQ-REASON", "dlq_reason", "string"),
    ("x-opt-DLQ-ERROR-CONDITION", "dlq_error_condition", "symbol"),
    ("x-opt-DLQ-ERROR-DESCRIPTION", "dlq_error_description", "string"),
    ("x-opt-DLQ-DELIVERY-COUNT", "dlq_delivery_count", "uint"),
    ("x-opt-routing-type", "routing_type", "byte"),
)

# B-090/B-079: the broker-internal properties a selector reads from a moved copy's
# annotations (`_AMQ_ORIG_ADDRESS` is `x-opt-ORIG-ADDRESS`); never taken from
# application-properties, so a producer cannot forge them (B-131).
INTERNAL_PROPERTIES = frozenset(
    "_AMQ_" + name.removeprefix("x-opt-").replace("-", "_")
    for name, _, _ in MOVE_ANNOTATIONS
    if name.startswith(("x-opt-ORIG-", "x-opt-ACTUAL-", "x-opt-DLQ-"))
)


def move_annotation_values(
    move: MoveAnnotations, typed: Mapping[str, Callable[[Any], Any]] | None = None
) -> dict[str, Any]:
    """The `x-opt-*` annotation values of a move, absent entries left out (B-090); each
    passed through `typed[its AMQP type]` when there is one."""
    values: dict[str, Any] = {}
    for name, attribute, kind in MOVE_ANNOTATIONS:
        value = getattr(move, attribute)
        if value is not None:
            wrap = typed.get(kind) if typed is not None else None
            values[name] = value if wrap is None else wrap(value)
    return values
