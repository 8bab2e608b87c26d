"""Apply the broker's effects to the links they name, on whatever connection (issue 18).

Theory of operation
-------------------
The core answers every call with effects, as data, in the order they must happen
(`core/effects.py`): `Dispatch`, `Drained`, `CloseConsumer`, `AddressUnblocked`,
`CloseConnection`. After each batch of engine events (and after a timer tick or an HTTP
command) the connection, or the server, calls `Shell.apply_effects`, which takes them and
applies them in order:

* `Dispatch` -> `ConsumerLink.send`: a transfer on the consumer's proton `Sender`, with the
  stored bytes (only the header re-encoded on a redelivery, B-050) and the delivery id as
  its tag; the link keeps the id by its `pn_delivery_t` until the consumer settles
  (`ConsumerLink.delivery_id`; the tag, read back by `delivery_id_of`, is the fallback);
* `Drained` -> the link's drain is answered; `CloseConsumer` -> the link is closed with
  the condition the core names; `AddressUnblocked` -> every connection tops up the credit
  of its producers to that address and of its anonymous relays (all of them when the
  broker-wide limit has room again: address None) (B-151); `CloseConnection` -> the
  connection is closed with the condition, as on a connection error (a slow consumer's
  KILL, core/slowconsumer.py).

A dispatch to a consumer that has meanwhile gone is dropped: the core already returned
that message. Every connection touched is marked `dirty`, and the server writes what each
dirty engine has to say once per batch. Durable state: the step's journal records are
appended once, after the effects (`Persistence.flush`); dispatches whose delivery counts
must reach the journal first are held until it has written them (B-097), and later
effects queue behind them, so the order per link is kept.

The shell knows connections only through `Engine` (the two calls it makes on one), so
this module does not import `connection.py`; `Shell` and `ConsumerLink` are generic in
the connection type, which the server fixes (`Shell[AmqpConnection]`).

Loop thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final, Generic, Protocol, TypeVar

from cproton_ffi import ffi, lib
from proton import Link

import amqpbroker.protocol.pnloop as pnloop
from amqpbroker.amqp import sections
from amqpbroker.core import (
    AddressUnblocked,
    Broker,
    CloseConnection,
    CloseConsumer,
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Dispatch,
    Drained,
    Effect,
    Message,
    ProducerTarget,
    RawEvent,
    RoutingType,
)
from amqpbroker.core.queue import Consumer
from amqpbroker.protocol.peer import PeerInvalidField


class Engine(Protocol):
    """What the shell asks of a connection."""

    def resume_producers(self, address: str | None) -> bool: ...

    def close_link(self, link: Link, condition: str, description: str) -> None: ...

    def close_with_error(self, condition: str, description: str) -> None: ...


C = TypeVar("C", bound=Engine)

# The C API of the hot path, bound once: compiled (setup.py), a `Final` name is a C
# static, so a call costs no module-dict lookup of `lib` and no attribute lookup on it.
_pn_delivery_tag: Final = lib.pn_delivery_tag
_from_buffer: Final = ffi.from_buffer
_unpack: Final = ffi.unpack
_send: Final = pnloop.send
_send_headed: Final = pnloop.send_headed
_key: Final = pnloop.key
_pointer: Final = pnloop.pointer
_FAST_SEND: Final[bool] = pnloop.FAST
_TAG: Final = pnloop.TAG
_TAG_STRUCTS: Final[tuple[Any, ...]] = pnloop.TAG_STRUCTS
_pn_delivery: Final = lib.pn_delivery
_pn_delivery_settle: Final = lib.pn_delivery_settle
_pn_link_advance: Final = lib.pn_link_advance
_pn_link_send: Final = lib.pn_link_send
# `_pnloop.send` takes a uint64 id; the bound is lower so that the comparison stays a C
# one when compiled (a short int).
_MAX_C_ID: Final[int] = 2**62 - 1


class ConsumerLink(Generic[C]):
    """A consumer, as the broker sees it: wraps the proton `Sender` the broker sends on."""

    __slots__ = ("connection", "core", "id", "impl", "link", "sent", "unsettled")

    def __init__(
        self, consumer: ConsumerId, link: Link, connection: C, core: Consumer | None = None
    ) -> None:
        self.id = consumer
        self.link = link
        # The core's consumer, and how many of its dispatches went to the engine: the
        # rest wait in this step's effects or behind a journal write (B-097).
        self.core = core
        self.sent = 0
        # The pn_link_t's `pnloop.key`: the hot path calls the engine with it directly.
        self.impl = _key(link._impl)
        self.connection = connection
        # The id of each unsettled delivery sent, by its `pn_delivery_t` (issue 20: reading
        # the tag back cost ~4.5k instructions a disposition, three of them cffi calls).
        # An entry leaves before the broker settles the delivery locally, the only way
        # proton frees it (and may reuse its address) while the link lives; the map goes
        # with the link.
        self.unsettled: dict[object, DeliveryId] = {}

    def credit(self, engine_credit: int) -> int:
        """What the core may still hand over (B-037): the engine's credit less the
        dispatches it has not been given yet. The engine's credit is the client's last
        flow less what the engine sent; without this, a second flow in one read (attach
        and flow together, or a top-up) gave the core the same credit again, and a
        consumer held twice what it asked for, out of its queue's other consumers' reach."""
        core = self.core
        if core is None:
            return engine_credit
        unsent = core.dispatched - self.sent
        return engine_credit - unsent if engine_credit > unsent else 0

    def send(self, dispatch: Dispatch) -> None:
        self.sent += 1
        message = dispatch.message
        data = message.data
        settled = dispatch.settled
        delivery_id: int = dispatch.delivery
        if dispatch.wire_count or message.header is not None:
            # B-050: re-encode only the header; also when the producer sent a count.
            header_end = message.header_end
            if _FAST_SEND and delivery_id <= _MAX_C_ID and type(data) is bytes:
                header = sections.delivery_count_header(data, header_end, dispatch.wire_count)
                if header is not None:
                    # The new header, then the bytes after the old one: one C call, no
                    # joined copy of the message (issue 20).
                    delivery = _send_headed(
                        self.impl, delivery_id, header, data, header_end, settled
                    )
                    if not settled:
                        self.unsettled[delivery] = dispatch.delivery
                    return
            else:
                data = sections.with_delivery_count(data, header_end, dispatch.wire_count)
        # One C call (`pnloop.send`): the delivery, tagged with its id in decimal (read
        # back by `delivery_id_of`), the bytes (any buffer: proton copies them), the link
        # advanced. An id past `_MAX_C_ID` (never in practice) and the build without
        # `_pnloop` make the same calls one by one, here.
        if _FAST_SEND and delivery_id <= _MAX_C_ID:
            delivery = _send(self.impl, delivery_id, data, settled)
        else:  # inline: a call more costs pure Python ~0.5k instructions
            impl = _pointer(self.impl) if _FAST_SEND else self.impl
            tag = b"%d" % delivery_id
            size = len(tag)
            _TAG[0:size] = tag
            delivery = _pn_delivery(impl, _TAG_STRUCTS[size])
            _pn_link_send(impl, data if type(data) is bytes else _from_buffer(data), len(data))
            _pn_link_advance(impl)
            if settled:
                _pn_delivery_settle(delivery)
            if _FAST_SEND:
                delivery = _key(delivery)
        if not settled:
            self.unsettled[delivery] = dispatch.delivery

    def delivery_id(self, delivery: object) -> DeliveryId:
        """The id of delivery `delivery` (a `pn_delivery_t` of this link), forgotten here:
        call it only when the broker is about to settle the delivery locally, or once
        the core has its outcome. Unknown (already forgotten, or made by the peer): its
        tag (`delivery_id_of`, which refuses a delivery of the peer's)."""
        unsettled = self.unsettled
        known = unsettled.get(delivery)  # get and del: compiled, `pop` is a method call
        if known is None:
            return delivery_id_of(delivery)
        del unsettled[delivery]
        return known


class ProducerLink:
    """A producer: wraps the proton `Receiver` the broker receives on."""

    __slots__ = ("credit", "last_to", "link", "target")

    def __init__(self, link: Link, target: ProducerTarget) -> None:
        self.link = link
        self.target = target
        self.last_to: str | None = None  # anonymous relay: its last message's `to` (B-151)
        # At least the link's credit (`Transfers._top_up`, B-021); 0: ask the engine.
        self.credit = 0


def wrong_direction() -> PeerInvalidField:
    return PeerInvalidField("transfer", "a transfer on a link the broker sends on")


def delivery_id_of(delivery: object) -> DeliveryId:
    """The id of a delivery the broker sent (a `pn_delivery_t`): its tag is the id in
    decimal (`ConsumerLink.send`).

    Raises:
        PeerInvalidField: the peer made this delivery: a transfer on a link the broker
            sends on (proton accepts one), which has no id of ours (issue 15).
    """
    tag = _pn_delivery_tag(_pointer(delivery))
    raw = _unpack(tag.start, tag.size) if tag.size <= 20 else b""
    if not raw.isdigit():
        raise wrong_direction()
    return DeliveryId(int(raw))


class Prepared:
    """A decoded transfer and what routing it needs (`Transfers.prepare`): routed at once,
    or kept by a transaction until its commit (B-141)."""

    __slots__ = (
        "delivery_delay_ms",
        "duplicate_id",
        "message",
        "message_routing_type",
        "target",
        "to",
    )

    def __init__(
        self,
        message: Message,
        target: ProducerTarget,
        to: str | None,
        message_routing_type: RoutingType | None,
        duplicate_id: str | bytes | None,
        delivery_delay_ms: int,
    ) -> None:
        self.message = message
        self.target = target
        self.to = to
        self.message_routing_type = message_routing_type
        self.duplicate_id = duplicate_id
        self.delivery_delay_ms = delivery_delay_ms


class Shell(Generic[C]):
    """Applies broker effects to links across connections. Loop thread only."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.consumers: dict[ConsumerId, ConsumerLink[C]] = {}
        self.dirty: set[C] = set()
        self._next_connection_id = 0
        self.connections: dict[ConnectionId, C] = {}
        self.opened_total = 0
        # Where lifecycle events go (the event-log writer); None drops them.
        self.event_sink: Callable[[list[RawEvent]], None] | None = None
        self.auth_failures = 0
        self._held: deque[list[Effect]] = deque()  # B-097: effects waiting for a write
        # The roles of an authenticated user (security enabled); none for anonymous.
        self.roles_for: Callable[[str | None], frozenset[str]] = lambda user: frozenset()
        # Told when a connection's AMQP open arrived: the server ends its handshake timer
        # and ticks the engine, whose heartbeat deadline the peer's idle-timeout sets.
        self.on_opened: Callable[[C], None] = lambda connection: None

    def new_connection_id(self) -> ConnectionId:
        self._next_connection_id += 1
        return ConnectionId(self._next_connection_id)

    def apply_effects(self) -> None:
        broker = self.broker
        persistence = broker.persistence
        if persistence is not None and (persistence.dispatch_waits or self._held):
            # B-097: these dispatches carry counts that must reach the journal first; and
            # while some are held, later effects queue behind them (order per link).
            effects = broker.take_effects()
            if persistence.dispatch_waits or effects:
                persistence.dispatch_waits = False
                self._held.append(effects)
                persistence.when_written(self._release_held)
            self._apply([])  # the events and the journal append of this step
            return
        self._apply()

    def _release_held(self, error: BaseException | None) -> None:
        """The oldest held step is written (callbacks come in append order): apply it,
        also after a journal failure (memory semantics then)."""
        self._apply(self._held.popleft(), more=False)

    def _apply(self, effects: list[Effect] | None = None, *, more: bool = True) -> None:
        broker = self.broker
        if broker.emitter.events:
            events = broker.emitter.take_raw()
            if self.event_sink is not None:
                self.event_sink(events)
        if effects is None:
            effects = broker.take_effects()
        while effects:
            consumers = self.consumers
            dirty = self.dirty
            for effect in effects:
                if type(effect) is Dispatch:
                    link = consumers.get(effect.consumer)
                    if link is not None:
                        link.send(effect)
                        dirty.add(link.connection)
                elif type(effect) is Drained:
                    link = consumers.get(effect.consumer)
                    if link is not None:
                        link.link.drained()
                        dirty.add(link.connection)
                elif type(effect) is AddressUnblocked:
                    for connection in list(self.connections.values()):
                        if connection.resume_producers(effect.address):
                            dirty.add(connection)
                elif type(effect) is CloseConsumer:
                    link = consumers.pop(effect.consumer, None)
                    if link is not None:
                        link.connection.close_link(link.link, effect.condition, effect.description)
                        dirty.add(link.connection)
                elif type(effect) is CloseConnection:
                    ended = self.connections.get(effect.connection)
                    if ended is not None:
                        ended.close_with_error(effect.condition, effect.description)
                        dirty.add(ended)
            effects = broker.take_effects() if more and not self._held else []
        if broker.persistence is not None:
            broker.persistence.flush()  # this step's durable changes: one journal append
