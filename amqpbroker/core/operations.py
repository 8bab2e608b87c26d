"""Management operations on queues (B-161): browse, purge, move, retry, and a snapshot.

They act only on messages waiting in the queue (ready or scheduled): a message being
delivered to a consumer belongs to that consumer until it settles. Moves and retries make
a copy with the B-090 annotations of the latest hop (`x-opt-DLQ-*` are dropped, B-079),
route it, then remove the original, in one step of the event loop. Each operation that
changes a queue is a call into the broker (`clock.entry`): one clock reading for its events
and moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from amqpbroker.core.broker import Broker
from amqpbroker.core.clock import entry
from amqpbroker.core.errors import ClientError, NotFound
from amqpbroker.core.model import Message, annotated_routing_type
from amqpbroker.core.moves import ORIG_ADDRESS, ORIG_QUEUE
from amqpbroker.core.queue import Queue
from amqpbroker.core.refs import DELIVERING, GONE, Ref
from amqpbroker.core.selector import parse_selector


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


def queue_stats(broker: Broker) -> list[QueueStats]:
    """A consistent snapshot of every queue (taken on the loop thread)."""
    rows = []
    for queue in broker.queues.values():
        c = queue.counters
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
            )
        )
    return rows


def _queue(broker: Broker, name: str) -> Queue:
    queue = broker.queues.get(name)
    if queue is None:
        raise NotFound(f"queue {name} does not exist")
    return queue


def _waiting(queue: Queue, selector: str | None, ids: Iterable[int] | None = None) -> list[Ref]:
    """Waiting references matching the filter (B-130) and, if given, the message ids."""
    match = parse_selector(selector).matches if selector else None
    wanted = set(ids) if ids is not None else None
    refs = []
    for ref in queue.refs():
        if ref.state == DELIVERING or ref.state == GONE:
            continue
        if wanted is not None and ref.message.msg_id not in wanted:
            continue
        if match is not None and not match(ref.message):
            continue
        refs.append(ref)
    return refs


def browse(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Ref]:
    """Messages of a queue in order, without acquiring them (delivering ones included)."""
    queue = _queue(broker, queue_name)
    match = parse_selector(selector).matches if selector else None
    refs = [r for r in queue.refs() if match is None or match(r.message)]
    return refs[offset : offset + limit]


def waiting_ids(broker: Broker, queue_name: str, *, selector: str | None = None) -> list[int]:
    """The ids of the waiting messages that match, in order (what a task will work on)."""
    return [ref.message.msg_id for ref in _waiting(_queue(broker, queue_name), selector)]


def count(broker: Broker, queue_name: str, *, selector: str | None = None) -> int:
    """How many messages `browse` would list without a limit."""
    queue = _queue(broker, queue_name)
    if not selector:
        return sum(1 for _ in queue.refs())
    match = parse_selector(selector).matches
    return sum(1 for r in queue.refs() if match(r.message))


@entry
def purge(
    broker: Broker,
    queue_name: str,
    *,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> int:
    """Delete waiting messages; counted as killed (B-161), event `killed`/`purge`."""
    queue = _queue(broker, queue_name)
    refs = _waiting(queue, selector, ids)
    for ref in refs:
        queue.kill(ref, "purge")
    return len(refs)


@entry
def move(
    broker: Broker,
    queue_name: str,
    *,
    to_queue: str,
    selector: str | None = None,
    ids: Iterable[int] | None = None,
) -> int:
    """B-161 moveMessages: copies into `to_queue` with B-090 annotations."""
    queue = _queue(broker, queue_name)
    target = _queue(broker, to_queue)
    if target is queue:
        raise ClientError("cannot move messages to the same queue")
    refs = _waiting(queue, selector, ids)
    for ref in refs:
        copy = broker.copy_for_move(ref.message, queue, broker.hop(queue, ref.message))
        _complete_move(broker, queue, ref, copy, target.address, [target], reason="move")
    return len(refs)


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
    queue = _queue(broker, queue_name)
    wanted = None if ids is None else list(ids)
    retried = 0
    skipped: list[tuple[int, str]] = []
    seen: set[int] = set()
    for ref in _waiting(queue, selector, wanted):
        message = ref.message
        seen.add(message.msg_id)
        expected = expect.get(message.msg_id) if expect is not None else None
        why = _mismatch(message, queue, expected) if expected else None
        if why is not None:
            skipped.append((message.msg_id, why))
            continue
        annotations = message.get_annotations()
        address_name = annotations.get(ORIG_ADDRESS)
        queue_name_orig = annotations.get(ORIG_QUEUE)
        if not isinstance(address_name, str) or not isinstance(queue_name_orig, str):
            if wanted is not None:  # named ones are reported; a filter's are left quietly
                skipped.append((message.msg_id, "no x-opt-ORIG-ADDRESS/x-opt-ORIG-QUEUE"))
            continue
        original = broker.queues.get(queue_name_orig)
        address = broker.post_office.addresses.get(address_name)
        if original is None or address is None:
            if wanted is not None:
                gone = f"queue {queue_name_orig}" if original is None else f"address {address_name}"
                skipped.append((message.msg_id, f"original {gone} does not exist"))
            continue
        copy = broker.copy_for_move(message, queue, broker.hop(queue, message))
        routing_type = annotated_routing_type(copy.get_annotations(), jms_dest=False)
        if original.name != address.name:
            targets = [original] if original.accepts_message(copy) else []
        else:
            targets = broker.post_office.route(copy, address, routing_type)
        _complete_move(broker, queue, ref, copy, address.name, targets, reason="retry")
        retried += 1
    not_found = () if wanted is None else tuple(dict.fromkeys(i for i in wanted if i not in seen))
    return RetryResult(retried, tuple(skipped), not_found)


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
