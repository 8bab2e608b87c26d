"""The values the core works on: routing types, messages and queue configuration.

A `Message` is what a producer sent, as encoded AMQP sections, plus the handful of fields
the core reads (durability, priority, expiration, routing annotations). The core never
decodes a body; the protocol adapter fills these fields by scanning the section headers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NewType, Protocol, TypeAlias

# An event's fields that depend only on its message: (msg_id, durable, size, first_ts,
# data). `data` is the message's encoded bytes (or their first `lifecycle.Emitter.data_limit` bytes,
# or its head: see `Emitter.heads_only`), from which the writer takes amqp_message_id,
# props and body_hash; None when there is no message to read; `lifecycle.KNOWN` when an
# earlier event sent them to the writer process, which remembers them. Built once per message
# (`lifecycle.Emitter.message_part`, kept in `Message.event_part`) and shared by all its events.
# Typed as a tuple of any length on purpose: mypyc unboxes a fixed-length tuple type into a
# C struct and boxes a new tuple at every use, so the events would no longer share it
# (nor `marshal` write it once a frame); a variadic tuple stays the one object.
MessagePart: TypeAlias = tuple[Any, ...]
ConsumerId = NewType("ConsumerId", int)
DeliveryId = NewType("DeliveryId", int)
ConnectionId = NewType("ConnectionId", int)

DEFAULT_PRIORITY = 4  # B-013: priority when the header or the field is absent


def priority_level(priority: int) -> int:
    """B-013: a priority as a queue level, 0..9 (a queue keeps one deque per level). Every
    priority read from outside goes through here: a page file's (a ubyte) or an old
    journal record's (an i64) set past 9 made a queue's depage raise IndexError, its
    messages lost (fifth attack pass), and a negative one picked a level from the end."""
    return min(max(priority, 0), 9)


DUPLICATE_ID = "_AMQ_DUPL_ID"  # B-012: the application property holding a duplicate id
# B-015: the latest scheduled delivery time, epoch ms: a Java long, what the journal and
# the page files store (i64). A later `x-opt-delivery-time` (a ulong) or a delay that
# passes it is this time: it failed the journal's encoding, and with it every durable
# send after it until a restart (issue 15 attack).
LATEST_DELIVERY_MS = 2**63 - 1


class RoutingType(enum.Enum):
    """Artemis routing types, spelled as in the config."""

    ANYCAST = "ANYCAST"
    MULTICAST = "MULTICAST"


# The routing type <-> annotation tables (B-008 rule 2, B-090), used everywhere.
# `x-opt-routing-type` / `x-opt-ORIG-ROUTING-TYPE`: the byte Artemis writes.
ROUTING_TYPE_OF_BYTE: dict[Any, RoutingType] = {0: RoutingType.MULTICAST, 1: RoutingType.ANYCAST}
BYTE_OF_ROUTING_TYPE: dict[RoutingType, int] = {v: k for k, v in ROUTING_TYPE_OF_BYTE.items()}
# `x-opt-jms-dest` (Qpid JMS): 0 queue, 1 topic, 2 temporary queue, 3 temporary topic.
ROUTING_TYPE_OF_JMS_DEST: dict[Any, RoutingType] = {
    0: RoutingType.ANYCAST,
    1: RoutingType.MULTICAST,
    2: RoutingType.ANYCAST,
    3: RoutingType.MULTICAST,
}


def annotated_routing_type(
    annotations: Mapping[Any, Any], *, jms_dest: bool = True
) -> RoutingType | None:
    """The routing type a message's annotations ask for: `x-opt-routing-type`, else (when
    `jms_dest`) `x-opt-jms-dest`; None when neither is a known integer."""
    value = annotations.get("x-opt-routing-type")
    if isinstance(value, int) and (found := ROUTING_TYPE_OF_BYTE.get(value)) is not None:
        return found
    if jms_dest:
        jms = annotations.get("x-opt-jms-dest")
        if isinstance(jms, int):
            return ROUTING_TYPE_OF_JMS_DEST.get(jms)
    return None


@dataclass(frozen=True, slots=True)
class ProducerTarget:
    """Where a producer link's messages go (`Broker.attach_producer`, core/attach.py).
    address None: anonymous relay. Here, in a compiled module, a native class: `publish`
    reads four of its fields a message (issue 20)."""

    address: str | None
    routing_type: RoutingType | None = None  # fixed by capability or prefix (B-008 rule 1)
    queue: str | None = None  # FQQN: only this queue (B-006)
    link_routing_type: RoutingType | None = None  # anonymous relay: from link capabilities
    user: str | None = None
    roles: frozenset[str] | None = None  # anonymous relay: `send` is checked per message
    management: bool = False  # a link to the management address: requests (B-160)


class SectionReader(Protocol):
    """Decodes sections of an encoded message on demand (implemented in `protocol/`).

    The core asks only when a filter, a move or management needs the values; the hot path
    never does. Keys of `properties` are the AMQP field names (`message-id`, `to`,
    `absolute-expiry-time`, ...); annotation keys are the symbols as `str`.
    """

    def properties(self, data: bytes) -> dict[str, Any]: ...

    def application_properties(self, data: bytes) -> dict[str, Any]: ...

    def message_annotations(self, data: bytes) -> dict[str, Any]: ...


class Message:
    """One message as the broker stores and forwards it (immutable once routed).

    `data` holds the encoded sections exactly as received, minus delivery annotations
    (B-017). `header_end` is the offset where the header section ends (0 when there is
    none): redelivery re-encodes only `data[:header_end]` (B-050). `head_end` is where
    the sections up to properties end, for the event log.
    """

    __slots__ = (
        "address",
        "annotations",
        "application_properties",
        "data",
        "deliver_at_ms",
        "durable",
        "event_part",
        "event_sent",
        "expiration_ms",
        "first_ts",
        "group_id",
        "group_sequence",
        "head_end",
        "header",
        "header_end",
        "msg_id",
        "origin_container",
        "priority",
        "properties",
        "reader",
        "size",
        "stored",
        "ttl_ms",
    )

    def __init__(
        self,
        data: bytes,
        *,
        msg_id: int = 0,
        durable: bool = False,
        priority: int = DEFAULT_PRIORITY,
        expiration_ms: int = 0,
        header_end: int = 0,
        head_end: int = 0,
        header: dict[str, Any] | None = None,
        annotations: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
        application_properties: dict[str, Any] | None = None,
        address: str = "",
        first_ts: int = 0,
        origin_container: str | None = None,
        reader: SectionReader | None = None,
        ttl_ms: int | None = None,
        deliver_at_ms: int = 0,
        group_id: str | None = None,
        group_sequence: int = 0,
    ) -> None:
        self.data = data
        self.size = len(data)
        self.msg_id = msg_id
        self.durable = durable
        self.priority = priority_level(priority)
        self.expiration_ms = expiration_ms
        self.header_end = header_end
        # Where the sections up to properties end (0: not known): the event log reads no
        # more of the message than that, unless it writes props or body_hash.
        self.head_end = head_end
        self.header = header
        self.annotations = annotations
        self.properties = properties
        self.application_properties = application_properties
        self.address = address
        self.first_ts = first_ts
        self.origin_container = origin_container
        self.reader = reader
        self.ttl_ms = ttl_ms  # header.ttl as sent; expiration_ms holds the computed value
        self.deliver_at_ms = deliver_at_ms  # scheduled delivery, epoch ms; 0 = now (B-015)
        # properties.group-id / group-sequence (B-127), read by the adapter's scan.
        self.group_id = group_id
        self.group_sequence = group_sequence
        self.stored = False  # its AddMessage record is in the journal (core/persistence.py)
        # Its lifecycle events' shared part (`Emitter.message_part`), built on the first;
        # whoever changes `data` sets it back to None.
        self.event_part: MessagePart | None = None
        # The number (`Emitter.part`) of the event that last carried its bytes to the
        # event-log writer process, which remembers them for a while (B-170, issue 20).
        self.event_sent = 0

    def get_properties(self) -> dict[str, Any]:
        """The properties section as a dict (decoded once, on first use)."""
        if self.properties is None:
            self.properties = self.reader.properties(self.data) if self.reader else {}
        return self.properties

    def get_application_properties(self) -> dict[str, Any]:
        """The application-properties section as a dict (decoded once, on first use)."""
        if self.application_properties is None:
            reader = self.reader
            self.application_properties = reader.application_properties(self.data) if reader else {}
        return self.application_properties

    def get_annotations(self) -> dict[str, Any]:
        """The message-annotations section as a dict (decoded once, on first use)."""
        if self.annotations is None:
            self.annotations = self.reader.message_annotations(self.data) if self.reader else {}
        return self.annotations

    def __repr__(self) -> str:
        return f"Message(id={self.msg_id}, address={self.address!r}, size={self.size})"


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueConfig:
    """How to create a queue (from configuration, auto-create or a subscription)."""

    name: str
    address: str
    routing_type: RoutingType
    durable: bool = True
    filter: str | None = None
    max_consumers: int = -1
    purge_on_no_consumers: bool = False
    exclusive: bool = False
    last_value_key: str | None = None
    non_destructive: bool = False
    ring_size: int = -1
    # Message groups and the dispatch gate (B-127, B-128; core/dispatch.py).
    group_rebalance: bool = False
    group_rebalance_pause_dispatch: bool = False
    group_buckets: int = -1  # -1: one owner per group id; 0: grouping off; N: N buckets
    group_first_key: str | None = None
    consumers_before_dispatch: int = 0
    delay_before_dispatch: int = -1  # ms; -1: off
    temporary: bool = False
    auto_created: bool = False
    configured: bool = False  # configuration-managed: never auto-deleted (B-113)
    extra: dict[str, Any] = field(default_factory=dict)
