"""The copy a dead-letter, expiry or management move makes (B-076, B-079, B-090).

The core says *what* the copy must record (`core.MoveAnnotations`); this module knows the
AMQP type each annotation has on the wire and rebuilds the sections, copying
application-properties, body and footer byte for byte.
"""

from __future__ import annotations

from typing import Any

from amqpbroker.amqp import sections
from amqpbroker.amqp.sections import Byte, Long, Symbol, UInt
from amqpbroker.core import Message, MoveAnnotations, kept_annotations


def _typed(move: MoveAnnotations) -> dict[str, Any]:
    """The B-090/B-079 annotations with their exact AMQP types; absent ones left out."""
    values: dict[str, Any] = {
        "x-opt-ORIG-QUEUE": move.orig_queue,
        "x-opt-ORIG-ADDRESS": move.orig_address,
        "x-opt-ORIG-MESSAGE-ID": Long(move.orig_message_id),
        "x-opt-ORIG-ROUTING-TYPE": None
        if move.orig_routing_type is None
        else Byte(move.orig_routing_type),
        "x-opt-ACTUAL-EXPIRY": None if move.actual_expiry is None else Long(move.actual_expiry),
        "x-opt-DLQ-REASON": move.dlq_reason,
        "x-opt-DLQ-ERROR-CONDITION": None
        if move.dlq_error_condition is None
        else Symbol(move.dlq_error_condition),
        "x-opt-DLQ-ERROR-DESCRIPTION": move.dlq_error_description,
        "x-opt-DLQ-DELIVERY-COUNT": None
        if move.dlq_delivery_count is None
        else UInt(move.dlq_delivery_count),
        "x-opt-routing-type": None if move.routing_type is None else Byte(move.routing_type),
    }
    return {k: v for k, v in values.items() if v is not None}


class Copier:
    """`core.MessageCopier` over the section codec."""

    def copy(self, message: Message, move: MoveAnnotations) -> Message:
        scanned = sections.scan(message.data)
        header = scanned.header()
        annotations = kept_annotations(message.get_annotations())
        annotations.update(_typed(move))
        data = sections.rebuild(
            scanned.data,
            header=None
            if header is None
            else header._replace(ttl=None, delivery_count=0, first_acquirer=None),
            message_annotations=annotations,
            properties_update={"absolute-expiry-time": None}
            if scanned.absolute_expiry_time is not None
            else None,
        )
        rescanned = sections.scan(data)
        return Message(
            data,
            durable=message.durable,
            priority=message.priority,
            header_end=rescanned.header_end,
            head_end=rescanned.head_end(),
            annotations=annotations,
            reader=sections.READER,
        )

    def set_expiration(self, message: Message, expiration_ms: int) -> None:
        """B-083: absolute-expiry-time = the new value (removed for 0); header.ttl removed."""
        scanned = sections.scan(message.data)
        header = scanned.header()
        data = sections.rebuild(
            scanned.data,
            header=sections.KEEP
            if header is None or header.ttl is None
            else header._replace(ttl=None),
            properties_update={"absolute-expiry-time": expiration_ms or None},
        )
        rescanned = sections.scan(data)
        message.data = data
        message.size = len(data)
        message.header_end = rescanned.header_end
        message.head_end = rescanned.head_end()
        message.event_part = None  # its events from now on carry the new bytes
        message.expiration_ms = expiration_ms


COPIER = Copier()
