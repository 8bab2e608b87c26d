"""The broker's state machine: the only API the protocol adapter calls.

Requests come in as method calls; effects go out as data (`take_effects()`), in the order
they must happen. Never blocks, sleeps, reads the time except through the injected clock
(once per call), or touches a socket. Loop thread only.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from random import Random
from typing import Any, Protocol

from amqpbroker.core.clock import Clock
from amqpbroker.core.effects import AddressUnblocked, CloseConsumer, Effect
from amqpbroker.core.errors import (
    ClientError,
    IllegalState,
    MaxConsumersReached,
    NotFound,
    ResourceLimitExceeded,
)
from amqpbroker.core.expiry import apply_expiry_overrides, initial_expiration
from amqpbroker.core.ids import MessageIds
from amqpbroker.core.lifecycle import Emitter, EventLevel, Extra, Shape
from amqpbroker.core.model import (
    BYTE_OF_ROUTING_TYPE,
    ROUTING_TYPE_OF_BYTE,
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Message,
    QueueConfig,
    RoutingType,
    annotated_routing_type,
)
from amqpbroker.core.names import advisory_characters, parse_address
from amqpbroker.core.outcomes import Modified, Outcome, Rejected
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.postoffice import Address, PostOffice
from amqpbroker.core.queue import Consumer, Queue, Window
from amqpbroker.core.refs import DELIVERING, Ref
from amqpbroker.core.security import SecurityRepository
from amqpbroker.core.selector import parse_selector
from amqpbroker.core.settings import ResolvedSettings, SettingsRepository
from amqpbroker.core.totals import CounterTotals

log = logging.getLogger(__name__)

_SENT_SHAPES = 1000  # `sent` shapes kept per address (one per producer container)

_ROLLBACK = Modified(delivery_failed=True)  # B-143: a rollback counts as a failed attempt


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveAnnotations:
    """What a moved copy must say about where it came from (B-076, B-079, B-090).

    The protocol codec knows the AMQP type of each annotation; the core only the values.
    """

    orig_address: str
    orig_queue: str | None
    orig_message_id: int
    orig_routing_type: int | None = None  # 0 MULTICAST, 1 ANYCAST
    actual_expiry: int | None = None
    dlq_reason: str | None = None
    dlq_error_condition: str | None = None
    dlq_error_description: str | None = None
    dlq_delivery_count: int | None = None
    routing_type: int | None = None  # x-opt-routing-type on the copy (B-090 exception)


class MessageCopier(Protocol):
    """Rewrites encoded messages (implemented by the protocol codec)."""

    def copy(self, message: Message, move: MoveAnnotations) -> Message:
        """The copy a dead-letter, expiry or management move routes (B-076)."""
        ...

    def set_expiration(self, message: Message, expiration_ms: int) -> None:
        """B-083: write absolute-expiry-time (or remove it for 0) and drop header.ttl."""
        ...


class _BytesCopier:
    """Fallback for tests without a codec: the copy shares the original bytes."""

    def copy(self, message: Message, move: MoveAnnotations) -> Message:
        annotations = kept_annotations(message.get_annotations())
        annotations.update(move_annotation_values(move))
        return Message(
            message.data,
            durable=message.durable,
            priority=message.priority,
            header_end=message.header_end,
            annotations=annotations,
            properties=message.properties,
            application_properties=message.application_properties,
            reader=message.reader,
        )

    def set_expiration(self, message: Message, expiration_ms: int) -> None:
        message.expiration_ms = expiration_ms


def kept_annotations(annotations: dict[Any, Any]) -> dict[Any, Any]:
    """The annotations a moved copy keeps: all but earlier hops' `x-opt-ORIG-*` /
    `x-opt-DLQ-*` entries and `x-opt-routing-type` (B-076, B-079, B-090)."""
    return {
        key: value
        for key, value in annotations.items()
        if not (isinstance(key, str) and key.startswith(("x-opt-ORIG-", "x-opt-DLQ-")))
        and key != "x-opt-routing-type"
    }


# The annotations of a moved copy (B-076, B-079, B-090), in the order they are written:
# (name, `MoveAnnotations` field, AMQP type). The one list of their names; the protocol
# codec maps the type names to its wrappers (`protocol/moves.py`).
MOVE_ANNOTATIONS: tuple[tuple[str, str, str], ...] = (
    ("x-opt-ORIG-QUEUE", "orig_queue", "string"),
    ("x-opt-ORIG-ADDRESS", "orig_address", "string"),
    ("x-opt-ORIG-MESSAGE-ID", "orig_message_id", "long"),
    ("x-opt-ORIG-ROUTING-TYPE", "orig_routing_type", "byte"),
    ("x-opt-ACTUAL-EXPIRY", "actual_expiry", "long"),
    ("x-opt-DLQ-REASON", "dlq_reason", "string"),
    ("x-opt-DLQ-ERROR-CONDITION", "dlq_error_condition", "symbol"),
    ("x-opt-DLQ-ERROR-DESCRIPTION", "dlq_error_description", "string"),
    ("x-opt-DLQ-DELIVERY-COUNT", "dlq_delivery_count", "uint"),
    ("x-opt-routing-type", "routing_type", "byte"),
)


def move_annotation_values(
    move: MoveAnnotations, typed: Mapping[str, Callable[[Any], Any]] | None = None
) -> dict[str, Any]:
    """The `x-opt-*` annotation values of a move, absent entries left out (B-090); each
    passed through `typed[its AMQP type]` when there is one."""
    values: dict[str, Any] = {}
    for name, attribute, kind in MOVE_ANNOTATIONS:
        value = getattr(move, attribute)
        if value is not None:
            wrap = typed.get(kind) if typed is not None else None
            values[name] = value if wrap is None else wrap(value)
    return values


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


@dataclass(frozen=True, slots=True)
class ProducerTarget:
    """Where a producer link's messages go. address None: anonymous relay."""

    address: str | None
    routing_type: RoutingType | None = None  # fixed by capability or prefix (B-008 rule 1)
    queue: str | None = None  # FQQN: only this queue (B-006)
    link_routing_type: RoutingType | None = None  # anonymous relay: from link capabilities
    user: str | None = None
    roles: frozenset[str] | None = None  # anonymous relay: `send` is checked per message


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


@dataclass(slots=True)
class BrokerStats:
    """Broker-wide counters (per-queue and per-address ones live with those)."""

    unrouted: int = 0
    routed: int = 0
    killed_no_dla: int = 0


class Broker:
    """The broker: addresses, queues, consumers and every message state change."""

    def __init__(
        self,
        *,
        settings: SettingsRepository,
        clock: Clock,
        rng: Random | None = None,
        copier: MessageCopier | None = None,
        name: str = "amqpbroker",
        address_queue_scan_period_ms: int = 30_000,
        message_expiry_scan_period_ms: int = 30_000,
        event_level: EventLevel = EventLevel.LIFECYCLE,
        security: SecurityRepository | None = None,
        id_cache_size: int = 20_000,
        persistence: Persistence | None = None,
    ) -> None:
        self.name = name
        self.persistence = persistence  # None: memory only
        self.emitter = Emitter(event_level)
        self.security = security or SecurityRepository({})
        self._id_cache_size = id_cache_size  # B-012: ids remembered per address
        # Who the current client request acts for (set only around attach/publish).
        self._principal: tuple[str | None, frozenset[str]] | None = None
        self.settings = settings
        self.clock = clock
        self.rng = rng or Random()
        self.copier: MessageCopier = copier or _BytesCopier()
        self.post_office = PostOffice(settings.wildcards)
        self.queues: dict[str, Queue] = {}
        self.stats = BrokerStats()
        self.totals = CounterTotals()  # counters across queue incarnations (issue 16 item 4)
        self._effects: list[Effect] = []
        self._msg_ids = MessageIds()  # unique across restarts once reserve_with() is set
        self._consumer_ids = itertools.count(1)
        self._delivery_ids = itertools.count(1)
        self._consumers: dict[ConsumerId, _ConsumerInfo] = {}
        self._scan_period_ms = address_queue_scan_period_ms
        self._next_scan_ms = clock.now_ms() + address_queue_scan_period_ms
        self._warned_names: set[str] = set()
        self._deadlines: list[int] = []  # may hold stale entries; tick() drops them
        # Expiry index (B-084): (expiration, n, queue, ref) for references that can expire,
        # so a scan pops only what is due instead of walking every message.
        self._expiries: list[tuple[int, int, Queue, Ref]] = []
        self._expiry_seq = itertools.count()
        self._expiry_scan_period_ms = message_expiry_scan_period_ms
        self._next_expiry_scan_ms = clock.now_ms() + max(message_expiry_scan_period_ms, 0)
        self._expiry_drop_warned: set[str] = set()

    # -- effects and time -----------------------------------------------------------
    def take_effects(self) -> list[Effect]:
        """Effects since the last call, in the order they must be applied."""
        effects, self._effects = self._effects, []
        return effects

    def _add_deadline(self, at_ms: int) -> None:
        heapq.heappush(self._deadlines, at_ms)

    def next_deadline_ms(self) -> int | None:
        """When `tick()` next has work: a redelivery, the reaper or the expiry scan. O(1)."""
        candidates = []
        if self._scan_period_ms > 0:
            candidates.append(self._next_scan_ms)
        if self._deadlines:
            candidates.append(self._deadlines[0])
        if self._expiries and self._expiry_scan_period_ms > 0:
            candidates.append(max(self._next_expiry_scan_ms, self._expiries[0][0]))
        return min(candidates) if candidates else None

    def tick(self) -> None:
        """Fire due redeliveries and, every address-queue-scan-period, the reaper."""
        now_ms = self.clock.now_ms()
        out = self._effects
        deadlines = self._deadlines
        if deadlines and deadlines[0] <= now_ms:
            while deadlines and deadlines[0] <= now_ms:
                heapq.heappop(deadlines)
            for queue in list(self.queues.values()):
                if (due := queue.next_deadline_ms()) is not None and due <= now_ms:
                    queue.tick(now_ms, out)
        if self._scan_period_ms > 0 and now_ms >= self._next_scan_ms:
            self._next_scan_ms = now_ms + self._scan_period_ms
            self.reap(now_ms)
        if self._expiry_scan_period_ms > 0 and now_ms >= self._next_expiry_scan_ms:
            self._next_expiry_scan_ms = now_ms + self._expiry_scan_period_ms
            self.expire_due(now_ms)

    def next_message_id(self) -> int:
        return next(self._msg_ids)

    def enable_persistence(self, persistence: Persistence) -> None:
        """Journal from now on: first what exists (configured addresses and queues)."""
        self.persistence = persistence
        persistence.on_lost = self._unstored
        for address in self.post_office.addresses.values():
            self._journal_address(address)
        for queue in self.queues.values():
            self._journal_queue(queue)

    def _journal_address(self, address: Address) -> None:
        if self.persistence is not None and not address.temporary:
            self.persistence.address_changed(
                address.name, address.routing_types, address.auto_created
            )

    def _journal_queue(self, queue: Queue) -> None:
        """Durable queues (not temporary ones) are journaled, with their messages."""
        if self.persistence is not None and queue.durable and not queue.config.temporary:
            queue.store = self.persistence
            self.persistence.queue_added(queue.config)

    def _unstored(self, refs: list[tuple[str, Ref]]) -> None:
        """The journal failed to store these: take back those not yet delivered (their
        producers are told `resource-limit-exceeded`; at-least-once for the rest)."""
        for name, ref in refs:
            queue = self.queues.get(name)
            if queue is None or not ref.waiting:
                continue
            queue.kill(ref, "journal-failed")

    def restore(
        self, queue_name: str, message: Message, delivery_count: int, scheduled_at_ms: int
    ) -> bool:
        """Put a message recovered from the journal back in its queue (False: no queue).

        Call with persistence suspended, before any client connects, then
        `reserve_message_ids` with the largest id the journal has seen.
        """
        queue = self.queues.get(queue_name)
        if queue is None:
            return False
        message.stored = True
        queue.restore(message, delivery_count, scheduled_at_ms)
        return True

    def reserve_message_ids(self, max_used: int) -> None:
        """New message ids start above `max_used`: recovery, before any message arrives,
        so that no stored id is given out again."""
        self._msg_ids.start_above(max_used)

    @property
    def message_ids(self) -> MessageIds:
        """The id source; the server makes its blocks durable (`MessageIds.reserve_with`)."""
        return self._msg_ids

    # -- addresses and queues ---------------------------------------------------------
    def settings_for(self, address: str) -> ResolvedSettings:
        return self.settings.resolve(address)

    def create_address(
        self,
        name: str,
        routing_types: set[RoutingType],
        *,
        auto_created: bool = False,
        temporary: bool = False,
        owner: ConnectionId | None = None,
    ) -> Address:
        """Create the address, or add routing types to an existing one."""
        existing = self.post_office.addresses.get(name)
        if existing is not None:
            if not routing_types <= existing.routing_types:
                existing.routing_types |= routing_types
                self._journal_address(existing)
            return existing
        address = Address(
            name=name,
            routing_types=set(routing_types),
            auto_created=auto_created,
            temporary=temporary,
            owner=owner,
            idle_since_ms=self.clock.now_ms(),
        )
        self.totals.address_created(address)
        self.post_office.add(address)
        self._journal_address(address)
        log.debug("created address %s %s", name, sorted(t.value for t in routing_types))
        return address

    def create_queue(self, config: QueueConfig, *, owner: ConnectionId | None = None) -> Queue:
        """Create a queue on its address (the address must allow its routing type, B-001)."""
        if config.name in self.queues:
            raise IllegalState(f"queue {config.name} already exists")
        address = self.post_office.addresses.get(config.address)
        if address is None:
            raise NotFound(f"address {config.address} does not exist")
        if config.routing_type not in address.routing_types:
            raise IllegalState(
                f"address {config.address} does not support {config.routing_type.value}"
            )
        selector = parse_selector(config.filter) if config.filter else None
        queue_address = config.address

        def on_size(delta_bytes: int) -> None:
            address.size_bytes += delta_bytes
            if delta_bytes < 0 and address.blocked:
                self._check_unblocked(address)

        queue = Queue(
            config,
            settings=lambda: self.settings.resolve(queue_address),
            selector=selector,
            rng=self.rng,
            delivery_ids=self._delivery_ids,
            dead_letter=self._dead_letter,
            on_schedule=self._add_deadline,
            emitter=self.emitter,
            clock_ms=self.clock.now_ms,
            on_size=on_size,
            on_expiring=self._track_expiry,
            expired=self._on_expired,
        )
        queue.idle_since_ms = self.clock.now_ms()
        queue.owner = owner
        self._journal_queue(queue)
        self.queues[config.name] = queue
        address.queues.append(queue)
        log.debug(
            "created queue %s on %s (%s)", config.name, config.address, config.routing_type.value
        )
        return queue

    def delete_queue(self, name: str, *, reason: str = "deleted") -> None:
        """Delete a queue with its messages; attached consumers are detached (B-038)."""
        queue = self.queues.pop(name, None)
        if queue is None:
            return
        address = self.post_office.addresses.get(queue.address)
        if address is not None and queue in address.queues:
            address.queues.remove(queue)
            address.used = True
            address.idle_since_ms = self.clock.now_ms()
        for consumer in list(queue.consumers):
            self._consumers.pop(consumer.id, None)
            self._effects.append(
                CloseConsumer(consumer.id, "amqp:resource-deleted", f"queue {name} was {reason}")
            )
        queue.consumers.clear()
        if queue.store is not None:
            queue.store.queue_deleted(name)  # covers its references: no ack each
            queue.store = None
        queue.remove_all()
        self.totals.queue_deleted(queue, self.post_office.addresses.__contains__)
        log.debug("deleted queue %s (%s)", name, reason)

    def _remove_address(self, name: str) -> None:
        address = self.post_office.remove(name)
        if address is not None:
            self.totals.address_deleted(address, self.post_office.addresses.__contains__)

    def delete_address(self, name: str) -> None:
        address = self.post_office.addresses.get(name)
        if address is None:
            return
        for queue in list(address.queues):
            self.delete_queue(queue.name)
        self._remove_address(name)
        if self.persistence is not None and not address.temporary:
            self.persistence.address_deleted(name)

    @contextlib.contextmanager
    def _acting_for(self, user: str | None, roles: frozenset[str] | None) -> Iterator[None]:
        previous = self._principal
        self._principal = None if roles is None else (user, roles)
        try:
            yield
        finally:
            self._principal = previous

    def _check(self, permission: str, address: str) -> None:
        """B-154: refuse with amqp:unauthorized-access when the client lacks it."""
        if self._principal is not None:
            user, roles = self._principal
            self.security.require(roles, permission, address, user=user)

    def _ensure_address(
        self, name: str, routing_type: RoutingType, settings: ResolvedSettings
    ) -> Address:
        """B-110: auto-create or update the address for `routing_type`, or NotFound."""
        address = self.post_office.addresses.get(name)
        if address is not None and routing_type in address.routing_types:
            return address
        if not settings.auto_create_addresses:
            raise NotFound(f"target address {name} does not exist")
        if address is None:
            self._check("create-address", name)
            self._warn_advisory(name)
        return self.create_address(name, {routing_type}, auto_created=address is None)

    def _auto_queue(
        self,
        name: str,
        address: str,
        routing_type: RoutingType,
        settings: ResolvedSettings,
        **overrides: Any,
    ) -> Queue:
        """An auto-created queue taking the `default-*` settings of its address (B-110)."""
        values: dict[str, Any] = {
            "name": name,
            "address": address,
            "routing_type": routing_type,
            "durable": True,
            "max_consumers": settings.default_max_consumers,
            "purge_on_no_consumers": settings.default_purge_on_no_consumers,
            "exclusive": settings.default_exclusive_queue,
            "last_value_key": settings.default_last_value_key
            or ("_AMQ_LVQ_NAME" if settings.default_last_value_queue else None),
            "non_destructive": settings.default_non_destructive,
            "ring_size": settings.default_ring_size,
            "auto_created": True,
        }
        values.update(overrides)
        self._check("create-durable-queue", address)
        return self.create_queue(QueueConfig(**values))

    def _warn_advisory(self, name: str) -> None:
        chars = advisory_characters(name)
        if chars and name not in self._warned_names:
            self._warned_names.add(name)
            log.warning(
                "name %r contains %s: accepted, but other protocols may not like it (B-150)",
                name,
                " ".join(repr(c) for c in chars),
            )

    # -- producers --------------------------------------------------------------------
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
        self._check("send", parsed.address)
        routing_type = caps_type or parsed.routing_type
        self._prepare_target(parsed.address, parsed.queue, routing_type)
        return ProducerTarget(parsed.address, routing_type, parsed.queue)

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

    def publish(
        self,
        message: Message,
        target: ProducerTarget,
        *,
        to: str | None = None,
        message_routing_type: RoutingType | None = None,
        duplicate_id: str | bytes | None = None,
    ) -> int:
        """Route a message; returns how many queues took it (0: unrouted, B-004).

        `to` is `properties.to`, used only on an anonymous relay (B-009/B-010);
        `message_routing_type` is the message's `x-opt-routing-type` (B-008 rule 2).

        Raises:
            NotFound: anonymous relay to an address that cannot be auto-created.
            ClientError: anonymous relay without `to`, or to a wildcard address.
        """
        now_ms = self.clock.now_ms()
        if message.durable and self.persistence is not None and self.persistence.failure:
            raise ResourceLimitExceeded(
                f"the broker cannot store durable messages: {self.persistence.failure}"
            )
        if not message.msg_id:
            message.msg_id = next(self._msg_ids)
        if not message.first_ts:
            message.first_ts = now_ms
        routing_type = target.routing_type or message_routing_type
        address_name = target.address
        fqqn_queue = target.queue
        if address_name is None:  # anonymous relay (B-009)
            if not to:
                raise ClientError("message has no 'to' address on an anonymous relay link")
            parsed = parse_address(to)
            if self.settings.wildcards.has_wildcard(parsed.address):
                raise ClientError(f"cannot send to wildcard address {parsed.address} (B-011)")
            address_name, fqqn_queue = parsed.address, parsed.queue
            routing_type = target.link_routing_type or message_routing_type or parsed.routing_type
            address = self.post_office.addresses.get(address_name)
            with self._acting_for(target.user, target.roles):
                self._check("send", address_name)  # per message on the relay (B-154)
                if address is None or (routing_type and routing_type not in address.routing_types):
                    try:
                        address = self._prepare_target(address_name, fqqn_queue, routing_type)
                    except NotFound as e:
                        raise NotFound(f"target address {address_name} does not exist") from e
        else:
            address = self.post_office.addresses.get(address_name)
            if address is None:  # deleted since attach: re-create as attach would
                address = self._prepare_target(address_name, fqqn_queue, routing_type)
        message.address = address_name
        if duplicate_id is not None and self._is_duplicate(address, duplicate_id):
            address.unrouted += 1
            if self.emitter.failures:
                self._message_event("unrouted", message, now_ms, reason="duplicate")
            return 0
        settings = self.settings.resolve(address_name)
        if message.ttl_ms or message.expiration_ms or settings.has_expiry_overrides:
            self._set_expiration(message, address_name, now_ms)
        if settings.max_size_bytes >= 0 and not self._has_room(address, message, now_ms):
            return 0
        if fqqn_queue is not None:
            queue = self.queues.get(fqqn_queue)
            queues = [queue] if queue is not None and queue.accepts_message(message) else []
        else:
            queues = self.post_office.route(message, address, routing_type)
        return self._deliver_to(message, address, queues, now_ms)

    def _is_duplicate(self, address: Address, duplicate_id: str | bytes) -> bool:
        """B-012: seen among the address's last `id-cache-size` ids? Remembers it if not."""
        cache = address.duplicate_ids
        if duplicate_id in cache:
            return True
        cache[duplicate_id] = None
        if len(cache) > self._id_cache_size:
            del cache[next(iter(cache))]  # dicts keep insertion order: drop the oldest
        return False

    def _set_expiration(self, message: Message, address: str, now_ms: int) -> None:
        """B-080 once, then the B-081 overrides of the routing address (also for copies,
        B-082); a changed expiration is written into the message (B-083)."""
        expiration = initial_expiration(
            ttl_ms=message.ttl_ms, absolute_expiry_ms=message.expiration_ms, now_ms=now_ms
        )
        message.expiration_ms = expiration
        overridden = apply_expiry_overrides(
            expiration, self.settings.resolve(address), now_ms=now_ms
        )
        if overridden != expiration:
            self.copier.set_expiration(message, overridden)
            message.expiration_ms = overridden
            message.ttl_ms = None

    def _has_room(self, address: Address, message: Message, now_ms: int) -> bool:
        """B-151: enforce max-size-bytes with FAIL (raise) and DROP (False); BLOCK lets
        this message in and marks the address so producers get no more credit."""
        settings = self.settings.resolve(address.name)
        limit = settings.max_size_bytes
        if limit < 0 or address.size_bytes < limit:
            return True
        policy = settings.address_full_policy
        if policy == "FAIL":
            raise ResourceLimitExceeded(f"address {address.name} is full: max-size-bytes={limit}")
        if policy == "DROP":
            address.unrouted += 1
            if self.emitter.failures:
                self._message_event("unrouted", message, now_ms, reason="dropped-full")
            return False
        if policy == "BLOCK" and not address.blocked:
            address.blocked = True
            log.info(
                "address %s is full (max-size-bytes=%d): blocking its producers",
                address.name,
                limit,
            )
        return True

    def _check_unblocked(self, address: Address) -> None:
        limit = self.settings.resolve(address.name).max_size_bytes
        if limit < 0 or address.size_bytes < limit:
            address.blocked = False
            self._effects.append(AddressUnblocked(address.name))

    def producer_may_send(self, target: ProducerTarget) -> bool:
        """Whether a producer link to `target` may be given more credit (B-151 BLOCK)."""
        if target.address is None:
            return True  # the anonymous relay is paced per message, not per address
        address = self.post_office.addresses.get(target.address)
        return address is None or not address.blocked

    def _message_event(
        self,
        kind: str,
        message: Message,
        now_ms: int,
        reason: str | None = None,
        extra: Extra | None = None,
        shape: Shape | None = None,
    ) -> None:
        """Record `sent`/`unrouted` (no queue yet) as a `lifecycle.RawEvent`; `shape`, when
        given, is the one `_sent_shape` keeps (the same as the one built here)."""
        emitter = self.emitter
        txn = emitter.txn
        ts = emitter.step_ms  # a step's events share its time (Emitter.step_ms)
        emitter.events.append(
            (
                shape
                or (kind, (message.address, None, None), (message.origin_container, None), reason),
                now_ms if ts is None else ts,
                message.event_part or emitter.message_part(message),
                None,
                extra
                if txn is None
                else (txn, None, None if extra is None else extra[2], None, None, None, None, None),
            )
        )

    @staticmethod
    def _sent_shape(address: Address, origin: str | None) -> Shape:
        """The `sent` shape of messages from producer container `origin` to `address`, built
        once: `sent` is one event a message at level `lifecycle` (B-171), and marshal then
        writes its shape once a frame, too."""
        shapes = address.event_sent
        if len(shapes) >= _SENT_SHAPES:
            shapes.clear()  # short-lived connections: start afresh
        shape: Shape = ("sent", (address.name, None, None), (origin, None), None)
        shapes[origin] = shape
        return shape

    def _deliver_to(
        self,
        message: Message,
        address: Address,
        queues: list[Queue],
        now_ms: int,
        *,
        reason: str = "route",
    ) -> int:
        emitter = self.emitter
        if emitter.all and reason == "route":
            origin = message.origin_container
            self._message_event(
                "sent",
                message,
                now_ms,
                extra=queues[0].event_routed
                if len(queues) == 1
                else (None, None, tuple([q.name for q in queues]), None, None, None, None, None),
                shape=address.event_sent.get(origin) or self._sent_shape(address, origin),
            )
        if not queues:
            address.unrouted += 1
            self.stats.unrouted += 1
            if emitter.failures:
                self._message_event("unrouted", message, now_ms, reason="no-bindings")
            settings = self.settings.resolve(address.name)
            if settings.send_to_dla_on_no_route and settings.dead_letter_address:
                move = MoveAnnotations(
                    orig_address=address.name,
                    orig_queue=None,
                    orig_message_id=message.msg_id,
                    dlq_reason="no-route",
                )
                self._move_to_dla(message, address.name, settings, move)
            return 0
        address.routed += 1
        self.stats.routed += 1
        out = self._effects
        waiting = False
        for queue in queues:
            if queue.add(message, out, reason=reason).state != DELIVERING:
                waiting = True
        if waiting:
            # A message that waits in a queue keeps no copy of its head for its events
            # (~0.4 KB a message in a deep queue): its next event builds it again.
            message.event_part = None
        return len(queues)

    # -- consumers --------------------------------------------------------------------
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
        self._consumers[consumer.id] = _ConsumerInfo(consumer, request, kind)
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
        self._consumers[consumer.id] = _ConsumerInfo(
            consumer, replace(request, expiry_policy="never", durable=True), "durable"
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
            ),
            owner=request.connection if temporary else None,
        )
        return queue, kind

    def detach_consumer(
        self, consumer_id: ConsumerId, *, closed: bool, abrupt: bool = False
    ) -> None:
        """A consumer link ended: return its deliveries (B-053/B-054), then B-028/B-030."""
        info = self._consumers.pop(consumer_id, None)
        if info is None:
            return
        consumer, queue = info.consumer, info.consumer.queue
        now_ms = self.clock.now_ms()
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

    def set_credit(self, consumer_id: ConsumerId, credit: int, *, drain: bool = False) -> None:
        """The link credit the consumer now has (B-037)."""
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.set_credit(info.consumer, credit, drain, self._effects)

    def resume(self, consumer_id: ConsumerId) -> None:
        """The consumer's connection wrote what it was handed and its window has room
        again: dispatch to it, with the credit and drain it kept (issue 15)."""
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.dispatch(self._effects)

    def settle(self, consumer_id: ConsumerId, delivery: DeliveryId, outcome: Outcome) -> None:
        """Apply a consumer's outcome; ignore deliveries no longer held (B-055)."""
        info = self._consumers.get(consumer_id)
        if info is None:
            log.debug("outcome for delivery %s of a closed consumer ignored (B-055)", delivery)
            return
        queue = info.consumer.queue
        held = queue.settle(info.consumer, delivery, outcome, self.clock.now_ms(), self._effects)
        if not held:
            log.debug(
                "outcome for delivery %s not held by consumer %s ignored (B-055)",
                delivery,
                consumer_id,
            )

    def rollback_delivery(self, consumer_id: ConsumerId, delivery: DeliveryId) -> None:
        """B-143: a rolled-back transactional accept of a settled delivery, or a forced
        rollback: back to the queue with the attempt counted, as modified{delivery-failed},
        with the redelivery delay and the max-delivery-attempts check."""
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.settle(
                info.consumer,
                delivery,
                _ROLLBACK,
                self.clock.now_ms(),
                self._effects,
                reason="tx-rollback",
            )

    def hold(self, consumer_id: ConsumerId, delivery: DeliveryId) -> None:
        """B-142: see `Queue.hold`."""
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.hold(info.consumer, delivery)

    def connection_closed(self, connection: ConnectionId, *, abrupt: bool) -> None:
        """Return every consumer's deliveries, then drop the connection's temporaries."""
        for consumer_id in [
            c for c, i in self._consumers.items() if i.consumer.connection == connection
        ]:
            self.detach_consumer(consumer_id, closed=False, abrupt=abrupt)
        for queue in [
            q for q in self.queues.values() if q.config.temporary and q.owner == connection
        ]:
            self.delete_queue(queue.name, reason="deleted with its connection")
        for name in [
            a.name
            for a in self.post_office.addresses.values()
            if a.temporary and a.owner == connection
        ]:
            self.delete_address(name)

    # -- dead letters (B-070…B-076) ---------------------------------------------------
    def _dead_letter(self, queue: Queue, ref: Ref, reason: str, rejection: Rejected | None) -> None:
        """B-070…B-076: copy the message to the queue's DLA, or drop it (B-071/B-072)."""
        settings = self.settings.resolve(queue.address)
        message = ref.message
        dla = settings.dead_letter_address
        if not dla:
            self.stats.killed_no_dla += 1
            queue.killed(ref, "no-dla")
            log.warning(
                "dropping message %s from queue %s: %s and no dead-letter-address is set",
                message.msg_id,
                queue.name,
                "rejected"
                if reason == "rejected"
                else f"max-delivery-attempts={settings.max_delivery_attempts} reached",
            )
            return
        queue.counters.dead_lettered += 1
        queue.counters.count(queue.counters.dead_lettered_by_reason, reason)
        move = self.hop(
            queue,
            message,
            dlq_reason=reason,
            dlq_error_condition=rejection.condition if rejection else None,
            dlq_error_description=rejection.description[:512]
            if rejection and rejection.description
            else None,
            dlq_delivery_count=ref.delivery_count,
        )
        if settings.auto_create_dead_letter_resources and queue.address != dla:
            self._ensure_move_resources(
                dla,
                queue.address,
                settings.dead_letter_queue_prefix,
                settings.dead_letter_queue_suffix,
            )
        copy = self._move_to_dla(message, queue.address, settings, move, queue=queue, ref=ref)
        if copy is None:
            queue.killed(ref, "dla-no-bindings")

    def copy_for_move(self, message: Message, queue: Queue, move: MoveAnnotations) -> Message:
        """A copy with a new id carrying `move` (B-076/B-090), not yet routed."""
        copy = self.copier.copy(message, move)
        copy.msg_id = next(self._msg_ids)
        copy.first_ts = message.first_ts
        return copy

    def deliver_copy(
        self, copy: Message, address: str, queues: list[Queue], *, reason: str
    ) -> None:
        """Route a prepared copy to `queues` of `address` (overrides apply, B-082)."""
        copy.address = address
        now_ms = self.clock.now_ms()
        self._set_expiration(copy, address, now_ms)
        target = self.post_office.addresses.get(address)
        if target is not None:
            self._deliver_to(copy, target, queues, now_ms, reason=reason)

    def hop(self, queue: Queue, message: Message, **extra: Any) -> MoveAnnotations:
        """The B-090 annotations of a move out of `queue`: where it came from, and the
        original routing type carried forward when it was moved before."""
        internal = message.get_annotations().get("x-opt-ORIG-ROUTING-TYPE")
        return MoveAnnotations(
            orig_address=queue.address,
            orig_queue=queue.name,
            orig_message_id=message.msg_id,
            orig_routing_type=self._orig_routing_type(message),
            routing_type=internal if isinstance(internal, int) else None,
            **extra,
        )

    @staticmethod
    def _orig_routing_type(message: Message) -> int | None:
        """B-090: only when the original carried a routing-type annotation."""
        routing_type = annotated_routing_type(message.get_annotations())
        return None if routing_type is None else BYTE_OF_ROUTING_TYPE[routing_type]

    def _ensure_move_resources(self, target: str, origin: str, prefix: str, suffix: str) -> None:
        with self._acting_for(None, None):  # broker-internal: not the client's permission
            self._create_move_resources(target, origin, prefix, suffix)

    def _create_move_resources(self, target: str, origin: str, prefix: str, suffix: str) -> None:
        """B-074/B-086: the target address and a `<prefix><origin><suffix>` queue."""
        target_settings = self.settings.resolve(target)
        routing_type = target_settings.default_queue_routing_type
        self.create_address(target, {routing_type}, auto_created=True)
        name = f"{prefix}{origin}{suffix}"
        if name not in self.queues:
            quoted = origin.replace("'", "''")
            self._auto_queue(
                name,
                target,
                routing_type,
                target_settings,
                filter=f"_AMQ_ORIG_ADDRESS = '{quoted}'",
            )

    def _move_to_dla(
        self,
        message: Message,
        origin: str,
        settings: ResolvedSettings,
        move: MoveAnnotations,
        *,
        queue: Queue | None = None,
        ref: Ref | None = None,
    ) -> Message | None:
        """Route a copy to the DLA (B-073); None when it has no queue (dropped, B-072)."""
        dla = settings.dead_letter_address
        address = self.post_office.addresses.get(dla)
        copy = self.copier.copy(message, move)
        copy.msg_id = next(self._msg_ids)
        copy.first_ts = message.first_ts
        copy.address = dla
        self._set_expiration(copy, dla, self.clock.now_ms())
        routing_type = ROUTING_TYPE_OF_BYTE.get(move.routing_type)
        queues = self.post_office.route(copy, address, routing_type) if address else []
        if not queues:
            self.stats.killed_no_dla += 1
            log.warning(
                "dropping message %s from %s: dead-letter-address %s has no queue (B-072)",
                message.msg_id,
                origin,
                dla,
            )
            return None
        assert address is not None
        if queue is not None and ref is not None and self.emitter.failures:
            queue.event(
                "dead-lettered",
                ref,
                reason=move.dlq_reason,
                target_address=dla,
                target_queues=tuple(q.name for q in queues),
                copy_msg_id=copy.msg_id,
                error_condition=move.dlq_error_condition,
                error_description=move.dlq_error_description,
            )
        self._deliver_to(copy, address, queues, self.clock.now_ms(), reason="move")
        return copy

    # -- expiry (B-084…B-087) ----------------------------------------------------------
    def _track_expiry(self, queue: Queue, ref: Ref) -> None:
        heapq.heappush(
            self._expiries, (ref.message.expiration_ms, next(self._expiry_seq), queue, ref)
        )

    def expire_due(self, now_ms: int) -> int:
        """The periodic scan (B-084): expire every waiting reference whose time is up.

        Pops only due entries of the expiry index: O(expired x log n), not O(messages).
        References being delivered are skipped; they are indexed again if they return.
        """
        expired = 0
        index = self._expiries
        while index and index[0][0] <= now_ms:
            _, _, queue, ref = heapq.heappop(index)
            if queue.name in self.queues and queue.expire(ref):
                expired += 1
        if expired:
            for queue in list(self.queues.values()):
                if queue.consumers:
                    queue.dispatch(self._effects)
        return expired

    def _on_expired(self, queue: Queue, ref: Ref) -> None:
        """B-085: move a copy to the expiry address (with x-opt-ACTUAL-EXPIRY), or drop."""
        message = ref.message
        now_ms = self.clock.now_ms()
        settings = self.settings.resolve(message.address or queue.address)
        target = settings.expiry_address
        if target and settings.auto_create_expiry_resources and message.address != target:
            self._ensure_move_resources(
                target,
                message.address or queue.address,
                settings.expiry_queue_prefix,
                settings.expiry_queue_suffix,
            )
        address = self.post_office.addresses.get(target) if target else None
        if address is not None:
            move = self.hop(queue, message, actual_expiry=now_ms)
            copy = self.copy_for_move(message, queue, move)
            copy.address = target
            self._set_expiration(copy, target, now_ms)
            routing_type = ROUTING_TYPE_OF_BYTE.get(move.routing_type)
            queues = self.post_office.route(copy, address, routing_type)
            if queues:
                if self.emitter.failures:
                    queue.event(
                        "expired",
                        ref,
                        reason="moved",
                        target_address=target,
                        target_queues=tuple(q.name for q in queues),
                        copy_msg_id=copy.msg_id,
                    )
                self._deliver_to(copy, address, queues, now_ms, reason="move")
                return
        if self.emitter.failures:
            queue.event("expired", ref, reason="dropped")
        if queue.name not in self._expiry_drop_warned:
            self._expiry_drop_warned.add(queue.name)
            log.warning(
                "dropping expired messages from queue %s: %s (warned once per queue)",
                queue.name,
                f"expiry-address {target} has no queue" if target else "no expiry-address is set",
            )

    # -- auto-delete (B-111…B-114) ----------------------------------------------------
    def reap(self, now_ms: int) -> None:
        """One reaper pass: delete what qualified on this and the previous pass."""
        for queue in list(self.queues.values()):
            if self._queue_reapable(queue, now_ms):
                if queue.swept:
                    log.info("auto-deleting queue %s", queue.name)
                    self.delete_queue(queue.name, reason="auto-deleted")
                else:
                    queue.swept = True
            else:
                queue.swept = False
        for address in list(self.post_office.addresses.values()):
            if self._address_reapable(address, now_ms):
                if address.swept:
                    log.info("auto-deleting address %s", address.name)
                    self._remove_address(address.name)
                else:
                    address.swept = True
            else:
                address.swept = False

    def _queue_reapable(self, queue: Queue, now_ms: int) -> bool:
        config = queue.config
        if not config.auto_created or config.configured or config.temporary:
            return False
        settings = self.settings.resolve(queue.address)
        if not settings.auto_delete_queues or queue.consumers:
            return False
        limit = settings.auto_delete_queues_message_count
        if limit >= 0 and queue.message_count > limit:
            return False
        if not (queue.used or settings.auto_delete_queues_skip_usage_check):
            return False
        return now_ms - queue.idle_since_ms >= settings.auto_delete_queues_delay

    def _address_reapable(self, address: Address, now_ms: int) -> bool:
        if not address.auto_created or address.temporary or address.queues:
            return False
        settings = self.settings.resolve(address.name)
        if not settings.auto_delete_addresses:
            return False
        if not (address.used or settings.auto_delete_addresses_skip_usage_check):
            return False
        return now_ms - address.idle_since_ms >= settings.auto_delete_addresses_delay

    # -- helpers ------------------------------------------------------------------------
    def _random_name(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))


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
