"""Drive one Proton engine per connection and translate its events into Broker calls.

Theory of operation
-------------------
The server owns the sockets. For each connection it creates an `AmqpConnection`: a
`proton.Transport` in server mode bound to a `proton.Connection` with a `Collector`. Bytes
read from the socket are pushed into the transport (`feed`), the collector's events are
translated into `core.Broker` calls (`process`), and the bytes the engine wants to send are
popped and written back (`output`). No reactor, no proton threads.

The `Shell` applies the broker's effects after each batch of events: a `Dispatch` becomes a
transfer on the consumer's link, which may live on another connection; every connection
touched is marked dirty so the server flushes it. Effects are applied in order; a dispatch
to a consumer that has meanwhile gone is dropped (the core already returned that message).

Hot path: a producer's transfer is read as bytes, scanned for the few header fields the
core needs (`sections.scan`), published, and settled `accepted`; consumer transfers send
the stored bytes, re-encoding only the header on redelivery (B-050). No `proton.Message`.

Errors: one boundary per event. A `ClientError` refuses the link with its condition; any
other exception is logged with the connection and link and closes that connection only,
with `amqp:internal-error`.

The SASL/TLS seam: `AmqpConnection.feed`/`output` carry the socket bytes (TLS is undone by
Python `ssl` below). With security enabled the broker's own `SaslServer` reads them first
and the engine gets nothing until the outcome is ok and the user and roles are set (issue
15); with security disabled Proton's built-in SASL offers ANONYMOUS and `roles` is None.
The server ticks each engine at `tick_at_s` (heartbeats, idle-timeout) and closes a
connection whose AMQP open has not arrived within the acceptor's handshake-timeout.

Loop thread only.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi, lib
from proton import (
    SASL,
    Collector,
    Condition,
    Connection,
    Delivery,
    Endpoint,
    Event,
    Link,
    Session,
    Terminus,
    Transport,
    symbol,
)

from amqpbroker.amqp import sections
from amqpbroker.amqp.frames import frame
from amqpbroker.core import (
    ACCEPTED,
    AddressUnblocked,
    Broker,
    BrokerError,
    ClientError,
    CloseConsumer,
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Dispatch,
    Drained,
    Effect,
    Message,
    Modified,
    ProducerTarget,
    RawEvent,
    Rejected,
    Window,
    annotated_routing_type,
)
from amqpbroker.protocol.dispositions import outcome_at, outcome_of
from amqpbroker.protocol.links import (
    TerminusFields,
    answer_terminus,
    consumer_request,
    echo_source_filter,
    producer_request,
    read_terminus,
    recovered_source,
)
from amqpbroker.protocol.peer import (
    PeerInvalidField,
    data_at,
    name_for_log,
    read_link_name,
    read_symbol_map,
    read_symbols,
    read_text,
)
from amqpbroker.protocol.sasl import MAX_SASL_FRAME_BYTES, Identity, SaslServer
from amqpbroker.protocol.transactions import (
    TRANSACTIONAL_STATE,
    UNKNOWN_ID,
    ControlError,
    Transaction,
    answer_declared,
    answer_rejected,
    answer_transactional_accepted,
    as_txn_id,
    control_request,
    is_accepted,
    txn_id_of,
)

# Makes the SASL layer of one connection: (on_authenticated, on_failure) -> SaslServer
SaslFactory = Callable[[Callable[[Identity, bytes], None], Callable[[str], None]], SaslServer]

log = logging.getLogger(__name__)

OFFERED_CAPABILITIES = [
    symbol("sole-connection-for-container"),
    symbol("DELAYED_DELIVERY"),
    symbol("SHARED-SUBS"),
    symbol("ANONYMOUS-RELAY"),
]
SOLE_CONNECTION = "sole-connection-for-container"
PRODUCER_CREDIT = 1000  # B-021 amqpCredits
PRODUCER_LOW_CREDIT = 300  # B-021 amqpLowCredits
MAX_FRAME_SIZE = 131072  # B-021
# What one `output()` call collects at most: the server writes it and asks again unless the
# socket is over its high-water mark, so a slow reader never makes us copy a whole backlog.
OUTPUT_CHUNK_BYTES = 1024 * 1024
# Issue 15: what a connection's consumers may be handed (copied into the engine) before
# its output has been written; credit alone would let one non-reading consumer buffer a
# whole queue. Refilled when `output()` finds the engine empty (the socket took it all).
ENGINE_WINDOW_BYTES = 4 * 1024 * 1024
# Until the peer's open arrives (SASL included), frames are at most this big: before the
# open exchange a peer may send only 512-byte frames (AMQP 1.0 §2.4.1), and a peer that
# has proven nothing must not make the broker buffer 128 KiB per socket (issue 15 item 5).
HANDSHAKE_MAX_FRAME_SIZE = MAX_SASL_FRAME_BYTES
# Issue 15: what one connection may hold open, as RabbitMQ 4 bounds it by default
# (session_max_per_connection 64, link_max_per_session 256). Proton would take 32768
# sessions (~3.7 KB each) and 2**31 handles per session, and finds a link by name with a
# linear search: one peer could use gigabytes and seconds of loop time per attach.
MAX_SESSIONS = 64  # the open's channel-max is one less; Proton refuses a higher channel
MAX_LINKS_PER_SESSION = 256  # a 257th attach on a session closes the connection
MAX_TRANSACTIONS = 1024  # declared and not yet discharged, per connection
# Transaction ids are unique in the broker process, not per connection: the event log's
# `txn` (B-170) must tell two connections' transactions apart.
_TXN_IDS = itertools.count(1)

FAILED = Modified(delivery_failed=True)
_DUPLICATE_ID_KEY = b"_AMQ_DUPL_ID"
_PN_DELIVERY = lib.PN_DELIVERY
_PN_TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED
_PN_LINK_FLOW = lib.PN_LINK_FLOW
_PN_ACCEPTED = lib.PN_ACCEPTED
_UNKNOWN_PROTOCOL = "Unknown protocol detected"
_PASSED_CONDITIONS = ("amqp:unauthorized-access", "amqp:resource-limit-exceeded")


class ConsumerLink:
    """A consumer, as the broker sees it: wraps the proton `Sender` the broker sends on."""

    __slots__ = ("connection", "id", "impl", "link")

    def __init__(self, consumer: ConsumerId, link: Link, connection: AmqpConnection) -> None:
        self.id = consumer
        self.link = link
        self.impl = link._impl  # the pn_link_t: the hot path calls the C API directly
        self.connection = connection

    def send(self, dispatch: Dispatch) -> None:
        message = dispatch.message
        data = message.data
        if dispatch.wire_count or message.header is not None:
            # B-050: re-encode only the header; also when the producer sent a count.
            data = sections.with_delivery_count(data, message.header_end, dispatch.wire_count)
        impl = self.impl
        tag = b"%d" % dispatch.delivery
        delivery = lib.pn_delivery(impl, (len(tag), ffi.from_buffer(tag)))
        lib.pn_link_send(impl, ffi.from_buffer(data), len(data))
        lib.pn_link_advance(impl)
        if dispatch.settled:
            lib.pn_delivery_settle(delivery)


class ProducerLink:
    """A producer: wraps the proton `Receiver` the broker receives on."""

    __slots__ = ("link", "target")

    def __init__(self, link: Link, target: ProducerTarget) -> None:
        self.link = link
        self.target = target


class Shell:
    """Applies broker effects to links across connections. Loop thread only."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.consumers: dict[ConsumerId, ConsumerLink] = {}
        self.dirty: set[AmqpConnection] = set()
        self._next_connection_id = 0
        self.connections: dict[ConnectionId, AmqpConnection] = {}
        self.opened_total = 0
        # Where lifecycle events go (the event-log writer); None drops them.
        self.event_sink: Callable[[list[RawEvent]], None] | None = None
        self.auth_failures = 0
        self._held: deque[list[Effect]] = deque()  # B-097: effects waiting for a write
        # The roles of an authenticated user (security enabled); none for anonymous.
        self.roles_for: Callable[[str | None], frozenset[str]] = lambda user: frozenset()
        # Told when a connection's AMQP open arrived: the server ends its handshake timer
        # and ticks the engine, whose heartbeat deadline the peer's idle-timeout sets.
        self.on_opened: Callable[[AmqpConnection], None] = lambda connection: None

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
            effects = broker.take_effects() if more and not self._held else []
        if broker.persistence is not None:
            broker.persistence.flush()  # this step's durable changes: one journal append


class AmqpConnection:
    """One AMQP connection: a proton engine fed with socket bytes. Loop thread only."""

    def __init__(
        self,
        shell: Shell,
        *,
        peer: str,
        anycast_prefix: str | None = None,
        multicast_prefix: str | None = None,
        sasl: SaslFactory | None = None,
        reject_as_modified: bool = False,
        duplicate_detection: bool = True,
        max_message_size: int = 0,
        idle_timeout_ms: int = 0,
    ) -> None:
        self.shell = shell
        self.max_message_size = max_message_size  # B-152: 0 for no limit
        self.duplicate_detection = duplicate_detection  # B-012 amqpDuplicateDetection
        self.reject_as_modified = reject_as_modified  # B-047
        self.broker = shell.broker
        self.id = shell.new_connection_id()
        self.peer = peer
        self.anycast_prefix = anycast_prefix
        self.multicast_prefix = multicast_prefix
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = HANDSHAKE_MAX_FRAME_SIZE  # MAX_FRAME_SIZE at open
        self.transport.channel_max = MAX_SESSIONS - 1
        if idle_timeout_ms > 0:  # Artemis amqpIdleTimeout: the open advertises half of it
            self.transport.idle_timeout = idle_timeout_ms / 1000
        self.tick_at_s = 0.0  # when the server must next call transport.tick (0: never)
        self.opened = False  # the peer's AMQP open has arrived (the handshake is over)
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        # Broker-checked SASL (security enabled) or Proton's built-in ANONYMOUS. Security
        # is enabled exactly when the server hands over a SASL layer; then nothing
        # reaches the engine before authentication has set the user and roles.
        self.sasl: SaslServer | None = None
        self.security_enabled = sasl is not None
        self.user: str | None = None
        self._roles: frozenset[str] = frozenset()
        if sasl is not None:
            self.sasl = sasl(self._authenticated, self._sasl_failed)
        else:
            self._setup_sasl()
        self.container_id = ""
        # Keyed by the pn_link_t pointer, which the hot path reads from events directly.
        self.producers: dict[Any, ProducerLink] = {}
        self.consumers: dict[Any, ConsumerLink] = {}
        self._awaiting: list[Any] | None = None  # durable sends of this loop step
        self.coordinators: set[Any] = set()  # transaction coordinator links (B-140)
        self.transactions: dict[bytes, Transaction] = {}
        self._links_per_session: dict[Any, int] = {}  # pn_session_t -> links not yet ended
        self._collector_impl = self.collector._impl
        self.closed = False  # the broker side is done with this connection
        self.window = Window(ENGINE_WINDOW_BYTES)  # issue 15: shared by its consumers
        self._resume_from = 0
        self._orderly = False
        self._socket_gone = False
        # Issue 15: after a framing error the socket closes once the close frame is out.
        self._hang_up = False
        self._input_closed = False  # the engine reads no more (framing error, idle-timeout)
        self._handlers: dict[int, Callable[[Event], None]] = {
            lib.PN_CONNECTION_REMOTE_OPEN: self._on_connection_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self._on_connection_close,
            lib.PN_SESSION_REMOTE_OPEN: self._on_session_open,
            lib.PN_SESSION_REMOTE_CLOSE: self._on_session_close,
            lib.PN_LINK_REMOTE_OPEN: self._on_link_open,
            lib.PN_LINK_REMOTE_DETACH: self._on_link_detach,
            lib.PN_LINK_REMOTE_CLOSE: self._on_link_close,
            lib.PN_TRANSPORT_ERROR: self._on_transport_error,
            lib.PN_TRANSPORT_TAIL_CLOSED: self._on_tail_closed,
            lib.PN_TRANSPORT_CLOSED: self._on_transport_closed,
        }
        shell.connections[self.id] = self
        shell.opened_total += 1

    def _setup_sasl(self) -> None:
        """Proton's built-in ANONYMOUS for now; broker-checked SASL replaces this seam."""
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        sasl.done(SASL.OK)

    @property
    def roles(self) -> frozenset[str] | None:
        """What the core checks permissions against: None only when security is disabled
        (B-154); with security on, no roles until authentication has finished."""
        if not self.security_enabled:
            return None
        return self._roles

    @property
    def awaiting_authentication(self) -> bool:
        """Credentials are being checked: stop reading the socket until they are."""
        return self.sasl is not None and self.sasl.checking

    # -- bytes in and out ---------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Socket bytes in: through the SASL layer first when the broker checks it."""
        sasl = self.sasl
        if sasl is not None and not sasl.done:
            sasl.feed(data)  # the bytes after a successful outcome go to _authenticated
            self.shell.dirty.add(self)
            return
        self._push(data)

    def _authenticated(self, identity: Identity, rest: bytes) -> None:
        """The SASL outcome is ok: the identity first, then the engine gets the bytes."""
        self.user = identity.user
        self._roles = self.shell.roles_for(identity.user)
        self.shell.dirty.add(self)
        if rest:
            self._push(rest)

    def _sasl_failed(self, why: str) -> None:
        self.shell.auth_failures += 1
        log.warning("connection %s from %s: %s; closing it", self.id, self.peer, why)
        self.closed = True
        self.shell.connections.pop(self.id, None)
        self.shell.dirty.add(self)  # the outcome goes out, then the socket is closed

    def _push(self, data: bytes) -> None:
        """Push bytes into the engine and handle what they caused.

        A socket read can be 256 KiB, the engine takes ~16 KiB at a time: the rest is
        walked with a memoryview, not re-sliced (copied) after every push (issue 20).
        """
        transport = self.transport
        impl = transport._impl
        view = memoryview(data)
        while view:
            capacity = lib.pn_transport_capacity(impl)
            if capacity < 0:  # the engine's input side is closed (or failed)
                break
            chunk = view[:capacity]
            pushed = lib.pn_transport_push(impl, ffi.from_buffer(chunk), len(chunk))
            if pushed < 0:
                transport._check(pushed)  # raises proton's TransportException
            view = view[pushed:]
            self.process()
        self.process()

    @property
    def finished(self) -> bool:
        """Whether the socket can be closed once `output()` has been written."""
        if self._hang_up or (self.sasl is not None and self.sasl.failed):
            return True
        # Once the engine reads no more (a framing error, an expired idle-timeout), the
        # socket goes as soon as the engine has written its last bytes.
        return (self.closed or self._input_closed) and self.transport.pending() < 0

    def output(self, limit: int = OUTPUT_CHUNK_BYTES) -> bytes:
        """Bytes to send now: the SASL layer's, then up to about `limit` of the engine's.

        b"" means the engine has nothing more; call again until then (issue 16 item 1).
        """
        sasl = self.sasl
        if sasl is not None and (sasl.output or not sasl.done):
            out = bytes(sasl.output)
            sasl.output.clear()
            if not sasl.done:
                return out
            return out + self._engine_output(limit)
        return self._engine_output(limit)

    def _engine_output(self, limit: int) -> bytes:
        """Pop output buffers until the engine has none or `limit` bytes are collected.

        Proton fills one output buffer per `pending()` call (a few frames): reading it once
        per flush left the rest of a large message or a backlog waiting for the next input
        or engine tick, a second later (issue 16 item 1).
        """
        transport = self.transport
        impl = transport._impl
        chunks: list[bytes | bytearray] = []
        size = 0
        # The C API: copied out of the engine once, then joined (the wrappers copied the
        # bytes three times more; issue 20).
        while size < limit and (pending := lib.pn_transport_pending(impl)) > 0:
            chunk = bytearray(pending)
            lib.pn_transport_peek(impl, ffi.from_buffer(chunk), pending)
            lib.pn_transport_pop(impl, pending)
            chunks.append(chunk)
            size += pending
        if not size and self.window.room < ENGINE_WINDOW_BYTES:
            self._reopen_window()
        if self._hang_up and size < limit and transport.pending() >= 0:
            # Proton writes no close frame on a connection the peer never opened: ours.
            chunks.append(_close_frame(self.connection.condition))
            transport.close_head()
        return b"".join(chunks)

    def _reopen_window(self) -> None:
        """The engine holds no output (the socket took it all): the window is whole again,
        and consumers it stopped are dispatched to, with the credit and drain request they
        kept (issue 15); what that hands the engine, the next `output()` returns."""
        stalled = self.window.room <= 0
        self.window.room = ENGINE_WINDOW_BYTES
        if stalled and not self.closed:
            consumers = list(self.consumers.values())
            if consumers:  # a different first one each time: one queue cannot starve another
                self._resume_from = start = (self._resume_from + 1) % len(consumers)
                for consumer in consumers[start:] + consumers[:start]:
                    self.broker.resume(consumer.id)
            self.shell.apply_effects()
            self.shell.dirty.add(self)

    def socket_closed(self) -> None:
        """The socket is gone. Without a close frame first, that is an abrupt loss (B-054)."""
        self._socket_gone = True
        if self.sasl is not None:
            self.sasl.abandon()
        if not self.closed:
            self.transport.close_tail()
            self.process()
            self._finish(abrupt=not self._orderly)

    # -- events -------------------------------------------------------------------------
    def process(self) -> None:
        """Handle every pending engine event, then apply the broker's effects.

        Transfers, dispositions and flow are read with the C API (no wrapper objects per
        message); the rare events go through proton's wrappers.
        """
        emitter = self.broker.emitter
        if emitter.failures:  # one clock reading for this step's events (B-170 ts)
            emitter.step_ms = self.broker.clock.now_ms()
        try:
            self._process_events()
        finally:
            emitter.step_ms = None

    def _process_events(self) -> None:
        collector = self._collector_impl
        handlers = self._handlers
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        null = ffi.NULL
        while (event := peek(collector)) != null:
            kind = event_type(event)
            if self.closed and kind != _PN_TRANSPORT_CLOSED:
                pop(collector)  # issue 15: nothing a peer sends after the end is acted on
                continue
            try:
                if kind == _PN_DELIVERY:
                    delivery = lib.pn_event_delivery(event)
                    link = lib.pn_delivery_link(delivery)
                    if lib.pn_link_is_receiver(link):
                        self._on_transfer(delivery, link)
                    elif lib.pn_link_current(link) == delivery:  # ours are never current
                        # The peer sent on a link it receives on; proton keeps that
                        # delivery as the link's next to send and would hold back a
                        # detach behind it, so the connection ends (issue 15).
                        self._refuse(_wrong_direction(), None)
                    else:
                        self._on_disposition(delivery, link)
                elif kind == _PN_LINK_FLOW:
                    self._on_link_flow(lib.pn_event_link(event))
                else:
                    handler = handlers.get(kind)
                    if handler is not None:
                        handler(Event.wrap(event))
            except ClientError as e:  # issue 15: a field of the peer's is malformed
                self._refuse(
                    e,
                    lib.pn_delivery_link(lib.pn_event_delivery(event))
                    if kind == _PN_DELIVERY
                    else None,
                )
            except Exception:
                log.exception(
                    "internal error on connection %s (%s) at event %s: closing it",
                    self.id,
                    self.container_id or self.peer,
                    kind,
                )
                self._fail("amqp:internal-error", "internal error")
            pop(collector)
        self._awaiting = None  # the step ends: its sends wait for this step's append
        self.shell.apply_effects()
        self.shell.dirty.add(self)

    def _refuse(self, error: ClientError, link: Any) -> None:
        """A malformed or mistyped field: on a delivery, end its link with the error;
        elsewhere (open, begin, ...) close the connection with it."""
        log.info("connection %s from %s: %s %s", self.id, self.peer, error.condition, error)
        if link is None:
            self._fail(error.condition, str(error))
            return
        consumer = self.consumers.get(link)
        if consumer is not None:
            self._drop_consumer(link, consumer, closed=True)
        self.close_link(Link.wrap(link), error.condition, str(error))

    def _fail(self, condition: str, description: str) -> None:
        self._hang_up = True
        self.connection.condition = Condition(condition, description)
        self.connection.close()
        self._finish(abrupt=True)

    def _finish(self, *, abrupt: bool) -> None:
        if self.closed:
            return
        self.closed = True
        transactions, self.transactions = self.transactions, {}
        for txn in transactions.values():
            self._rollback(txn, forced=True)  # B-143: before the links return the rest
        for link in list(self.consumers.values()):
            self.shell.consumers.pop(link.id, None)
        self.consumers.clear()
        self.producers.clear()
        self.broker.connection_closed(self.id, abrupt=abrupt)
        self.shell.connections.pop(self.id, None)
        log.info(
            "connection %s from %s (%s) closed%s",
            self.id,
            self.peer,
            self.container_id or "-",
            " abruptly" if abrupt else "",
        )

    def _on_connection_open(self, event: Event) -> None:
        connection = self.connection
        self.transport.max_frame_size = MAX_FRAME_SIZE  # what our open advertises (B-021)
        connection.container = self.broker.name
        connection.offered_capabilities = OFFERED_CAPABILITIES
        try:  # issue 15: the open's fields are the peer's, checked before use
            self.container_id = (
                read_text(lambda: connection.remote_container, "open.container-id") or ""
            )
            impl = connection._impl
            desired = read_symbols(
                data_at(lib.pn_connection_remote_desired_capabilities(impl)),
                "open.desired-capabilities",
            )
            read_symbols(
                data_at(lib.pn_connection_remote_offered_capabilities(impl)),
                "open.offered-capabilities",
            )
            read_symbol_map(data_at(lib.pn_connection_remote_properties(impl)), "open.properties")
            read_text(lambda: connection.remote_hostname, "open.hostname")
        except ClientError as e:
            log.info("refusing connection %s from %s: %s", self.id, self.peer, e)
            connection.open()
            self._fail(e.condition, str(e))
            return
        if SOLE_CONNECTION in desired and self._container_connected_elsewhere():
            self._refuse_duplicate_container()
            return
        connection.open()
        self.opened = True
        self.shell.on_opened(self)
        log.info(
            "connection %s from %s opened (container %s)",
            self.id,
            self.peer,
            self.container_id or "-",
        )

    def _container_connected_elsewhere(self) -> bool:
        return any(
            other is not self and not other.closed and other.container_id == self.container_id
            for other in self.shell.connections.values()
        )

    def _refuse_duplicate_container(self) -> None:
        """B-020: open with connection-establishment-failed, then close with
        amqp:invalid-field naming the container-id."""
        connection = self.connection
        connection.properties = {symbol("amqp:connection-establishment-failed"): True}
        connection.open()
        connection.condition = Condition(
            "amqp:invalid-field",
            f"a connection with container-id {self.container_id!r} already exists",
            {symbol("invalid-field"): symbol("container-id")},
        )
        connection.close()
        log.info(
            "refusing connection %s from %s: container-id %r is already connected "
            "(sole-connection-for-container)",
            self.id,
            self.peer,
            self.container_id,
        )
        self._finish(abrupt=False)

    def _on_connection_close(self, event: Event) -> None:
        if self.connection.state & Endpoint.LOCAL_UNINIT:
            self._framing_error("close before open")  # issue 15: proton would not answer it
            return
        self._orderly = True
        self.connection.close()
        self._finish(abrupt=False)  # B-053: an AMQP close is orderly

    def _on_transport_error(self, event: Event) -> None:
        condition = self.transport.condition
        description = condition.description if condition else ""
        if description.startswith(_UNKNOWN_PROTOCOL):
            # Proton quotes the peer's first bytes: after the broker's SASL outcome, a
            # second sasl-init with its password (issue 15 attack pass). Never log them.
            description = f"{_UNKNOWN_PROTOCOL} (the bytes are not logged)"
        log.warning("connection %s from %s: transport error %s", self.id, self.peer, description)

    def _on_tail_closed(self, event: Event) -> None:
        """The engine reads no more input. Unless the peer closed or the socket is gone,
        that is a framing error, which proton may leave unanswered: answer it now with
        `amqp:connection:framing-error`, then hang up (issue 15). An expired idle-timeout
        ends here too, with proton's own condition (B-054: an abrupt loss)."""
        self._input_closed = True
        if self._orderly or self._socket_gone or self._hang_up:
            return
        self._hang_up = True
        condition = self.transport.condition
        if condition is None:  # proton stopped reading without saying why
            log.warning("connection %s from %s: undecodable frame; closing it", self.id, self.peer)
            self.connection.condition = Condition(
                "amqp:connection:framing-error", "undecodable frame"
            )
        else:  # proton has written its own close frame (PN_TRANSPORT_ERROR logged it)
            self.connection.condition = condition
        self.connection.close()
        self._finish(abrupt=True)

    def _on_transport_closed(self, event: Event) -> None:
        self._finish(abrupt=not self._orderly)

    def _on_session_open(self, event: Event) -> None:
        if self.connection.state & Endpoint.REMOTE_UNINIT:
            # Proton accepts a begin before the open; AMQP does not (issue 15).
            self._framing_error("begin before open")
            return
        event.session.open()

    def _framing_error(self, description: str) -> None:
        log.warning("connection %s from %s: %s; closing it", self.id, self.peer, description)
        self._hang_up = True
        self.connection.condition = Condition("amqp:connection:framing-error", description)
        self.connection.close()
        self.transport.close_tail()
        self._finish(abrupt=True)

    def _on_session_close(self, event: Event) -> None:
        session: Session = event.session
        for impl, consumer in list(self.consumers.items()):
            if consumer.link.session == session:
                self._drop_consumer(impl, consumer, closed=False)
        for impl in [i for i, p in self.producers.items() if p.link.session == session]:
            del self.producers[impl]
        for impl in [i for i in self.coordinators if lib.pn_link_session(i) == session._impl]:
            self.coordinators.discard(impl)
        self._links_per_session.pop(session._impl, None)
        session.close()
        # Issue 15: ended on both sides, so Proton may forget it and its links (else a
        # peer that begins and ends sessions, or attaches and detaches links, on one
        # long-lived connection grows the broker by ~3 KB each time).
        session.free()

    # -- links --------------------------------------------------------------------------
    def _on_link_open(self, event: Event) -> None:
        link: Link = event.link
        if link.state & Endpoint.LOCAL_ACTIVE:
            return
        session = lib.pn_link_session(link._impl)
        count = self._links_per_session.get(session, 0) + 1
        self._links_per_session[session] = count
        if count > MAX_LINKS_PER_SESSION:
            description = f"more than {MAX_LINKS_PER_SESSION} links on one session"
            log.warning("connection %s from %s: %s; closing it", self.id, self.peer, description)
            self._fail("amqp:resource-limit-exceeded", description)
            return
        try:
            read_link_name(link)
            if link.is_receiver:
                self._attach_producer(link)
            else:
                self._attach_consumer(link)
        except BrokerError as e:
            log.info(
                "refusing attach of link %r on connection %s (%s): %s %s",
                name_for_log(link),
                self.id,
                self.container_id or "-",
                e.condition,
                e,
            )
            self.close_link(link, e.condition, str(e))

    def _attach_producer(self, link: Link) -> None:
        # Issue 15: read and check the peer's termini first; answer with our own.
        source = read_terminus(link.remote_source, "source")
        remote_target = read_terminus(link.remote_target, "target")
        if remote_target.type == Terminus.COORDINATOR:
            self._attach_coordinator(link, source, remote_target)
            return
        target = self.broker.attach_producer(
            producer_request(
                remote_target,
                self.id,
                anycast_prefix=self.anycast_prefix,
                multicast_prefix=self.multicast_prefix,
                user=self.user,
                roles=self.roles,
            )
        )
        answer_terminus(link.source, source, address=source.address)
        answer_terminus(
            link.target,
            remote_target,
            address=target.address if remote_target.dynamic else remote_target.address,
        )
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST  # B-021: `second` is answered with `first`
        if self.max_message_size:
            link.max_message_size = self.max_message_size  # B-152: advertised
        link.open()
        self.producers[link._impl] = ProducerLink(link, target)
        link.flow(PRODUCER_CREDIT)

    def _attach_coordinator(
        self, link: Link, source: TerminusFields, target: TerminusFields
    ) -> None:
        """B-140: a transaction coordinator; declare/discharge arrive as transfers."""
        answer_terminus(link.source, source, address=source.address)
        answer_terminus(link.target, target, address=None)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self.coordinators.add(link._impl)
        link.flow(PRODUCER_CREDIT)

    def _attach_consumer(self, link: Link) -> None:
        source = read_terminus(link.remote_source, "source")
        target = read_terminus(link.remote_target, "target")
        attached = self.broker.attach_consumer(
            consumer_request(
                link,
                source,
                self.id,
                self.container_id,
                anycast_prefix=self.anycast_prefix,
                multicast_prefix=self.multicast_prefix,
                user=self.user,
                roles=self.roles,
                window=self.window,
            )
        )
        answer_terminus(link.source, source, address=attached.address)
        if attached.recovered:
            link.source.address = attached.address
            recovered_source(link, attached.selector)
        else:
            echo_source_filter(link, source.filters, attached.selector, no_local=attached.no_local)
        answer_terminus(link.target, target, address=target.address)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        consumer = ConsumerLink(attached.consumer, link, self)
        self.consumers[link._impl] = consumer
        self.shell.consumers[attached.consumer] = consumer
        if link.credit > 0:
            self.broker.set_credit(attached.consumer, link.credit, drain=link.drain_mode)

    def close_link(self, link: Link, condition: str, description: str) -> None:
        """Refuse or end a link from the broker side, with an AMQP error (B-022, B-038)."""
        if not link.state & Endpoint.LOCAL_ACTIVE:
            link.open()
        link.condition = Condition(condition, description)
        link.close()
        self.consumers.pop(link._impl, None)
        self.producers.pop(link._impl, None)
        self.coordinators.discard(link._impl)

    def _drop_consumer(self, impl: Any, consumer: ConsumerLink, *, closed: bool) -> None:
        del self.consumers[impl]
        self.shell.consumers.pop(consumer.id, None)
        self.broker.detach_consumer(consumer.id, closed=closed)

    def _on_link_detach(self, event: Event) -> None:
        self._link_ended(event.link, closed=False)

    def _on_link_close(self, event: Event) -> None:
        self._link_ended(event.link, closed=True)

    def _link_ended(self, link: Link, *, closed: bool) -> None:
        consumer = self.consumers.get(link._impl)
        if consumer is not None:
            self._drop_consumer(link._impl, consumer, closed=closed)
        self.producers.pop(link._impl, None)
        self.coordinators.discard(link._impl)
        if link.state & Endpoint.LOCAL_ACTIVE:
            if closed:
                link.close()
            else:
                link.detach()
        session = lib.pn_link_session(link._impl)
        count = self._links_per_session.get(session, 0)
        if count > 0:
            self._links_per_session[session] = count - 1
        link.free()  # issue 15: ended on both sides (see _on_session_close)

    def _on_link_flow(self, link: Any) -> None:
        consumer = self.consumers.get(link)
        if consumer is not None:  # producer links: flow from the client is informational
            self.broker.set_credit(
                consumer.id, lib.pn_link_credit(link), drain=bool(lib.pn_link_get_drain(link))
            )

    # -- deliveries (hot path: C API, no wrappers) --------------------------------------
    def _on_transfer(self, delivery: Any, link: Any) -> None:
        size = lib.pn_delivery_pending(delivery)
        limit = self.max_message_size
        if (
            limit
            and size > limit
            and not lib.pn_delivery_aborted(delivery)
            and link not in self.coordinators  # the limit is advertised on producers only
        ):
            self._too_large(delivery, link, size)  # B-152: checked as the frames arrive
            return
        if lib.pn_delivery_partial(delivery):
            return  # proton buffers the frames until the last one
        buffer = bytearray(size)
        received = lib.pn_link_recv(link, ffi.from_buffer(buffer), size)
        lib.pn_link_advance(link)
        producer = self.producers.get(link)
        if lib.pn_delivery_aborted(delivery) or producer is None or received < 0:
            if link in self.coordinators and not lib.pn_delivery_aborted(delivery):
                self._on_control(Delivery.wrap(delivery), bytes(buffer[:received]))
                self._top_up(link)
            else:
                lib.pn_delivery_settle(delivery)
                if producer is not None:
                    lib.pn_link_flow(link, 1)  # B-152: an aborted transfer's credit back
            return
        raw = bytes(buffer[:received]) if received < size else bytes(buffer)
        if lib.pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            self._transactional_send(Delivery.wrap(delivery), producer, raw)
            self._top_up(link, producer)
            return
        store = self.broker.persistence
        stored_before = store.messages_added if store is not None else 0
        try:
            self._publish(producer, raw)
        except ClientError as e:
            # B-023: security and address-full keep their condition; all else is `failed`
            # (B-009: even a missing address on the anonymous relay, as Artemis does).
            condition = e.condition if e.condition in _PASSED_CONDITIONS else "failed"
            self._reject(delivery, condition, str(e))
            lib.pn_delivery_settle(delivery)
        except sections.SectionError as e:
            log.info(
                "rejecting malformed message on connection %s link %r: %s",
                self.id,
                name_for_log(producer.link),
                e,
            )
            self._reject(delivery, "amqp:decode-error", str(e))
            lib.pn_delivery_settle(delivery)
        else:
            if store is not None and store.must_wait(stored_before):
                # Settled once its journal records are on disk (the group commit): one
                # callback per connection and loop step, the pn_delivery_t kept alive.
                awaiting = self._awaiting
                if awaiting is None:
                    awaiting = self._awaiting = []
                    store.when_stored(functools.partial(self._settle_stored, awaiting))
                lib.pn_incref(delivery)
                awaiting.append(delivery)
            else:
                lib.pn_delivery_update(delivery, _PN_ACCEPTED)
                lib.pn_delivery_settle(delivery)
        self._top_up(link, producer)

    def _too_large(self, delivery: Any, link: Any, size: int) -> None:
        """B-152: detach the producer with message-size-exceeded and drop what arrived."""
        lib.pn_delivery_settle(delivery)
        producer = self.producers.get(link)
        if producer is None:
            return  # detached already: the rest of the message is discarded as it comes
        description = (
            f"message of {size} bytes or more exceeds max-message-size {self.max_message_size}"
        )
        log.info("connection %s link %r: %s", self.id, producer.link.name, description)
        self.close_link(producer.link, "amqp:link:message-size-exceeded", description)

    def _top_up(self, link: Any, producer: ProducerLink | None = None) -> None:
        credit = lib.pn_link_credit(link)
        if credit < PRODUCER_LOW_CREDIT and (
            producer is None or self.broker.producer_may_send(producer.target)
        ):
            lib.pn_link_flow(link, PRODUCER_CREDIT - credit)

    # -- transactions (B-140…B-144, protocol/transactions.py) ---------------------------
    def _on_control(self, delivery: Delivery, raw: bytes) -> None:
        try:
            kind, fields = control_request(raw)
            if kind == "declare":
                if len(self.transactions) >= MAX_TRANSACTIONS:
                    raise ControlError(
                        "amqp:resource-limit-exceeded",
                        f"more than {MAX_TRANSACTIONS} transactions on one connection",
                    )
                new_id = b"txn:%d" % next(_TXN_IDS)
                self.transactions[new_id] = Transaction(new_id)
                answer_declared(delivery, new_id)
                return
            named = as_txn_id(fields[0]) if fields else None
            txn = self.transactions.pop(named, None) if named is not None else None
            if txn is None:
                raise ControlError(UNKNOWN_ID, f"unknown transaction {named!r}")
            if len(fields) > 1 and fields[1]:
                self._rollback(txn, forced=False)
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            else:
                self._commit(txn, delivery)
        except ControlError as e:
            answer_rejected(delivery, e.condition, str(e))

    def _transactional_send(self, delivery: Delivery, producer: ProducerLink, raw: bytes) -> None:
        """B-141: kept until commit; answered transactional-state(accepted) now."""
        txn_id = txn_id_of(delivery)
        txn = self.transactions.get(txn_id) if txn_id is not None else None
        if txn is None:
            answer_rejected(delivery, UNKNOWN_ID, f"unknown transaction {txn_id!r}")
            return
        try:
            sections.scan(raw)  # a malformed message is refused now, not at commit
        except sections.SectionError as e:
            answer_rejected(delivery, "amqp:decode-error", str(e))
            return
        txn.sends.append(functools.partial(self._publish, producer, raw))
        answer_transactional_accepted(delivery, txn.id)

    def _commit(self, txn: Transaction, discharge: Delivery) -> None:
        """Route the kept sends and acknowledge the accepted deliveries, in one step."""
        store = self.broker.persistence
        stored_before = store.messages_added if store is not None else 0
        errors = []
        emitter = self.broker.emitter
        emitter.txn = txn.id.hex()  # B-170: the events of this commit carry it
        try:
            for route in txn.sends:
                try:
                    route()
                except (ClientError, sections.SectionError) as e:
                    errors.append(str(e))
            for consumer, delivery_id, wire in txn.acks:
                self.broker.settle(consumer, delivery_id, ACCEPTED)
                if wire is not None:
                    wire.update(Delivery.ACCEPTED)
                    wire.settle()
        finally:
            emitter.txn = None
        if errors:
            answer_rejected(discharge, "amqp:transaction:rollback", "; ".join(errors)[:512])
        elif store is not None and store.must_wait(stored_before):
            store.when_stored(functools.partial(self._stored, discharge))
        else:
            discharge.update(Delivery.ACCEPTED)
            discharge.settle()

    def _rollback(self, txn: Transaction, *, forced: bool) -> None:
        """Drop the kept sends; B-142 for unsettled accepts, B-143 for the rest."""
        emitter = self.broker.emitter
        emitter.txn = txn.id.hex()  # B-170: `held` and `returned` carry it
        try:
            for consumer, delivery_id, wire in txn.acks:
                if wire is not None and not forced:
                    self.broker.hold(consumer, delivery_id)
                else:
                    self.broker.rollback_delivery(consumer, delivery_id)
        finally:
            emitter.txn = None

    def _transactional_outcome(self, delivery: Delivery, consumer: ConsumerLink) -> None:
        txn_id = txn_id_of(delivery)
        txn = self.transactions.get(txn_id) if txn_id is not None else None
        delivery_id = _delivery_id(delivery._impl)
        if txn is None:
            log.info(
                "connection %s: disposition in unknown transaction %r ignored", self.id, txn_id
            )
        elif is_accepted(delivery):
            txn.acks.append((consumer.id, delivery_id, None if delivery.settled else delivery))
        else:  # decision: only acceptance waits for the discharge
            outcome = outcome_of(delivery)
            if outcome is not None:
                self.broker.settle(consumer.id, delivery_id, outcome)
        if delivery.settled:
            delivery.settle()

    def resume_producers(self, address: str) -> bool:
        """Top up credit of producer links to an address that has room again (B-151)."""
        resumed = False
        for impl, producer in self.producers.items():
            if producer.target.address == address:
                credit = lib.pn_link_credit(impl)
                if credit < PRODUCER_LOW_CREDIT:
                    lib.pn_link_flow(impl, PRODUCER_CREDIT - credit)
                    resumed = True
        return resumed

    def _settle_stored(self, deliveries: list[Any], error: BaseException | None) -> None:
        """The journal answered for this step's durable sends (C API: the hot path)."""
        closed = self.closed
        for delivery in deliveries:
            if not closed:
                if error is None:
                    lib.pn_delivery_update(delivery, _PN_ACCEPTED)
                    lib.pn_delivery_settle(delivery)
                else:
                    self._stored(Delivery.wrap(delivery), error)
            lib.pn_decref(delivery)
        if not closed:
            self.shell.dirty.add(self)

    def _stored(self, delivery: Delivery, error: BaseException | None) -> None:
        """The journal answered for a durable send: accept it, or refuse it (disk full)."""
        if self.closed:
            return  # the client never saw it accepted: at-least-once, it may resend
        if error is None:
            delivery.update(Delivery.ACCEPTED)
        else:
            cause = error.__cause__ or error
            delivery.local.condition = Condition(
                "amqp:resource-limit-exceeded", f"the broker could not store the message: {cause}"
            )
            delivery.update(Delivery.REJECTED)
        delivery.settle()
        self.shell.dirty.add(self)

    @staticmethod
    def _reject(delivery_impl: Any, condition: str, description: str) -> None:
        delivery = Delivery.wrap(delivery_impl)
        delivery.local.condition = Condition(condition, description)
        delivery.update(Delivery.REJECTED)

    def _publish(self, producer: ProducerLink, raw: bytes) -> None:
        scanned = sections.scan(raw)
        message = message_of(scanned, origin_container=self.container_id)
        target = producer.target
        message_routing_type = None
        to = None
        if scanned.message_annotations is not None:
            message.deliver_at_ms = _scheduled_delivery(
                message.get_annotations(), self.broker.clock.now_ms()
            )
        if scanned.message_annotations is not None and target.routing_type is None:
            message_routing_type = annotated_routing_type(
                message.get_annotations(), jms_dest=target.address is None
            )
        if target.address is None and scanned.properties is not None:
            value = message.get_properties().get("to")
            to = value if isinstance(value, str) else None
        duplicate_id = None
        app = scanned.application_properties
        if (
            self.duplicate_detection
            and app is not None
            and (scanned.data.find(_DUPLICATE_ID_KEY, app[0], app[1]) >= 0)
        ):  # decode only when the key's bytes are there (B-012)
            value = message.get_application_properties().get("_AMQ_DUPL_ID")
            duplicate_id = value if isinstance(value, str | bytes) else None
        self.broker.publish(
            message,
            target,
            to=to,
            message_routing_type=message_routing_type,
            duplicate_id=duplicate_id,
        )

    def _on_disposition(self, delivery: Any, link: Any) -> None:
        consumer = self.consumers.get(link)
        outcome = None
        if consumer is not None:
            state = lib.pn_delivery_remote_state(delivery)
            if state == TRANSACTIONAL_STATE:
                self._transactional_outcome(Delivery.wrap(delivery), consumer)
                return
            outcome = outcome_at(delivery, state)
        if self.reject_as_modified and isinstance(outcome, Rejected):
            outcome = FAILED  # B-047: rejected behaves exactly like modified{df=true}
        if outcome is None:
            if lib.pn_delivery_settled(delivery):
                lib.pn_delivery_settle(delivery)  # B-048: no outcome: stays acquired
            return
        assert consumer is not None
        self.broker.settle(consumer.id, _delivery_id(delivery), outcome)
        lib.pn_delivery_settle(delivery)


def _close_frame(condition: Condition | None) -> bytes:
    """An AMQP close frame carrying `condition` (for when proton will not write one)."""
    error = (
        None
        if condition is None
        else sections.Described(
            sections.ULong(0x1D),
            [sections.Symbol(condition.name), condition.description or ""],
        )
    )
    return frame(0x18, [error])


def message_of(scanned: sections.Scanned, *, origin_container: str | None = None) -> Message:
    """The core's view of a scanned message: the bytes plus the few fields it reads."""
    return Message(
        scanned.data,
        durable=scanned.durable,
        priority=scanned.priority,
        ttl_ms=scanned.ttl,
        expiration_ms=scanned.absolute_expiry_time or 0,
        header_end=scanned.header_end,
        head_end=scanned.head_end(),
        header={"delivery-count": scanned.delivery_count}
        if scanned.delivery_count or scanned.first_acquirer
        else None,
        origin_container=origin_container,
        reader=sections.READER,
    )


def _scheduled_delivery(annotations: dict[str, Any], now_ms: int) -> int:
    """B-015: x-opt-delivery-time (epoch ms) wins over x-opt-delivery-delay (ms after
    receipt); a value that is not a number is ignored (B-153)."""
    at = annotations.get("x-opt-delivery-time")
    if isinstance(at, int) and not isinstance(at, bool):
        return at
    delay = annotations.get("x-opt-delivery-delay")
    if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0:
        return now_ms + delay
    return 0


def _wrong_direction() -> PeerInvalidField:
    return PeerInvalidField("transfer", "a transfer on a link the broker sends on")


def _delivery_id(delivery: Any) -> DeliveryId:
    """The id of a delivery the broker sent: its tag is the id in decimal (`ConsumerLink`).

    Raises:
        PeerInvalidField: the peer made this delivery: a transfer on a link the broker
            sends on (proton accepts one), which has no id of ours (issue 15).
    """
    tag = lib.pn_delivery_tag(delivery)
    raw = ffi.unpack(tag.start, tag.size) if tag.size <= 20 else b""
    if not raw.isdigit():
        raise _wrong_direction()
    return DeliveryId(int(raw))
