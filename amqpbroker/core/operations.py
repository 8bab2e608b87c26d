"""Management operations (B-161, B-162): browse, purge, move, retry, dead-letter, expire,
pause; creating and destroying queues and addresses; and a snapshot. The HTTP API and the
AMQP management address (`management/`) both call these: one place per operation.

They act only on messages waiting in the queue (ready or scheduled): a message being
delivered to a consumer belongs to that consumer until it settles. Moves and retries make
a copy with the B-090 annotations of the latest hop (`x-opt-DLQ-*` are dropped, B-079),
route it, then remove the original, in one step of the event loop. Each operation that
changes a queue is a call into the broker (`clock.entry`): one clock reading for its events
and moves.

Paged messages (B-151 PAGE) are part of the queue: they come after the ones in memory,
are read from the page files one at a time as an operation walks them (a large paged
backlog is never held), and the ones an operation takes leave the page files after each
slice (`Queue.remove_paged`: skipped, not rewritten; journaled with the slice's step).

Walks in slices (issue 23): an operation that walks a queue (browse, count, purge, move,
retry, expire, dead-letter) is a generator that yields every `SLICE_MESSAGES` messages,
run by a `Walk`: the HTTP API (`LoopBridge.walk`) gives the loop back between slices, so
that a walk over a million paged messages (~20 us each) does not stop every connection
for ~20 s, and so does the AMQP management address (a slice per loop turn, from
`Broker.tick`); `Walk.run` runs it at once (by-id operations, replay tasks). A walk
covers the messages the queue held when it started, in order: the in-memory ones as a
list taken then (each checked again when its turn comes: one a consumer took meanwhile
is skipped) and the paged ones up to the files' `end` then. While it runs it holds the
queue (`Queue.walk`): nothing is read back from the page files, so the cursor and the
positions it walks stay valid; another walk of the queue waits for it, and one run at
once is refused (`IllegalState`). Arrivals meanwhile are left alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from amqpbroker.core.broker import Broker
from amqpbroker.core.clock import entry
from amqpbroker.core.errors import ClientError, IllegalState, NotFound
from amqpbroker.core.management import MANAGEMENT_ADDRESS
from amqpbroker.core.model import DUPLICATE_ID, Message, QueueConfig, annotated_routing_type
from amqpbroker.core.moves import ORIG_ADDRESS, ORIG_QUEUE
from amqpbroker.core.queue import Queue
from amqpbroker.core.reaper import CREATED_AUTO_DELETE
from amqpbroker.core.refs import DELIVERING, GONE, PagedRef, Ref
from amqpbroker.core.selector import parse_selector

R = TypeVar("R")
# Messages a walk handles per slice: ~10 ms of the loop for paged ones (read, decoded and
# matched: ~20 us each on the reference machine), less for those in memory.
SLICE_MESSAGES = 500
SLICE_S = 0.010  # and at most this long (a move routes and writes each copy: ~160 us)
# The wall clock of the slice running now (`Walk.timer`, given by the caller: the core
# reads no clock of its own, core/clock.py); None: slices are counted in messages only.
_slice_clock: Callable[[], float] | None = None
Steps = Generator[None, None, R]


class Walk(Generic[R]):
    """A management operation over a queue, a slice at a time (issue 23; module doc).
    Loop thread only."""

    __slots__ = ("_steps", "broker", "queue", "result", "timer")

    def __init__(self, broker: Broker, queue: Queue, steps: Steps[R]) -> None:
        self.broker = broker
        self.queue = queue
        self.result: R | None = None
        self._steps = steps
        # seconds, monotonic: with it a slice also ends after SLICE_S (the HTTP API's)
        self.timer: Callable[[], float] | None = None

    @property
    def blocked(self) -> bool:
        """Whether another walk holds the queue (this one waits its turn)."""
        holder = self.queue.walk
        return holder is not None and holder is not self

    def step(self) -> bool:
        """Run the next slice; True once the operation is done (`result`). Nothing is
        done while `blocked`."""
        if self.blocked:
            return False
        self.queue.walk = self
        return _slice(self.broker, self)

    def run(self) -> R:
        """All slices at once (callers that cannot wait: the AMQP management address,
        replay tasks). Refused while another walk holds the queue."""
        if self.blocked:
            raise IllegalState(
                f"queue {self.queue.name} is busy: a management operation is walking it"
            )
        while not self.step():
            pass
        return self.result  # type: ignore[return-value]  # R (None only when R is)

    def close(self) -> None:
        """Abandon the walk (its caller went away): the queue is let go."""
        _abandon(self.broker, self)

    def _release(self) -> None:
        if self.queue.walk is self:
            self.queue.walk_ended()
            if self.queue.consumers:  # reading back was held for the walk
                self.broker.redispatch(self.queue)


@entry
def _slice(broker: Broker, walk: Walk[R]) -> bool:
    """One slice of `walk`, as one call into the broker (one clock reading)."""
    global _slice_clock
    _slice_clock = walk.timer
    try:
        next(walk._steps)
    except StopIteration as stop:
        walk.result = stop.value
        walk._release()
        return True
    except BaseException:
        walk._release()
        raise
    finally:
        _slice_clock = None
    return False


@entry
def _abandon(broker: Broker, walk: Walk[R]) -> None:
    walk._steps.close()
    walk._release()


class _Budget:
    """Counts the messages and the time of a slice: `spent()` says when to yield."""

    __slots__ = ("deadline", "left")

    def __init__(self) -> None:
        self.left = SLICE_MESSAGES
        self.deadline = 0.0  # set by the slice's first message

    def spent(self, messages: int = 1) -> bool:
        self.left -= messages
        clock = _slice_clock
        if clock is None:  # no time budget: messages only
            if self.left > 0:
                return False
        else:
            now = clock()
            if not self.deadline:
                self.deadline = now + SLICE_S
            if self.left > 0 and now < self.deadline:
                return False
        self.left = SLICE_MESSAGES
        self.deadline = 0.0
        return True


def _gone(broker: Broker, queue: Queue) -> bool:
    """The queue was deleted while a walk gave the loop back (the walk stops there)."""
    return broker.queues.get(queue.name) is not queue


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One row of `GET /api/v1/queues` and of the queue metrics (B-161 counters)."""

    name: str
    address: str
    routing_type: str
    durable: bool
    filter: str | None
    messages: int
    delivering: int
    scheduled: int
    consumers: int
    added: int
    acknowledged: int
    dead_lettered: int
    expired: int
    killed: int
    returned: int
    size_bytes: int = 0  # encoded size of the messages held (Artemis persistent.size)
    oldest_ts: int | None = None  # first_ts of the oldest waiting message (issue 24)
    dead_lettered_by_reason: tuple[tuple[str, int], ...] = ()
    killed_by_reason: tuple[tuple[str, int], ...] = ()
    returned_by_reason: tuple[tuple[str, int], ...] = ()
    # B-122/B-125/B-126/B-127/B-128: what the queue does and where it stands.
    exclusive: bool = False
    max_consumers: int = -1
    purge_on_no_consumers: bool = False
    groups: int = 0  # group owners (or owned buckets) now
    dispatching: bool = True  # False: consumers-before-dispatch or a rebalance holds it
    replaced: int = 0  # ring and last-value removals (B-120, B-121)
    replaced_by_reason: tuple[tuple[str, int], ...] = ()
    # B-151 PAGE: what its page files hold (included in `messages`), and how many files.
    paged_messages: int = 0
    paged_bytes: int = 0
    page_files: int = 0
    paged_lost: int = 0  # lost to damaged page files (a counter, B-151 issue 23)


def queue_stats(broker: Broker) -> list[QueueStats]:
    """A consistent snapshot of every queue (taken on the loop thread)."""
    rows = []
    for queue in broker.queues.values():
        c = queue.counters
        pages = queue.pages
        rows.append(
            QueueStats(
                name=queue.name,
                address=queue.address,
                routing_type=queue.routing_type.value,
                durable=queue.durable,
                filter=queue.config.filter,
                messages=queue.message_count,
                delivering=queue.delivering,
                scheduled=queue.scheduled_count,
                consumers=len(queue.consumers),
                added=c.added,
                acknowledged=c.acknowledged,
                dead_lettered=c.dead_lettered,
                expired=c.expired,
                killed=c.killed,
                returned=c.returned,
                size_bytes=queue.size_bytes,
                oldest_ts=queue.oldest_waiting_ts(),
                dead_lettered_by_reason=tuple(c.dead_lettered_by_reason.items()),
                killed_by_reason=tuple(c.killed_by_reason.items()),
                returned_by_reason=tuple(c.returned_by_reason.items()),
                exclusive=queue.config.exclusive,
                max_consumers=queue.config.max_consumers,
                purge_on_no_consumers=queue.config.purge_on_no_consumers,
                groups=0 if queue.policy is None else len(queue.policy.groups),
                dispatching=queue.policy is None or queue.policy.dispatching,
                replaced=c.replaced,
                replaced_by_reason=tuple(c.replaced_by_reason.items()),
                paged_messages=pages.messages if pages is not None else 0,
                paged_bytes=pages.size_bytes if pages is not None else 0,
                page_files=pages.files if pages is not None else 0,
                paged_lost=c.paged_lost,
            )
        )
    return rows


def queue_of(broker: Broker, name: str) -> Queue:
    """The queue `name` (NotFound if there is none)."""
    return _queue(broker, name)


def _queue(broker: Broker, name: str) -> Queue:
    queue = broker.queues.get(name)
    if queue is None:
        raise NotFound(f"queue {name} does not exist")
    return queue


def _held(queue: Queue) -> Iterator[Ref]:
    """Every message of the queue now, in order: in memory (a list taken now), then the
    paged ones written until now (B-151; a walk does not chase a producer)."""
    memory = _let_go(queue.refs())
    pages = queue.pages
    if pages is None or not pages.messages:
        return memory
    return itertools.chain(memory, queue.paged_refs(pages.end))


def _let_go(refs: list[Ref]) -> Iterator[Ref]:
    """Each of `refs` in order, dropped from the list as it is given: a walk keeps no
    message it has passed, so what a slice purged is freed in that slice (issue 23:
    the whole list kept a purged 50 MiB backlog alive to the walk's end, and the memory
    returner, which had trimmed as the counted bytes fell, gave nothing back)."""
    refs.reverse()
    pop = refs.pop
    while refs:
        yield pop()


def _named(queue: Queue, ids: Iterable[int]) -> list[Ref]:
    """The references to the messages `ids`, in queue order (as `_held` lists them): the
    in-memory ones from the queue's id index (O(1) each, `Queue.find`), then, only for
    ids not found there, the paged ones, read from the page files until all are found
    (bounded by the paged messages; B-151).

    The page files are read from where the previous by-id call found its last paged
    message (`Queue.paged_hint`), then from the cursor up to there: a replay task's
    ids come in queue order, and each of its steps read again, from the cursor, every
    message its filter had left before them (issue 23: 382 ms a step, quadratic, over
    20k paged)."""
    wanted = dict.fromkeys(ids)
    found = [ref for ref in map(queue.find, wanted) if ref is not None]
    found.sort()
    missing = wanted.keys() - {ref.message.msg_id for ref in found}
    pages = queue.pages
    if missing and pages is not None and pages.messages:
        hint = queue.paged_hint
        start: tuple[int, int] | None = None
        if hint is not None and hint[0] == pages.epoch and hint[1] > pages.position:
            start = hint[1]
        refs: Iterable[Ref] = queue.paged_refs()
        if start is not None:  # from the hint to the end, then from the cursor to it
            refs = itertools.chain(queue.paged_refs(start=start), queue.paged_refs(until=start))
        paged: list[Ref] = []
        for ref in refs:
            if ref.message.msg_id in missing:
                paged.append(ref)
                missing.discard(ref.message.msg_id)
                assert isinstance(ref, PagedRef)
                queue.paged_hint = (pages.epoch, ref.at)
                if not missing:
                    break
        paged.sort(key=_at)
        found.extend(paged)
    return found


def _at(ref: Ref) -> tuple[int, int]:
    assert isinstance(ref, PagedRef)
    return ref.at


def _waiting(
    queue: Queue, selector: str | None, ids: Iterable[int] | None = None
) -> Iterator[Ref | None]:
    """Each message walked: its reference if it is waiting (checked as its turn comes)
    and matches the filter (B-130) and, if given, the message ids; else None (it still
    counts for a walk's slice).

    With ids, O(ids) by the queue's id index, whatever the queue's length; without, the
    whole queue as `_held` lists it, since acting on one may route a copy back into this
    queue (a dead-letter or retry address bound to it)."""
    match = parse_selector(selector).matches if selector else None
    refs = _named(queue, ids) if ids is not None else _held(queue)
    for ref in refs:
        gone = ref.state == DELIVERING or ref.state == GONE
        yield None if gone or (match is not None and not match(ref.message)) else ref


def _waiting_in_memory(
    queue: Queue, selector: str | None, ids: Iterable[int] | None
) -> Iterator[Ref]:
    """The waiting messages held in memory that match (by the id index with `ids`), in
    queue order: never the paged ones, which are not even read (B-151 with B-161
    changeMessagesPriority, as Artemis changes only the references it holds; issue 23:
    the walk read every page file in one loop turn to change nothing there)."""
    match = parse_selector(selector).matches if selector else None
    if ids is not None:
        refs = sorted(ref for ref in map(queue.find, dict.fromkeys(ids)) if ref is not None)
    else:
        refs = queue.refs()
    for ref in refs:
        if ref.waiting and (match is None or match(ref.message)):
            yield ref


def _check_range(offset: int, limit: int) -> None:
    if offset < 0 or limit < 0:
        raise ValueError("a browse's offset and limit must not be negative")


def browse_walk(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Walk[list[Ref]]:
    """`browse`, a slice at a time."""
    _check_range(offset, limit)
    queue = _queue(broker, queue_name)
    return Walk(broker, queue, _browse_steps(broker, queue, selector, limit, offset))


def _browse_steps(
    broker: Broker, queue: Queue, selector: str | None, limit: int, offset: int
) -> Steps[list[Ref]]:
    """The in-memory part lazily (`Queue.iter_refs`: a page costs the page, in this
    slice: a lazy read must not span a change of the queue), then the paged part a slice
    at a time, both stopping after `offset + limit` matches."""
    match = parse_selector(selector).matches if selector else None
    pages = queue.pages
    until = pages.end if pages is not None and pages.messages else None
    found: list[Ref] = []
    matched = 0
    if limit == 0:
        return found
    for ref in queue.iter_refs():
        if match is None or match(ref.message):
            if matched >= offset:
                found.append(ref)
            matched += 1
            if matched >= offset + limit:
                return found
    if until is None:
        return found
    budget = _Budget()
    for ref in queue.paged_refs(until):
        if match is None or match(ref.message):
            if matched >= offset:
                found.append(ref)
            matched += 1
            if matched >= offset + limit:
                return found
        if budget.spent():
            yield
            if _gone(broker, queue):
                return found
    return found


def listing_walk(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Walk[tuple[int, list[Ref]]]:
    """`count` and then `browse` in one walk (a page of the HTTP API and its total)."""
    _check_range(offset, limit)
    queue = _queue(broker, queue_name)
    return Walk(broker, queue, _listing_steps(broker, queue, selector, limit, offset))


def _listing_steps(
    broker: Broker, queue: Queue, selector: str | None, limit: int, offset: int
) -> Steps[tuple[int, list[Ref]]]:
    total = yield from _count_steps(broker, queue, selector)
    refs = yield from _browse_steps(broker, queue, selector, limit, offset)
    return total, refs


def browse(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Ref]:
    """Messages of a queue in order, without acquiring them (delivering ones included)."""
    return browse_walk(broker, queue_name, selector=selector, limit=limit, offset=offset).run()


def waiting_ids(broker: Broker, queue_name: str, *, selector: str | None = None) -> list[int]:
    """The ids of the waiting messages that match, in order (what a task will work on)."""
    return waiting_ids_walk(broker, queue_name, selector=selector).run()


def waiting_ids_walk(
    broker: Broker, queue_name: str, *, selector: str | None = None
) -> Walk[list[int]]:
    """`waiting_ids`, a slice at a time: a replay task over a filter of a paged queue
    reads every page file to find its ids (issue 23: that was one loop turn, and the
    HTTP request's 30 s bound cut it at ~1M paged messages)."""
    queue = _queue(broker, queue_name)
    return Walk(broker, queue, _waiting_ids_steps(broker, queue, selector))


def _waiting_ids_steps(broker: Broker, queue: Queue, selector: str | None) -> Steps[list[int]]:
    ids: list[int] = []
    budget = _Budget()
    for ref in _waiting(queue, selector):
        if ref is not None:
            ids.append(ref.message.msg_id)
        if budget.spent():
            yield
            if _gone(broker, queue):
                return ids
    return ids


def count_walk(broker: Broker, queue_name: str, *, selector: str | None = None) -> Walk[int]:
    """`count`, a slice at a time."""
    queue = _queue(broker, queue_name)
    return Walk(broker, queue, _count_steps(broker, queue, selector))


def _count_steps(broker: Broker, queue: Queue, selector: str | None) -> Steps[int]:
    if not selector:
        return queue.message_count
    match = parse_selector(selector).matches
    counted = 0
    budget = _Budget()
    for ref in _held(queue):
        if ref.state != GONE and match(ref.message):
            counted += 1
        if budget.spent():
            yield
            if _gone(broker, queue):
                return counted
    return counted


def count(broker: Broker, queue_name: str, *, selector: str | None = None) -> int:
    """How many messages `browse` would list without a limit."""
    if not selector:  # O(1): answered even while a walk holds the queue
        return _queue(broker, queue_name).message_count
    return count_walk(broker, queue_name, selector=selector).run()


def purge_walk(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> Walk[int]:
    """`purge`, a slice at a time."""
    queue = _queue(broker, queue_name)
    if selector is None and ids is None and queue.pages is not None:
        return Walk(broker, queue, _purge_all_steps(broker, queue))
    return Walk(
        broker,
        queue,
        _on_waiting_steps(broker, queue, selector, ids, lambda q, r: q.kill(r, "purge")),
    )


def _purge_all_steps(broker: Broker, queue: Queue) -> Steps[int]:
    """All of a paging queue: the paged ones are counted as they are read, never held
    (B-151), a read step at a time up to the files' end when the purge started."""
    pages = queue.pages
    assert pages is not None
    until = pages.end
    killed = 0
    budget = _Budget()
    for ref in queue.refs():
        if ref.state != DELIVERING and ref.state != GONE:
            queue.kill(ref, "purge")
            killed += 1
        if budget.spent():
            yield
            if _gone(broker, queue):
                return killed
    queue.compact()
    while True:
        budget.spent(0)  # the slice's time starts before its first read step
        step, done = queue.purge_paged_step("purge", until, budget.left)
        killed += step
        if done:
            return killed
        if budget.spent(step):
            yield
            if _gone(broker, queue):
                return killed


@entry
def purge(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> int:
    """Delete waiting messages; counted as killed (B-161), event `killed`/`purge`."""
    return purge_walk(broker, queue_name, selector=selector, ids=ids).run()


def _on_waiting_steps(
    broker: Broker,
    queue: Queue,
    selector: str | None,
    ids: Iterable[int] | None,
    act: Callable[[Queue, Ref], bool | None],
) -> Steps[int]:
    """Apply `act` to each matching waiting message: how many it acted on (an `act`
    answering False did not)."""
    acted = 0
    budget = _Budget()
    for ref in _waiting(queue, selector, ids):
        if ref is not None and act(queue, ref) is not False:
            acted += 1
        if budget.spent():
            queue.remove_paged()  # the paged ones it took, with this slice's step
            yield
            if _gone(broker, queue):
                return acted
    queue.remove_paged()  # B-151: the paged ones it took leave the page files
    queue.compact(removed=acted)  # issue 23: the memory of many taken is freed now
    return acted


def move_walk(
    broker: Broker,
    queue_name: str,
    *,
    to_queue: str,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
    reject_duplicates: bool = False,
) -> Walk[int]:
    """`move`, a slice at a time."""
    queue = _queue(broker, queue_name)
    target = _queue(broker, to_queue)
    if target is queue:
        raise ClientError("cannot move messages to the same queue")
    steps = _move_steps(broker, queue, target, selector, ids, reject_duplicates)
    return Walk(broker, queue, steps)


def _move_steps(
    broker: Broker,
    queue: Queue,
    target: Queue,
    selector: str | None,
    ids: Iterable[int] | None,
    reject_duplicates: bool,
) -> Steps[int]:
    address = broker.post_office.addresses[target.address]
    moved = 0
    budget = _Budget()
    for ref in _waiting(queue, selector, ids):
        if ref is not None:
            copy = broker.copy_for_move(ref.message, broker.hop(queue, ref.message))
            targets = [target]
            if reject_duplicates:
                duplicate_id = ref.message.get_application_properties().get(DUPLICATE_ID)
                if isinstance(duplicate_id, str | bytes) and broker.is_duplicate(
                    address, duplicate_id
                ):
                    targets = []
            _complete_move(broker, queue, ref, copy, target.address, targets, reason="move")
            moved += 1
        if budget.spent():
            queue.remove_paged()  # the paged ones it took, with this slice's step
            yield
            if _gone(broker, queue):
                return moved
            if _gone(broker, target):  # deleted meanwhile: the rest stay where they are
                break
    queue.remove_paged()
    queue.compact(removed=moved)
    return moved


@entry
def move(
    broker: Broker,
    queue_name: str,
    *,
    to_queue: str,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
    reject_duplicates: bool = False,
) -> int:
    """B-161 moveMessages: copies into `to_queue` with B-090 annotations. With
    `reject_duplicates`, a message whose duplicate id (`_AMQ_DUPL_ID`, B-012) the target
    address has already seen is removed without its copy being routed (Artemis routes
    the copy with rejectDuplicates), and the ids of the others are remembered there."""
    walk = move_walk(
        broker,
        queue_name,
        to_queue=to_queue,
        selector=selector,
        ids=ids,
        reject_duplicates=reject_duplicates,
    )
    return walk.run()


# What a redrive line may say about the message it names (issue 16 item 2), and where
# the message says it: `queue` is the queue retried from (the DLQ).
EXPECT_FIELDS = ("queue", "original_address", "original_queue", "amqp_message_id")


@dataclass(frozen=True, slots=True)
class RetryResult:
    """What `retry` did: how many went back, which ids it skipped and why, and which of
    the ids asked for are not waiting in the queue."""

    retried: int
    skipped: tuple[tuple[int, str], ...] = ()
    not_found: tuple[int, ...] = ()


def _mismatch(message: Message, queue: Queue, expected: Mapping[str, str | None]) -> str | None:
    """Why `message` is not the one a redrive line describes (None: it is).

    A line written before a restart may name an id that now belongs to another message;
    a null or absent field is not checked."""
    annotations = message.get_annotations()
    amqp_id = message.get_properties().get("message-id")
    actual = {
        "queue": queue.name,
        "original_address": annotations.get(ORIG_ADDRESS),
        "original_queue": annotations.get(ORIG_QUEUE),
        "amqp_message_id": None if amqp_id is None else str(amqp_id),
    }
    for key, want in expected.items():
        if want is not None and actual[key] != want:
            return f"{key} is {actual[key]!r}, expected {want!r}"
    return None


def retry_walk(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
    expect: Mapping[int, Mapping[str, str | None]] | None = None,
) -> Walk[RetryResult]:
    """`retry`, a slice at a time."""
    queue = _queue(broker, queue_name)
    wanted = None if ids is None else list(ids)
    return Walk(broker, queue, _retry_steps(broker, queue, selector, wanted, expect))


def _retry_steps(
    broker: Broker,
    queue: Queue,
    selector: str | None,
    wanted: list[int] | None,
    expect: Mapping[int, Mapping[str, str | None]] | None,
) -> Steps[RetryResult]:
    retried = 0
    skipped: list[tuple[int, str]] = []
    seen: set[int] = set()
    budget = _Budget()
    for ref in _waiting(queue, selector, wanted):
        if ref is not None:
            retried += _retry_one(broker, queue, ref, wanted is not None, expect, seen, skipped)
        if budget.spent():
            queue.remove_paged()  # the paged ones it took, with this slice's step
            yield
            if _gone(broker, queue):
                return RetryResult(retried, tuple(skipped))
    queue.remove_paged()
    queue.compact(removed=retried)
    not_found = () if wanted is None else tuple(dict.fromkeys(i for i in wanted if i not in seen))
    return RetryResult(retried, tuple(skipped), not_found)


def _retry_one(
    broker: Broker,
    queue: Queue,
    ref: Ref,
    by_id: bool,
    expect: Mapping[int, Mapping[str, str | None]] | None,
    seen: set[int],
    skipped: list[tuple[int, str]],
) -> int:
    """Retry one waiting message (1), or leave it where it is (0, `skipped` says why
    when it was named by id or failed its `expect`)."""
    message = ref.message
    seen.add(message.msg_id)
    expected = expect.get(message.msg_id) if expect is not None else None
    why = _mismatch(message, queue, expected) if expected else None
    if why is not None:
        skipped.append((message.msg_id, why))
        return 0
    annotations = message.get_annotations()
    address_name = annotations.get(ORIG_ADDRESS)
    queue_name_orig = annotations.get(ORIG_QUEUE)
    if not isinstance(address_name, str) or not isinstance(queue_name_orig, str):
        if by_id:  # named ones are reported; a filter's are left quietly
            skipped.append((message.msg_id, "no x-opt-ORIG-ADDRESS/x-opt-ORIG-QUEUE"))
        return 0
    original = broker.queues.get(queue_name_orig)
    address = broker.post_office.addresses.get(address_name)
    if original is None or address is None:
        if by_id:
            gone = f"queue {queue_name_orig}" if original is None else f"address {address_name}"
            skipped.append((message.msg_id, f"original {gone} does not exist"))
        return 0
    copy = broker.copy_for_move(message, broker.hop(queue, message))
    routing_type = annotated_routing_type(copy.get_annotations(), jms_dest=False)
    if original.name != address.name:
        targets = [original] if original.accepts_message(copy) else []
    else:
        targets = broker.post_office.route(copy, address, routing_type)
    _complete_move(broker, queue, ref, copy, address.name, targets, reason="retry")
    return 1


@entry
def retry(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
    expect: Mapping[int, Mapping[str, str | None]] | None = None,
) -> RetryResult:
    """B-161 retryMessages: back to `x-opt-ORIG-ADDRESS`, with the original routing type,
    to the original queue only when its name differs from the address. Messages whose
    original queue no longer exists stay where they are (reported when named by id).

    `expect` maps ids to the `EXPECT_FIELDS` a redrive list recorded: a message that does
    not match stays where it is and is reported as skipped (issue 16 item 2)."""
    return retry_walk(broker, queue_name, selector=selector, ids=ids, expect=expect).run()


def _complete_move(
    broker: Broker,
    queue: Queue,
    ref: Ref,
    copy: Message,
    address: str,
    targets: list[Queue],
    *,
    reason: str,
) -> None:
    """Remove the original, record the `moved` event, route the copy (one loop step)."""
    queue.take(ref)
    if broker.emitter.failures:
        queue.event(
            "moved",
            ref,
            reason=reason,
            target_address=address,
            target_queues=tuple(t.name for t in targets),
            copy_msg_id=copy.msg_id,
        )
    broker.deliver_copy(copy, address, targets, reason="move")


def dead_letter_walk(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> Walk[int]:
    """`dead_letter`, a slice at a time."""
    queue = _queue(broker, queue_name)
    return Walk(
        broker, queue, _on_waiting_steps(broker, queue, selector, ids, broker.dead_letter_waiting)
    )


@entry
def dead_letter(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> int:
    """B-161 sendMessagesToDeadLetterAddress: waiting messages dead-lettered now (B-070)."""
    return dead_letter_walk(broker, queue_name, selector=selector, ids=ids).run()


def expire_walk(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> Walk[int]:
    """`expire`, a slice at a time."""
    queue = _queue(broker, queue_name)
    return Walk(
        broker, queue, _on_waiting_steps(broker, queue, selector, ids, lambda q, r: q.expire(r))
    )


@entry
def expire(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> int:
    """B-161 expireMessages: waiting messages expired now (B-085); none on a queue whose
    expiry address is its own (B-087)."""
    return expire_walk(broker, queue_name, selector=selector, ids=ids).run()


def count_delivering(broker: Broker, queue_name: str, *, selector: str | None = None) -> int:
    """B-161 countDeliveringMessages: messages handed to a consumer and not yet settled."""
    queue = _queue(broker, queue_name)
    match = parse_selector(selector).matches if selector else None
    return sum(
        1
        for consumer in queue.consumers
        for ref in consumer.unsettled.values()
        if match is None or match(ref.message)
    )


@entry
def pause(broker: Broker, queue_name: str, *, paused: bool) -> None:
    """B-161 pause()/resume(): stop or restart dispatch to the queue's consumers (not
    persisted, as Artemis `pause()` without `persist`)."""
    queue = _queue(broker, queue_name)
    queue.paused = paused
    if not paused and queue.consumers:
        broker.redispatch(queue)


@entry
def create_queue(
    broker: Broker,
    config: QueueConfig,
    *,
    auto_create_address: bool = False,
    auto_delete: bool | None = None,
) -> Queue:
    """B-162 createQueue: a queue that is neither configured nor auto-created; its
    auto-delete defaults to the address's `auto-delete-created-queues` (B-113)."""
    if config.address == MANAGEMENT_ADDRESS:  # B-160: answered, never routed or consumed
        raise ClientError(f"{MANAGEMENT_ADDRESS} is the management address: it has no queues")
    if auto_delete is None:
        auto_delete = broker.settings.resolve(config.address).auto_delete_created_queues
    address = broker.post_office.addresses.get(config.address)
    if address is not None and address.temporary:  # it goes with its connection, queues too
        raise ClientError(f"address {config.address} is temporary: it cannot take a queue")
    if address is None or config.routing_type not in address.routing_types:
        if not auto_create_address:
            what = "does not exist" if address is None else "lacks that routing type"
            raise NotFound(f"address {config.address} {what} (auto-create-address is false)")
        broker.create_address(config.address, {config.routing_type})
    extra = {**config.extra, CREATED_AUTO_DELETE: auto_delete}
    return broker.create_queue(replace(config, auto_created=False, configured=False, extra=extra))


@entry
def destroy_queue(broker: Broker, queue_name: str, *, remove_consumers: bool = False) -> None:
    """B-162 destroyQueue: refused while consumers are attached unless `remove_consumers`
    (they are detached, B-038)."""
    queue = _queue(broker, queue_name)
    if queue.consumers and not remove_consumers:
        raise IllegalState(f"queue {queue_name} has {len(queue.consumers)} consumer(s)")
    broker.delete_queue(queue_name, reason="destroyed by management")


@entry
def delete_address(broker: Broker, name: str, *, force: bool = False) -> None:
    """B-162 deleteAddress: refused while it has queues unless `force` (they go too)."""
    address = broker.post_office.addresses.get(name)
    if address is None:
        raise NotFound(f"address {name} does not exist")
    if address.queues and not force:
        raise IllegalState(f"address {name} has {len(address.queues)} queue(s)")
    broker.delete_address(name)


@entry
def change_priority(
    broker: Broker,
    queue_name: str,
    *,
    priority: int,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> int:
    """B-161 changeMessagesPriority: waiting messages get `priority` (0..9), in their
    header too, and go to the tail of that level (not persisted, as in Artemis)."""
    if not 0 <= priority <= 9:
        raise ClientError(f"a priority is 0..9, not {priority}")
    queue = _queue(broker, queue_name)
    refs = list(_waiting_in_memory(queue, selector, ids))
    queue.change_priority(
        [(ref, broker.copier.with_priority(ref.message, priority)) for ref in refs]
    )
    return len(refs)
