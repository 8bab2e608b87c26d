"""Queue kinds: last-value (B-120), ring (B-121) and non-destructive (B-123) queues.

Theory of operation
-------------------
A plain queue has `Queue.kind is None` and pays one attribute test per message for these
features. A queue whose configuration names a last-value key, a ring size ≥ 0 or
non-destructive gets a `QueueKind`, which `Queue` calls at four places: a reference
arrived (`arrived`, after `Queue.add` and `Queue.restore`), one became ready again
(`ready_again`: a return, or a scheduled delivery that became due), the arrival was
dispatched (`trim`), and a non-destructive delivery ended (`settled`). The kind reaches
into the queue's containers (it is the queue's friend, one module per subject).

**Last value (B-120).** `index` maps each key value V (an application-property that is a
string; other values and absent keys are never replaced) to the *current* reference for
V: the one that arrived last, by arrival sequence (`Ref.seq`). A reference that enters
the waiting set (arrival, return, redelivery due) is compared with the current one:
* the newer of the two is current;
* the older is removed if it is waiting (ready or scheduled): event `replaced`, reason
  `last-value`, counted as neither acknowledged nor killed;
* a reference in delivery is never removed; when it comes back and a newer value exists,
  it is removed then; when none does, it is current again.
A message scheduled at send (B-015) takes part once it is due, as in Artemis (it is not
"in the queue" before). Arrival order decides "newer" throughout (Decision: Artemis lets
a delayed redelivery displace a newer value; we never let an older value win).
A gone reference found in the index counts as absent; the index forgets gone ones when
they outnumber the messages held, so a stream of distinct keys that consumers take does
not keep their messages in memory.

**Ring (B-121).** After an arrival has had its chance to be dispatched, and after a
reference became ready again, the queue drops the reference at its head (the next one
dispatch would take: highest priority, oldest) if more than `ring_size` are ready:
event `replaced`, reason `ring`. One per reference that came in, as Artemis
`enforceRing`, so a ring size lowered at runtime (a retroactive address's, B-124) does
not trim at once. References in delivery and scheduled ones are not
counted and cannot be dropped, so the total may exceed the ring size.

**Non-destructive (B-123).** References are never taken: they stay ready while consumers
receive them, and leave only by expiry, ring trimming, last-value replacement or
management. Each consumer walks the queue on its own cursor over `log`, the references
in the order they became ready (arrival, or a scheduled delivery falling due), and gets
each once; `accepted`, `released`, `modified` and `rejected` only end its delivery
(Decision: nothing redelivers to the consumer that already had it, and the delivery count
of the reference is not changed; the wire count is the stored one). Priority does not
reorder the walk (Decision: arrival order, so a cursor is one position).

**Memory.** References removed from the middle of a queue are only marked gone (the
queue's lazy removal); a last-value queue without consumers would keep every replaced
one. `stale` counts them, and the containers are compacted when the gone ones outnumber
the live ones (amortised O(1) a removal).

Loop thread only.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque

from amqpbroker.core.effects import Dispatch, Effect
from amqpbroker.core.model import QueueConfig
from amqpbroker.core.queue import Consumer, Queue
from amqpbroker.core.refs import DELIVERING, GONE, READY, Ref

__all__ = ["LVQ_DEFAULT_KEY", "QueueKind", "kind_of", "last_value_key"]

# Artemis Message.HDR_LAST_VALUE_NAME: the key of `last-value: true` (B-120).
LVQ_DEFAULT_KEY = "_AMQ_LVQ_NAME"
_COMPACT_MIN = 64  # gone references tolerated before a compaction is worth it


def last_value_key(key: str | None, last_value: bool) -> str | None:
    """The key of a queue configured with `last-value-key` and/or `last-value` (B-120):
    the named key, else _AMQ_LVQ_NAME when `last-value` is true, else None (not an LVQ)."""
    return key or (LVQ_DEFAULT_KEY if last_value else None)


def kind_of(queue: Queue, config: QueueConfig) -> QueueKind | None:
    """The queue's kind, or None for a plain queue (the hot path tests only that)."""
    if config.last_value_key or config.ring_size >= 0 or config.non_destructive:
        return QueueKind(queue, config)
    return None


class QueueKind:
    """What a queue's `last-value-key`, `ring-size` and `non-destructive` make it do."""

    __slots__ = ("index", "key", "log", "non_destructive", "position", "queue", "ring", "stale")

    def __init__(self, queue: Queue, config: QueueConfig) -> None:
        self.queue = queue
        self.key = config.last_value_key or None
        self.ring = config.ring_size  # -1: off
        self.non_destructive = config.non_destructive
        self.index: dict[str, Ref] = {}
        # Non-destructive: (position, ref) in the order they became ready; the consumers'
        # cursors (`Consumer.browsed_seq`) are positions in it.
        self.log: list[tuple[int, Ref]] = []
        self.position = 0
        self.stale = 0

    # -- the hooks ----------------------------------------------------------------------
    def arrived(self, ref: Ref) -> None:
        """A reference entered the queue (sent, copied or recovered)."""
        if ref.state == READY:
            self._ready(ref)

    def ready_again(self, ref: Ref) -> None:
        """`ref` became ready again: a return, or its scheduled time came."""
        if self._ready(ref):
            self.trim()

    def _ready(self, ref: Ref) -> bool:
        """Index and log a reference that became ready; False when it was replaced."""
        if self.key is not None and not self._admit(ref):
            return False
        if self.non_destructive:
            self.position += 1
            self.log.append((self.position, ref))
            if len(self.log) > 2 * self.queue.ready_count + _COMPACT_MIN:
                self._compact()
        return True

    def trim(self) -> None:
        """B-121: one reference came in; drop the head if more than `ring` are ready.

        One, as Artemis `enforceRing`: a ring size lowered at runtime does not trim at
        once, the queue keeps its length as new messages arrive (B-121, B-124)."""
        ring = self.ring
        queue = self.queue
        if 0 <= ring < queue.ready_count:
            ref = queue._pop_next()
            if ref is not None:
                queue._removed(ref)
                self._replace(ref, "ring")

    def settled(self, consumer: Consumer) -> None:
        """A non-destructive delivery ended (any outcome): the message stays (B-123)."""
        self.queue.used = True

    # -- last value (B-120) -------------------------------------------------------------
    def value_of(self, ref: Ref) -> str | None:
        """The reference's last-value key value: a string application-property, else None
        (also when the section does not decode: such a message is never replaced, as a
        selector does not match it, B-130)."""
        assert self.key is not None
        try:
            value = ref.message.get_application_properties().get(self.key)
        except ValueError:  # amqp.sections.SectionError: malformed bytes from the producer
            return None
        return value if isinstance(value, str) else None

    def _admit(self, ref: Ref) -> bool:
        """Make `ref` current for its value, or remove it if a newer one exists; False when
        it was removed."""
        value = self.value_of(ref)
        if value is None:
            return True
        index = self.index
        current = index.get(value)
        if current is None or current is ref or current.state == GONE:
            index[value] = ref
            queue = self.queue
            held = queue.ready_count + queue.scheduled_count + queue.delivering
            if len(index) > 2 * held + _COMPACT_MIN:  # consumed values: forget them
                self.index = {k: r for k, r in index.items() if r.state != GONE}
            return True
        if current.seq > ref.seq:  # a newer value exists (waiting or in delivery)
            self._take(ref)
            return False
        self.index[value] = ref
        if current.state != DELIVERING:  # in delivery: removed if it comes back
            self._take(current)
        return True

    def _take(self, ref: Ref) -> None:
        """Remove a waiting reference from the middle of the queue (lazily)."""
        queue = self.queue
        queue.take(ref)
        self.stale += 1
        self._replace(ref, "last-value")
        if self.stale > queue.ready_count + _COMPACT_MIN:
            self._compact()

    def _replace(self, ref: Ref, reason: str) -> None:
        """The bookkeeping of a removed reference: counted as replaced, event `replaced`."""
        queue = self.queue
        counters = queue.counters
        counters.replaced += 1
        counters.count(counters.replaced_by_reason, reason)
        if queue.emitter.failures:
            queue.event("replaced", ref, reason=reason)

    # -- non-destructive (B-123) --------------------------------------------------------
    def deliver(self, active: list[Consumer], out: list[Effect]) -> None:
        """Each consumer with credit gets the ready references past its cursor, in order;
        the references stay in the queue (the dispatch of a non-destructive queue)."""
        queue = self.queue
        log = self.log
        now_ms = queue._moment.ms
        for consumer in active:
            i = bisect_right(log, consumer.browsed_seq, key=_position)
            while i < len(log) and consumer.credit > 0 and consumer.window.room > 0:
                position, ref = log[i]
                i += 1
                if ref.state != READY:
                    continue  # gone since (expired, replaced, removed)
                expiration = ref.message.expiration_ms
                if expiration and now_ms >= expiration and queue.expire(ref):
                    continue  # B-084: never sent
                consumer.browsed_seq = position
                if consumer.accepts(ref):
                    self._send(consumer, ref, out)

    def _send(self, consumer: Consumer, ref: Ref, out: list[Effect]) -> None:
        queue = self.queue
        consumer.credit -= 1
        consumer.dispatched += 1
        consumer.window.room -= ref.message.size
        delivery = queue._delivery_ids.take()
        out.append(
            Dispatch(consumer.id, delivery, ref.message, ref.delivery_count, consumer.presettled)
        )
        if queue.emitter.all:
            queue.note(consumer.event_dispatched, ref, None)
        if not consumer.presettled:
            consumer.unsettled[delivery] = ref
            queue.delivering += 1

    # -- memory -------------------------------------------------------------------------
    def _compact(self) -> None:
        """Drop gone references from the queue's containers and the log."""
        self.stale = 0
        self.log = [entry for entry in self.log if entry[1].state != GONE]
        queue = self.queue
        _compact_levels(queue._fresh, queue._returned)


def _position(entry: tuple[int, Ref]) -> int:
    return entry[0]


def _compact_levels(fresh: list[deque[Ref]], returned: list[list[Ref]]) -> None:
    """Rebuild a queue's per-priority containers without gone references."""
    for level, refs in enumerate(fresh):
        if refs:
            fresh[level] = deque(ref for ref in refs if ref.state != GONE)
    for level, heap in enumerate(returned):
        if heap:
            kept = [ref for ref in heap if ref.state != GONE]
            heapq.heapify(kept)
            returned[level] = kept
