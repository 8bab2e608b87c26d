"""Queues: ordered message references, consumers with credit, and the return paths.

Theory of operation
-------------------
A queue holds *references* (`Ref`) to messages; a multicast route gives each queue its own
reference, so delivery counts are per (message, queue). A reference is in exactly one of:

* **ready**: waiting for a consumer. Kept per priority level (B-013), highest first; within
  a level in arrival order (`seq`). Fresh arrivals are appended to a deque; references that
  come back (release, modify, link close, expired delay) go into a per-level heap keyed by
  `seq`, so a returned message is delivered before everything that arrived after it
  (B-014). The next reference is the smaller `seq` of the deque head and the heap top.
* **scheduled**: returned with a redelivery delay (B-065); in a heap by due time, moved
  back to ready by `tick()`. Counts as scheduled, not delivering.
* **delivering**: sent to a consumer and not yet settled, in that consumer's `unsettled`.

Dispatch is credit based: a consumer gets at most `credit` messages; competing consumers
are served round-robin (the rotation start moves past the consumer served). A consumer
with a selector, or a reference blocked for a consumer (B-045), makes dispatch scan past
references that consumer cannot take; those keep their place.

Delivery counting follows B-040…B-054: the broker count `n` is incremented when a
reference is handed to a non-browsing consumer; returns that do not signal failure undo
it. The redelivery decision (dead-letter or delay) is `redelivery.redelivery_at`;
what happens to a dead letter is the broker's business. Everything a queue needs from the
broker that owns it (its settings, the time, dead letters, expiry, size accounting) is
one declared interface, `QueueOwner`, which `Broker` implements.

Loop thread only.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from random import Random
from typing import TYPE_CHECKING, Final, Protocol, cast

from amqpbroker.core.clock import Moment
from amqpbroker.core.dispatch import (
    PURGE_ON_NO_CONSUMERS,
    DispatchPolicy,
    FirstMarker,
    needs_policy,
    purge_on_no_consumers,
)
from amqpbroker.core.effects import Dispatch, Drained, Effect
from amqpbroker.core.lifecycle import By, Emitter, Extra, Shape, Where
from amqpbroker.core.model import (
    ConnectionId,
    ConsumerId,
    DeliveryId,
    Message,
    QueueConfig,
    RoutingType,
)
from amqpbroker.core.outcomes import FAILED, Accepted, Modified, Outcome, Rejected, Released
from amqpbroker.core.paging import (
    READ_STEP_BYTES,
    READ_STEP_MESSAGES,
    PageMark,
)
from amqpbroker.core.redelivery import DEAD_LETTER, MAX_ATTEMPTS, redelivery_at
from amqpbroker.core.refs import DELIVERING, GONE, PAGED, READY, SCHEDULED, PagedRef, Ref
from amqpbroker.core.settings import ResolvedSettings, SettingsRepository

if TYPE_CHECKING:
    from amqpbroker.core.paging import PageStore
    from amqpbroker.core.persistence import Persistence
    from amqpbroker.core.selector import Selector

_LEVELS = 10
# At most this many references re-prioritized at once are unlinked one by one (found by
# bisection in their level); more, and the levels are rebuilt in one pass.
_FEW = 8


# The largest header section the adapter writes when it re-encodes one (B-050): durable,
# priority, ttl, first-acquirer and delivery-count at their widest (a test checks).
MAX_HEADER_BYTES = 20


def wire_size(message: Message, delivery_count: int) -> int:
    """The bytes a transfer of `message` carries (at most): the stored bytes, or with the
    header re-encoded when the count is not 0 or the producer sent a header (B-050)."""
    if not delivery_count and message.header is None:
        return message.size
    return message.size - message.header_end + MAX_HEADER_BYTES


# The outcome classes as C statics (compiled, setup.py): an imported name is a module-dict
# lookup at each use, four a return in `Queue.settle` (issue 20). `Queue.settle` compares
# an outcome's type with them (`type(o) is C`: a pointer comparison; `isinstance` on
# these pure-Python classes was a generic call, ~150 instructions each); the outcome
# classes are final dataclasses, never subclassed.
_ACCEPTED: Final = Accepted
_RELEASED: Final = Released
_REJECTED: Final = Rejected
_MODIFIED: Final = Modified
# The commonest modified outcome (the one `dispositions.outcome_at` hands over for
# delivery-failed alone): `settle` knows its fields without reading them (issue 20).
_FAILED: Final = FAILED
# A C static too: `heapq.heappush` is a module attribute read per return (issue 20).
_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop  # (and per redelivered message that waited, `_pop_next`)

# The `extra` of a `returned` event without delay or transaction (`Queue._note_returned`):
# (txn, target_address, target_queues, copy_msg_id, delay_ms, ...), see `lifecycle.Extra`.
_RETURNED_AT_ONCE: Final[Extra] = (None, None, None, None, 0, None, None, None)


# A window that never closes: a consumer no adapter bounds (the core's own tests, tools).
UNBOUNDED = 1 << 62


class Window:
    """The bytes a connection's consumers may still be handed before its socket catches
    up (issue 15): dispatch stops once `room` is spent and the adapter refills it when the
    engine's output is written, so credit alone cannot buffer a whole queue in memory."""

    __slots__ = ("room",)

    def __init__(self, room: int = UNBOUNDED) -> None:
        self.room = room


@dataclass(eq=False, slots=True, kw_only=True)
class Address:
    """An address and its bindings (queues), in binding order: the post office's
    (core/postoffice.py), defined here for `Memory`, which counts its `size_bytes`."""

    name: str
    routing_types: set[RoutingType]
    auto_created: bool = False
    temporary: bool = False
    owner: ConnectionId | None = None  # temporary addresses die with their connection
    queues: list[Queue] = field(default_factory=list)
    wildcard: bool = False
    used: bool = False  # a binding was removed (B-114)
    swept: bool = False
    idle_since_ms: int = 0
    anycast_start: int = 0  # rotating start position (B-003)
    routed: int = 0
    unrouted: int = 0
    size_bytes: int = 0  # bytes of the references its queues hold (B-151)
    duplicate_ids: dict[str | bytes, None] = field(default_factory=dict)  # B-012, in order
    blocked: bool = False  # full under policy BLOCK: producers get no more credit
    # The lifecycle `sent` shape per producer container (`Broker._sent_shape`), built once.
    event_sent: dict[str | None, Shape] = field(default_factory=dict)
    # The queues the last message routed here reached (two or more), with the `extra` of
    # its `sent` event (target_queues): the next message that reaches the same queues
    # shares it instead of building a list and two tuples (fan-out, issue 20).
    event_routed: tuple[list[Queue], Extra] | None = None


class Memory:
    """B-151: the bytes all queues hold in memory (`used`, against global-max-size), each
    address's share (`Address.size_bytes`), and whether the broker-wide limit blocks
    producers. The broker owns it; its queues count every message in and out here, a
    native object (compiled, setup.py), not through a call on `Broker`, which is not
    one (issue 20: ~2.4k instructions a call, two a message)."""

    __slots__ = ("addresses", "global_blocked", "used")

    def __init__(self, addresses: dict[str, Address]) -> None:
        self.addresses = addresses  # the post office's, by name (never replaced)
        self.used = 0
        self.global_blocked = False

    def changed(self, address: str, delta_bytes: int) -> bool:
        """A queue of `address` holds `delta_bytes` more (or fewer). True when bytes were
        freed while the address or the broker blocks its producers: the owner then checks
        whether they may resume (`QueueOwner.freed`)."""
        self.used += delta_bytes
        entry = self.addresses.get(address)
        if entry is None:
            return delta_bytes < 0 and self.global_blocked
        entry.size_bytes += delta_bytes
        return delta_bytes < 0 and (entry.blocked or self.global_blocked)


@dataclass(eq=False, slots=True, kw_only=True)
class Consumer:
    """A consumer link as the core sees it."""

    id: ConsumerId
    queue: Queue
    connection: ConnectionId
    link_name: str = ""
    container: str = ""  # the client's container-id, for lifecycle events
    selector: Selector | None = None
    browser: bool = False  # distribution-mode copy (B-031)
    presettled: bool = False  # snd-settle-mode settled (B-037)
    priority: int = 0  # consumer priority (B-035): higher is served first
    # The largest transfer the receiver takes (its attach max-message-size; 0: any).
    max_message_size: int = 0
    credit: int = 0
    drain: bool = False
    # Dispatches made to it since it attached: its connection subtracts those not yet
    # handed to the engine from the engine's credit it reports (B-037, `ConsumerLink`).
    dispatched: int = 0
    window: Window = field(default_factory=Window)  # shared by the connection's consumers
    unsettled: dict[DeliveryId, Ref] = field(default_factory=dict)
    # A browser has seen every reference up to this seq; a consumer of a non-destructive
    # queue, every one up to this position of its log (core/queuekinds.py).
    browsed_seq: int = -1
    page_mark: PageMark | None = None  # a browser's place in the page files (B-151)
    # Slow-consumer checks (core/slowconsumer.py): acknowledged so far, and the count and
    # time its rate is measured from.
    acked: int = 0
    rate_mark: tuple[int, int] = (0, 0)
    # Its events' `lifecycle.By`, and the shapes of the common ones, built once.
    event_by: By = field(init=False)
    event_dispatched: Shape = field(init=False)
    event_acked: Shape = field(init=False)
    # Its `returned` shapes by reason, built at the first return of each (issue 20).
    event_returned: dict[str, Shape] = field(init=False, default_factory=dict)
    # Takes any message as dispatch offers it: not a browser, no selector, no size limit
    # (all fixed at attach): one test on the hot path (`Queue._hand_over`, `_deliver`).
    plain: bool = field(init=False)

    def __post_init__(self) -> None:
        self.plain = not self.browser and self.selector is None and not self.max_message_size
        by = self.event_by = (self.container, self.link_name)
        where = self.queue.event_where
        reason = "presettled" if self.presettled else None
        self.event_dispatched = ("dispatched", where, by, reason)
        self.event_acked = ("acked", where, by, "accepted")

    def accepts(self, ref: Ref) -> bool:
        if ref.blocked is not None and self.id in ref.blocked:
            return False
        limit = self.max_message_size
        if limit and wire_size(ref.message, ref.delivery_count) > limit:
            return False  # AMQP 2.7.3: never sent to it; it waits for another consumer
        return self.selector is None or self.selector.matches(ref.message)


# The B-171 reasons the counters are labelled with. Every one starts at 0, so the first
# dead letter of a queue is an increase of an existing series, which Prometheus's
# increase() sees, not the birth of one at 1, which it does not (issue 16 item 4).
DEAD_LETTER_REASONS = ("max-attempts", "rejected", "management", "delivery-error", "no-route")
KILL_REASONS = (
    "no-dla",
    "dla-no-bindings",
    "purge",
    "purge-on-no-consumers",
    "management",
    "journal-failed",
)
# B-171 `replaced` reasons (B-120, B-121).
REPLACE_REASONS = ("ring", "last-value")
RETURN_OUTCOMES = (
    "released",
    "modified",
    "modified-failed",
    "rejected",
    "link-closed",
    "connection-lost",
    "tx-rollback",
)


@dataclass(slots=True)
class QueueCounters:
    """Artemis queue counters (B-161 semantics); monotonic except where noted."""

    added: int = 0
    acknowledged: int = 0
    killed: int = 0  # dead-lettered, dropped and purged
    dead_lettered: int = 0
    expired: int = 0
    returned: int = 0
    # by B-171 reason, for the labelled metrics (CONTRACT "Metrics")
    dead_lettered_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(DEAD_LETTER_REASONS, 0)
    )
    killed_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KILL_REASONS, 0))
    returned_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(RETURN_OUTCOMES, 0)
    )
    replaced: int = 0  # ring and last-value removals (B-120, B-121)
    paged_lost: int = 0  # paged messages lost to damaged page files (B-151, issue 23)
    replaced_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(REPLACE_REASONS, 0)
    )

    def count(self, table: dict[str, int], reason: str) -> None:
        table[reason] = table.get(reason, 0) + 1

    def add(self, other: QueueCounters) -> None:
        """Fold `other` into these: the totals of an address or of the broker."""
        self.added += other.added
        self.acknowledged += other.acknowledged
        self.killed += other.killed
        self.dead_lettered += other.dead_lettered
        self.expired += other.expired
        self.returned += other.returned
        self.replaced += other.replaced
        self.paged_lost += other.paged_lost
        for mine, theirs in (
            (self.dead_lettered_by_reason, other.dead_lettered_by_reason),
            (self.killed_by_reason, other.killed_by_reason),
            (self.returned_by_reason, other.returned_by_reason),
            (self.replaced_by_reason, other.replaced_by_reason),
        ):
            for reason, count in theirs.items():
                mine[reason] = mine.get(reason, 0) + count


class QueueOwner(Protocol):
    """What a queue needs from the broker that owns it: the one dependency of `Queue` on
    `Broker`, declared once (issue 18). Every method is called on the loop thread, from
    inside a call into the broker."""

    @property
    def moment(self) -> Moment:
        """The time of the call into the broker being handled (`moment.ms`, epoch ms): a
        native object the queue keeps and reads per event (issue 20)."""
        ...

    def queue_settings(self, queue: Queue) -> ResolvedSettings:
        """The settings of `queue`'s address, as they are now."""
        ...

    def schedule(self, at_ms: int) -> None:
        """The queue has a scheduled reference due at `at_ms`: `tick()` has work then."""
        ...

    @property
    def memory(self) -> Memory:
        """Where the queue counts the bytes it holds (B-151), per message."""
        ...

    def freed(self, queue: Queue) -> None:
        """`queue` freed bytes while its address or the broker blocks producers
        (`Memory.changed`): they may resume (B-151)."""
        ...

    def track_expiry(self, queue: Queue, ref: Ref) -> None:
        """`ref` waits and can expire: index it for the expiry scan (B-084)."""
        ...

    def expired(self, queue: Queue, ref: Ref) -> None:
        """`ref` expired and left `queue`: move a copy to the expiry address (B-085)."""
        ...

    def dead_letter(self, queue: Queue, ref: Ref, reason: str, rejection: Rejected | None) -> None:
        """`ref` left `queue` for the dead-letter address, for `reason` (B-070…B-076)."""
        ...


class QueueKind(Protocol):
    """The hooks of a last-value, ring or non-destructive queue (`core.queuekinds`,
    which imports this module: the protocol keeps the import one way)."""

    key: str | None  # the last-value key; None: not a last-value queue
    non_destructive: bool

    def arrived(self, ref: Ref) -> None: ...

    def ready_again(self, ref: Ref) -> None: ...

    def trim(self) -> None: ...

    def settled(self, consumer: Consumer) -> None: ...

    def deliver(self, active: list[Consumer], out: list[Effect]) -> None: ...


class DeliveryIds:
    """The broker's delivery ids, one sequence its queues share. A native counter when
    compiled (setup.py): `next()` on an `itertools.count` was a lookup of `next` in the
    builtins module and a generic call, ~500 instructions a dispatch, two a redelivered
    message (callgrind, issue 20). Not an iterator: mypyc cannot build an `int`-returning
    `__next__` (setup.py, core/ids.py)."""

    def __init__(self, first: int = 1) -> None:
        self.last = first - 1

    def take(self) -> DeliveryId:
        """The next id."""
        self.last += 1
        return cast("DeliveryId", self.last)


class Queue:
    """One queue bound to one address (B-001). Loop thread only."""

    def __init__(
        self,
        config: QueueConfig,
        *,
        owner: QueueOwner,
        selector: Selector | None,
        rng: Random,
        delivery_ids: DeliveryIds,
        emitter: Emitter | None = None,
        settings_source: SettingsRepository | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.address = config.address
        self.routing_type: RoutingType = config.routing_type
        # Its events' `lifecycle.Where`, and the shape of the common one, built once.
        self.event_where: Where = (self.address, self.name, self.routing_type.value)
        self.event_enqueued: Shape = ("enqueued", self.event_where, None, "route")
        # The `extra` of a `sent` routed to this queue alone (target_queues).
        self.event_routed: Extra = (None, None, (self.name,), None, None, None, None, None)
        self.durable = config.durable
        self.selector = selector  # the queue filter: what may enter
        self._owner = owner
        self._moment = owner.moment  # the call's time, read per event (`note`)
        self._memory = owner.memory  # B-151: the bytes held, counted per message
        # The repository behind `owner.queue_settings`, when the owner has one: its
        # `version` says when the settings kept here (`settings()`) are stale.
        self._settings_source = settings_source
        self._settings: ResolvedSettings | None = None
        self._settings_version = -1
        self.counters = QueueCounters()
        self.consumers: list[Consumer] = []
        self._browsers = 0  # browsers among them (`dispatch` skips the browse pass at 0)
        # Consumers of different priorities (B-035), kept by add/remove_consumer.
        self._prioritized = False
        self.used = False
        self.paused = False  # B-161 pause(): no dispatch to consumers (browsers go on)
        self.swept = False  # first reaper pass passed (B-111)
        self.idle_since_ms = 0
        self.owner: ConnectionId | None = None  # temporary queues die with their connection
        self._rng = rng
        self._delivery_ids = delivery_ids
        self.emitter = emitter or Emitter()
        self._scheduled_live = 0
        self.size_bytes = 0
        self._seq = itertools.count()
        self._fresh: list[deque[Ref]] = [deque() for _ in range(_LEVELS)]
        self._returned: list[list[Ref]] = [[] for _ in range(_LEVELS)]
        # No priority level above this one holds a reference (`_pop_next` starts here,
        # not at level 9: most messages are at the default level 4).
        self._top = 0
        self._ready = 0
        self._scheduled: list[tuple[int, int, Ref]] = []
        self._rr = 0
        self.delivering = 0
        # Set by the broker for a durable queue when persistence is on (B-095).
        self.store: Persistence | None = None
        # Its page files, once it has paged (B-151 PAGE, core/paging.py), and the paged
        # messages a management operation took (`take`), until `remove_paged`.
        self.pages: PageStore | None = None
        # paged messages taken by management since the last `remove_paged`: where each
        # ends in the page files, and its size (`PageStore.skip`)
        self._doomed: list[tuple[tuple[int, int], int]] = []
        # The management walk running over the queue a slice at a time (core/operations
        # `Walk`, issue 23): while set, nothing is read back (the walk owns the cursor).
        self.walk: object | None = None
        # B-126 over B-151: a purge-on-no-consumers' paged part, killed a read step a loop
        # turn (`tick`) up to this `pages.end` (the files' end when the last consumer
        # left), holding the queue as a walk does; `_purge_due_ms`: its next step.
        self._purge_until: tuple[int, int] | None = None
        self._purge_due_ms = 0
        # (epoch, position) where the last paged message a by-id operation found ends: the
        # next one looks from there first (a task's ids come in queue order), issue 23
        self.paged_hint: tuple[int, tuple[int, int]] | None = None
        self._page_expiry_ms = 0  # when `tick` next reads back for expired paged ones
        self._page_browse_ms = 0  # when `tick` lets browsers walk on through the pages
        self._pages_lost = 0  # `pages.lost` already in `counters.paged_lost`
        # Last-value, ring, non-destructive (`set_kind`); None: a plain queue.
        self.kind: QueueKind | None = None
        # How ready references reach consumers: taken, or walked by each (B-123).
        self._deliver_ready: Callable[[list[Consumer], list[Effect]], None] = self._deliver
        # msg_id -> reference held in memory, kept by `_enqueue` and `_removed`, for the
        # by-id management operations (issue: management on big queues).
        self._by_id: dict[int, Ref] = {}
        self._taken = 0  # taken by management since the last `compact`

        # Exclusive, groups, dispatch gate (B-122, B-127, B-128): core/dispatch.py.
        self.first_marker: FirstMarker | None = None  # the broker's codec, for group-first-key
        self.policy: DispatchPolicy[Consumer] | None = (
            DispatchPolicy(config) if needs_policy(config) else None
        )
        self.purging = config.purge_on_no_consumers  # B-126: routing skips it while idle

    def set_kind(self, kind: QueueKind) -> None:
        """Make this a last-value, ring or non-destructive queue (core/queuekinds.py)."""
        self.kind = kind
        if kind.non_destructive:
            self._deliver_ready = kind.deliver

    # -- state ------------------------------------------------------------------------
    def settings(self) -> ResolvedSettings:
        """The settings of its address, as they are now: asked of the owner once per
        change of its settings repository (issue 20: every return reads them)."""
        source = self._settings_source
        if source is None:
            return self._owner.queue_settings(self)
        settings = self._settings
        if settings is None or self._settings_version != source.version:
            settings = self._settings = self._owner.queue_settings(self)
            self._settings_version = source.version
        return settings

    @property
    def message_count(self) -> int:
        """Ready + scheduled + delivering + paged, as Artemis messageCount (B-161); without
        the delivering ones on a last-value or non-destructive queue (B-120, B-123)."""
        pages = self.pages
        paged = pages.messages if pages is not None else 0
        kind = self.kind
        if kind is not None and (kind.key is not None or kind.non_destructive):
            return self._ready + self._scheduled_live + paged
        return self._ready + self._scheduled_live + self.delivering + paged

    @property
    def memory_count(self) -> int:
        """The messages held in memory: not paged (B-151 max-size-messages)."""
        return self._ready + self._scheduled_live + self.delivering

    @property
    def ready_count(self) -> int:
        return self._ready

    @property
    def scheduled_count(self) -> int:
        return self._scheduled_live

    def next_deadline_ms(self) -> int | None:
        while self._scheduled and self._scheduled[0][2].state != SCHEDULED:
            heapq.heappop(self._scheduled)  # expired while waiting
        due = self._scheduled[0][0] if self._scheduled else None
        if (paged := self._page_expiry_ms) and (due is None or paged < due):
            due = paged  # B-151: paged messages may have expired
        if (walk := self._page_browse_ms) and (due is None or walk < due):
            due = walk  # B-031 over B-151: a browser's walk goes on
        if (purge := self._purge_due_ms) and (due is None or purge < due):
            due = purge  # B-126 over B-151: the next step of a purge of the paged part
        if self.policy is not None and (gate := self.policy.deadline_ms()) is not None:
            due = gate if due is None else min(due, gate)  # B-128 delay-before-dispatch
        return due

    def refs(self) -> list[Ref]:
        """Every reference held (ready, scheduled, delivering), in arrival order."""
        held: list[Ref] = []
        for level in range(_LEVELS):
            held.extend(self._fresh[level])
            held.extend(self._returned[level])
        held.extend(entry[2] for entry in self._scheduled)
        for consumer in self.consumers:
            held.extend(consumer.unsettled.values())
        held = [ref for ref in held if ref.state != GONE]
        if self.kind is not None:  # non-destructive: delivered ones are still ready
            held = list(dict.fromkeys(held))
        held.sort()
        return held

    def iter_refs(self) -> Iterator[Ref]:
        """`refs()`, lazily: each priority level's fresh deque is already in `seq` order,
        so they are merged as they are read; only the returned, scheduled and delivering
        references (few: consumer credit, redelivery delays) are sorted first. A page of
        a browse costs O(returned + scheduled + delivering + page * log levels), not a
        sort of the queue. Nothing may be added to the queue while it is being read."""
        others: list[Ref] = []
        for returned in self._returned:
            others.extend(returned)
        others.extend(entry[2] for entry in self._scheduled)
        for consumer in self.consumers:
            others.extend(consumer.unsettled.values())
        others.sort()
        previous: Ref | None = None
        for ref in heapq.merge(*(fresh for fresh in self._fresh if fresh), others):
            # A non-destructive queue's delivered reference is in both (same seq: adjacent).
            if ref.state != GONE and ref is not previous:
                previous = ref
                yield ref

    def find(self, msg_id: int) -> Ref | None:
        """The reference to message `msg_id` held in memory (ready, scheduled or
        delivering; not paged), in O(1): the queue's id index (docs/decisions.md)."""
        return self._by_id.get(msg_id)

    def oldest_waiting_ts(self) -> int | None:
        """When the broker first accepted (`first_ts`, epoch ms) the oldest message waiting
        at the head of this queue; None when nothing waits (issue 24: a DLQ ageing).

        The heads of each priority level and of its returned references, and the
        scheduled ones: O(levels + scheduled), not O(messages), as a scrape needs."""
        oldest: int | None = None
        heads: list[Ref] = []
        for level in range(_LEVELS):
            heads.extend(itertools.islice((r for r in self._fresh[level] if r.waiting), 1))
            returned = self._returned[level]
            if returned:
                heads.extend(itertools.islice((r for r in returned if r.waiting), 1))
        heads.extend(entry[2] for entry in self._scheduled if entry[2].waiting)
        for ref in heads:
            ts = ref.message.first_ts
            if ts and (oldest is None or ts < oldest):
                oldest = ts
        pages = self.pages
        if oldest is None and pages is not None and pages.messages:
            # B-151: nothing waits in memory (all delivering, or a restart left only the
            # paged part): the head of the page files waits (issue 23 audit: the age was
            # "nothing waits" over a paged backlog). Paged messages come after those in
            # memory, so with any waiting there they are not the head; one frame read.
            oldest = pages.oldest_ts()
        return oldest

    # -- arrival ----------------------------------------------------------------------
    def accepts_message(self, message: Message) -> bool:
        """Whether the queue filter lets the message in (B-002), and B-126: a
        purge-on-no-consumers queue takes nothing while it has no consumers."""
        if self.purging and not self.consumers:
            return False
        return self.selector is None or self.selector.matches(message)

    def note(self, shape: Shape, ref: Ref, extra: Extra | None) -> None:
        """Record a common lifecycle event (B-171): `enqueued`, `dispatched`, `acked`, three
        a delivered message at level `lifecycle`, with a shape built once and kept (on the
        queue or the consumer) and `extra` None or the emitter's `txn_extra`.

        The hot path of the B-170 cost budget: positional arguments (each default would
        cost a lookup per call) and a `lifecycle.RawEvent` of five things already built.
        """
        message = ref.message
        emitter = self.emitter
        part = message.event_part
        if part is None or message.event_sent < emitter.handed:  # else the same hand-off
            part = emitter.part(message)  # (no call: pure Python pays ~0.4k a call)
        emitter.events.append(
            (
                shape,
                self._moment.ms,  # the time of the call into the broker (clock.entry)
                part,
                ref.delivery_count,
                extra,
            )
        )

    def event(
        self,
        kind: str,
        ref: Ref,
        consumer: Consumer | None = None,
        reason: str | None = None,
        delay_ms: int | None = None,
        target_address: str | None = None,
        target_queues: tuple[str, ...] | None = None,
        copy_msg_id: int | None = None,
        error_condition: str | None = None,
        error_description: str | None = None,
    ) -> None:
        """Record any lifecycle event (B-171) about `ref` in this queue, with the fields
        moves, returns and rejections have (`note` is the common case, cheaper)."""
        txn = self.emitter.txn
        extra: Extra | None = None
        if not (
            txn is None
            and delay_ms is None
            and target_address is None
            and target_queues is None
            and copy_msg_id is None
            and error_condition is None
            and error_description is None
        ):
            extra = (
                txn,
                target_address,
                target_queues,
                copy_msg_id,
                delay_ms,
                error_condition,
                error_description,
                None,
            )
        by = None if consumer is None else consumer.event_by
        self.note((kind, self.event_where, by, reason), ref, extra)

    def add(
        self, message: Message, out: list[Effect], *, delivery_count: int = 0, reason: str = "route"
    ) -> Ref:
        ref = self._enqueue(message, delivery_count, message.deliver_at_ms)
        store = self.store
        if store is not None and message.durable:
            store.ref_added(
                self.name,
                ref,
                scheduled_at_ms=message.deliver_at_ms if ref.state == SCHEDULED else 0,
            )
        self.counters.added += 1
        emitter = self.emitter
        if emitter.all:
            self.note(
                self.event_enqueued
                if reason == "route"
                else ("enqueued", self.event_where, None, reason),
                ref,
                emitter.txn_extra,
            )
        kind = self.kind
        if kind is None:
            consumers = self.consumers
            if consumers:
                if len(consumers) == 1 and self._ready == 1 and ref.state == READY:
                    self._hand_over(consumers[0], ref, out)
                else:
                    self.dispatch(out)
        else:  # B-120/B-123: index and log it; B-121: trim once it had its chance
            kind.arrived(ref)
            if self.consumers:
                self.dispatch(out)
            kind.trim()
        return ref

    def restore(self, message: Message, delivery_count: int, scheduled_at_ms: int) -> Ref:
        """A reference recovered from the journal: no event, no count, no dispatch yet."""
        ref = self._enqueue(message, delivery_count, scheduled_at_ms)
        ref.stored_count = delivery_count
        if self.kind is not None:
            self.kind.arrived(ref)
            self.kind.trim()
        return ref

    def restore_many(self, restored: list[tuple[Message, int, int]]) -> None:
        """`restore` of each (message, delivery_count, scheduled_at_ms), in order, with
        the size accounted once (recovery of millions, issue 23 item 4). The same refs,
        order, priorities, schedule and expiry tracking as one `restore` at a time."""
        if self.kind is not None:  # last-value, ring: each arrival may displace another
            for message, count, at_ms in restored:
                self.restore(message, count, at_ms)
            return
        seq, fresh, by_id, owner = self._seq, self._fresh, self._by_id, self._owner
        now_ms = self._moment.ms
        ready = size = 0
        for message, count, at_ms in restored:
            ref = Ref(message, next(seq), count)
            ref.stored_count = count
            if at_ms and at_ms > now_ms:  # B-015: scheduled until then
                heapq.heappush(self._scheduled, (at_ms, ref.seq, ref))
                ref.state = SCHEDULED
                self._scheduled_live += 1
                owner.schedule(at_ms)
            else:
                fresh[message.priority].append(ref)
                ready += 1
            by_id[message.msg_id] = ref
            size += message.size
            if message.expiration_ms:
                owner.track_expiry(self, ref)
        self._ready += ready
        if ready:
            self._top = _LEVELS - 1  # an upper bound: `_pop_next` lowers it as it goes
        self._size_changed(size)

    def _enqueue(self, message: Message, delivery_count: int, at_ms: int) -> Ref:
        ref = Ref(message, next(self._seq), delivery_count)
        owner = self._owner
        if at_ms and at_ms > self._moment.ms:  # B-015: scheduled until then
            heapq.heappush(self._scheduled, (at_ms, ref.seq, ref))
            ref.state = SCHEDULED
            self._scheduled_live += 1
            owner.schedule(at_ms)
        else:
            level = message.priority
            self._fresh[level].append(ref)
            if level > self._top:
                self._top = level
            self._ready += 1
        self._by_id[message.msg_id] = ref
        self._size_changed(message.size)
        if message.expiration_ms:
            owner.track_expiry(self, ref)
        return ref

    # -- dispatch ---------------------------------------------------------------------
    def _pop_next(self) -> Ref | None:
        if not self._ready:
            return None
        level = self._top
        while level >= 0:
            fresh, returned = self._fresh[level], self._returned[level]
            while fresh or returned:
                if returned and not (fresh and fresh[0].seq < returned[0].seq):
                    # a list's own pop for the last one: native, `heappop` a generic call
                    ref = _heappop(returned) if len(returned) > 1 else returned.pop()
                else:
                    ref = fresh.popleft()
                if ref.state == GONE:
                    continue  # removed while waiting (expired by the scanner)
                self._ready -= 1
                self._top = level  # every level above it is empty
                return ref
            level -= 1
        self._top = 0
        return None

    def _put_back(self, ref: Ref) -> None:
        level = ref.message.priority
        returned = self._returned[level]
        if returned:
            _heappush(returned, ref)
        else:  # already a heap; `heappush` is a generic call (~350 instructions, issue 20)
            returned.append(ref)
        if level > self._top:
            self._top = level
        ref.state = READY
        self._ready += 1
        if ref.message.expiration_ms:
            self._owner.track_expiry(self, ref)  # B-084: returned, it can expire again
        if self.kind is not None:
            self.kind.ready_again(ref)

    def dispatch(self, out: list[Effect]) -> None:
        """Hand ready references to consumers with credit, round-robin."""
        pages = self.pages
        if pages is not None and pages.messages:
            self._depage()  # B-151 PAGE: the next paged messages, when memory has room
        consumers = self.consumers
        if self._browsers:
            browsers = [c for c in consumers if c.browser and c.credit > 0 and c.window.room > 0]
            if browsers:
                self._browse(browsers, out)
        # Nothing ready in memory, yet paged messages: `_deliver` reads them back (a drain
        # beyond the read limits, `_drain_allowance`), as far as memory or credit allows.
        kind = self.kind
        paged = (
            pages is not None
            and pages.messages > 0
            and (kind is None or not kind.non_destructive)  # its `deliver` reads no pages
        )
        if (self._ready or paged) and not self.paused:
            active = [c for c in consumers if c.credit > 0 and not c.browser and c.window.room > 0]
            policy = self.policy
            if active and (
                policy is None or policy.may_dispatch(consumers, self.delivering, self._moment.ms)
            ):
                self._deliver_ready(active, out)
        for consumer in consumers:
            # A stalled consumer drains once its window reopens: what is ready goes first.
            # A browser still walking the page files (`_browse_pages`) has more to see.
            if (
                consumer.drain
                and consumer.credit > 0
                and consumer.window.room > 0
                and (consumer.page_mark is None or not consumer.page_mark.walking)
                and not self._reading_on()
            ):
                consumer.credit = 0
                consumer.drain = False
                out.append(Drained(consumer.id))

    def _reading_on(self) -> bool:
        """Whether a read back of paged messages is due and not yet run (`tick` runs
        `expire_paged`): after a step of only expired ones, or at the earliest paged
        expiration. A drain waits for it (issue 23: it was answered while live paged
        messages remained behind expired ones); `expire_paged` always dispatches."""
        pages = self.pages
        return (
            pages is not None and pages.messages > 0 and 0 < self._page_expiry_ms <= self._moment.ms
        )

    def _drain_allowance(self, active: list[Consumer]) -> int:
        """How many messages a read back may take beyond max-read-page-bytes/-messages
        for this dispatch: the credit of the draining consumers (docs/decisions.md,
        "A drain reads paged messages beyond the read limits"). A drain spends its credit
        on every available message before it is answered (AMQP 1.0 2.6.7), and paged
        messages are available; what is read for it is delivered at once, so memory
        grows by what the consumers' credit holds, as for an unpaged queue."""
        allowance = 0
        for consumer in active:
            if consumer.drain:
                allowance += consumer.credit
        return allowance

    def _hand_over(self, consumer: Consumer, ref: Ref, out: list[Effect]) -> None:
        """`dispatch` for the commonest cases (issue 20): `ref`, just added or just returned
        (released, modified), is the only ready reference of a plain queue with one
        consumer (every subscription queue of a topic). When that consumer can take it as
        `_deliver` would (credit, window, no selector or size limit, no policy, group,
        browser, pause, pages, expiry or B-045 block in the way) it goes straight to the
        consumer, with the same rotation, counts, effects and events; otherwise
        `dispatch` decides. Only when nothing else is in its level or above it: removed
        references (GONE) waiting there are dropped by `dispatch`'s `_pop_next`, not
        left to hold their messages' memory."""
        message = ref.message
        level = message.priority
        fresh = self._fresh[level]
        returned = self._returned[level]
        pages = self.pages
        if (
            len(fresh) + len(returned) != 1
            or self._top != level
            or ref.blocked is not None
            or not consumer.plain
            or consumer.credit <= 0
            or consumer.window.room <= 0
            or self.paused
            or self.policy is not None
            or message.group_id is not None
            or (pages is not None and pages.messages)
            or (message.expiration_ms and self._moment.ms >= message.expiration_ms)
        ):
            self.dispatch(out)
            return
        if returned:  # `ref` itself; a list's pop is native, `(fresh or returned).pop()`
            returned.pop()  # a generic method call (~350 instructions a redelivery)
        else:
            fresh.pop()
        self._ready -= 1
        self._rr = 1  # `_deliver`'s rotation past index 0 of one active consumer
        self._send(consumer, ref, out)
        if consumer.drain and consumer.credit > 0 and consumer.window.room > 0:
            consumer.credit = 0  # what `dispatch` ends with: a drain with nothing left
            consumer.drain = False
            out.append(Drained(consumer.id))

    def _deliver(self, active: list[Consumer], out: list[Effect]) -> None:
        skipped: list[Ref] | None = None
        picky = False
        for c in active:
            if not c.plain:  # a selector or a size limit (browsers are not active)
                picky = True
                break
        policy = self.policy  # B-122/B-127/B-128 (core/dispatch.py); None: a plain queue
        ranked = self._prioritized
        moment = self._moment
        allowance = -1  # beyond the read limits, for a drain (`_drain_allowance`)
        while active:
            ref = self._pop_next() if self._ready else None
            if ref is None:
                pages = self.pages
                if pages is None or not pages.messages:
                    break
                if allowance < 0:
                    allowance = self._drain_allowance(active)
                # B-151 PAGE: the next slice of the page files; a drain goes beyond the
                # limits only while nothing read waits in memory (a selector's misses
                # stop it: memory never fills with what no drainer takes) and less than
                # a step waits for its delivery time (each drain would pull its credit's
                # worth of messages due later in)
                waiting = skipped is not None or self._scheduled_live >= READ_STEP_MESSAGES
                beyond = 0 if waiting else allowance
                kept = self._depage(empty=True, beyond=beyond)
                if not kept:
                    break
                allowance = max(0, allowance - kept)
                continue
            message = ref.message
            expiration = message.expiration_ms
            if expiration and moment.ms >= expiration and self.expire(ref, popped=True):
                continue  # B-084: an expired message is never sent to a consumer
            count = len(active)
            index = self._rr % count
            chosen = None
            prioritized = ranked
            if policy is None and message.group_id is None:
                owner = None  # the plain path: no policy, no group
            else:
                if policy is None:
                    policy = self._group_policy()
                owner = None if policy is None else policy.owner(ref)
            if owner is not None:  # B-122/B-127: only the owner; the rotation stays put
                prioritized = True
                if owner.credit > 0 and owner.window.room > 0 and owner.accepts(ref):
                    chosen = owner
            elif prioritized:
                chosen = self._by_priority(active, ref)  # rotates self._rr itself
            elif not picky and ref.blocked is None:
                chosen = active[index]
            else:
                for i in range(count):
                    candidate = active[(index + i) % count]
                    if candidate.accepts(ref):
                        chosen, index = candidate, (index + i) % count
                        break
            if chosen is None:
                if skipped is None:
                    skipped = []
                skipped.append(ref)
                continue
            if not prioritized:
                self._rr = index + 1
            self._send(chosen, ref, out)
            if policy is not None:
                dispatch = out[-1]
                assert isinstance(dispatch, Dispatch)
                policy.sent(chosen, ref, dispatch, self.first_marker)
            if chosen.credit == 0:
                active.remove(chosen)
            if chosen.window.room <= 0:  # issue 15: its connection has enough to write
                active = [c for c in active if c.window.room > 0]
        if skipped is not None:
            for ref in skipped:
                self._put_back(ref)

    def _group_policy(self) -> DispatchPolicy[Consumer] | None:
        """B-127: the first message with a group-id gives a plain queue its policy, unless
        grouping is off (group-buckets 0)."""
        if self.config.group_buckets == 0:
            return None
        self.policy = DispatchPolicy(self.config)
        return self.policy

    def _consumers_changed(self) -> None:
        """Keep what dispatch reads of the consumers once, not per message: whether any is
        a browser, and whether their priorities differ (B-035)."""
        consumers = self.consumers
        self._browsers = sum(1 for c in consumers if c.browser)
        self._prioritized = len(consumers) > 1 and any(
            c.priority != consumers[0].priority for c in consumers
        )

    def _by_priority(self, active: list[Consumer], ref: Ref) -> Consumer | None:
        """B-035: the highest-priority consumer able to take `ref`, round-robin among
        equals; lower priorities only when no higher one can."""
        for level in sorted({c.priority for c in active}, reverse=True):
            group = [c for c in active if c.priority == level]
            start = self._rr % len(group)
            for i in range(len(group)):
                candidate = group[(start + i) % len(group)]
                if candidate.accepts(ref):
                    self._rr = start + i + 1
                    return candidate
        return None

    def _send(self, consumer: Consumer, ref: Ref, out: list[Effect]) -> None:
        consumer.credit -= 1
        consumer.dispatched += 1
        consumer.window.room -= ref.message.size
        ref.state = DELIVERING
        ref.delivery_count += 1  # B-040: before the transfer is written
        if ref.stored_count is not None and self.store is not None and self.store.before_delivery:
            self.store.count_before_delivery(self.name, ref)  # B-097
        delivery = self._delivery_ids.take()
        out.append(
            Dispatch(
                consumer.id, delivery, ref.message, ref.delivery_count - 1, consumer.presettled
            )
        )
        if self.emitter.all:
            self.note(consumer.event_dispatched, ref, None)  # never txn (B-170)
        if consumer.presettled:
            self._acknowledge(ref, consumer)  # B-037: at-most-once, acknowledged as written
        else:
            consumer.unsettled[delivery] = ref
            self.delivering += 1

    def _browse(self, browsers: list[Consumer], out: list[Effect]) -> None:
        """B-031: browsers see messages without acquiring them or changing counts. Read
        lazily (`iter_refs`): a browser with little credit on a big queue costs its page,
        not a sort of the whole queue on every dispatch."""
        for browser in browsers:
            for ref in self.iter_refs():
                if browser.credit <= 0 or browser.window.room <= 0:
                    break
                if ref.seq <= browser.browsed_seq or not browser.accepts(ref):
                    continue
                expiration = ref.message.expiration_ms
                if expiration and self._moment.ms >= expiration:
                    continue  # B-084: never sent, not even to a browser
                browser.browsed_seq = ref.seq
                browser.credit -= 1
                browser.dispatched += 1
                browser.window.room -= ref.message.size
                delivery = self._delivery_ids.take()
                out.append(Dispatch(browser.id, delivery, ref.message, ref.delivery_count, True))
            else:
                if self.pages is not None and self.pages.messages:
                    self._browse_pages(browser, self.pages, out)
                elif browser.page_mark is not None:
                    browser.page_mark.walking = False  # nothing paged is left to walk

    def _browse_pages(self, browser: Consumer, pages: PageStore, out: list[Effect]) -> None:
        """B-031 over B-151: a browser that has seen what memory holds goes on into the
        page files, read as its credit and window allow (core/paging.py `PageMark`),
        skipping at most a read step (`READ_STEP_MESSAGES` / `READ_STEP_BYTES`) of
        messages it does not take per call: a selector that matches nothing walked every
        page file in one dispatch (issue 23: a 10 GiB backlog would hold the loop); past
        the step the walk goes on next loop turn (`tick`), and a drain waits for it
        (`mark.walking`)."""
        if browser.credit <= 0 or browser.window.room <= 0:
            return
        mark = browser.page_mark
        if mark is None:
            mark = browser.page_mark = PageMark(pages)
        elif mark.walking:
            # It stopped at a step this loop turn: `tick` walks it on. Every message paged
            # is a dispatch, and a producer's burst walked a step for each (h-attack).
            return
        now_ms = self._moment.ms
        skipped = skipped_bytes = 0  # what is sent is bounded by the credit and window
        for message, end in pages.browse_from(mark.start(pages)):
            if browser.credit <= 0 or browser.window.room <= 0:
                break
            if skipped >= READ_STEP_MESSAGES or skipped_bytes >= READ_STEP_BYTES:
                mark.walking = True  # the rest next turn, from `mark.position`
                if not self._page_browse_ms:
                    self._page_browse_ms = now_ms
                    self._owner.schedule(now_ms)
                break
            mark.seen += 1
            mark.position = end
            expiration = message.expiration_ms
            if (expiration and now_ms >= expiration) or not browser.accepts(Ref(message, -1)):
                skipped += 1
                skipped_bytes += message.size
                continue  # B-084: never sent, not even to a browser
            browser.credit -= 1
            browser.dispatched += 1
            browser.window.room -= message.size
            delivery = self._delivery_ids.take()
            out.append(Dispatch(browser.id, delivery, message, 0, True))

    # -- settlement -------------------------------------------------------------------
    def _removed(self, ref: Ref) -> None:
        ref.state = GONE
        by_id = self._by_id
        if by_id.get(ref.message.msg_id) is ref:
            del by_id[ref.message.msg_id]
            left = len(by_id)
            if left >= _INDEX_FLOOR and not left & (left - 1):  # a power of two: a look
                self._fit_index(left)
        if ref.stored_count is not None and self.store is not None:
            self.store.ref_removed(self.name, ref)
        self._size_changed(-ref.message.size)

    def _fit_index(self, left: int) -> None:
        """Rebuild `_by_id` when its table is far larger than its `left` entries need. A
        dict keeps the table of its largest size as entries leave: after a purge or a
        drain of 1M messages it held ~40 MB for no entry, for good (issue 23: RSS after a
        purge). Looked at only when `left` reaches a power of two on the way down, from
        `_INDEX_FLOOR` up (the last look leaves at most 160 KB of table for the rest; a queue
        that empties after each message does not look at all: an empty index looked at
        on every acknowledgement cost ~800 instructions a message in bench/core_loop.py),
        and rebuilt (O(left)) only when the table is `_INDEX_SLACK` times what `left`
        needs: O(1) amortized per removal."""
        if sys.getsizeof(self._by_id) > _INDEX_SLACK * _INDEX_ENTRY_BYTES * (left + 64):
            self._by_id = dict(self._by_id)  # sized for what it holds

    def _size_changed(self, delta_bytes: int) -> None:
        """The queue holds `delta_bytes` more (or fewer): its size, its address's and the
        broker's (B-151)."""
        self.size_bytes += delta_bytes
        if self._memory.changed(self.address, delta_bytes):
            self._owner.freed(self)

    def _acknowledge(self, ref: Ref, consumer: Consumer) -> None:
        self.counters.acknowledged += 1
        consumer.acked += 1
        self.used = True
        self._removed(ref)
        if self.emitter.all:
            self.note(consumer.event_acked, ref, self.emitter.txn_extra)

    def settle(
        self,
        consumer: Consumer,
        delivery: DeliveryId,
        outcome: Outcome,
        now_ms: int,
        out: list[Effect],
        *,
        reason: str | None = None,
    ) -> bool:
        """Apply a consumer's outcome (B-041…B-046). False if the delivery is not held
        (B-055: ignored). `reason` names a return in events and metrics (B-171)."""
        if consumer.browser:
            return True
        unsettled = consumer.unsettled
        ref = unsettled.get(delivery)  # get and del: compiled, `pop` is a method call
        if ref is None:
            return False
        del unsettled[delivery]
        self.delivering -= 1
        kind = self.kind
        if kind is not None and kind.non_destructive:
            kind.settled(consumer)  # B-123: any outcome only ends the delivery
        elif type(outcome) is _ACCEPTED:
            self._acknowledge(ref, consumer)
        elif type(outcome) is _RELEASED:  # the commoner outcomes first (issue 20)
            ref.delivery_count -= 1
            self._return(ref, now_ms, delay=True, reason="released", consumer=consumer)
        elif type(outcome) is _REJECTED:
            self._kill_to_dla(ref, "rejected", outcome)
        elif type(outcome) is _MODIFIED:
            if outcome is _FAILED:  # B-044, no block: both fields known (issue 20)
                failed = True
                undeliverable = False
            else:
                failed = outcome.delivery_failed
                undeliverable = outcome.undeliverable_here
            if not failed:
                ref.delivery_count -= 1
            if undeliverable:
                if ref.blocked is None:
                    ref.blocked = set()
                ref.blocked.add(consumer.id)
            if reason is None:
                reason = "modified-failed" if failed else "modified"
            self._return(ref, now_ms, delay=True, reason=reason, consumer=consumer)
        consumers = self.consumers
        if ref.state == READY and len(consumers) == 1 and self._ready == 1 and kind is None:
            self._hand_over(consumers[0], ref, out)  # back, and at once out again
        else:
            self.dispatch(out)
        return True

    def _return(
        self, ref: Ref, now_ms: int, *, delay: bool, reason: str, consumer: Consumer | None
    ) -> None:
        at_ms = redelivery_at(self.settings(), ref.delivery_count, now_ms, self._rng, delay)
        if at_ms == DEAD_LETTER:
            self._kill_to_dla(ref, MAX_ATTEMPTS, None)
            return
        store = self.store
        if ref.stored_count is not None and store is not None:
            store.count_changed(self.name, ref)  # B-095
            if at_ms > now_ms:
                store.scheduled(self.name, ref, at_ms)
        self.counters.returned += 1  # B-171: it went back to its queue
        self.counters.count(self.counters.returned_by_reason, reason)
        if self.emitter.failures:
            self._note_returned(ref, consumer, reason, at_ms - now_ms)
        if at_ms > now_ms:
            heapq.heappush(self._scheduled, (at_ms, ref.seq, ref))
            ref.state = SCHEDULED
            self._scheduled_live += 1
            self._owner.schedule(at_ms)
            if ref.message.expiration_ms:
                self._owner.track_expiry(self, ref)  # it may expire while it waits
        else:
            self._put_back(ref)

    def _note_returned(
        self, ref: Ref, consumer: Consumer | None, reason: str, delay_ms: int
    ) -> None:
        """The `returned` event (B-171), as `event` records it. A consumer's return outside
        a transaction, the common case (a redelivery's return leg), takes the shape the
        consumer keeps for `reason` and, without a delay, one shared `extra` (issue 20:
        the two tuples were built per return, and `marshal` then wrote them in full)."""
        if consumer is None or self.emitter.txn_extra is not None:
            self.event("returned", ref, consumer, reason=reason, delay_ms=delay_ms)
            return
        shapes = consumer.event_returned
        shape = shapes.get(reason)
        if shape is None:
            shape = shapes[reason] = ("returned", self.event_where, consumer.event_by, reason)
        self.note(
            shape,
            ref,
            _RETURNED_AT_ONCE
            if delay_ms == 0
            else (None, None, None, None, delay_ms, None, None, None),
        )

    def kill(self, ref: Ref, reason: str) -> None:
        """Remove a waiting reference for good (purge, a failed store): counted as killed
        for `reason`, event `killed`."""
        self.take(ref)
        self.counters.killed += 1
        self.killed(ref, reason)

    def killed(self, ref: Ref, reason: str) -> None:
        """The reason-bookkeeping of a kill (`killed_by_reason`, event `killed`): the one
        place for it, also for a dead-letter that found nowhere to go."""
        self.counters.count(self.counters.killed_by_reason, reason)
        if self.emitter.failures:
            self.event("killed", ref, reason=reason)

    def _kill_to_dla(self, ref: Ref, reason: str, rejection: Rejected | None) -> None:
        self.counters.killed += 1
        self.used = True
        self._removed(ref)
        self._owner.dead_letter(self, ref, reason, rejection)

    def hold(self, consumer: Consumer, delivery: DeliveryId) -> bool:
        """B-142: a rolled-back transactional accept of an unsettled delivery. It stays
        acquired by the same link and its count goes up by 1."""
        ref = consumer.unsettled.get(delivery)
        if ref is None:
            return False
        kind = self.kind
        if kind is None or not kind.non_destructive:  # B-123: the count is not changed
            ref.delivery_count += 1
            if ref.stored_count is not None and self.store is not None:
                self.store.count_changed(self.name, ref)
        if self.emitter.failures:
            self.event("held", ref, consumer, reason="tx-rollback")
        return True

    def tick(self, now_ms: int, out: list[Effect]) -> None:
        """Move due scheduled references back to ready (B-065: at their old place)."""
        scheduled = self._scheduled
        moved = False
        while scheduled and scheduled[0][0] <= now_ms:
            ref = heapq.heappop(scheduled)[2]
            if ref.state == SCHEDULED:
                self._scheduled_live -= 1
                self._put_back(ref)
                moved = True
        if (moved or self.policy is not None) and self.consumers:
            self.dispatch(out)  # a policy's delay-before-dispatch may be what is due
        if 0 < self._purge_due_ms <= now_ms:
            self._purge_paged_step(now_ms, out)
        if 0 < self._page_expiry_ms <= now_ms:
            self.expire_paged(now_ms, out)
        if 0 < self._page_browse_ms <= now_ms:
            self._page_browse_ms = 0
            for consumer in self.consumers:
                if (mark := consumer.page_mark) is not None:
                    mark.walking = False  # a new loop turn: a step more (`_browse_pages`)
            if self.consumers:
                self.dispatch(out)  # B-031 over B-151: browsers walk on, a step a turn

    # -- consumers --------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._consumers_changed()
        if self.policy is not None:
            self.policy.consumer_added(consumer, self._moment.ms)
            if (due := self.policy.deadline_ms()) is not None:
                self._owner.schedule(due)

    def remove_consumer(
        self, consumer: Consumer, now_ms: int, out: list[Effect], *, abrupt: bool
    ) -> None:
        """Return what the consumer held: B-053 (orderly: undo the count) or B-054
        (abrupt: the loss counts as an attempt). Never delayed."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            self._consumers_changed()
        if self.policy is not None:
            self.policy.consumer_removed(consumer, self.consumers)
        held = sorted(consumer.unsettled.values())
        consumer.unsettled.clear()
        self.delivering -= len(held)
        if self.kind is not None and self.kind.non_destructive:
            held = []  # B-123: they never left the queue
        reason = "connection-lost" if abrupt else "link-closed"
        for ref in held:
            if not abrupt:
                ref.delivery_count -= 1
            self._return(ref, now_ms, delay=False, reason=reason, consumer=consumer)
        self.used = True
        self.idle_since_ms = now_ms
        if self.purging and not self.consumers:
            purge_on_no_consumers(self)  # B-126, after the returns: they go too
        elif held and self.consumers:
            self.dispatch(out)

    def set_credit(self, consumer: Consumer, credit: int, drain: bool, out: list[Effect]) -> None:
        consumer.credit = credit
        consumer.drain = drain
        self.dispatch(out)

    def remove_all(self) -> list[Ref]:
        """Take every ready and scheduled reference out (purge, delete)."""
        taken: list[Ref] = []
        while (ref := self._pop_next()) is not None:
            taken.append(ref)
        taken.extend(entry[2] for entry in self._scheduled if entry[2].state == SCHEDULED)
        self._scheduled.clear()
        self._scheduled_live = 0
        for ref in taken:
            self._removed(ref)
        return taken

    def change_priority(self, changed: list[tuple[Ref, Message]]) -> None:
        """B-161 changeMessagesPriority: each waiting reference takes its re-prioritized
        message and a ready one goes to the tail of its new level (Artemis `addTail`); a
        scheduled one takes its level when due. Not journaled, as in Artemis."""
        moving = {id(ref) for ref, _ in changed if ref.state == READY}
        if 0 < len(moving) <= _FEW:  # by id: out of its level in O(log n), no rebuild
            for ref, _ in changed:
                if id(ref) in moving:
                    _unlink(ref, self._fresh[ref.message.priority], self._returned)
        elif moving:
            for level in range(_LEVELS):
                self._fresh[level] = deque(r for r in self._fresh[level] if id(r) not in moving)
                returned = [r for r in self._returned[level] if id(r) not in moving]
                heapq.heapify(returned)
                self._returned[level] = returned
        for ref, message in changed:
            delta = message.size - ref.message.size
            ref.message = message
            self._size_changed(delta)
            if id(ref) in moving:
                ref.seq = next(self._seq)
                self._fresh[message.priority].append(ref)
                self._top = max(self._top, message.priority)

    def take(self, ref: Ref) -> None:
        """Remove a waiting (ready, scheduled or paged) reference, for management (B-161);
        a paged one goes from the page files at `remove_paged`."""
        if ref.state == PAGED:
            assert isinstance(ref, PagedRef), "paged references come from `paged_refs`"
            self._doomed.append((ref.at, ref.message.size))
            ref.state = GONE
            self.used = True
            return
        if ref.state == READY:
            self._ready -= 1
        elif ref.state == SCHEDULED:
            self._scheduled_live -= 1
        else:
            raise ValueError(f"reference {ref.message.msg_id} is not waiting")
        self.used = True
        self._removed(ref)

    def expire(self, ref: Ref, *, popped: bool = False) -> bool:
        """Expire a ready or scheduled reference (B-084/B-085). False when it is being
        delivered, already gone, or expiry is disabled for this queue (B-087).
        `popped`: dispatch already took it out of the ready count."""
        if ref.state == DELIVERING or ref.state == GONE:
            return False
        if self.settings().expiry_address == self.address:
            return False  # B-087: expiry address equal to the queue's own address
        if ref.state == PAGED:
            self.take(ref)  # B-151: it leaves the page files at `remove_paged`
        else:
            if not popped:
                if ref.state == READY:
                    self._ready -= 1
                else:
                    self._scheduled_live -= 1
            self._removed(ref)
        self._expired(ref)
        return True

    def _expired(self, ref: Ref) -> None:
        """`ref` has left the queue, expired: counted, and moved or dropped (B-085)."""
        self.counters.expired += 1
        self.used = True
        self._owner.expired(self, ref)

    # -- paging (B-151 PAGE: core/paging.py) ---------------------------------------------
    def page(self, message: Message, out: list[Effect], *, reason: str = "route") -> None:
        """Write `message` to the page files instead of memory: an arrival like `add`'s
        (counted, event `enqueued`); `dispatch` reads it back in its turn."""
        pages = self.pages
        assert pages is not None, "the broker opens the page files first"
        committed = pages.committed
        pages.write(message)
        if pages.committed != committed and self.store is not None:
            self.store.moved_in(self.name, pages)  # a walk's copy: journaled with its move
        if message.expiration_ms and not self._page_expiry_ms:
            self._arm_page_expiry(message.expiration_ms)  # B-084: checked when due
        if self.store is not None and message.durable:
            self.store.paged()
        self.counters.added += 1
        if self.emitter.all:
            shape = (
                self.event_enqueued
                if reason == "route"
                else ("enqueued", self.event_where, None, reason)
            )
            self.note(shape, Ref(message, -1), self.emitter.txn_extra)
        if self.consumers:
            self.dispatch(out)

    def _depage(self, *, empty: bool = False, beyond: int = 0) -> int:
        """Read paged messages back up to max-read-page-bytes and -messages in memory, once
        the queue's memory is under half of them (or nothing is ready: `empty`), so that
        they come back in slices, not one file read per message; durable ones are
        journaled as they come in, with the page cursor, in one append
        (core/persistence.py `page_read`). `beyond`: with memory at the limits, a step
        of at most this many is read anyway (a drain, `_drain_allowance`). How many
        were kept (read and not expired)."""
        pages = self.pages
        assert pages is not None
        if self.walk is not None or self._purge_until is not None:
            # a management walk owns the page cursor until it ends (`walk_ended`); a
            # purge's paged part is not read back, it is killed (`purge_paged_later`)
            return 0
        settings = self.settings()
        max_bytes, max_messages = settings.max_read_page_bytes, settings.max_read_page_messages
        size, count = self.size_bytes, self.memory_count
        if 0 <= max_bytes <= size or 0 <= max_messages <= count:
            if beyond <= 0:
                return 0
            read_bytes, read_messages = READ_STEP_BYTES, min(beyond, READ_STEP_MESSAGES)
        elif not empty and (0 <= max_bytes < 2 * size or 0 <= max_messages < 2 * count):
            return 0
        else:
            read_bytes = (
                min(max_bytes - size, READ_STEP_BYTES) if max_bytes >= 0 else READ_STEP_BYTES
            )
            read_messages = (
                min(max_messages - count, READ_STEP_MESSAGES)
                if max_messages >= 0
                else READ_STEP_MESSAGES
            )
        # a step at a time: the loop is not held (core/paging.py)
        position = pages.position
        messages = pages.read(max_bytes=read_bytes, max_messages=read_messages)
        # journaled already (a recovered queue's part left in the journal, issue 23):
        # their counts and times, nothing written but the acks of those that expire
        restored = pages.restored
        if pages.lost != self._pages_lost:
            self._count_lost(pages)
        store = self.store
        kind = self.kind
        now_ms = self._moment.ms
        expires = settings.expiry_address != self.address  # B-087
        seqs: list[int] = []
        kept = 0
        for i, message in enumerate(messages):
            expiration = message.expiration_ms
            if expiration and now_ms >= expiration and expires:
                seqs.append(-1)
                gone = Ref(message, -1)
                gone.state = GONE
                if restored is not None and store is not None:
                    store.ref_removed(self.name, gone)
                self._expired(gone)  # B-084: expired as it is read back, never delivered
                continue
            kept += 1
            if restored is not None:
                count, at_ms = restored[i]
                ref = self._enqueue(message, count, at_ms)  # B-095, B-065: as recovered
                ref.stored_count = count
                seqs.append(ref.seq)
            else:
                ref = self._enqueue(message, 0, message.deliver_at_ms)
                seqs.append(ref.seq)
                if store is not None and message.durable:
                    at_ms = message.deliver_at_ms if ref.state == SCHEDULED else 0
                    store.ref_added(self.name, ref, scheduled_at_ms=at_ms)
            if kind is not None:  # it enters the queue now (B-120, B-121, B-123)
                kind.arrived(ref)
                kind.trim()
        if store is not None and restored is None and (messages or pages.position != position):
            # also a read that only passed a damaged page file (issue 23 fix 4): else its
            # cursor was not journaled, and a restart met the damage again
            store.page_read(self.name, pages)
        for consumer in self.consumers:
            if (mark := consumer.page_mark) is not None:
                consumer.browsed_seq = max(consumer.browsed_seq, mark.read(seqs))
                if not mark.seen:
                    consumer.page_mark = None  # back at the read cursor
        if messages and not kept and pages.messages:
            self._arm_page_expiry(now_ms)  # a step of expired ones: the next, next turn
        return kept

    def attach_pages(self, pages: PageStore) -> None:
        """The queue's page files, opened (first paging, or found by a restart): what they
        hold may expire (issue 23 defect 2: a recovered paged message whose TTL passed
        while the broker was down waited for the first periodic expiry scan, or forever
        with the scan off), so the expiry is armed for their earliest expiration now."""
        self.pages = pages
        self._pages_lost = pages.lost
        if pages.expiring_ms:
            self._arm_page_expiry(pages.expiring_ms)
        if self.store is not None:  # what the open passed (a lost move's copies) is
            self.store.page_read(self.name, pages)  # journaled before anything else

    def _count_lost(self, pages: PageStore) -> None:
        """Paged messages lost to a damaged page file (`PageStore.lost`, counted there as
        the damage is met) go to the queue's counters: the per-address metric and the
        API's `paged_lost` (issue 23 fix 3), kept across queue incarnations as the other
        counters are (core/totals.py)."""
        self.counters.paged_lost += pages.lost - self._pages_lost
        self._pages_lost = pages.lost

    def _arm_page_expiry(self, at_ms: int) -> None:
        """Have `tick` call `expire_paged` at `at_ms` (one pending time per queue)."""
        if not self._page_expiry_ms or at_ms < self._page_expiry_ms:
            self._page_expiry_ms = at_ms
            self._owner.schedule(at_ms)

    def expire_paged(self, now_ms: int, out: list[Effect]) -> int:
        """B-084/B-085 for paged messages (issue 23), with or without a consumer: when
        the earliest paged expiration is due, read back a step (`_depage`: expired ones
        go to the expiry address as they are read); again on the next loop turn while
        steps find expired ones. Called by `tick` and by the periodic expiry scan. Stops
        at live messages: with no consumer once a step of them is in memory (a queue
        nobody drains does not pull max-read-page-bytes in), else when memory is full
        (as Artemis: only depaged messages expire). How many expired."""
        self._page_expiry_ms = 0
        pages = self.pages
        if pages is None or not pages.expiring_ms or pages.expiring_ms > now_ms:
            if pages is not None and pages.expiring_ms:
                self._arm_page_expiry(pages.expiring_ms)
            if self.consumers:
                self.dispatch(out)  # a drain that waited for this read back (`_reading_on`)
            return 0
        if not self.consumers and (
            self.size_bytes >= READ_STEP_BYTES or self.memory_count >= READ_STEP_MESSAGES
        ):
            return 0  # live ones at the head: no consumer, no more memory (B-151 bound)
        before = self.counters.expired
        self._depage(empty=True)
        expired = self.counters.expired - before
        if expired and pages.messages:
            self._arm_page_expiry(now_ms)  # there may be more behind: the next loop turn
        if self.consumers:
            self.dispatch(out)
        return expired

    def paged_refs(
        self, until: tuple[int, int] | None = None, start: tuple[int, int] | None = None
    ) -> Iterator[Ref]:
        """The paged messages in order, as references in state PAGED (for management:
        `take` or `kill` them, then `remove_paged`); with `until` (a `pages.end`), none
        written after it (a walk does not chase a producer); from `start` (a `PagedRef.at`
        of the current `pages.epoch`, past the cursor) rather than from the cursor."""
        pages = self.pages
        if pages is None:
            return
        for message, end in pages.browse_from(pages.position if start is None else start):
            if until is not None and end > until:
                return
            yield PagedRef(message, end)

    def walk_ended(self) -> None:
        """A management walk let the queue go (core/operations `Walk`): what it held up
        goes on (paged expiry, reading back for consumers)."""
        self.walk = None
        if self._purge_until is not None:  # a purge that waited for the walk: its turn
            self.walk = _PURGE
            self._purge_due_ms = self._moment.ms
            self._owner.schedule(self._purge_due_ms)
            return
        pages = self.pages
        if pages is not None and pages.expiring_ms:
            self._arm_page_expiry(pages.expiring_ms)

    def remove_paged(self) -> None:
        """The paged messages taken since the last call leave the page files (`skip`:
        nothing is rewritten; the cursor moves past those that are next), and, for a
        durable queue, the skips and the cursor are journaled with this step (a move's
        copies are in it: a crash repeats no move and loses none). A management walk
        calls this after each slice (issue 23)."""
        pages, doomed = self.pages, self._doomed
        if pages is None or not doomed:
            return
        self._doomed = []
        marks = [c for c in self.consumers if c.page_mark is not None]
        for consumer in marks:  # B-031: the removed ones it was sent leave its count
            mark = consumer.page_mark
            assert mark is not None
            if mark.epoch == pages.epoch:
                mark.removed(at for at, _ in doomed)
        pages.skip(doomed)
        for consumer in marks:
            mark = consumer.page_mark
            if mark is not None and not mark.seen:
                consumer.page_mark = None  # back at the read cursor
        self._count_lost(pages)
        if self.store is not None:
            self.store.page_read(self.name, pages)

    def purge_paged_later(self) -> int:
        """B-126 over B-151: the last consumer left a queue with paged messages: kill
        them a read step a loop turn (`tick`, `_purge_paged_step`), not all in this one
        (issue 23: a paged backlog of 1M held the loop ~20 s), up to where the files end
        now. Meanwhile the queue is held as by a management walk (nothing is read back,
        a walk waits its turn or is refused at once); one already walking it goes first.
        Each step is journaled with its cursor (`purge_paged_step`), so a crash leaves
        every paged message purged or still there, never purged and back. How many
        paged messages the purge has to go through."""
        pages = self.pages
        if pages is None or not pages.messages:
            return 0
        self._purge_until = pages.end  # a consumer that left again: up to the new end
        if self.walk is None:
            self.walk = _PURGE  # held from now (a walk already running goes first)
        self._purge_due_ms = self._moment.ms
        self._owner.schedule(self._purge_due_ms)
        return pages.messages

    @property
    def purging_pages(self) -> bool:
        """Whether a purge-on-no-consumers is still killing paged messages (B-126)."""
        return self._purge_until is not None

    def _purge_paged_step(self, now_ms: int, out: list[Effect]) -> None:
        self._purge_due_ms = 0
        until = self._purge_until
        if until is None:
            return
        if self.walk is not _PURGE:
            return  # a management walk holds the queue: `walk_ended` brings it back
        _, done = self.purge_paged_step(PURGE_ON_NO_CONSUMERS, until)
        if not done:
            self._purge_due_ms = now_ms  # the next step on the next loop turn
            self._owner.schedule(now_ms)
            return
        self._purge_until = None
        self.walk_ended()
        if self.consumers:  # (attached meanwhile) what came after the purge
            self.dispatch(out)

    def purge_paged_step(
        self, reason: str, until: tuple[int, int] | None = None, most: int = READ_STEP_MESSAGES
    ) -> tuple[int, bool]:
        """A read step of a purge of every paged message (at most `most` and
        READ_STEP_MESSAGES), killed and evented one by one without being held, so that
        a walk can give the loop back between steps (issue 23); with `until` (a
        `pages.end`), the messages written after it stay. How many it killed, and
        whether it is done."""
        pages = self.pages
        if pages is None or not pages.messages:
            return 0, True
        most = max(1, min(most, READ_STEP_MESSAGES))
        step = pages.read(max_bytes=READ_STEP_BYTES, max_messages=most, until=until)
        restored = pages.restored
        store = self.store
        for message in step:
            ref = Ref(message, -1)
            ref.state = PAGED
            if restored is not None and store is not None:
                store.ref_removed(self.name, ref)  # journaled already: acknowledged
            self.counters.killed += 1
            self.killed(ref, reason)
        self._count_lost(pages)
        self.used = True
        done = not step or not pages.messages
        cleared = done and (until is None or not pages.messages)
        if cleared:  # (without `until`, also what a damaged file left uncounted)
            pages.clear()
        for consumer in self.consumers:
            mark = consumer.page_mark
            if mark is not None:
                mark.read([-1] * len(step))  # the killed ones it was sent leave its count
                if cleared or not mark.seen:
                    consumer.page_mark = None  # B-031: back at the read cursor
        if self.store is not None:
            self.store.page_read(self.name, pages)
        return len(step), done

    def compact(self, *, removed: int | None = None) -> None:
        """Drop the references removed from the middle of the queue (marked GONE, left in
        place for `_pop_next`) after a bulk removal, so their messages' memory is freed
        now rather than when dispatch reaches them (issue 23: RSS after a purge).

        `removed`: how many a management operation just took. The containers are rebuilt
        only once those taken since the last rebuild are an eighth of what memory holds,
        so that removing one message by id is O(1) amortized, not a pass over the queue
        (issue: management on big queues), while a bulk removal still frees at once."""
        if removed is not None:
            self._taken += removed
            if self._taken * 8 < self.memory_count:
                return
        self._taken = 0
        for level in range(_LEVELS):
            fresh = self._fresh[level]
            if any(ref.state == GONE for ref in fresh):
                self._fresh[level] = deque(ref for ref in fresh if ref.state != GONE)
            returned = self._returned[level]
            if any(ref.state == GONE for ref in returned):
                kept = [ref for ref in returned if ref.state != GONE]
                heapq.heapify(kept)
                self._returned[level] = kept
        if any(entry[2].state != SCHEDULED for entry in self._scheduled):
            self._scheduled = [e for e in self._scheduled if e[2].state == SCHEDULED]
            heapq.heapify(self._scheduled)


# `Queue._fit_index`: the most a dict of int keys takes per entry when sized for them (the
# index and the entry table, each up to twice what it holds), and how many times that
# its table may take before it is rebuilt.
_INDEX_ENTRY_BYTES = 64
_INDEX_SLACK = 8
_INDEX_FLOOR = 256

# What holds `Queue.walk` while a purge-on-no-consumers kills the paged part (B-126).
_PURGE = object()


def _unlink(ref: Ref, fresh: deque[Ref], returned: list[list[Ref]]) -> None:
    """Take a ready `ref` out of its level. In its fresh deque (in `seq` order) it is
    found by bisection and its place taken by a GONE stand-in with its `seq`, which
    dispatch and `compact` drop like any removed reference: O(log n) C-level steps, where
    a `remove` would compare with every reference before it. Else it is in the level's
    returned heap (few: returns wait there)."""
    i = bisect_left(fresh, ref.seq, key=_seq)
    if i < len(fresh) and fresh[i] is ref:
        stand_in = Ref(ref.message, ref.seq)
        stand_in.state = GONE
        fresh[i] = stand_in
        return
    heap = returned[ref.message.priority]
    heap.remove(ref)
    heapq.heapify(heap)


def _seq(ref: Ref) -> int:
    return ref.seq
