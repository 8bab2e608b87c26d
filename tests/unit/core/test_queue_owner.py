"""A `Queue` depends on its broker only through `QueueOwner` (issue 18 item: the seven
callbacks into `Broker` became one declared interface): a queue runs with a stub owner,
and every return path reaches the owner's method for it (B-015, B-065, B-070, B-084,
B-085, B-151)."""

from __future__ import annotations

from random import Random

from amqpbroker.core import (
    Accepted,
    AddressSettings,
    Message,
    Modified,
    QueueConfig,
    Rejected,
    ResolvedSettings,
    RoutingType,
)
from amqpbroker.core.clock import ManualClock, Moment
from amqpbroker.core.effects import Dispatch, Effect
from amqpbroker.core.model import ConnectionId, ConsumerId
from amqpbroker.core.queue import Consumer, DeliveryIds, Memory, Queue, QueueOwner
from amqpbroker.core.refs import Ref
from amqpbroker.core.settings import resolve


class _Owner:
    """Records what the queue asked of it."""

    def __init__(self, settings: ResolvedSettings) -> None:
        self.moment = Moment(ManualClock(1_000))
        self.memory = Memory({})
        self.settings = settings
        self.calls: list[tuple[object, ...]] = []

    def queue_settings(self, queue: Queue) -> ResolvedSettings:
        return self.settings

    def schedule(self, at_ms: int) -> None:
        self.calls.append(("schedule", at_ms))

    def freed(self, queue: Queue) -> None:
        self.calls.append(("freed",))

    def track_expiry(self, queue: Queue, ref: Ref) -> None:
        self.calls.append(("track", ref.message.msg_id))

    def expired(self, queue: Queue, ref: Ref) -> None:
        self.calls.append(("expired", ref.message.msg_id))

    def dead_letter(self, queue: Queue, ref: Ref, reason: str, rejection: Rejected | None) -> None:
        self.calls.append(("dead-letter", ref.message.msg_id, reason))


def _queue(owner: QueueOwner) -> Queue:
    return Queue(
        QueueConfig(name="q", address="q", routing_type=RoutingType.ANYCAST),
        owner=owner,
        selector=None,
        rng=Random(0),
        delivery_ids=DeliveryIds(),
    )


def _message(msg_id: int, *, deliver_at_ms: int = 0, expiration_ms: int = 0) -> Message:
    return Message(
        b"body",
        msg_id=msg_id,
        annotations={},
        properties={},
        deliver_at_ms=deliver_at_ms,
        expiration_ms=expiration_ms,
    )


def test_a_queue_runs_with_any_owner_and_asks_it_for_time_and_moves() -> None:
    owner = _Owner(resolve(AddressSettings.of(redelivery_delay=500, max_delivery_attempts=2)))
    queue = _queue(owner)
    out: list[Effect] = []
    size = _message(1).size
    queue.add(_message(1), out)
    queue.add(_message(2, deliver_at_ms=owner.moment.ms + 100), out)  # B-015: scheduled
    queue.add(_message(3, expiration_ms=owner.moment.ms + 50), out)
    assert owner.calls == [("schedule", 1_100), ("track", 3)]
    assert owner.memory.used == queue.size_bytes == 3 * size  # B-151, counted by the queue
    owner.calls.clear()

    consumer = Consumer(id=ConsumerId(1), queue=queue, connection=ConnectionId(1), credit=10)
    queue.add_consumer(consumer)
    owner.moment.ms += 60  # message 3 is past its expiration: never dispatched (B-084)
    queue.dispatch(out)
    [first] = [e for e in out if isinstance(e, Dispatch)]
    assert first.message.msg_id == 1
    assert ("expired", 3) in owner.calls

    owner.calls.clear()
    queue.settle(consumer, first.delivery, Modified(delivery_failed=True), owner.moment.ms, out)
    assert owner.calls == [("schedule", owner.moment.ms + 500)]  # B-065: the owner's time + delay

    owner.calls.clear()
    owner.moment.ms += 500
    out.clear()
    queue.tick(owner.moment.ms, out)
    again = [e for e in out if isinstance(e, Dispatch)]
    assert [d.message.msg_id for d in again] == [1, 2]  # both due now: at their places
    owner.memory.global_blocked = True  # B-151: freed bytes may let producers resume
    queue.settle(consumer, again[0].delivery, Rejected(), owner.moment.ms, out)
    queue.settle(consumer, again[1].delivery, Accepted(), owner.moment.ms, out)
    assert owner.calls == [("freed",), ("dead-letter", 1, "rejected"), ("freed",)]
    assert owner.memory.used == queue.size_bytes == 0
