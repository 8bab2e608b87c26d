"""How long the other walks over a paged queue hold the loop (issue 23, h-page second
pass): purge-on-no-consumers (B-126), changeMessagesPriority, a replay task's ids and
its steps, and a filtered purge sent to the AMQP management address (B-160).

    .venv/bin/python bench/paging_queue_ops.py [N]      # N=50000 paged 1 KiB messages

The core broker with real page files (no sockets), max-size-bytes 100 kB, messages
alternating `k = 0` / `k = 1`. For each operation: the CPU seconds in all, and each
call into the broker that the loop would run as one turn (the detach, then each tick
of the purge; the priority change; each slice of the ids' walk, `time.monotonic` its
timer): how many, the longest and the median. On a checkout without the slicing each
operation is one call: one hold.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from proton import Message as ProtonMessage  # noqa: E402
from support.core_harness import Harness  # noqa: E402

from amqpbroker.core import AddressSettings, QueueConfig, RoutingType  # noqa: E402
from amqpbroker.core import operations as ops  # noqa: E402
from amqpbroker.protocol import message_of  # noqa: E402
from amqpbroker.protocol.moves import COPIER  # noqa: E402
from amqpbroker.store.paging import PageFiles  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000


def _paged(*, purge_on_no_consumers: bool = False) -> tuple[Harness, object]:
    files = PageFiles(
        Path(tempfile.mkdtemp()), message_of=message_of, page_size_bytes=lambda a: 10 << 20
    )
    files.recover({}, {})
    settings = AddressSettings.of(max_size_bytes=100_000, max_read_page_bytes=100_000)
    h = Harness({"#": settings}, copier=COPIER)
    h.broker.enable_paging(files)
    h.broker.create_address("q", {RoutingType.ANYCAST})
    config = QueueConfig(
        name="q",
        address="q",
        routing_type=RoutingType.ANYCAST,
        purge_on_no_consumers=purge_on_no_consumers,
    )
    h.broker.create_queue(config)
    idle = h.consumer("q", "queue", credit=0)  # B-126: routed to while it has one
    target = h.producer("q", "queue")
    bodies = [bytes(ProtonMessage(body="x" * 1000, properties={"k": k}).encode()) for k in (0, 1)]
    for i in range(N):
        h.send(target, bodies[i % 2], props={"k": i % 2})
    return h, idle


def _report(label: str, result: object, holds: list[float]) -> None:
    cpu = sum(holds)
    print(
        f"{label}: {result} in {cpu:.2f} s CPU; {len(holds)} loop turns, "
        f"longest {max(holds) * 1e3:.1f} ms, median {sorted(holds)[len(holds) // 2] * 1e3:.1f} ms",
        flush=True,
    )


def _timed(fn: Callable[[], object], holds: list[float]) -> object:
    started = time.process_time()
    result = fn()
    holds.append(time.process_time() - started)
    return result


def purge_on_no_consumers() -> None:
    h, idle = _paged(purge_on_no_consumers=True)
    queue = h.queue("q")
    holds: list[float] = []
    _timed(lambda: h.broker.detach_consumer(idle, closed=True), holds)  # type: ignore[arg-type]
    while queue.message_count:
        _timed(lambda: h.advance(0), holds)
    _report("purge-on-no-consumers", queue.counters.killed, holds)


def change_priority() -> None:
    h, _ = _paged()
    holds: list[float] = []
    change = lambda: ops.change_priority(h.broker, "q", priority=9, selector="k = 0")  # noqa: E731
    changed = _timed(change, holds)
    _report("changeMessagesPriority k = 0", changed, holds)


def waiting_ids() -> None:
    h, _ = _paged()
    holds: list[float] = []
    if not hasattr(ops, "waiting_ids_walk"):
        ids = _timed(lambda: ops.waiting_ids(h.broker, "q", selector="k = 0"), holds)
    else:
        walk = ops.waiting_ids_walk(h.broker, "q", selector="k = 0")
        walk.timer = time.monotonic
        while not _timed(walk.step, holds):
            pass
        ids = walk.result
    _report("a task's ids, k = 0", len(ids), holds)  # type: ignore[arg-type]


def task_steps() -> None:
    """A move task over `k = 0`: each step moves the next CHUNK_MAX ids (at once, as
    `management/tasks.py` runs it); the `k = 1` ones stay at the head of the pages."""
    h, _ = _paged()
    h.broker.create_address("other", {RoutingType.ANYCAST})
    anycast = RoutingType.ANYCAST
    h.broker.create_queue(QueueConfig(name="other", address="other", routing_type=anycast))
    ids = ops.waiting_ids(h.broker, "q", selector="k = 0")
    holds: list[float] = []
    moved = 0
    for at in range(0, len(ids), 100):
        part = ids[at : at + 100]
        step = partial(ops.move, h.broker, "q", to_queue="other", ids=part)
        moved += _timed(step, holds)  # type: ignore[operator]
    _report("a move task's steps, k = 0", moved, holds)


def management_address() -> None:
    """removeMessages(k = 0) sent to the AMQP management address: the request's own
    loop turn, then each tick until the reply is there."""
    from support.core_harness import CONN

    from amqpbroker.amqp import sections
    from amqpbroker.core import Message, ProducerRequest
    from amqpbroker.management import AmqpManagement

    h, _ = _paged()
    h.broker.management = AmqpManagement(h.broker)
    h.producer("r", "queue")
    replies = h.consumer("r", "queue", credit=10)
    request_to = ProducerRequest(connection=CONN, address="activemq.management")
    target = h.broker.attach_producer(request_to)
    raw = bytes(
        ProtonMessage(
            id=1,
            reply_to="r",
            properties={"_AMQ_ResourceName": "queue.q", "_AMQ_OperationName": "removeMessages"},
            body='["k = 0"]',
        ).encode()
    )
    scanned = sections.scan(raw)
    head_end = scanned.head_end()
    request = Message(
        scanned.data, header_end=scanned.header_end, head_end=head_end, reader=sections.READER
    )
    holds: list[float] = []
    _timed(lambda: h.broker.publish(request, target), holds)
    while not h.take(replies):
        _timed(lambda: h.advance(0), holds)
    _report("removeMessages k = 0 (management address)", h.queue("q").counters.killed, holds)


def main() -> None:
    purge_on_no_consumers()
    change_priority()
    waiting_ids()
    task_steps()
    management_address()


if __name__ == "__main__":
    main()
