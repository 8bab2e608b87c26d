"""Message lifecycle events (B-170, B-171): one record per state change of a message.

The core appends each event to `Emitter.events` as a `RawEvent` (layout below), a tuple
of shared parts, and the event-log writer adds `seq`, `broker`, `amqp_message_id`,
`props` and `body_hash` and writes one JSON object a line. Why tuples: at level
`lifecycle` a delivered message makes four events, and building a keyword-argument
dataclass for each cost ~29% of queue throughput. Why shared parts: a flat tuple of
fifteen fields still cost the broker ~14% more instructions per message with the log on;
the parts that depend only on the message, or only on the queue and the link, are built
once and kept, so an event is a few attribute loads, and `marshal` (which hands events to
the writer process at C speed) writes each part once per frame.
`LifecycleEvent` is the readable form of the same record, for tests and tools.

Building events still costs, so the broker builds only the ones its level asks for:
`failures` builds only FAILURE_EVENTS.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from amqpbroker.core.model import Message, MessagePart


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

# The fields few events have (moves, returns, rejections), kept out of the common tuple:
# (txn, target_address, target_queues, copy_msg_id, delay_ms, error_condition,
#  error_description, amqp_message_id). amqp_message_id is normally left None: the writer
# reads it from the message bytes, off the loop thread.
# Variadic for mypyc, as `model.MessagePart` (a queue's `event_routed` is shared by the
# `sent` events of its messages).
Extra: TypeAlias = tuple[Any, ...]

# An event's fields that depend only on its message: `model.MessagePart` (kept on the
# message, so defined there).
# (address, queue, routing_type): built once per queue (`Queue.event_where`).
Where: TypeAlias = tuple[str | None, str | None, str | None]
# (connection, link): built once per consumer.
By: TypeAlias = tuple[str | None, str | None]
# (event, where, by, reason): what an event says besides its message, time and count. The
# common ones are built once, on the queue (`enqueued`) or on the consumer (`dispatched`,
# `acked`); by is None when there is no link.
# Variadic for mypyc, as `model.MessagePart`: a fixed-length tuple type would be boxed
# anew at each use, and events would no longer share their shape.
Shape: TypeAlias = tuple[Any, ...]

# A message part's `data` when an earlier event sent the message's bytes to the event-log
# writer process, which remembers what it read from them (amqp_message_id, props,
# body_hash) for `Emitter.known_window` events (issue 20: a redelivered message's bytes
# were marshalled and piped with every frame that held one of its events, three times).
KNOWN: Final = 0

# `Emitter.data_limit` when events carry the whole message: below 2**62, so that compiled
# (setup.py) it is a short int and the check per message a C comparison, where
# `sys.maxsize` was a boxed one (~260 instructions a message, issue 20).
NO_DATA_LIMIT: Final = (1 << 62) - 1

# One event as the core records it: (shape, ts, message part, delivery_count, extra).
# Shared tuples, not copied fields: a common event is one small tuple of things already
# built, and `marshal` writes a shape or a message part once per frame however many events
# of the frame share it.
RawEvent: TypeAlias = tuple[Shape, int, MessagePart, int | None, Extra | None]


@dataclass(slots=True, kw_only=True)
class LifecycleEvent:
    """One B-170 record, minus the writer's fields (seq, broker, props, body_hash): the
    readable form of a `RawEvent` (`raw()`, `of()`), for tests and tools; the hot path
    never builds one. `data` (message bytes) is for the writer only: it is never written.
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
    data: bytes | None = None

    def raw(self) -> RawEvent:
        """The tuple the core would have recorded for this event."""
        extra: Extra = (
            self.txn,
            self.target_address,
            self.target_queues,
            self.copy_msg_id,
            self.delay_ms,
            self.error_condition,
            self.error_description,
            self.amqp_message_id,
        )
        by = None if self.connection is None and self.link is None else (self.connection, self.link)
        return (
            (self.event, (self.address, self.queue, self.routing_type), by, self.reason),
            self.ts,
            (self.msg_id, self.durable, self.size, self.first_ts, self.data),
            self.delivery_count,
            None if extra == _NO_EXTRA else extra,
        )

    @classmethod
    def of(cls, raw: RawEvent) -> LifecycleEvent:
        """The readable form of a recorded event."""
        shape, ts, part, delivery_count, extra = raw
        event, where, by, reason = shape
        msg_id, durable, size, first_ts, data = part
        address, queue, routing_type = where
        connection, link = by or (None, None)
        (
            txn,
            target_address,
            target_queues,
            copy_msg_id,
            delay_ms,
            condition,
            description,
            amqp_id,
        ) = extra or _NO_EXTRA
        return cls(
            ts=ts,
            event=event,
            msg_id=msg_id,
            address=address,
            queue=queue,
            routing_type=routing_type,
            durable=durable,
            size=size,
            delivery_count=delivery_count,
            connection=connection,
            link=link,
            txn=txn,
            reason=reason,
            target_address=target_address,
            target_queues=target_queues,
            copy_msg_id=copy_msg_id,
            delay_ms=delay_ms,
            first_ts=first_ts,
            error_condition=condition,
            error_description=description,
            amqp_message_id=amqp_id,
            data=data,
        )


_NO_EXTRA: Extra = (None, None, None, None, None, None, None, None)


class Emitter:
    """Collects the events the configured level asks for, in order. Loop thread only."""

    def __init__(self, level: EventLevel = EventLevel.LIFECYCLE) -> None:
        self.level = level
        self.all = level is EventLevel.LIFECYCLE  # cheap checks on the hot path
        self.failures = level is not EventLevel.OFF
        self.events: list[RawEvent] = []
        # How many bytes of a message an event carries (the event-log writer sets it: it
        # needs all of them only for `props` or `body_hash`, else the head that holds
        # properties.message-id, so a large message costs no more than a small one).
        self.data_limit = NO_DATA_LIMIT
        # Whether an event may carry just the message's head (`Message.head_end`): the
        # writer sets it when it writes neither props nor body_hash. A head is a tenth of
        # a 1 KiB message, and the bytes handed to the writer are most of its cost.
        self.heads_only = False
        # How many events after the one that carried a message's bytes its later events
        # may carry `KNOWN` instead (the event-log writer sets it: its writer process
        # remembers that long, `eventlog.frames.KNOWN_WINDOW`); 0: always the bytes.
        self.known_window = 0
        # Events handed over (`take_raw`) so far: `handed + len(events)` numbers the next
        # one as the writer numbers it (`seq` - 1) at level lifecycle, and never less.
        self.handed = 0
        # B-170 `txn` (see the property), and the `extra` of a common event that carries it.
        self._txn: str | None = None
        self.txn_extra: Extra | None = None

    @property
    def txn(self) -> str | None:
        """The transaction (id in hex) whose commit or rollback the broker is carrying
        out; the events it causes carry it, except `dispatched` (a delivery to a consumer
        is not part of the transaction that routed the message)."""
        return self._txn

    @txn.setter
    def txn(self, txn: str | None) -> None:
        self._txn = txn
        self.txn_extra = None if txn is None else (txn, None, None, None, None, None, None, None)

    def message_part(self, message: Message) -> MessagePart:
        """Build `message`'s `MessagePart` and keep it on the message for its next events
        (callers write `emitter.part(message)`, which calls this when needed; whoever
        changes its bytes, B-083, drops it: `Message.event_part`)."""
        data = message.data
        head_end = message.head_end
        if self.heads_only and head_end:
            data = data[:head_end]
        elif len(data) > self.data_limit:
            data = data[: self.data_limit]
        part: MessagePart = (message.msg_id, message.durable, message.size, message.first_ts, data)
        message.event_part = part
        return part

    def part(self, message: Message) -> MessagePart:
        """`message`'s part for its next event: the one kept on it (`Message.event_part`)
        while its bytes went over in this hand-off (`marshal` writes a shared part once a
        frame); a copy whose data is `KNOWN` once they went in an earlier one and the
        writer process still remembers them; else built anew (its bytes again)."""
        part = message.event_part
        if part is not None:
            sent = message.event_sent
            handed = self.handed
            if sent >= handed:
                return part
            window = self.known_window
            if not window:
                return part
            if handed + len(self.events) - sent < window:
                if part[4] is KNOWN:
                    return part
                light: MessagePart = (part[0], part[1], part[2], part[3], KNOWN)
                message.event_part = light
                return light
        part = self.message_part(message)
        message.event_sent = self.handed + len(self.events)
        return part

    def forget_sent(self) -> None:
        """Bytes handed over may not have reached the writer process (a frame dropped):
        every message's next event carries its bytes again."""
        self.handed += self.known_window

    def take_raw(self) -> list[RawEvent]:
        """The events since the last call, as recorded (the shell's hand-off)."""
        events, self.events = self.events, []
        self.handed += len(events)
        return events

    def take(self) -> list[LifecycleEvent]:
        """The events since the last call, readable (tests and tools)."""
        return [LifecycleEvent.of(raw) for raw in self.take_raw()]
