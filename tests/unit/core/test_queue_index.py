"""Issue 23 (memory a purge or a drain frees comes back): the queue's id index gives back
the table a large backlog grew it to (`Queue._fit_index`). A dict keeps its largest table
as entries leave: after a purge of 1M messages `_by_id` held ~40 MB for no entry."""

from __future__ import annotations

import sys

from support.core_harness import Harness

from amqpbroker.core import ACCEPTED
from amqpbroker.core import operations as ops
from amqpbroker.core.queue import Queue

N = 20_000
SMALL = 8 * 64 * (256 + 64)  # what `_fit_index` may leave at `_INDEX_FLOOR` (160 KB)


def _filled(h: Harness, n: int = N) -> tuple[Queue, list[int]]:
    target = h.producer("q", "queue")
    ids = [h.send(target, b"%d" % i).msg_id for i in range(n)]
    queue = h.queue("q")
    assert sys.getsizeof(queue._by_id) > 16 * n  # the table the backlog grew it to
    return queue, ids


def test_a_purge_gives_back_the_id_index() -> None:
    h = Harness()
    queue, _ = _filled(h)
    assert ops.purge(h.broker, "q") == N
    assert sys.getsizeof(queue._by_id) < SMALL


def test_a_drain_gives_back_the_id_index_as_it_goes() -> None:
    """Rebuilt on the way down, sized for what is left, and still finds it."""
    h = Harness()
    queue, ids = _filled(h)
    c = h.consumer("q", "queue", credit=N - 1000)
    for d in h.take(c):
        h.settle(c, d, ACCEPTED)
    assert len(queue._by_id) == 1000
    assert sys.getsizeof(queue._by_id) < 64 * 8 * (1000 + 64)  # not the 20,000's table
    assert all(queue.find(i) is not None for i in ids[-1000:])
    assert queue.find(ids[0]) is None
    h.broker.set_credit(c, 1000)
    for d in h.take(c):
        h.settle(c, d, ACCEPTED)
    assert sys.getsizeof(queue._by_id) < SMALL


def test_removing_a_few_keeps_the_index() -> None:
    """A rebuild only when the table is far too large: taking a few by id from a large
    queue leaves the index as it is (O(1) each, issue: management on big queues)."""
    h = Harness()
    queue, ids = _filled(h, 1 << 12)
    index = queue._by_id
    assert ops.purge(h.broker, "q", ids=ids[5:7]) == 2  # left: 4094; 4096 was looked at
    assert queue._by_id is index
