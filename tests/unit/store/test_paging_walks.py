"""Management walks over paged queues run a slice at a time (issue 23 "management
operations behave the same for paged messages", B-151 with B-161): between slices the
broker serves other work, the result is what one pass gives, and what arrives or is
consumed meanwhile is handled exactly (core, real page files, no sockets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message as ProtonMessage

from amqpbroker.core import AddressSettings, IllegalState
from amqpbroker.core import operations as ops
from amqpbroker.core.outcomes import Accepted
from amqpbroker.protocol import message_of
from amqpbroker.protocol.moves import COPIER
from amqpbroker.store.paging import PageFiles
from tests.support.core_harness import Harness

LIMIT = 2_000  # max-size-bytes: a few dozen messages in memory, the rest paged
SLICE = 20


@pytest.fixture
def files(tmp_path: Path) -> Iterator[PageFiles]:
    files = PageFiles(tmp_path, message_of=message_of, page_size_bytes=lambda address: 4_000)
    files.recover({}, {})
    yield files
    files.close()


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "SLICE_MESSAGES", SLICE)


def _paging(files: PageFiles) -> Harness:
    h = Harness({"#": AddressSettings.of(max_size_bytes=LIMIT)}, copier=COPIER)
    h.broker.enable_paging(files)
    h.producer("other", "queue")
    return h


def _amqp(i: int, colour: str = "red") -> bytes:
    message = ProtonMessage(body=f"{i:06d}" + "x" * 40, properties={"colour": colour})
    return bytes(message.encode())


def _number(data: bytes) -> int:
    message = ProtonMessage()
    message.decode(data)
    return int(str(message.body)[:6])


def _send(h: Harness, address: str, numbers: range, colour: str = "red") -> None:
    target = h.producer(address, "queue")
    for i in numbers:  # the properties in memory as in the bytes a page file keeps
        h.send(target, _amqp(i, colour), props={"colour": colour})


def _drain(h: Harness, address: str) -> list[int]:
    c = h.consumer(address, "queue", credit=100_000)
    got = [_number(d.message.data) for d in h.take(c)]
    for d in h.take(c):
        got.append(_number(d.message.data))
    return got


def _steps(walk: ops.Walk[ops.R], between: object = None) -> int:
    """Run `walk` to its end, calling `between()` between slices; how many slices."""
    slices = 1
    while not walk.step():
        slices += 1
        if callable(between):
            between()
    return slices


def test_a_sliced_purge_of_a_paged_queue_lets_other_queues_work_and_keeps_arrivals(
    files: PageFiles,
) -> None:
    """A purge of 1,000 mostly paged messages takes many slices; between them a
    producer and a consumer of another queue are served, and messages sent to the
    purged queue after the purge started stay there, in order."""
    h = _paging(files)
    _send(h, "q", range(1_000))
    assert h.queue("q").pages.messages > 900
    other = h.consumer("other", "queue", credit=100_000)
    target = h.producer("other", "queue")
    late = h.producer("q", "queue")
    served: list[int] = []
    arrivals = iter(range(1_000, 2_000))

    def between() -> None:
        h.send(target, _amqp(len(served)))
        served.extend(_number(d.message.data) for d in h.take(other))
        h.send(late, _amqp(next(arrivals)))

    walk = ops.purge_walk(h.broker, "q")
    slices = _steps(walk, between)
    assert slices >= 1_000 // SLICE
    assert walk.result == 1_000
    assert served == list(range(slices - 1))  # the other queue was served every time
    assert h.queue("q").counters.killed == 1_000
    assert _drain(h, "q") == list(range(1_000, 1_000 + slices - 1))


@pytest.mark.parametrize("operation", ["purge", "move", "count", "retry-none"])
def test_a_filtered_walk_gives_what_one_pass_gives(files: PageFiles, operation: str) -> None:
    """A filter over in-memory and paged messages: the sliced walk's answer and the
    queue after it are those of one pass (`run`), with arrivals and a consumer of the
    queue meanwhile left to their own: the arrivals stay, in order after the rest."""
    h = _paging(files)
    for i in range(600):
        _send(h, "q", range(i, i + 1), "blue" if i % 3 == 0 else "red")
    blue = [i for i in range(600) if i % 3 == 0]
    red = [i for i in range(600) if i % 3 != 0]
    late = h.producer("q", "queue")
    arrivals = iter(range(600, 1_000))
    sent_late: list[int] = []

    def between() -> None:
        i = next(arrivals)
        sent_late.append(i)
        h.send(late, _amqp(i, "blue"), props={"colour": "blue"})

    selector = "colour = 'blue'"
    if operation == "purge":
        walk: ops.Walk[object] = ops.purge_walk(h.broker, "q", selector=selector)
    elif operation == "move":
        walk = ops.move_walk(h.broker, "q", to_queue="other", selector=selector)
    elif operation == "count":
        walk = ops.count_walk(h.broker, "q", selector=selector)
    else:  # nothing there has an original address: every match stays
        walk = ops.retry_walk(h.broker, "q", selector=selector)
    assert _steps(walk, between) > 600 // SLICE
    if operation == "retry-none":
        assert walk.result == ops.RetryResult(0)
        assert _drain(h, "q") == list(range(600)) + sent_late
        return
    assert walk.result == len(blue)
    if operation == "count":
        assert _drain(h, "q") == list(range(600)) + sent_late
        return
    assert _drain(h, "q") == red + sent_late
    if operation == "move":
        assert _drain(h, "other") == blue


def test_a_consumer_during_a_walk_gets_what_is_in_memory_and_the_rest_after(
    files: PageFiles,
) -> None:
    """While a walk holds the queue nothing is read back from the page files (the walk
    owns the cursor): a consumer gets the in-memory messages the walk has not taken,
    then, once the walk ends, the paged ones; nothing lost, nothing twice."""
    h = _paging(files)
    _send(h, "q", range(500))
    consumer = h.consumer("q", "queue", credit=0)
    got: list[int] = []

    def between() -> None:
        h.broker.set_credit(consumer, 5)
        for d in h.take(consumer):
            got.append(_number(d.message.data))
            h.settle(consumer, d, Accepted())

    in_memory = h.queue("q").memory_count
    walk = ops.count_walk(h.broker, "q", selector="colour = 'red'")
    _steps(walk, between)
    # each one was still in the queue when the walk came to it (the consumer takes from
    # the head, behind the walk's first slice)
    assert walk.result == 500
    assert len(got) == in_memory < 100  # the paged part waited for the walk's end
    h.broker.set_credit(consumer, 1_000)
    got.extend(_number(d.message.data) for d in h.take(consumer))
    assert got == list(range(500))


def test_a_second_walk_waits_and_one_run_at_once_is_refused(files: PageFiles) -> None:
    """One walk holds a queue at a time: another waits its turn (no progress), and an
    operation that must answer at once (`run`: the AMQP management address) is refused
    with IllegalState instead of walking the files under the first one's feet."""
    h = _paging(files)
    _send(h, "q", range(300))
    first = ops.purge_walk(h.broker, "q", selector="colour = 'red'")
    second = ops.count_walk(h.broker, "q", selector="colour = 'red'")
    assert not first.step()
    assert second.blocked
    assert not second.step()
    with pytest.raises(IllegalState):
        ops.purge(h.broker, "q")
    assert ops.count(h.broker, "q") == h.queue("q").message_count  # O(1): not refused
    while not first.step():
        pass
    assert first.result == 300
    assert not second.blocked
    _steps(second)
    assert second.result == 0
    assert ops.purge(h.broker, "q") == 0


def test_a_walk_stops_when_its_queue_is_deleted(files: PageFiles) -> None:
    """A queue deleted between slices ends the walk with what it had done."""
    h = _paging(files)
    _send(h, "q", range(300))
    walk = ops.purge_walk(h.broker, "q")
    assert not walk.step()
    ops.destroy_queue(h.broker, "q")
    _steps(walk)
    assert walk.result is not None
    assert 0 < walk.result < 300
