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

The SASL/TLS seam: `AmqpConnection.feed`/`output` carry the raw socket bytes; a later layer
(broker-checked SASL, Python `ssl`) wraps them before they reach the engine.

Loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

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
    Transport,
    symbol,
)

from amqpbroker.core import (
    Broker,
    BrokerError,
    ClientError,
    CloseConsumer,
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Dispatch,
    Drained,
    Message,
    ProducerTarget,
    RoutingType,
)
from amqpbroker.protocol import sections
from amqpbroker.protocol.dispositions import outcome_of
from amqpbroker.protocol.links import consumer_request, echo_source_filter, producer_request

log = logging.getLogger(__name__)

OFFERED_CAPABILITIES = [
    symbol("sole-connection-for-container"),
    symbol("DELAYED_DELIVERY"),
    symbol("SHARED-SUBS"),
    symbol("ANONYMOUS-RELAY"),
]
PRODUCER_CREDIT = 1000  # B-021 amqpCredits
PRODUCER_LOW_CREDIT = 300  # B-021 amqpLowCredits
MAX_FRAME_SIZE = 131072  # B-021

_PASSED_CONDITIONS = ("amqp:unauthorized-access", "amqp:resource-limit-exceeded")
_ROUTING_TYPE_BYTES = {0: RoutingType.MULTICAST, 1: RoutingType.ANYCAST}
_JMS_DEST = {0: RoutingType.ANYCAST, 2: RoutingType.ANYCAST, 1: RoutingType.MULTICAST,
             3: RoutingType.MULTICAST}


class ConsumerLink:
    """A consumer, as the broker sees it: wraps the proton `Sender` the broker sends on."""

    __slots__ = ("connection", "id", "link")

    def __init__(self, consumer: ConsumerId, link: Link, connection: AmqpConnection) -> None:
        self.id = consumer
        self.link = link
        self.connection = connection

    def send(self, dispatch: Dispatch) -> None:
        message = dispatch.message
        data = message.data
        if dispatch.wire_count or message.header is not None:
            # B-050: re-encode only the header; also when the producer sent a count.
            data = sections.with_delivery_count(data, message.header_end, dispatch.wire_count)
        link = self.link
        delivery = link.delivery(b"%d" % dispatch.delivery)
        link.send(data)
        link.advance()
        if dispatch.settled:
            delivery.settle()


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

    def new_connection_id(self) -> ConnectionId:
        self._next_connection_id += 1
        return ConnectionId(self._next_connection_id)

    def apply_effects(self) -> None:
        broker = self.broker
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
                elif type(effect) is CloseConsumer:
                    link = consumers.pop(effect.consumer, None)
                    if link is not None:
                        link.connection.close_link(
                            link.link, effect.condition, effect.description
                        )
                        dirty.add(link.connection)
            effects = broker.take_effects()


class AmqpConnection:
    """One AMQP connection: a proton engine fed with socket bytes. Loop thread only."""

    def __init__(
        self,
        shell: Shell,
        *,
        peer: str,
        anycast_prefix: str | None = None,
        multicast_prefix: str | None = None,
    ) -> None:
        self.shell = shell
        self.broker = shell.broker
        self.id = shell.new_connection_id()
        self.peer = peer
        self.anycast_prefix = anycast_prefix
        self.multicast_prefix = multicast_prefix
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = MAX_FRAME_SIZE
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self._setup_sasl()
        self.container_id = ""
        self.producers: dict[Link, ProducerLink] = {}
        self.consumers: dict[Link, ConsumerLink] = {}
        self.closed = False  # the broker side is done with this connection
        self._orderly = False
        self._handlers: dict[Any, Callable[[Event], None]] = {
            Event.CONNECTION_REMOTE_OPEN: self._on_connection_open,
            Event.CONNECTION_REMOTE_CLOSE: self._on_connection_close,
            Event.SESSION_REMOTE_OPEN: self._on_session_open,
            Event.SESSION_REMOTE_CLOSE: self._on_session_close,
            Event.LINK_REMOTE_OPEN: self._on_link_open,
            Event.LINK_REMOTE_DETACH: self._on_link_detach,
            Event.LINK_REMOTE_CLOSE: self._on_link_close,
            Event.LINK_FLOW: self._on_link_flow,
            Event.DELIVERY: self._on_delivery,
            Event.TRANSPORT_ERROR: self._on_transport_error,
            Event.TRANSPORT_CLOSED: self._on_transport_closed,
        }
        shell.connections[self.id] = self
        shell.opened_total += 1

    def _setup_sasl(self) -> None:
        """Proton's built-in ANONYMOUS for now; broker-checked SASL replaces this seam."""
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        sasl.done(SASL.OK)

    # -- bytes in and out ---------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Push socket bytes into the engine and handle what they caused."""
        transport = self.transport
        while data:
            capacity = transport.capacity()
            if capacity < 0:  # the engine's input side is closed
                break
            chunk, data = data[:capacity], data[capacity:]
            transport.push(chunk)
            self.process()
        self.process()

    def output(self) -> bytes:
        """Bytes the engine wants to send now."""
        transport = self.transport
        pending = transport.pending()
        if pending <= 0:
            return b""
        out = transport.peek(pending)
        transport.pop(pending)
        return bytes(out)

    def socket_closed(self) -> None:
        """The socket is gone. Without a close frame first, that is an abrupt loss (B-054)."""
        if not self.closed:
            self.transport.close_tail()
            self.process()
            self._finish(abrupt=not self._orderly)

    # -- events -------------------------------------------------------------------------
    def process(self) -> None:
        collector = self.collector
        handlers = self._handlers
        while (event := collector.peek()) is not None:
            handler = handlers.get(event.type)
            if handler is not None:
                try:
                    handler(event)
                except Exception:
                    log.exception(
                        "internal error on connection %s (%s) at %s: closing it",
                        self.id, self.container_id or self.peer, event.type,
                    )
                    self._fail("amqp:internal-error", "internal error")
            collector.pop()
        self.shell.apply_effects()
        self.shell.dirty.add(self)

    def _fail(self, condition: str, description: str) -> None:
        self.connection.condition = Condition(condition, description)
        self.connection.close()
        self._finish(abrupt=True)

    def _finish(self, *, abrupt: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for link in list(self.consumers.values()):
            self.shell.consumers.pop(link.id, None)
        self.consumers.clear()
        self.producers.clear()
        self.broker.connection_closed(self.id, abrupt=abrupt)
        self.shell.connections.pop(self.id, None)
        log.info("connection %s from %s (%s) closed%s", self.id, self.peer,
                 self.container_id or "-", " abruptly" if abrupt else "")

    def _on_connection_open(self, event: Event) -> None:
        connection = self.connection
        self.container_id = connection.remote_container or ""
        connection.container = self.broker.name
        connection.offered_capabilities = OFFERED_CAPABILITIES
        connection.open()
        log.info("connection %s from %s opened (container %s)", self.id, self.peer,
                 self.container_id or "-")

    def _on_connection_close(self, event: Event) -> None:
        self._orderly = True
        self.connection.close()
        self._finish(abrupt=False)  # B-053: an AMQP close is orderly

    def _on_transport_error(self, event: Event) -> None:
        condition = self.transport.condition
        log.warning("connection %s from %s: transport error %s", self.id, self.peer,
                    condition.description if condition else "")

    def _on_transport_closed(self, event: Event) -> None:
        self._finish(abrupt=not self._orderly)

    def _on_session_open(self, event: Event) -> None:
        event.session.open()

    def _on_session_close(self, event: Event) -> None:
        session: Session = event.session
        for link, consumer in list(self.consumers.items()):
            if link.session == session:
                self._drop_consumer(link, consumer, closed=False)
        for link in [lk for lk in self.producers if lk.session == session]:
            del self.producers[link]
        session.close()

    # -- links --------------------------------------------------------------------------
    def _on_link_open(self, event: Event) -> None:
        link: Link = event.link
        if link.state & Endpoint.LOCAL_ACTIVE:
            return
        try:
            if link.is_receiver:
                self._attach_producer(link)
            else:
                self._attach_consumer(link)
        except BrokerError as e:
            log.info("refusing attach of link %r on connection %s (%s): %s %s", link.name,
                     self.id, self.container_id or "-", e.condition, e)
            self.close_link(link, e.condition, str(e))

    def _attach_producer(self, link: Link) -> None:
        target = self.broker.attach_producer(
            producer_request(link, self.id, anycast_prefix=self.anycast_prefix,
                             multicast_prefix=self.multicast_prefix)
        )
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.remote_target.dynamic:
            link.target.address = target.address
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST  # B-021: `second` is answered with `first`
        link.open()
        self.producers[link] = ProducerLink(link, target)
        link.flow(PRODUCER_CREDIT)

    def _attach_consumer(self, link: Link) -> None:
        attached = self.broker.attach_consumer(
            consumer_request(link, self.id, self.container_id,
                             anycast_prefix=self.anycast_prefix,
                             multicast_prefix=self.multicast_prefix)
        )
        link.source.copy(link.remote_source)
        link.source.address = attached.address
        echo_source_filter(link, attached.selector)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        consumer = ConsumerLink(attached.consumer, link, self)
        self.consumers[link] = consumer
        self.shell.consumers[attached.consumer] = consumer
        if link.credit > 0:
            self.broker.set_credit(attached.consumer, link.credit, drain=link.drain_mode)

    def close_link(self, link: Link, condition: str, description: str) -> None:
        """Refuse or end a link from the broker side, with an AMQP error (B-022, B-038)."""
        if not link.state & Endpoint.LOCAL_ACTIVE:
            link.open()
        link.condition = Condition(condition, description)
        link.close()
        self.consumers.pop(link, None)
        self.producers.pop(link, None)

    def _drop_consumer(self, link: Link, consumer: ConsumerLink, *, closed: bool) -> None:
        del self.consumers[link]
        self.shell.consumers.pop(consumer.id, None)
        self.broker.detach_consumer(consumer.id, closed=closed)

    def _on_link_detach(self, event: Event) -> None:
        self._link_ended(event.link, closed=False)

    def _on_link_close(self, event: Event) -> None:
        self._link_ended(event.link, closed=True)

    def _link_ended(self, link: Link, *, closed: bool) -> None:
        consumer = self.consumers.get(link)
        if consumer is not None:
            self._drop_consumer(link, consumer, closed=closed)
        self.producers.pop(link, None)
        if link.state & Endpoint.LOCAL_ACTIVE:
            if closed:
                link.close()
            else:
                link.detach()

    def _on_link_flow(self, event: Event) -> None:
        link: Link = event.link
        if link.is_sender:
            consumer = self.consumers.get(link)
            if consumer is not None:
                self.broker.set_credit(consumer.id, link.credit, drain=link.drain_mode)

    # -- deliveries ---------------------------------------------------------------------
    def _on_delivery(self, event: Event) -> None:
        delivery: Delivery = event.delivery
        link: Link = delivery.link
        if link.is_receiver:
            self._on_transfer(delivery, link)
        else:
            self._on_disposition(delivery, link)

    def _on_transfer(self, delivery: Delivery, link: Link) -> None:
        if delivery.partial:
            return  # proton buffers the frames until the last one (B-152: no size limit)
        producer = self.producers.get(link)
        data = link.recv(delivery.pending)
        link.advance()
        if delivery.aborted or producer is None or data is None:
            delivery.settle()
            return
        try:
            self._publish(producer, data)
        except ClientError as e:
            # B-023: security and address-full keep their condition; all else is `failed`
            # (B-009: even a missing address on the anonymous relay, as Artemis does).
            condition = e.condition if e.condition in _PASSED_CONDITIONS else "failed"
            delivery.local.condition = Condition(condition, str(e))
            delivery.update(Delivery.REJECTED)
        except sections.SectionError as e:
            log.info("rejecting malformed message on connection %s link %r: %s", self.id,
                     link.name, e)
            delivery.local.condition = Condition("amqp:decode-error", str(e))
            delivery.update(Delivery.REJECTED)
        else:
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        credit = link.credit
        if credit < PRODUCER_LOW_CREDIT:
            link.flow(PRODUCER_CREDIT - credit)

    def _publish(self, producer: ProducerLink, raw: bytes) -> None:
        scanned = sections.scan(raw)
        message = Message(
            scanned.data,
            durable=scanned.durable,
            priority=scanned.priority,
            header_end=scanned.header_end,
            header={"delivery-count": scanned.delivery_count}
            if scanned.delivery_count or scanned.first_acquirer else None,
            origin_container=self.container_id,
            reader=sections.READER,
        )
        target = producer.target
        message_routing_type = None
        to = None
        if scanned.message_annotations is not None and target.routing_type is None:
            annotations = message.get_annotations()
            value = annotations.get("x-opt-routing-type")
            message_routing_type = _ROUTING_TYPE_BYTES.get(value) if isinstance(
                value, int) else None
            if message_routing_type is None and target.address is None:
                jms = annotations.get("x-opt-jms-dest")
                message_routing_type = _JMS_DEST.get(jms) if isinstance(jms, int) else None
        if target.address is None and scanned.properties is not None:
            value = message.get_properties().get("to")
            to = value if isinstance(value, str) else None
        self.broker.publish(message, target, to=to, message_routing_type=message_routing_type)

    def _on_disposition(self, delivery: Delivery, link: Link) -> None:
        consumer = self.consumers.get(link)
        if consumer is None:
            if delivery.settled:
                delivery.settle()
            return
        outcome = outcome_of(delivery)
        if outcome is None:
            if delivery.settled:
                delivery.settle()  # B-048: settled with no outcome: message stays acquired
            return
        self.broker.settle(consumer.id, DeliveryId(int(delivery.tag)), outcome)
        delivery.settle()
