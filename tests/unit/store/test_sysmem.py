"""Issue 23 items 1 and 3: the memory limit global-max-size defaults from, and giving
freed memory back (`store/sysmem.py`)."""

from __future__ import annotations

import asyncio
import threading

from amqpbroker.core import AddressSettings
from amqpbroker.core import operations as ops
from amqpbroker.management.api import LoopBridge
from amqpbroker.store import sysmem
from tests.support.core_harness import Harness


def test_default_global_max_size_is_half_the_memory_limit() -> None:
    """B-151: as Artemis's half of the JVM heap."""
    limit = sysmem.memory_limit_bytes()
    assert limit > 0
    assert sysmem.default_global_max_size() == limit // 2


def test_the_returner_trims_once_queued_bytes_fell_by_the_threshold() -> None:
    """malloc_trim runs after a large drop from the peak, not on every small one."""
    calls: list[int] = []
    returner = sysmem.MemoryReturner(threshold_bytes=100)
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)
    assert not returner.check(450)  # fell by 50: not yet
    assert returner.check(390)  # fell by 110 from the peak
    assert not returner.check(380)  # the peak is now 390
    assert len(calls) == 1


def test_the_returner_trims_what_is_left_once_a_drain_has_stopped() -> None:
    """Issue 23 (memory a drain frees comes back within a bounded time): the last part
    of a drain, less than the threshold, was never given back (RSS +18 MB after a
    50 MiB drain, for good). Now, once the queued bytes stop falling (the same at two
    checks, a second apart on the server), a drop of `settled_bytes` is trimmed too,
    once."""
    calls: list[int] = []
    returner = sysmem.MemoryReturner(threshold_bytes=100, settled_bytes=10)
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)
    assert not returner.check(450)  # still falling, by less than the threshold
    assert returner.check(450)  # stopped: the 50 freed go back
    assert not returner.check(450)  # once
    assert not returner.check(445)  # less than settled_bytes
    assert not returner.check(445)
    assert len(calls) == 1


def test_the_returner_trims_at_once_when_a_walk_has_ended() -> None:
    """Issue 23: a sliced purge over HTTP frees what it took when it ends; the server
    checks then with `ended`, so a drop of `settled_bytes` is trimmed at once (the
    periodic check runs only while a connection has a timer: RSS stayed 60 MB up)."""
    calls: list[int] = []
    returner = sysmem.MemoryReturner(threshold_bytes=100, settled_bytes=10)
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)
    assert returner.check(450, ended=True)  # less than the threshold, all freed now
    assert not returner.check(445, ended=True)  # less than settled_bytes
    assert len(calls) == 1


def test_a_purge_drops_the_removed_references_at_once() -> None:
    """Issue 23 item 3: purged messages are not left in the queue's structures until
    dispatch reaches them (their memory is freed with the purge)."""
    h = Harness({"#": AddressSettings.of(redelivery_delay=1_000)})
    target = h.producer("q", "queue")
    for i in range(10):
        h.send(target, b"%d" % i, priority=i % 3)
    queue = h.queue("q")
    assert ops.purge(h.broker, "q", selector="JMSPriority < 2") > 0
    held = [r for level in queue._fresh for r in level] + [r for h_ in queue._returned for r in h_]
    assert len(held) == queue.message_count


def test_the_returner_collects_and_trims_after_connections_that_dropped_transfers() -> None:
    """Issue 23 (memory an aborted oversized transfer frees comes back): a closed
    connection's engine buffers go only with a full collection; the returner runs one
    (and a trim) once closed connections dropped `settled_bytes`, at most once per
    `collect_interval_s`, whatever the queued bytes do."""
    calls: list[int] = []
    now = [100.0]
    returner = sysmem.MemoryReturner(
        threshold_bytes=100,
        settled_bytes=10,
        collect_interval_s=10,
        collect_below_bytes=100,  # a backlog above it: only the dropped bytes count
        clock=lambda: now[0],
    )
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)
    returner.released(5)
    assert not returner.check(500)  # less than settled_bytes
    returner.released(5)
    assert returner.check(500)
    assert (returner.collections, len(calls)) == (1, 1)
    returner.released(50)
    now[0] += 9
    assert not returner.check(500)  # within the interval: kept for later
    now[0] += 1
    assert returner.check(500)
    assert (returner.collections, len(calls)) == (2, 2)
    assert not returner.check(500)


def test_a_trim_before_a_walk_frees_does_not_take_its_drop_with_it() -> None:
    """Issue 23, the purge test that failed at load ~20 (RSS at its peak for good): a
    walk's accounting falls slice by slice, its queue frees what it took only at its
    end. A periodic check between the last slice that killed and the one that frees
    trimmed (nothing freed yet) and moved the only mark to 0, so the walk's end found no
    drop and nothing trimmed after the frees. The ended rule has its own mark."""
    calls: list[int] = []
    returner = sysmem.MemoryReturner(threshold_bytes=100, settled_bytes=10)
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)  # the backlog, at a periodic check
    assert returner.check(0)  # mid-walk: all killed, nothing freed yet (falling rule)
    assert returner.check(0)  # a second check, still mid-walk: settled, trimmed again
    assert returner.check(0, ended=True)  # the walk freed it all: trimmed after the frees
    assert not returner.check(0, ended=True)  # once: the next walk took nothing
    assert not returner.check(0)
    assert len(calls) == 3


def test_the_settled_rule_is_not_consumed_by_a_trim_while_falling() -> None:
    """The last part of a drain goes back once it stops, after a falling-rule trim
    in the middle of it (each rule measures from its own mark)."""
    calls: list[int] = []
    returner = sysmem.MemoryReturner(threshold_bytes=100, settled_bytes=10)
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)
    assert returner.check(380)  # falling by 120: trimmed, the falling mark is 380
    assert not returner.check(330)  # falling by 50 more
    assert returner.check(330)  # stopped: trimmed (the settled rule's mark is 500)
    assert not returner.check(330)
    assert len(calls) == 2


def test_a_purge_is_given_back_after_its_queue_let_go_whenever_checks_come() -> None:
    """Issue 23, the same race through a real purge walk: the server's periodic checks
    may come between any two slices (here two between each), the last check is the
    walk's end (`ended`). The last trim must come after the queue dropped what it took
    (its containers rebuilt at the walk's end), or RSS stays at its peak."""
    h = Harness()
    target = h.producer("q", "queue")
    for _ in range(10 * ops.SLICE_MESSAGES):  # the last kill ends a slice: compact is next
        h.send(target, b"x" * 1024)
    queue = h.queue("q")
    trims: list[tuple[int, int]] = []  # (queued bytes, references the queue holds) at each
    returner = sysmem.MemoryReturner(threshold_bytes=1 << 20, settled_bytes=1 << 16)
    returner._trim = lambda: trims.append((h.broker.memory_bytes, len(queue._fresh[4]))) or True
    assert not returner.check(h.broker.memory_bytes)
    walk = ops.purge_walk(h.broker, "q")
    while not walk.step():
        returner.check(h.broker.memory_bytes)
        returner.check(h.broker.memory_bytes)
    assert returner.check(h.broker.memory_bytes, ended=True)
    assert trims[-1] == (0, 0)


def test_the_returner_collects_after_any_closed_connection_once_little_is_queued() -> None:
    """Issue 23 (memory a drain frees comes back): the consumer's closed connection (its
    engine, its objects in reference cycles) stayed until a full collection (300k
    drained: RSS +17.8 MiB, +2.1 after a collection). Collected once the queued bytes
    are below `collect_below_bytes` (the collection then short), at most once per
    `collect_interval_s`."""
    calls: list[int] = []
    now = [100.0]
    returner = sysmem.MemoryReturner(
        threshold_bytes=1000,
        settled_bytes=10,
        collect_interval_s=10,
        collect_below_bytes=100,
        clock=lambda: now[0],
    )
    returner._trim = lambda: calls.append(1) or True
    assert not returner.check(500)
    returner.released(0)  # a connection closed while 500 are queued: not yet
    assert not returner.check(450)
    assert returner.check(100)  # below the bound: collected and trimmed
    assert (returner.collections, len(calls)) == (1, 1)
    assert returner.check(100)  # settled: its own rule's trim, once
    returner.released(0)
    now[0] += 5
    assert not returner.check(100)  # within the interval: kept for later
    now[0] += 5
    assert returner.check(100)
    assert (returner.collections, len(calls)) == (2, 3)
    assert not returner.check(100)


def test_the_bridge_checks_a_walk_after_its_last_effects_went_out() -> None:
    """Issue 23: the server's memory check at a walk's end (`walked`) comes after the
    walk's last slice's effects were applied (`after_slice`), so what they held is freed
    before the trim, not after it."""
    h = Harness()
    target = h.producer("q", "queue")
    for _ in range(3 * ops.SLICE_MESSAGES):
        h.send(target, b"x")
    calls: list[str] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        bridge = LoopBridge(
            loop,
            after=lambda: calls.append("after"),
            after_slice=lambda: calls.append("slice"),
            walked=lambda: calls.append("walked"),
        )
        assert bridge.walk(lambda: ops.purge_walk(h.broker, "q"), lambda n: n) == 1500
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
    assert calls[-2:] == ["slice", "walked"]
    assert calls.count("walked") == 1
