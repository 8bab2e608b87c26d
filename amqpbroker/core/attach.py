"""Attaching producers and consumers: what a link is bound to (B-022…B-038, B-053).

Theory of operation
-------------------
The protocol adapter describes a link as a request (`ProducerRequest`, B-022;
`ConsumerRequest`, B-024…B-036); the broker answers with what it is bound to
(`ProducerTarget`, `ConsumerAttached`) or raises a `ClientError`. A producer's target is
an address, made on first use when the settings allow (its routing type from a
capability, a prefix or the settings, B-008), or a temporary node (B-030). A consumer's
source is a queue: a named one (FQQN, B-006), the address's anycast queue, a
subscription queue for multicast (durable by container id and link name, shared or not;
a null source recovers one, B-029), or a temporary queue (B-030); selectors are parsed
here. `detach_consumer` returns the link's deliveries (B-053/B-054) and deletes the
subscription or temporary queue its expiry policy ends (B-028/B-030). Permissions are
checked for the user the request acts for (`_acting_for`). Dispatch, credit and
settling stay in `Broker` and `Queue`. `_Attach` is a part of `Broker` (a mixin): it
declares the broker state it uses, which `Broker.__init__` sets.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, replace

from amqpbroker.core.clock import entry, within_call
from amqpbroker.core.effects import Effect
from amqpbroker.core.errors import (
    ClientError,
    IllegalState,
    MaxConsumersReached,
    NotFound,
)
from amqpbroker.core.management import MANAGEMENT_ADDRESS
from amqpbroker.core.model import (
    ConnectionId,
    ConsumerId,
    ProducerTarget,
    QueueConfig,
    RoutingType,
)
from amqpbroker.core.names import parse_address
from amqpbroker.core.parts import _BrokerPart
from amqpbroker.core.postoffice import Address
from amqpbroker.core.queue import Consumer, Queue, Window
from amqpbroker.core.queuekinds import last_value_key
from amqpbroker.core.security import SecurityRepository
from amqpbroker.core.selector import parse_selector
from amqpbroker.core.settings import ResolvedSettings

log = logging.getLogger("amqpbroker.core.broker")  # the broker's one logger


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerRequest:
    """A producer link attach, translated from the AMQP target (B-022)."""

    connection: ConnectionId
    address: str | None  # None or "" = anonymous relay (B-009)
    capabilities: tuple[str, ...] = ()
    dynamic: bool = False
    anycast_prefix: str | None = None
    multicast_prefix: str | None = None
    user: str | None = None
    roles: frozenset[str] | None = None  # None: security disabled, everything allowed


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerRequest:
    """A consumer link attach, translated from the AMQP source (B-024…B-036)."""

    connection: ConnectionId
    container_id: str
    link_name: str
    address: str | None
    capabilities: tuple[str, ...] = ()
    dynamic: bool = False
    durable: bool = False  # source durability unsettled-state or configuration
    expiry_policy: str = "session-end"  # link-detach | session-end | connection-close | never
    browse: bool = False  # distribution-mode copy
    selector: str | None = None
    no_local: bool = False
    presettled: bool = False
    priority: int | None = None  # attach property `priority` (B-035)
    null_source: bool = False  # attach with no source: recover a subscription (B-029)
    user: str | None = None
    roles: frozenset[str] | None = None  # None: security disabled
    anycast_prefix: str | None = None
    multicast_prefix: str | None = None
    max_message_size: int = 0  # the receiver's attach max-message-size; 0: none
    window: Window | None = None  # the connection's write window (issue 15); None: none


@dataclass(frozen=True, slots=True)
class ConsumerAttached:
    """The answer to a consumer attach: what to echo in the source."""

    consumer: ConsumerId
    queue: str
    address: str  # the source address to answer with (the queue name for dynamic nodes)
    subscription: bool
    selector: str | None
    no_local: bool = False  # echo the no-local filter (subscriptions only, B-034)
    recovered: bool = False  # B-029: answer with the stored subscription's source


@dataclass(slots=True)
class _ConsumerInfo:
    consumer: Consumer
    request: ConsumerRequest
    kind: str  # "queue", "durable", "shared-volatile", "volatile", "dynamic"


class _Attach(_BrokerPart):
    """`Broker`'s attach and detach of links (a mixin: it declares the broker state it
    uses, which `Broker.__init__` sets)."""

    _consumer_ids: itertools.count[int]
    _consumers: dict[ConsumerId, _ConsumerInfo]
    _consumer_of: dict[ConsumerId, Consumer]
    _effects: list[Effect]
    security: SecurityRepository

    def _check(self, permission: str, address: str) -> None:
        raise NotImplementedError  # Broker's

    def _register(self, info: _ConsumerInfo) -> None:
        """An attached consumer, in both maps: `_consumers` (what attach and detach read)
        and `_consumer_of` (`Hot.consumer_of`: the consumer alone, what a settle and a
        credit read, a native map of native objects; `_ConsumerInfo` is not compiled, and
        its `consumer` read was a generic attribute lookup, ~160 instructions a call)."""
        self._consumers[info.consumer.id] = info
        self._consumer_of[info.consumer.id] = info.consumer

    def _forget(self, consumer_id: ConsumerId) -> _ConsumerInfo | None:
        """The consumer out of both maps (`_register`); its info, None if unknown."""
        self._consumer_of.pop(consumer_id, None)
        return self._consumers.pop(consumer_id, None)

    def _ensure_address(
        self, name: str, routing_type: RoutingType, settings: ResolvedSettings
    ) -> Address:
        raise NotImplementedError  # Broker's

    def _random_name(self) -> str:
        raise NotImplementedError  # Broker's

    def watch_consumer(self, consumer: Consumer, now_ms: int) -> None:
        raise NotImplementedError  # Broker's (core/slowconsumer.py)

    @entry
    def attach_producer(self, request: ProducerRequest) -> ProducerTarget:
        """B-022: resolve a producer target, auto-creating what it needs."""
        with self._acting_for(request.user, request.roles):
            target = self._attach_producer(request)
        return replace(target, user=request.user, roles=request.roles)

    def _attach_producer(self, request: ProducerRequest) -> ProducerTarget:
        caps_type = _capability_routing_type(request.capabilities)
        if request.dynamic:
            return self._dynamic_target(request, caps_type)
        if not request.address:
            return ProducerTarget(None, link_routing_type=caps_type)
        parsed = parse_address(
            request.address,
            anycast_prefix=request.anycast_prefix,
            multicast_prefix=request.multicast_prefix,
        )
        if self.settings.wildcards.has_wildcard(parsed.address):
            raise ClientError(f"cannot send to wildcard address {parsed.address} (B-011)")
        if parsed.address == MANAGEMENT_ADDRESS:  # B-160: requests, answered not routed
            self._check("manage", parsed.address)  # B-154
            return ProducerTarget(parsed.address, management=True)
        self._check("send", parsed.address)
        routing_type = caps_type or parsed.routing_type
        self._prepare_target(parsed.address, parsed.queue, routing_type)
        return ProducerTarget(parsed.address, routing_type, parsed.queue)

    @within_call  # from publish (anonymous relay, deleted address): auto-creates
    def _prepare_target(
        self, name: str, fqqn_queue: str | None, routing_type: RoutingType | None
    ) -> Address:
        settings = self.settings.resolve(name)
        if fqqn_queue is not None:
            queue = self.queues.get(fqqn_queue)
            if queue is not None:
                if queue.address != name:
                    raise NotFound(f"queue {fqqn_queue} does not exist for address {name}")
                return self.post_office.addresses[name]
            rt = routing_type or settings.default_queue_routing_type
            address = self._ensure_address(name, rt, settings)
            if not settings.auto_create_queues:
                raise NotFound(f"queue {fqqn_queue} does not exist for address {name}")
            self._auto_queue(fqqn_queue, name, rt, settings)
            return address
        implicit = routing_type or self._implicit_routing_type(name, settings)
        address = self._ensure_address(name, implicit, settings)
        if implicit is RoutingType.ANYCAST and not any(
            q.routing_type is RoutingType.ANYCAST for q in address.queues
        ):
            if name in self.queues or not settings.auto_create_queues:
                if name not in self.queues:
                    raise NotFound(f"target address {name} does not exist")
            else:
                self._auto_queue(name, name, RoutingType.ANYCAST, settings)
        return address

    def _implicit_routing_type(self, name: str, settings: ResolvedSettings) -> RoutingType:
        """B-008 rule 3 for creating: the address's only type, else the default."""
        address = self.post_office.addresses.get(name)
        if address is not None and len(address.routing_types) == 1:
            return next(iter(address.routing_types))
        if address is not None:
            return (
                RoutingType.ANYCAST
                if RoutingType.ANYCAST in address.routing_types
                else (RoutingType.MULTICAST)
            )
        return settings.default_address_routing_type

    def _dynamic_target(
        self, request: ProducerRequest, caps_type: RoutingType | None
    ) -> ProducerTarget:
        """B-030: a temporary queue (temporary-queue) or topic address."""
        name = self._random_name()
        settings = self.settings.resolve(name)
        routing_type = caps_type or settings.default_address_routing_type
        self._check("create-non-durable-queue", name)
        self.create_address(name, {routing_type}, temporary=True, owner=request.connection)
        if routing_type is RoutingType.ANYCAST:
            self.create_queue(
                QueueConfig(
                    name=name,
                    address=name,
                    routing_type=routing_type,
                    durable=False,
                    temporary=True,
                ),
                owner=request.connection,
            )
        return ProducerTarget(name, routing_type)

    @entry
    def attach_consumer(self, request: ConsumerRequest) -> ConsumerAttached:
        """B-024…B-031: find or create the queue for a consumer link and attach to it."""
        with self._acting_for(request.user, request.roles):
            return self._attach_consumer(request)

    def _attach_consumer(self, request: ConsumerRequest) -> ConsumerAttached:
        if request.null_source:
            return self._recover_subscription(request)
        if request.dynamic:
            queue, kind, answer = self._dynamic_source(request), "dynamic", None
        else:
            if not request.address:
                raise ClientError("source has no address and is not dynamic (B-038)")
            queue, kind = self._consumer_queue(request)
            answer = request.address
        selector = None
        if request.selector and kind == "queue":
            selector = parse_selector(request.selector)
        max_consumers = queue.config.max_consumers
        if max_consumers >= 0 and len(queue.consumers) >= max_consumers and not request.browse:
            raise MaxConsumersReached(
                f"queue {queue.name} has reached max-consumers={max_consumers}"
            )
        consumer = Consumer(
            id=ConsumerId(next(self._consumer_ids)),
            queue=queue,
            connection=request.connection,
            link_name=request.link_name,
            container=request.container_id,
            selector=selector,
            browser=request.browse and kind == "queue",
            presettled=request.presettled,
            priority=_consumer_priority(request),
            max_message_size=request.max_message_size,
            window=request.window if request.window is not None else Window(),
        )
        queue.add_consumer(consumer)
        self.watch_consumer(consumer, self.now_ms)  # core/slowconsumer.py
        self._register(_ConsumerInfo(consumer, request, kind))
        return ConsumerAttached(
            consumer.id,
            queue.name,
            answer or queue.name,
            kind not in ("queue", "dynamic"),
            request.selector if kind != "dynamic" else None,
            no_local=request.no_local and kind not in ("queue", "dynamic"),
        )

    def _recover_subscription(self, request: ConsumerRequest) -> ConsumerAttached:
        """B-029: a null source looks the durable subscription up by container-id and
        link name (shared/global cannot be read from the link's desired capabilities with
        this Proton engine, so only the plain `<container-id>.<link-name>` form)."""
        container = request.container_id
        name = f"{container}.{request.link_name}" if container else request.link_name
        queue = self.queues.get(name)
        if (
            queue is None
            or queue.routing_type is not RoutingType.MULTICAST
            or (queue.config.temporary)
        ):
            raise NotFound("Unknown subscription link")
        self._check("consume", queue.address)
        consumer = Consumer(
            id=ConsumerId(next(self._consumer_ids)),
            queue=queue,
            connection=request.connection,
            link_name=request.link_name,
            container=container,
            presettled=request.presettled,
            max_message_size=request.max_message_size,
            window=request.window if request.window is not None else Window(),
        )
        queue.add_consumer(consumer)
        self.watch_consumer(consumer, self.now_ms)  # core/slowconsumer.py
        self._register(
            _ConsumerInfo(
                consumer, replace(request, expiry_policy="never", durable=True), "durable"
            )
        )
        return ConsumerAttached(
            consumer.id, queue.name, queue.name, True, queue.config.filter, recovered=True
        )

    def _dynamic_source(self, request: ConsumerRequest) -> Queue:
        """B-030: a temporary ANYCAST queue with a random name, on an address of that name."""
        name = self._random_name()
        self._check("create-non-durable-queue", name)
        self.create_address(name, {RoutingType.ANYCAST}, temporary=True, owner=request.connection)
        return self.create_queue(
            QueueConfig(
                name=name,
                address=name,
                routing_type=RoutingType.ANYCAST,
                durable=False,
                temporary=True,
            ),
            owner=request.connection,
        )

    def _consumer_queue(self, request: ConsumerRequest) -> tuple[Queue, str]:
        assert request.address is not None
        parsed = parse_address(
            request.address,
            anycast_prefix=request.anycast_prefix,
            multicast_prefix=request.multicast_prefix,
            allow_parameters=True,
        )
        for key, _ in parsed.parameters:
            if key != "consumer-priority":
                log.info("ignoring source-address parameter %r on %s (B-036)", key, parsed.address)
        if request.selector:
            parse_selector(request.selector)  # B-032: refuse a bad selector at attach
        name = parsed.address
        self._check("browse" if request.browse else "consume", name)
        settings = self.settings.resolve(name)
        caps = set(request.capabilities)
        wanted = parsed.routing_type
        if "topic" in caps:
            wanted = RoutingType.MULTICAST
        elif "queue" in caps:
            wanted = RoutingType.ANYCAST
        address = self.post_office.addresses.get(name)
        if parsed.queue is not None:
            return self._fqqn_consumer_queue(name, parsed.queue, wanted, settings), "queue"
        elsewhere = self.queues.get(name)
        if address is None and elsewhere is not None:
            # B-075 decision: queue names are broker-wide (B-001), so `DLQ.orders` cannot
            # be auto-created again; say which FQQN reaches the existing one.
            raise NotFound(
                f"address {name} does not exist; queue {name} is on address "
                f"{elsewhere.address}: attach to {elsewhere.address}::{name}"
            )
        if wanted is not None:  # the client decided (B-024 rule 1)
            if address is None:
                if not settings.auto_create_addresses:
                    raise NotFound(f"source address {name} does not exist")
                address = self.create_address(name, {wanted}, auto_created=True)
            elif wanted not in address.routing_types:
                kind = "topic" if wanted is RoutingType.MULTICAST else "queue"
                raise IllegalState(f"address {name} is not configured for {kind} support")
            subscription = wanted is RoutingType.MULTICAST
        else:  # B-024 rule 2
            if address is None:
                if not settings.auto_create_addresses:
                    raise NotFound(f"source address {name} does not exist")
                address = self.create_address(
                    name, {settings.default_address_routing_type}, auto_created=True
                )
            subscription = address.routing_types == {RoutingType.MULTICAST}
        if subscription:
            return self._subscription_queue(request, address, settings)
        return self._queue_for_consumer(address, settings), "queue"

    def _fqqn_consumer_queue(
        self, name: str, queue_name: str, wanted: RoutingType | None, settings: ResolvedSettings
    ) -> Queue:
        """B-006: consume from that exact queue; create it when auto-create allows."""
        queue = self.queues.get(queue_name)
        if queue is not None:
            if queue.address != name:
                raise NotFound(f"queue {queue_name} does not exist for address {name}")
            return queue
        if not settings.auto_create_queues:
            raise NotFound(f"queue {queue_name} does not exist for address {name}")
        rt = wanted or settings.default_queue_routing_type
        self._ensure_address(name, rt, settings)
        return self._auto_queue(queue_name, name, rt, settings)

    def _queue_for_consumer(self, address: Address, settings: ResolvedSettings) -> Queue:
        """B-025: same-named queue, else first ANYCAST, else any, else auto-create."""
        queue = self.queues.get(address.name)
        if queue is not None and queue.address == address.name:
            return queue
        for candidate in address.queues:
            if candidate.routing_type is RoutingType.ANYCAST:
                return candidate
        if address.queues:
            return address.queues[0]
        if not settings.auto_create_queues:
            raise NotFound(f"source address {address.name} has no queue")
        address.routing_types.add(RoutingType.ANYCAST)
        return self._auto_queue(address.name, address.name, RoutingType.ANYCAST, settings)

    def _subscription_queue(
        self, request: ConsumerRequest, address: Address, settings: ResolvedSettings
    ) -> tuple[Queue, str]:
        """B-026/B-027: durable, shared-volatile or private volatile subscription queues."""
        caps = set(request.capabilities)
        shared, is_global = "shared" in caps, "global" in caps
        link_name = request.link_name
        if shared and "|" in link_name:
            link_name = link_name.split("|", 1)[0]
        container = "" if is_global else request.container_id
        base = f"{container}.{link_name}" if container else link_name
        selector = request.selector
        if request.no_local:  # B-034: not from this connection's container
            quoted = request.container_id.replace("'", "''")
            no_local = f"__AMQ_CID <> '{quoted}'"
            selector = f"({selector}) AND {no_local}" if selector else no_local
        if request.durable:
            name = base + (":global" if shared and is_global else "")
            kind = "durable"
            durable, temporary = True, False
        elif shared:
            name = base + ":shared-volatile" + (":global" if is_global else "")
            kind, durable, temporary = "shared-volatile", False, False
        else:
            name, kind, durable, temporary = self._random_name(), "volatile", False, True
        existing = self.queues.get(name)
        if existing is None:
            self._check(
                "create-durable-queue" if durable else "create-non-durable-queue", address.name
            )
        if existing is not None:
            if existing.address == address.name and (existing.config.filter or None) == (
                selector or None
            ):
                return existing, kind
            if existing.consumers:
                raise IllegalState("Unable to recreate subscription, consumers already exist")
            # Third attack pass (B-154): re-creating deletes the old queue and its
            # messages, so it needs what a delete and a create need, as in Artemis (its
            # session's deleteQueue and createQueue check both). Without it, any user
            # could drop another's durable subscription by reusing its container-id
            # and link name on an address of their own.
            old_durable = existing.config.durable
            self._check(
                "delete-durable-queue" if old_durable else "delete-non-durable-queue",
                existing.address,
            )
            self._check(
                "create-durable-queue" if durable else "create-non-durable-queue", address.name
            )
            self.delete_queue(name, reason="re-created with a new address or filter")
        queue = self.create_queue(
            QueueConfig(
                name=name,
                address=address.name,
                routing_type=RoutingType.MULTICAST,
                durable=durable,
                filter=selector,
                temporary=temporary,
                max_consumers=1 if kind == "durable" and not shared else -1,
                # B-110 (Artemis applyDynamicDefaults): B-120, B-121, B-123
                last_value_key=last_value_key(
                    settings.default_last_value_key, settings.default_last_value_queue
                ),
                non_destructive=settings.default_non_destructive,
                ring_size=settings.default_ring_size,
            ),
            owner=request.connection if temporary else None,
        )
        return queue, kind

    @entry
    def detach_consumer(
        self, consumer_id: ConsumerId, *, closed: bool, abrupt: bool = False
    ) -> None:
        """A consumer link ended: return its deliveries (B-053/B-054), then B-028/B-030."""
        info = self._forget(consumer_id)
        if info is None:
            return
        consumer, queue = info.consumer, info.consumer.queue
        now_ms = self.now_ms
        queue.remove_consumer(consumer, now_ms, self._effects, abrupt=abrupt)
        if queue.name not in self.queues or queue.consumers:
            return
        policy = info.request.expiry_policy
        closing = closed or policy == "link-detach"
        if (
            (info.kind == "durable" and closing)
            or info.kind == "shared-volatile"
            or (
                info.kind in ("volatile", "dynamic")
                and closing
                and policy in ("link-detach", "session-end")
            )
        ):
            request = info.request
            if info.kind == "durable" and not self.security.allowed(
                request.roles, "delete-durable-queue", queue.address
            ):
                log.info(
                    "keeping subscription queue %s: user %s may not delete durable queues on %s",
                    queue.name,
                    request.user,
                    queue.address,
                )
                return
            self.delete_queue(queue.name, reason="unsubscribed")
            if info.kind == "dynamic":
                self._remove_address(queue.address)


def _consumer_priority(request: ConsumerRequest) -> int:
    """B-035: the attach property wins over `?consumer-priority=N`; default 0."""
    if request.priority is not None:
        return request.priority
    if request.address and "?" in request.address:
        for item in request.address.split("?", 1)[1].split("&"):
            key, _, value = item.partition("=")
            if key == "consumer-priority":
                try:
                    return int(value)
                except ValueError:
                    log.info("ignoring consumer-priority=%r: not an integer", value)
    return 0


def _capability_routing_type(capabilities: tuple[str, ...]) -> RoutingType | None:
    """B-008 rule 1: the first recognised capability in array order decides."""
    for cap in capabilities:
        if cap in ("topic", "temporary-topic"):
            return RoutingType.MULTICAST
        if cap in ("queue", "temporary-queue"):
            return RoutingType.ANYCAST
    return None
