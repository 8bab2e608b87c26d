"""The copy a dead-letter, expiry or management move makes (B-076, B-079, B-090).

The core says *what* the copy must record (`core.MoveAnnotations`); this module knows the
AMQP type each annotation has on the wire and rebuilds the sections, copying
application-properties, body and footer byte for byte.
"""

from __future__ import annotations

from typing import Any

from amqpbroker.amqp import sections
from amqpbroker.amqp.sections import Byte, Long, Symbol, UInt
from amqpbroker.core import Message, MoveAnnotations, kept_annotations, move_annotation_values
from amqpbroker.core.moves import INGRESS_TIME, rebuilt, reprioritized

# The wrappers that give a move annotation its AMQP type (`core.MOVE_ANNOTATIONS`).
_WIRE_TYPES = {"long": Long, "byte": Byte, "symbol": Symbol, "uint": UInt}


def _typed(move: MoveAnnotations) -> dict[str, Any]:
    """The B-090/B-079 annotations with their exact AMQP types; absent ones left out."""
    return move_annotation_values(move, _WIRE_TYPES)


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
            group_id=message.group_id,  # the copy stays in its group (B-127)
            group_sequence=message.group_sequence,
        )

    def with_property(self, message: Message, key: str, value: Any) -> Message:
        """B-127 group-first-key: a copy with `key: value` in application-properties, for
        one delivery (the stored message is unchanged)."""
        properties = {**message.get_application_properties(), key: value}
        data = sections.rebuild(message.data, application_properties=properties)
        rescanned = sections.scan(data)
        copy = rebuilt(message, data, rescanned.header_end, application_properties=properties)
        copy.head_end = rescanned.head_end()
        copy.reader = sections.READER
        return copy

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

    def set_ingress_time(self, message: Message, now_ms: int) -> None:
        """B-018 (d): x-opt-ingress-time (a long, epoch ms) among the message-annotations."""
        annotations = {**message.get_annotations(), INGRESS_TIME: Long(now_ms)}
        data = sections.rebuild(message.data, message_annotations=annotations)
        rescanned = sections.scan(data)
        message.data = data
        message.size = len(data)
        message.header_end = rescanned.header_end
        message.head_end = rescanned.head_end()
        message.annotations = annotations
        message.event_part = None  # its events from now on carry the new bytes

    def with_priority(self, message: Message, priority: int) -> Message:
        """B-161 changeMessagesPriority: the header rewritten (made if there was none)."""
        scanned = sections.scan(message.data)
        header = scanned.header() or sections.Header(message.durable, priority, None, None, 0)
        data = sections.rebuild(scanned.data, header=header._replace(priority=priority))
        rescanned = sections.scan(data)
        copy = reprioritized(message, data, priority, rescanned.header_end)
        copy.head_end = rescanned.head_end()
        return copy


COPIER = Copier()
