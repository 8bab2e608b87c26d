"""Management operations on big queues (B-161; issue: management on big queues blocks the
loop). One message by id and one browse page touch what they name, never the whole
queue: the operations are instrumented to fail if they list or sort it, and the queue's
containers must not be rebuilt. Their results are those of a walk of the whole queue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.core_harness import Harness

from amqpbroker.core import ACCEPTED, RELEASED, AddressSettings, QueueConfig, RoutingType
from amqpbroker.core import operations as ops
from amqpbroker.core.queue import Queue
from amqpbroker.core.refs import GONE

N = 3000


def _filled(h: Harness, n: int = N, address: str = "q") -> Queue:
    target = h.producer(address, "queue")
    for i in range(n):
        h.send(target, b"%d" % i, props={"n": i}, priority=i % 3 + 3)
    return h.queue(address)


def _no_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, listing every reference (the old O(n log n) path) fails the test."""

    def walked(self: Queue) -> list[object]:
        raise AssertionError("the whole queue was listed")

    monkeypatch.setattr(Queue, "refs", walked)
    monkeypatch.setattr(Queue, "iter_refs", walked)


def _ids(queue: Queue) -> list[int]:
    return [ref.message.msg_id for ref in queue.refs()]


def test_one_message_by_id_never_lists_or_rebuilds_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B-161 removeMessage/moveMessage/expireMessage/sendMessageToDeadLetterAddress/
    changeMessagePriority by id: O(1) by the queue's id index (O(log n) to re-prioritize),
    and the queue's containers are the same objects afterwards (no rebuild)."""
    h = Harness(
        {"#": AddressSettings.of(dead_letter_address="DLA", expiry_address="EXP")},
    )
    for name in ("other", "DLA", "EXP"):
        h.producer(name, "queue")
    queue = _filled(h)
    ids = _ids(queue)
    containers = [id(c) for c in (*queue._fresh, *queue._returned)]
    _no_walk(monkeypatch)

    assert ops.purge(h.broker, "q", ids=[ids[10]]) == 1
    assert ops.move(h.broker, "q", to_queue="other", ids=[ids[11]]) == 1
    assert ops.expire(h.broker, "q", ids=[ids[12]]) == 1
    assert ops.dead_letter(h.broker, "q", ids=[ids[13]]) == 1
    assert ops.change_priority(h.broker, "q", priority=9, ids=[ids[14]]) == 1
    assert ops.purge(h.broker, "q", ids=[ids[10], -5]) == 0  # gone, unknown: nothing
    assert [id(c) for c in (*queue._fresh, *queue._returned)] == containers
    assert queue.message_count == N - 4
    assert [h.queue(n).message_count for n in ("other", "DLA", "EXP")] == [1, 1, 1]
    assert queue.find(ids[10]) is None
    assert queue.find(ids[14]).message.priority == 9  # type: ignore[union-attr]


def test_a_browse_page_reads_only_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """B-161 listMessages / GET messages?offset&limit: the references are merged in
    order lazily and the walk stops after offset + limit, whatever the queue's size."""
    h = Harness()
    queue = _filled(h)
    expected = queue.refs()[40:50]
    read = 0
    lazy = Queue.iter_refs

    def counted(self: Queue) -> Iterator[object]:
        nonlocal read
        for ref in lazy(self):
            read += 1
            yield ref

    _no_walk(monkeypatch)
    monkeypatch.setattr(Queue, "iter_refs", counted)
    assert ops.browse(h.broker, "q", offset=40, limit=10) == expected
    assert read == 50


def test_lazy_order_is_the_order_of_the_whole_queue() -> None:
    """`iter_refs` lists what `refs` lists, in the same order: priorities, returned,
    scheduled (redelivery delay, B-065), delivering, gone ones left out."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=1_000)})
    queue = _filled(h, 60)
    c = h.consumer("q", "queue", credit=7)
    dispatches = h.take(c)
    for d in dispatches[:3]:
        h.settle(c, d, RELEASED)  # scheduled for 1 s
    ids = _ids(queue)
    ops.purge(h.broker, "q", ids=ids[20:25])  # GONE in place
    assert any(ref.state == GONE for ref in queue._fresh[3])
    h.send(h.producer("q", "queue"), b"late", priority=7)
    assert list(queue.iter_refs()) == queue.refs()
    assert [r.message.data for r in ops.browse(h.broker, "q", limit=1000)] == [
        r.message.data for r in queue.refs()
    ]


def test_lazy_order_of_a_non_destructive_queue_lists_each_message_once() -> None:
    """B-123: a delivered reference is both in its level and out with its consumer."""
    h = Harness()
    h.broker.create_address("q", {RoutingType.ANYCAST})
    h.broker.create_queue(
        QueueConfig(name="q", address="q", routing_type=RoutingType.ANYCAST, non_destructive=True)
    )
    queue = _filled(h, 20)
    h.take(h.consumer("q", "queue", credit=5))
    assert list(queue.iter_refs()) == queue.refs()
    assert len(queue.refs()) == 20


def test_the_id_index_follows_arrivals_deliveries_and_removals() -> None:
    """Every reference held is found by its id and nothing else is: the index is kept
    by arrival (`_enqueue`) and removal (`_removed`: ack, kill, expiry, move)."""
    h = Harness()
    queue = _filled(h, 50)
    target = h.producer("q", "queue")
    for i in range(10):
        h.send(target, b"new-%d" % i)
    c = h.consumer("q", "queue", credit=5)
    for d in h.take(c):
        h.settle(c, d, RELEASED if d.message.msg_id % 2 else ACCEPTED)
    ids = _ids(queue)
    ops.purge(h.broker, "q", ids=ids[:3])
    ops.change_priority(h.broker, "q", priority=0, ids=ids[3:5])
    held = queue.refs()
    assert all(queue.find(ref.message.msg_id) is ref for ref in held)
    assert len(queue._by_id) == len(held)


def test_many_removals_by_id_still_free_their_memory() -> None:
    """Issue 23: references taken one by one are dropped from the containers once they
    are an eighth of the queue (amortized O(1) each), not left until dispatch."""
    h = Harness()
    queue = _filled(h, 900)
    ids = _ids(queue)
    for msg_id in ids[:99]:
        ops.purge(h.broker, "q", ids=[msg_id])
    assert any(ref.state == GONE for level in queue._fresh for ref in level)
    ops.purge(h.broker, "q", ids=[ids[99]])  # the 100th: 100 * 8 >= 800 held
    assert not any(ref.state == GONE for level in queue._fresh for ref in level)
    assert queue.message_count == 800


def test_a_browser_grant_reads_lazily_and_never_sorts_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B-031: a browser's credit on a big queue costs its page: the queue is read lazily,
    never listed and sorted whole on each dispatch (it was ~50 ms a grant at 200k)."""
    h = Harness()
    queue = _filled(h)

    def walked(self: Queue) -> list[object]:
        raise AssertionError("the whole queue was listed")

    monkeypatch.setattr(Queue, "refs", walked)
    browser = h.consumer("q", "queue", credit=5, browse=True)
    first = [d.message.msg_id for d in h.take(browser)]
    h.broker.set_credit(browser, 5)
    second = [d.message.msg_id for d in h.take(browser)]
    monkeypatch.undo()
    assert first + second == _ids(queue)[:10]
    assert queue.message_count == N  # browsing takes nothing
