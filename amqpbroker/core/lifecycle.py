"""Message lifecycle events (B-170, B-171): one value per state change of a message.

The core builds these; the event-log writer adds `seq`, `broker`, `props` and `body_hash`
and writes one JSON object a line. Field names are the JSONL field names (the Spark
schema is tested against them). Building events costs, so the broker builds only the
ones its level asks for: `failures` builds only FAILURE_EVENTS.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from amqpbroker.core.model import Message


class EventLevel(enum.Enum):
    """`event-log.level`."""

    OFF = "off"
    FAILURES = "failures"
    LIFECYCLE = "lifecycle"


# B-170: the events written at level `failures`.
FAILURE_EVENTS = frozenset(
    {"returned", "held", "dead-lettered", "expired", "killed", "replaced", "moved", "unrouted"}
)

EVENT_TYPES = frozenset(
    {
        "sent",
        "unrouted",
        "enqueued",
        "dispatched",
        "acked",
        "returned",
        "held",
        "dead-lettered",
        "expired",
        "killed",
        "replaced",
        "moved",
    }
)


@dataclass(slots=True, kw_only=True)
class LifecycleEvent:
    """One B-170 record, minus the writer's fields (seq, broker, props, body_hash).

    Not frozen: these are built on the hot path and frozen dataclasses cost several times
    more to construct. Treat them as immutable. `message` is for the writer thread only
    (amqp_message_id, allow-listed properties, body hash): it is never written.
    """

    ts: int
    event: str
    msg_id: int
    address: str | None
    queue: str | None = None
    routing_type: str | None = None
    durable: bool = False
    size: int = 0
    delivery_count: int | None = None
    connection: str | None = None
    link: str | None = None
    txn: str | None = None
    reason: str | None = None
    target_address: str | None = None
    target_queues: tuple[str, ...] | None = None
    copy_msg_id: int | None = None
    delay_ms: int | None = None
    first_ts: int = 0
    error_condition: str | None = None
    error_description: str | None = None
    amqp_message_id: str | None = None
    message: Message | None = None


class Emitter:
    """Collects the events the configured level asks for, in order. Loop thread only."""

    def __init__(self, level: EventLevel = EventLevel.LIFECYCLE) -> None:
        self.level = level
        self.all = level is EventLevel.LIFECYCLE  # cheap checks on the hot path
        self.failures = level is not EventLevel.OFF
        self.events: list[LifecycleEvent] = []

    def take(self) -> list[LifecycleEvent]:
        events, self.events = self.events, []
        return events


# B-170: the JSONL fields, in order (the writer adds seq, broker, props, body_hash).
EVENT_FIELDS = (
    "ts",
    "seq",
    "event",
    "broker",
    "msg_id",
    "amqp_message_id",
    "address",
    "queue",
    "routing_type",
    "durable",
    "size",
    "delivery_count",
    "connection",
    "link",
    "txn",
    "reason",
    "target_address",
    "target_queues",
    "copy_msg_id",
    "delay_ms",
    "first_ts",
    "error_condition",
    "error_description",
    "props",
    "body_hash",
)
