"""The broker's state machine: the only API the protocol adapter calls.

Requests come in as method calls; effects go out as data (`take_effects()`), in the order
they must happen. Never blocks, sleeps, reads the time except through the injected clock
(once per call), or touches a socket. Loop thread only.

`Broker` is the facade: it keeps the state, addresses and queues, publishing (routing,
duplicate ids, admission and address-full) and consumers' credit and settling; its other
parts are mixins, each in its own module with its theory of operation: attaching links
(`_Attach`, `core/attach.py`), dead letters, expiry and moved copies (`_Moving`,
`core/moving.py`), the auto-delete pass (`_Reaper`, `core/reaper.py`), retroactive
addresses (`_Retroactive`, `core/retroactive.py`), slow consumers (`_SlowConsumers`,
`core/slowconsumer.py`). Management
operations are `core/operations.py`; the moved copy's annotations `core/moves.py`.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import uuid
from collections.abc import Callable, Iterator
from random import Random
from typing import Any, Final, NoReturn, final

from mypy_extensions import mypyc_attr

from amqpbroker.core.attach import _Attach, _ConsumerInfo
from amqpbroker.core.clock import Clock, Moment, entry
from amqpbroker.core.diskguard import DiskGuard
from amqpbroker.core.effects import AddressUnblocked, CloseConsumer, Effect
from amqpbroker.core.errors import (
    ClientError,
    IllegalState,
    NotFound,
    ResourceLimitExceeded,
)
from amqpbroker.core.expiry import apply_expiry_overrides, initial_expiration
from amqpbroker.core.ids import MessageIds
from amqpbroker.core.lifecycle import Emitter, EventLevel, Extra, Shape
from amqpbroker.core.management import MANAGEMENT_ADDRESS, ManagementHandler
from amqpbroker.core.model import (
    LATEST_DELIVERY_MS,
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Message,
    ProducerTarget,
    QueueConfig,
    RoutingType,
)
from amqpbroker.core.moves import MessageCopier, MoveAnnotations, _BytesCopier
from amqpbroker.core.moving import _Moving
from amqpbroker.core.names import advisory_characters, parse_address
from amqpbroker.core.outcomes import FAILED, Outcome
from amqpbroker.core.paging import PageStore, PageStores, Tailed, full_reason
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.postoffice import Address, PostOffice
from amqpbroker.core.queue import Consumer, DeliveryIds, Memory, Queue
from amqpbroker.core.queuekinds import kind_of, last_value_key
from amqpbroker.core.reaper import _Reaper
from amqpbroker.core.refs import DELIVERING, Ref
from amqpbroker.core.retroactive import _Retroactive
from amqpbroker.core.security import SecurityRepository
from amqpbroker.core.selector import parse_selector
from amqpbroker.core.settings import ResolvedSettings, SettingsRepository
from amqpbroker.core.slowconsumer import _SlowConsumers
from amqpbroker.core.totals import BrokerStats, CounterTotals

log = logging.getLogger(__name__)

_SENT_SHAPES = 1000  # `sent` shapes kept per address (one per producer container)


@final
class Hot:
    """What the per-message paths read of the broker, in one native object (issue 20).

    `Broker` is not a native class (setup.py): each attribute read of it is a dictionary
    lookup through `PyObject_GetAttr` (~250 instructions compiled, ~6.5k a queue message
    in all). These module functions (`publish_message`, `deliver_to`, `settle_delivery`,
    ...) read the same objects here, a field each when compiled. `Broker.__init__` makes
    it; the objects are the broker's own, never replaced, except `effects` (swapped by
    `Broker.take_effects`, which keeps both in step) and `persistence` and `page_stores`
    (set by `enable_persistence` and `enable_paging`, which set them here too).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker: Final = broker  # the rest of `Broker`, for the rarer branches
        self.moment: Final = broker.moment
        self.emitter: Final = broker.emitter
        self.post_office: Final = broker.post_office
        self.addresses: Final = broker.post_office.addresses
        self.settings: Final = broker.settings
        self.stats: Final = broker.stats
        self.msg_ids: Final = broker._msg_ids
        self.consumer_of: Final = broker._consumer_of  # a consumer by id, for settle and credit
        self.queues: Final = broker.queues
        self.copier: Final = broker.copier
        self.retroactive: Final = broker._retroactive
        self.global_max_size: Final = broker.global_max_size
        self.effects: list[Effect] = broker._effects
        self.persistence: Persistence | None = broker.persistence
        self.page_stores: PageStores | None = broker.page_stores


@mypyc_attr(native_class=False)  # its methods compiled, its mixins pure Python (setup.py)
class Broker(_SlowConsumers, _Attach, _Moving, _Reaper, _Retroactive):
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
        global_max_size: int = -1,
    ) -> None:
        self.name = name
        # B-151: the bytes all queues may hold in memory (-1: no broker-wide limit), what
        # they hold, and whether a BLOCK address hit it (producers and relays wait).
        self.global_max_size = global_max_size
        self.page_stores: PageStores | None = None  # PAGE writes to disk once set
        self.persistence = persistence  # None: memory only
        self.emitter = Emitter(event_level)
        self.security = security or SecurityRepository({})
        self._id_cache_size = id_cache_size  # B-012: ids remembered per address
        # Who the current client request acts for (set only around attach/publish).
        self._principal: tuple[str | None, frozenset[str]] | None = None
        self.settings = settings
        # The time of the call being handled: one clock reading per call (`clock.entry`);
        # a native object the queues share (`now_ms`, `in_call` and `clock` read it).
        self.moment = Moment(clock)
        self._in_commit = False  # B-141: `committing`
        self.rng = rng or Random()
        self.copier: MessageCopier = copier or _BytesCopier()
        self.post_office = PostOffice(settings.wildcards)
        # B-151: what the queues hold, counted by them per message (`memory_bytes`).
        self.memory = Memory(self.post_office.addresses)
        self.queues: dict[str, Queue] = {}
        self.stats = BrokerStats()
        self.totals = CounterTotals()  # counters across queue incarnations (issue 16 item 4)
        self._effects: list[Effect] = []
        self._msg_ids = MessageIds()  # unique across restarts once reserve_with() is set
        self._consumer_ids = itertools.count(1)
        self._delivery_ids = DeliveryIds()
        self._consumers: dict[ConsumerId, _ConsumerInfo] = {}
        self._consumer_of: dict[ConsumerId, Consumer] = {}  # the same consumers (`_register`)
        self._scan_period_ms = address_queue_scan_period_ms
        self._next_scan_ms = self.now_ms + address_queue_scan_period_ms
        self._warned_names: set[str] = set()
        self._deadlines: list[int] = []  # may hold stale entries; tick() drops them
        # Expiry index (B-084): (expiration, n, queue, ref) for references that can expire,
        # so a scan pops only what is due instead of walking every message.
        self._expiries: list[tuple[int, int, Queue, Ref]] = []
        self._expiry_seq = itertools.count()
        self._expiry_scan_period_ms = message_expiry_scan_period_ms
        self._next_expiry_scan_ms = self.now_ms + max(message_expiry_scan_period_ms, 0)
        self._expiry_drop_warned: set[str] = set()
        # B-160: answers requests to the management address (server.py sets it).
        self.management: ManagementHandler | None = None
        # Artemis max-disk-usage (core/diskguard.py): checked from `tick` (server.py sets it).
        self.disk_guard: DiskGuard | None = None
        self._retroactive: dict[str, dict[RoutingType, str]] = {}  # B-124, core/retroactive.py
        # Work done a step per loop turn from `tick` until it says it is done (True): the
        # AMQP management address's walks over a queue (issue 23, B-151 with B-160).
        self._background: list[Callable[[], bool]] = []
        self._slow_due: list[tuple[int, str]] = []  # core/slowconsumer.py
        self._slow_watched: set[str] = set()
        self.hot = Hot(self)  # last: it reads the attributes above

    # -- effects and time -----------------------------------------------------------
    @property
    def now_ms(self) -> int:
        """The time of the call being handled (epoch ms; `moment.ms`). The per-message
        paths read `moment` itself: a property read is a call more."""
        return self.moment.ms

    @property
    def in_call(self) -> bool:
        """Inside a call into the broker: entry points it reaches read no clock."""
        return self.moment.in_call

    @property
    def clock(self) -> Clock:
        """The injected clock (`moment.clock`; a test replaces it there)."""
        return self.moment.clock

    def take_effects(self) -> list[Effect]:
        """Effects since the last call, in the order they must be applied."""
        effects = self._effects
        self._effects = self.hot.effects = []
        return effects

    # -- what its queues need from it (`queue.QueueOwner`; also `dead_letter`,
    # `track_expiry` and `expired`, in core/moving.py) ---------------------------------
    def queue_settings(self, queue: Queue) -> ResolvedSettings:
        return self.settings.resolve(queue.address)

    def schedule(self, at_ms: int) -> None:
        heapq.heappush(self._deadlines, at_ms)

    @property
    def memory_bytes(self) -> int:
        """B-151: the bytes all queues hold in memory (`memory.used`)."""
        return self.memory.used

    @property
    def global_blocked(self) -> bool:
        """B-151: global-max-size reached under BLOCK: producers and relays wait."""
        return self.memory.global_blocked

    def freed(self, queue: Queue) -> None:
        """B-151: `queue` freed bytes while its address or the broker was blocked."""
        address = self.post_office.addresses.get(queue.address)
        if address is not None and address.blocked:
            self._check_unblocked(address)
        if self.memory.global_blocked:
            self._check_global_unblocked()

    def next_deadline_ms(self) -> int | None:
        """When `tick()` next has work: a redelivery, the reaper, the expiry scan, a
        slow-consumer check or the disk-usage check. O(1)."""
        candidates = []
        if self.disk_guard is not None:
            candidates.append(self.disk_guard.next_check_ms)
        if self._slow_due:
            candidates.append(self._slow_due[0][0])
        if self._scan_period_ms > 0:
            candidates.append(self._next_scan_ms)
        if self._deadlines:
            candidates.append(self._deadlines[0])
        if self._expiries and self._expiry_scan_period_ms > 0:
            candidates.append(max(self._next_expiry_scan_ms, self._expiries[0][0]))
        return min(candidates) if candidates else None

    @entry
    def tick(self) -> None:
        """Fire due redeliveries and, every address-queue-scan-period, the reaper; the
        expiry scan, the slow-consumer checks and the disk-usage check when due."""
        now_ms = self.now_ms
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
        if self._slow_due and self._slow_due[0][0] <= now_ms:
            self.check_slow_consumers(now_ms)
        if self.disk_guard is not None and now_ms >= self.disk_guard.next_check_ms:
            self.disk_guard.check(now_ms)
        if self._background:
            steps, self._background = self._background, []
            for step in steps:
                if not step():
                    self._background.append(step)
            if self._background:
                self.schedule(now_ms)  # the next step on the next loop turn

    def run_in_background(self, step: Callable[[], bool]) -> None:
        """Call `step` from `tick`, once a loop turn, until it answers True (it is done).
        Dropped when the broker stops."""
        self._background.append(step)
        self.schedule(self.now_ms)

    def next_message_id(self) -> int:
        return next(self._msg_ids)

    def enable_persistence(self, persistence: Persistence) -> None:
        """Journal from now on: first what exists (configured addresses and queues)."""
        self.persistence = self.hot.persistence = persistence
        persistence.on_lost = self._unstored
        for address in self.post_office.addresses.values():
            self._journal_address(address)
        for queue in self.queues.values():
            self._journal_queue(queue)

    def enable_paging(self, stores: PageStores, *, paged: tuple[str, ...] = ()) -> None:
        """B-151 PAGE to disk from now on; `paged`: queues whose page files a restart
        found (recovered after the journal, which holds their cursors)."""
        self.page_stores = self.hot.page_stores = stores
        for name in paged:
            queue = self.queues.get(name)
            if queue is None:
                continue
            if queue.pages is None:
                self._open_pages(queue)
            elif isinstance(queue.pages, Tailed):  # recovery left a part in the journal
                queue.pages.open_tail()
                queue.attach_pages(queue.pages)  # (its expiry, the files' lost counted)
            pages = queue.pages
            kind = queue.kind
            # made non-destructive in the file across a restart (docs/decisions.md)
            if kind is not None and kind.non_destructive and pages is not None and pages.messages:
                log.warning(
                    "queue %s is non-destructive and has %d paged messages: they are"
                    " read back only as far as max-read-page-bytes allows, and"
                    " non-destructive messages never leave memory, so its consumers"
                    " may never get them; move or purge them with the management API"
                    " (docs/decisions.md)",
                    name,
                    pages.messages,
                )

    def _open_pages(self, queue: Queue) -> None:
        queue.attach_pages(self.page_store(queue))

    def page_store(self, queue: Queue) -> PageStore:
        """Open `queue`'s page files (paging is enabled)."""
        assert self.page_stores is not None
        return self.page_stores.open(
            address=queue.address, queue=queue.name, durable=queue.store is not None
        )

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

    @entry  # a call into the broker: the journal's answer, posted to the loop
    def _unstored(self, refs: list[tuple[str, Ref]]) -> None:
        """The journal failed to store these: take back those not yet delivered (their
        producers are told `resource-limit-exceeded`; at-least-once for the rest). A call
        into the broker of its own: the journal's completion callback runs after the call
        that wrote the records has returned."""
        for name, ref in refs:
            queue = self.queues.get(name)
            if queue is None or not ref.waiting:
                continue
            queue.kill(ref, "journal-failed")

    @entry
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

    @entry
    def restore_many(self, queue_name: str, restored: list[tuple[Message, int, int]]) -> bool:
        """`restore` of each (message, delivery_count, scheduled_at_ms) into one queue,
        in order (recovery of millions: one call, the size accounted once)."""
        queue = self.queues.get(queue_name)
        if queue is None:
            return False
        for message, _, _ in restored:
            message.stored = True
        queue.restore_many(restored)
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

    @entry
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
        if auto_created and name == MANAGEMENT_ADDRESS:
            raise NotFound(f"{name} is the management address: it is never auto-created")
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
            idle_since_ms=self.now_ms,
        )
        self.totals.address_created(address)
        self.post_office.add(address)
        self._journal_address(address)
        self._make_retroactive(address)
        log.debug("created address %s %s", name, sorted(t.value for t in routing_types))
        return address

    @entry
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
        queue = Queue(
            config,
            owner=self,
            selector=selector,
            rng=self.rng,
            delivery_ids=self._delivery_ids,
            emitter=self.emitter,
            settings_source=self.settings,
        )
        kind = kind_of(queue, config)
        if kind is not None:
            queue.set_kind(kind)  # B-120, B-121, B-123
        queue.idle_since_ms = self.now_ms
        queue.owner = owner
        queue.first_marker = self.copier.with_property  # group-first-key (B-127)
        self._journal_queue(queue)
        self.queues[config.name] = queue
        address.queues.append(queue)
        if self._retroactive:
            self._copy_retained(queue)  # B-124
        log.debug(
            "created queue %s on %s (%s)", config.name, config.address, config.routing_type.value
        )
        return queue

    @entry
    def delete_queue(self, name: str, *, reason: str = "deleted") -> None:
        """Delete a queue with its messages; attached consumers are detached (B-038)."""
        queue = self.queues.pop(name, None)
        if queue is None:
            return
        address = self.post_office.addresses.get(queue.address)
        if address is not None and queue in address.queues:
            address.queues.remove(queue)
            address.used = True
            address.idle_since_ms = self.now_ms
        for consumer in list(queue.consumers):
            self._forget(consumer.id)
            self._effects.append(
                CloseConsumer(consumer.id, "amqp:resource-deleted", f"queue {name} was {reason}")
            )
        queue.consumers.clear()
        if queue.pages is not None:
            queue.pages.destroy()
            queue.pages = None
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

    @entry
    def delete_address(self, name: str) -> None:
        address = self.post_office.addresses.get(name)
        if address is None:
            return
        for queue in list(address.queues):
            self.delete_queue(queue.name)
        self._remove_address(name)
        if self._retroactive:
            self._drop_retroactive(name)  # B-124
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
            **settings.queue_defaults(),
            "last_value_key": last_value_key(
                settings.default_last_value_key, settings.default_last_value_queue
            ),
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

    # -- producers (attaching them: `_Attach`, core/attach.py) ------------------------
    def publish(
        self,
        message: Message,
        target: ProducerTarget,
        *,
        to: str | None = None,
        message_routing_type: RoutingType | None = None,
        duplicate_id: str | bytes | None = None,
        delivery_delay_ms: int = 0,
    ) -> int:
        """Route a message; returns how many queues took it (0: unrouted, B-004).

        `to` is `properties.to`, used only on an anonymous relay (B-009/B-010);
        `message_routing_type` is the message's `x-opt-routing-type` (B-008 rule 2);
        `delivery_delay_ms` its `x-opt-delivery-delay`, counted from this call's time
        (B-015; `deliver_at_ms` already holds an `x-opt-delivery-time`, which wins).

        Raises:
            NotFound: anonymous relay to an address that cannot be auto-created.
            ClientError: anonymous relay without `to`, or to a wildcard address.
        """
        return publish_message(
            self.hot, message, target, to, message_routing_type, duplicate_id, delivery_delay_ms
        )

    def _relay_target(
        self, target: ProducerTarget, to: str | None, message_routing_type: RoutingType | None
    ) -> tuple[Address, str | None, RoutingType | None] | None:
        """B-009/B-011/B-154: where a message on the anonymous relay goes: its address
        (auto-created if allowed), FQQN queue and routing type; None for the management
        address.

        Raises:
            NotFound: the address does not exist and cannot be auto-created.
            ClientError: no `to`, a wildcard `to`, or no `send` permission.
        """
        if not to:
            raise ClientError("message has no 'to' address on an anonymous relay link")
        parsed = parse_address(to)
        if self.settings.wildcards.has_wildcard(parsed.address):
            raise ClientError(f"cannot send to wildcard address {parsed.address} (B-011)")
        name, fqqn_queue = parsed.address, parsed.queue
        if name == MANAGEMENT_ADDRESS:
            return None
        routing_type = target.link_routing_type or message_routing_type or parsed.routing_type
        address = self.post_office.addresses.get(name)
        with self._acting_for(target.user, target.roles):
            self._check("send", name)  # per message on the relay (B-154)
            # An FQQN is prepared whenever it is named (third attack pass): that checks
            # the queue is on `name`. `alice.x::bob.q` on an existing `alice.x` put the
            # message on `bob.q` with `send` on `alice.x` alone.
            if (
                address is None
                or fqqn_queue is not None
                or (routing_type and routing_type not in address.routing_types)
            ):
                try:
                    address = self._prepare_target(name, fqqn_queue, routing_type)
                except NotFound as e:
                    if fqqn_queue is not None:
                        raise  # which queue of which address, as on a link (B-006)
                    raise NotFound(f"target address {name} does not exist") from e
        return address, fqqn_queue, routing_type

    def check_publish(
        self,
        target: ProducerTarget,
        *,
        durable: bool,
        to: str | None = None,
        message_routing_type: RoutingType | None = None,
    ) -> None:
        """B-141: raise what `publish` would raise for this message now, routing nothing.

        A transaction's sends are checked when they arrive and again, all of them, before
        its commit routes any (`committing`), so that a commit routes all or none. Like
        routing it may auto-create the address (Artemis routes a transactional send when
        it arrives, creating its address then).
        """
        if durable and self.persistence is not None and self.persistence.refusing:
            refuse_durable(self.persistence.refusing)
        if target.address is None:
            relayed = self._relay_target(target, to, message_routing_type)
            if relayed is None:
                with self._acting_for(target.user, target.roles):
                    self._check("manage", MANAGEMENT_ADDRESS)
                return
            address = relayed[0]
        elif target.management:
            return
        else:
            found = self.post_office.addresses.get(target.address)
            address = found or self._prepare_target(
                target.address, target.queue, target.routing_type or message_routing_type
            )
        settings = self.settings.resolve(address.name)
        refusal = self._refusal(address, settings, self._full_reason(address, settings))
        if refusal is not None:
            raise ResourceLimitExceeded(refusal)

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """B-141: route a commit's sends, all checked by `check_publish` in this same
        step, without refusing one for a limit: the commit is one unit, let in when its
        addresses had room before it, as a single message that crosses the limit is."""
        self._in_commit = True
        try:
            yield
        finally:
            self._in_commit = False

    def _refusal(
        self, address: Address, settings: ResolvedSettings, full: str | None
    ) -> str | None:
        """B-151: why a message for `address` is refused now (FAIL when `full`, the
        `_full_reason`; BLOCK past max-size-bytes-reject-threshold; PAGE when `full` while
        the disk is over max-disk-usage, core/diskguard.py: its page files would take the
        room kept for acks), or None."""
        policy = settings.address_full_policy
        threshold = settings.max_size_bytes_reject_threshold
        if policy == "BLOCK" and 0 <= threshold < address.size_bytes:
            return f"address {address.name} is over max-size-bytes-reject-threshold={threshold}"
        if policy == "FAIL" and full is not None:
            return f"address {address.name} is full: {full}"
        if policy == "PAGE" and full is not None and self.page_stores is not None:
            persistence = self.persistence
            if persistence is not None and persistence.disk_full is not None:
                return f"address {address.name} is full and cannot page: {persistence.disk_full}"
        return None

    def _management_request(self, message: Message, target: ProducerTarget) -> int:
        """B-160: a request to the management address is answered, never routed; the
        sender needs `manage` (B-154), checked per message as `send` is on the relay."""
        with self._acting_for(target.user, target.roles):
            self._check("manage", MANAGEMENT_ADDRESS)
        if self.management is None:
            raise NotFound(f"{MANAGEMENT_ADDRESS} is not served by this broker")
        message.address = MANAGEMENT_ADDRESS
        self.management.handle(message, target)
        return 1

    def is_duplicate(self, address: Address, duplicate_id: str | bytes) -> bool:
        """B-012 for a management move with rejectDuplicates (B-161)."""
        return self._is_duplicate(address, duplicate_id)

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

    def _full_reason(self, address: Address, settings: ResolvedSettings) -> str | None:
        """B-151: which limit makes `address` full now (`paging.full_reason`), or None."""
        return full_reason(
            settings,
            address_bytes=address.size_bytes,
            address_messages=sum(q.memory_count for q in address.queues)
            if settings.max_size_messages >= 0
            else None,
            memory_bytes=self.memory_bytes,
            global_max_size=self.global_max_size,
        )

    def _has_room(self, address: Address, message: Message, now_ms: int) -> bool:
        """B-151: enforce the limits with FAIL (raise) and DROP (False); BLOCK lets this
        message in and marks the address (or the broker, for global-max-size) so producers
        get no more credit, and refuses it as FAIL does once the address holds more than
        max-size-bytes-reject-threshold (Artemis `isRejectingMessages`: BLOCK only); PAGE
        lets it in (`_deliver_to` writes it to page files)."""
        settings = self.settings.resolve(address.name)
        policy = settings.address_full_policy
        reason = self._full_reason(address, settings)
        if not self._in_commit:  # else checked before the commit (B-141, `committing`)
            refusal = self._refusal(address, settings, reason)
            if refusal is not None:
                raise ResourceLimitExceeded(refusal)
        if reason is None or policy == "FAIL":
            return True
        if policy == "DROP":
            address.unrouted += 1
            if self.emitter.failures:
                self._message_event("unrouted", message, now_ms, reason="dropped-full")
            return False
        if policy == "BLOCK":
            self._block(address, reason)
        return True

    def _block(self, address: Address, reason: str) -> None:
        """B-151 BLOCK: the address (or, for global-max-size, the broker) is full: no more
        credit for its producers until memory is freed (`AddressUnblocked`)."""
        if reason.startswith("global-max-size"):
            if not self.memory.global_blocked:
                self.memory.global_blocked = True
                log.info("the broker is full (%s): blocking producers", reason)
        elif not address.blocked:
            address.blocked = True
            log.info("address %s is full (%s): blocking its producers", address.name, reason)

    def _must_page(self, address: Address, message: Message) -> bool:
        """B-151 PAGE: whether a message for `address` goes to page files (it is full)."""
        settings = self.settings.resolve(address.name)
        return (
            settings.address_full_policy == "PAGE"
            and (
                settings.max_size_bytes >= 0
                or settings.max_size_messages >= 0
                or 0 <= self.global_max_size <= self.memory_bytes + message.size
            )
            and self._full_reason(address, settings) is not None
        )

    def _check_unblocked(self, address: Address) -> None:
        settings = self.settings.resolve(address.name)
        reason = self._full_reason(address, settings)
        if reason is None or reason.startswith("global-max-size"):
            address.blocked = False
            self._effects.append(AddressUnblocked(address.name))

    def _check_global_unblocked(self) -> None:
        if not 0 <= self.global_max_size <= self.memory_bytes:
            self.memory.global_blocked = False
            self._effects.append(AddressUnblocked(None))

    def producer_may_send(self, target: ProducerTarget, *, to: str | None = None) -> bool:
        """Whether a producer link to `target` may be given more credit (B-151 BLOCK).

        The anonymous relay (`target.address` None) is paced by the broker-wide limit and
        by the address its last message went to (`to`, its `properties.to`): a relay can
        no more get past a full address than a link attached to it."""
        name = target.address
        if name is None and to:
            try:
                name = parse_address(to).address
            except ClientError:
                name = None
        if self.global_blocked and (
            target.address is None
            or (name is not None and self.settings.resolve(name).address_full_policy == "BLOCK")
        ):
            return False
        address = self.post_office.addresses.get(name) if name is not None else None
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
        message_event(self.hot, kind, message, now_ms, reason, extra, shape)

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
        limited: bool = True,
    ) -> int:
        """Add `message` to `queues` (routed to `address`), paging it if the address is
        full under PAGE. `limited` False: the caller found no limit that could make the
        address full (publish), so the B-151 check is skipped."""
        return deliver_to(self.hot, message, address, queues, now_ms, reason, limited)

    # -- consumers (attaching them: `_Attach`, core/attach.py) ------------------------
    def set_credit(self, consumer_id: ConsumerId, credit: int, *, drain: bool = False) -> None:
        """The link credit the consumer now has (B-037)."""
        set_consumer_credit(self.hot, consumer_id, credit, drain)

    def resume(self, consumer_id: ConsumerId) -> None:
        """The consumer's connection wrote what it was handed and its window has room
        again: dispatch to it, with the credit and drain it kept (issue 15)."""
        moment = self.moment
        if not moment.in_call:  # a hot entry point (core/clock.py)
            moment.read()
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.dispatch(self._effects)

    @entry
    def redispatch(self, queue: Queue) -> None:
        """Hand what is ready to the queue's consumers (B-161 resume())."""
        queue.dispatch(self._effects)

    def settle(self, consumer_id: ConsumerId, delivery: DeliveryId, outcome: Outcome) -> None:
        """Apply a consumer's outcome; ignore deliveries no longer held (B-055).

        Each attribute of `self` read here is a dictionary lookup (`Broker` is not a native
        class, setup.py), so each is read once (issue 20: two settles a redelivery)."""
        settle_delivery(self.hot, consumer_id, delivery, outcome)

    @entry
    def rollback_delivery(self, consumer_id: ConsumerId, delivery: DeliveryId) -> None:
        """B-143: a rolled-back transactional accept of a settled delivery, or a forced
        rollback: back to the queue with the attempt counted, as modified{delivery-failed},
        with the redelivery delay and the max-delivery-attempts check."""
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.settle(
                info.consumer,
                delivery,
                FAILED,  # B-143: a rollback counts as a failed attempt
                self.now_ms,
                self._effects,
                reason="tx-rollback",
            )

    @entry
    def hold(self, consumer_id: ConsumerId, delivery: DeliveryId) -> None:
        """B-142: see `Queue.hold`."""
        info = self._consumers.get(consumer_id)
        if info is not None:
            info.consumer.queue.hold(info.consumer, delivery)

    @entry
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

    # -- dead letters (B-070…B-076) and expiry (B-084…B-087): `_Moving`, core/moving.py
    # -- auto-delete (B-111…B-114): `_Reaper`, core/reaper.py
    # -- helpers ------------------------------------------------------------------------
    def _random_name(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))


# -- the per-message paths as module functions (issue 20) ------------------------
def refuse_durable(cause: BaseException) -> NoReturn:
    """Refuse a durable send while `Persistence.refusing` (the journal failed, or the
    disk is over `max-disk-usage`): the producer hears resource-limit-exceeded, and the
    transfer adapters answer it rejected. The one place of this policy."""
    raise ResourceLimitExceeded(f"the broker cannot store durable messages: {cause}")


def publish_message(
    hot: Hot,
    message: Message,
    target: ProducerTarget,
    to: str | None,
    message_routing_type: RoutingType | None,
    duplicate_id: str | bytes | None,
    delivery_delay_ms: int,
) -> int:
    """`Broker.publish`, a module function: compiled (setup.py), the adapter's call is a
    direct C call, no method lookup on the non-native `Broker` nor keyword parsing. It
    reads `hot` (fields when compiled), `Broker` itself only on the rarer branches."""
    moment = hot.moment
    # A hot entry point (core/clock.py); `read` keeps the int object within one ms.
    now_ms = moment.ms if moment.in_call else moment.read()
    if delivery_delay_ms > 0 and not message.deliver_at_ms:
        message.deliver_at_ms = now_ms + delivery_delay_ms
    if message.deliver_at_ms > LATEST_DELIVERY_MS:  # B-015: what the stores can hold
        message.deliver_at_ms = LATEST_DELIVERY_MS
    persistence = hot.persistence
    if message.durable and persistence is not None and persistence.refusing:
        refuse_durable(persistence.refusing)
    if not message.msg_id:
        ids = hot.msg_ids
        message.msg_id = next(ids.ready, 0) or next(ids)  # the block's next, or reserve
    if not message.first_ts:
        message.first_ts = now_ms
    routing_type = target.routing_type or message_routing_type
    address_name = target.address
    fqqn_queue = target.queue
    broker = hot.broker
    if address_name is None:  # anonymous relay (B-009)
        relayed = broker._relay_target(target, to, message_routing_type)
        if relayed is None:
            return broker._management_request(message, target)
        address, fqqn_queue, routing_type = relayed
        address_name = address.name
    else:
        if target.management:
            return broker._management_request(message, target)
        found = hot.addresses.get(address_name)
        # None: deleted since attach: re-create as attach would
        address = found or broker._prepare_target(address_name, fqqn_queue, routing_type)
    message.address = address_name
    if duplicate_id is not None and broker._is_duplicate(address, duplicate_id):
        address.unrouted += 1
        if hot.emitter.failures:
            message_event(hot, "unrouted", message, now_ms, "duplicate", None, None)
        return 0
    settings, expiry_overrides, size_limited = hot.settings.publishing(address_name)
    if message.ttl_ms or message.expiration_ms or expiry_overrides:
        broker._set_expiration(message, address_name, now_ms)
    if settings.enable_ingress_timestamp:  # B-018 (d)
        hot.copier.set_ingress_time(message, now_ms)
    limited = size_limited or 0 <= hot.global_max_size <= broker.memory_bytes + message.size
    if limited and not broker._has_room(address, message, now_ms):
        return 0
    if fqqn_queue is not None:
        queue = hot.queues.get(fqqn_queue)
        # The queue named at attach may since have been deleted and another of its
        # name made on another address: that one is not this link's (B-006).
        queues = (
            [queue]
            if queue is not None
            and queue.address == address_name
            and queue.accepts_message(message)
            else []
        )
    else:
        queues = hot.post_office.route(message, address, routing_type)
    # Not `limited`: no size limit and the broker under global-max-size, so it cannot
    # be full and nothing pages: `_deliver_to` skips `_must_page`.
    routed = deliver_to(hot, message, address, queues, now_ms, "route", limited)
    if hot.retroactive and fqqn_queue is None:  # B-124: the divert, after the route's
        broker._retain(message, address, routing_type)  # events; an FQQN bypasses it
    if limited and settings.address_full_policy == "BLOCK":
        reason = broker._full_reason(address, settings)
        if reason is not None:
            broker._block(address, reason)  # full now: no more credit at once
    return routed


def message_event(
    hot: Hot,
    kind: str,
    message: Message,
    now_ms: int,
    reason: str | None,
    extra: Extra | None,
    shape: Shape | None,
) -> None:
    """`Broker._message_event`, a module function (a direct call when compiled)."""
    emitter = hot.emitter
    txn_extra = emitter.txn_extra  # None: no transaction (a property read costs a call)
    part = message.event_part
    if part is None or message.event_sent < emitter.handed:  # else the same hand-off
        part = emitter.part(message)
    emitter.events.append(
        (
            shape
            or (kind, (message.address, None, None), (message.origin_container, None), reason),
            now_ms,
            part,
            None,
            extra
            if txn_extra is None
            else (
                txn_extra[0],
                None,
                None if extra is None else extra[2],
                None,
                None,
                None,
                None,
                None,
            ),
        )
    )


def deliver_to(
    hot: Hot,
    message: Message,
    address: Address,
    queues: list[Queue],
    now_ms: int,
    reason: str,
    limited: bool,
) -> int:
    """`Broker._deliver_to`, a module function (a direct call when compiled)."""
    emitter = hot.emitter
    if emitter.all and reason == "route":
        origin = message.origin_container
        if len(queues) == 1:
            extra = queues[0].event_routed
        elif (routed := address.event_routed) is not None and routed[0] == queues:
            extra = routed[1]  # the same queues as the last message (compared by identity)
        else:
            names = tuple([q.name for q in queues])
            extra = (None, None, names, None, None, None, None, None)
            address.event_routed = (queues, extra)
        message_event(
            hot,
            "sent",
            message,
            now_ms,
            None,
            extra,
            address.event_sent.get(origin) or Broker._sent_shape(address, origin),
        )
    if not queues:
        address.unrouted += 1
        hot.stats.unrouted += 1
        if emitter.failures:
            message_event(hot, "unrouted", message, now_ms, "no-bindings", None, None)
        settings = hot.settings.resolve(address.name)
        if settings.send_to_dla_on_no_route and settings.dead_letter_address:
            move = MoveAnnotations(
                orig_address=address.name,
                orig_queue=None,
                orig_message_id=message.msg_id,
                dlq_reason="no-route",
            )
            hot.broker._move_to_dla(message, address.name, settings, move)
        return 0
    address.routed += 1
    hot.stats.routed += 1
    out = hot.effects
    waiting = False
    page = limited and hot.page_stores is not None and hot.broker._must_page(address, message)
    for queue in queues:
        pages = queue.pages
        # Last-value, ring and non-destructive queues stay in memory: replacing,
        # trimming and their consumers' logs work on what they hold (decisions.md).
        if (page and queue.kind is None) or (pages is not None and pages.messages):
            if pages is None:
                hot.broker._open_pages(queue)
            queue.page(message, out, reason=reason)  # B-151 PAGE: in order, on disk
            waiting = True
            guard = hot.broker.disk_guard
            if guard is not None:  # max-disk-usage between scans (core/diskguard.py)
                guard.note_written(message.size)
        elif queue.add(message, out, reason=reason).state != DELIVERING:
            waiting = True
    if waiting:
        # A message that waits in a queue keeps no copy of its head for its events
        # (~0.4 KB a message in a deep queue): its next event builds it again.
        message.event_part = None
    return len(queues)


def settle_delivery(
    hot: Hot, consumer_id: ConsumerId, delivery: DeliveryId, outcome: Outcome
) -> None:
    """`Broker.settle`, a module function: the adapter's call is a direct C call when
    compiled (setup.py)."""
    moment = hot.moment
    now_ms = moment.ms if moment.in_call else moment.read()  # a hot entry point
    consumer = hot.consumer_of.get(consumer_id)
    if consumer is None:
        log.debug("outcome for delivery %s of a closed consumer ignored (B-055)", delivery)
        return
    held = consumer.queue.settle(consumer, delivery, outcome, now_ms, hot.effects)
    if not held:
        log.debug(
            "outcome for delivery %s not held by consumer %s ignored (B-055)",
            delivery,
            consumer_id,
        )


def set_consumer_credit(hot: Hot, consumer_id: ConsumerId, credit: int, drain: bool) -> None:
    """`Broker.set_credit`, a module function (a direct call when compiled)."""
    moment = hot.moment
    if not moment.in_call:  # a hot entry point (core/clock.py)
        moment.read()
    consumer = hot.consumer_of.get(consumer_id)
    if consumer is not None:
        consumer.queue.set_credit(consumer, credit, drain, hot.effects)
