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
        properties = dict(message.get_application_properties())
        properties[key] = value
        data = sections.rebuild(message.data, application_properties=properties)
        rescanned = sections.scan(data)
        return Message(
            data,
            msg_id=message.msg_id,
            durable=message.durable,
            priority=message.priority,
            expiration_ms=message.expiration_ms,
            header_end=rescanned.header_end,
            head_end=rescanned.head_end(),
            header=message.header,
            annotations=message.annotations,
            properties=message.properties,
            application_properties=properties,
            address=message.address,
            first_ts=message.first_ts,
            reader=sections.READER,
            group_id=message.group_id,
            group_sequence=message.group_sequence,
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
