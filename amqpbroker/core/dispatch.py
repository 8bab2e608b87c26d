"""Which consumer may take a message, and whether a queue may dispatch at all: exclusive
queues (B-122), message groups (B-127), consumers-before-dispatch / delay-before-dispatch
(B-128), and the purge of a purge-on-no-consumers queue (B-126).

Theory of operation
-------------------
`Queue` picks consumers itself (credit, round-robin, consumer priority B-035). A queue
that uses one of these features also has a `DispatchPolicy` (`Queue.policy`), which it
consults at three points, each a single `policy is not None` test on the plain path:

* **owner** (`DispatchPolicy.owner`): before choosing, the consumer that must take this
  message, if any: the exclusive consumer of an exclusive queue, else the owner of the
  message's group. An owner without credit, window or a matching selector leaves the
  message waiting in its place; nobody else gets it (Artemis: the group consumer
  overrides the round-robin choice). No owner: the queue chooses as usual.
* **sent** (`DispatchPolicy.sent`): after a message went to a consumer. On an exclusive
  queue the first consumer served becomes the exclusive consumer. Otherwise a message with
  a group-id makes the consumer the group's owner when it has none, and a group-sequence
  of -1 (0xFFFFFFFF as the AMQP uint) closes the group after this message. A new owner's
  first message carries the application property `group-first-key` = true (Artemis
  `GroupFirstMessageReference`: a copy for this delivery only, the stored message
  unchanged).
* **gate** (`DispatchPolicy.may_dispatch`): a queue with consumers-before-dispatch N > 0
  dispatches once N consumers are attached, or delay-before-dispatch ms after its first
  consumer attached, whichever comes first (Artemis `canDispatch`), and never while
  deliveries from before the gate closed are still out (ordering). The last consumer
  leaving closes the gate again. group-rebalance clears every group owner when a
  consumer attaches; with group-rebalance-pause-dispatch it also closes the gate until
  the deliveries in flight are settled, so no group is served by two consumers at once.

Group owners are kept by group-id (`group-buckets` -1), or by one of N buckets a group-id
hashes to (CRC-32, so a bucket is stable across restarts and processes); `group-buckets`
0 turns grouping off, as an exclusive queue does. A queue whose config needs none of this
gets its policy on the first message with a group-id (`Queue._group_policy`), so plain
queues pay one attribute test per message.

purge-on-no-consumers is not dispatch but shares its lifecycle: while the queue has no
consumers routing skips it (`Queue.accepts_message`), and when the last consumer leaves
`purge_on_no_consumers` kills what waits, reason `purge-on-no-consumers` (B-171). The kills
are journaled as any removal, so a restart does not bring them back.

Loop thread only.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from amqpbroker.core.effects import Dispatch
from amqpbroker.core.model import Message, QueueConfig
from amqpbroker.core.refs import Ref

log = logging.getLogger(__name__)

# group-sequence -1 closes the group (Artemis reads the AMQP uint as a Java int).
GROUP_CLOSE_SEQUENCES = frozenset((-1, 0xFFFFFFFF))

# Writes `key: true` into a copy of the message's application-properties (the protocol
# codec's `MessageCopier.with_property`); None: the first-key is not written.
FirstMarker = Callable[[Message, str, Any], Message]


class _ConsumerLike(Protocol):
    """What the policy reads of a `queue.Consumer` (typed apart: queue.py imports this)."""

    @property
    def browser(self) -> bool: ...


C = TypeVar("C", bound=_ConsumerLike)


class _Purged(Protocol):
    """What `purge_on_no_consumers` needs of a `queue.Queue`."""

    @property
    def name(self) -> str: ...

    def refs(self) -> list[Ref]: ...

    def kill(self, ref: Ref, reason: str) -> None: ...

    def compact(self) -> None: ...

    def purge_paged_later(self) -> int: ...


def needs_policy(config: QueueConfig) -> bool:
    """Whether a queue needs its `DispatchPolicy` from the start (a queue that does not
    gets one on its first grouped message)."""
    return bool(
        config.exclusive
        or config.consumers_before_dispatch > 0
        or config.group_rebalance
        or config.group_first_key
    )


class MessageGroups(Generic[C]):
    """Group owners: by group-id, or by bucket with `buckets` > 0 (B-127)."""

    __slots__ = ("_buckets", "_owners")

    def __init__(self, buckets: int) -> None:
        self._buckets = buckets
        self._owners: dict[str | int, C] = {}

    def key(self, group_id: str) -> str | int:
        if self._buckets <= 0:
            return group_id
        return zlib.crc32(group_id.encode("utf-8", "surrogatepass")) % self._buckets

    def get(self, group_id: str) -> C | None:
        return self._owners.get(self.key(group_id))

    def put(self, group_id: str, consumer: C) -> None:
        self._owners[self.key(group_id)] = consumer

    def remove(self, group_id: str) -> None:
        self._owners.pop(self.key(group_id), None)

    def release(self, consumer: C) -> None:
        """The consumer left: its groups go to whoever takes their next message."""
        for key in [k for k, owner in self._owners.items() if owner is consumer]:
            del self._owners[key]

    def clear(self) -> None:
        self._owners.clear()

    def __len__(self) -> int:
        return len(self._owners)


class DispatchPolicy(Generic[C]):
    """The exclusive consumer, group owners and dispatch gate of one queue (B-122, B-127,
    B-128). Loop thread only."""

    __slots__ = (
        "_config",
        "_grouping",
        "dispatching",
        "exclusive_consumer",
        "groups",
        "start_ms",
    )

    def __init__(self, config: QueueConfig) -> None:
        self._config = config
        self._grouping = not config.exclusive and config.group_buckets != 0
        self.groups: MessageGroups[C] = MessageGroups(config.group_buckets)
        self.exclusive_consumer: C | None = None
        # The gate (B-128): open, or closed until `start_ms` (-1: no delay running).
        self.dispatching = config.consumers_before_dispatch <= 0
        self.start_ms = -1

    # -- who takes a message ----------------------------------------------------------
    def owner(self, ref: Ref) -> C | None:
        """The consumer that must take `ref` (exclusive or group owner), None if any may."""
        if self._config.exclusive:
            return self.exclusive_consumer
        group_id = ref.message.group_id
        if group_id is None or not self._grouping:
            return None
        return self.groups.get(group_id)

    def sent(
        self, consumer: C, ref: Ref, dispatch: Dispatch, first_marker: FirstMarker | None
    ) -> None:
        """`ref` went to `consumer` as `dispatch`: record ownership, close the group, and
        mark a new owner's first message with `group-first-key`."""
        first = False
        if self._config.exclusive:
            if self.exclusive_consumer is None:
                self.exclusive_consumer = consumer
                first = True
        elif self._grouping and (group_id := ref.message.group_id) is not None:
            if ref.message.group_sequence in GROUP_CLOSE_SEQUENCES:
                self.groups.remove(group_id)
            elif self.groups.get(group_id) is None:
                self.groups.put(group_id, consumer)
                first = True
        key = self._config.group_first_key
        if first and key and first_marker is not None:
            dispatch.message = first_marker(ref.message, key, True)

    # -- consumers --------------------------------------------------------------------
    def consumer_added(self, consumer: C, now_ms: int) -> None:
        if consumer.browser:
            return  # browsers take nothing: not counted, not owners
        config = self._config
        if config.group_rebalance:
            if config.group_rebalance_pause_dispatch:
                self.dispatching = False  # until what is in flight is settled
            self.groups.clear()
        if config.delay_before_dispatch >= 0 and self.start_ms < 0:
            self.start_ms = now_ms + config.delay_before_dispatch

    def consumer_removed(self, consumer: C, remaining: Sequence[C]) -> None:
        """Before its deliveries are returned: they go to the next exclusive consumer or
        group owner, in their order (B-122)."""
        if consumer is self.exclusive_consumer:
            self.exclusive_consumer = None
        self.groups.release(consumer)
        if not any(not c.browser for c in remaining):
            self.dispatching = self._config.consumers_before_dispatch <= 0
            self.start_ms = -1

    # -- the gate (B-128) ---------------------------------------------------------------
    def may_dispatch(self, consumers: Sequence[C], delivering: int, now_ms: int) -> bool:
        """Artemis `canDispatch`: open stays open; a closed gate opens once nothing is
        in flight and enough consumers are attached or the delay has passed."""
        if self.dispatching:
            return True
        if delivering:
            return False
        config = self._config
        attached = sum(1 for c in consumers if not c.browser)
        if attached >= config.consumers_before_dispatch or (
            0 <= self.start_ms <= now_ms and attached
        ):
            self.dispatching = True
        return self.dispatching

    def deadline_ms(self) -> int | None:
        """When a closed gate opens by itself (delay-before-dispatch), else None."""
        return None if self.dispatching or self.start_ms < 0 else self.start_ms


def dispatch_options(config: QueueConfig) -> dict[str, Any]:
    """The queue's B-127/B-128 options, snake_case, for `GET /api/v1/queues/{name}`."""
    return {
        "group_buckets": config.group_buckets,
        "group_rebalance": config.group_rebalance,
        "group_rebalance_pause_dispatch": config.group_rebalance_pause_dispatch,
        "group_first_key": config.group_first_key,
        "consumers_before_dispatch": config.consumers_before_dispatch,
        "delay_before_dispatch": config.delay_before_dispatch,
    }


# The reason of a B-126 purge's `killed` events.
PURGE_ON_NO_CONSUMERS = "purge-on-no-consumers"


def purge_on_no_consumers(queue: _Purged) -> int:
    """B-126: the last consumer left: kill every waiting message (event `killed`, reason
    `purge-on-no-consumers`): those in memory now, the paged ones (B-151) a read step a
    loop turn from now on (`Queue.purge_paged_later`). Returns how many in all."""
    waiting = [ref for ref in queue.refs() if ref.waiting]
    for ref in waiting:
        queue.kill(ref, PURGE_ON_NO_CONSUMERS)
    queue.compact()  # free their memory now (as a management purge does)
    paged = queue.purge_paged_later()
    if waiting or paged:
        log.info(
            "queue %s: purge-on-no-consumers removes %d messages (%d of them paged, a step"
            " a loop turn): its last consumer left",
            queue.name,
            len(waiting) + paged,
            paged,
        )
    return len(waiting) + paged
