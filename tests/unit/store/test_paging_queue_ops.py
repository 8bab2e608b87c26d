"""What else goes over a queue's messages, over a paged backlog (issue 23, B-151): a
purge-on-no-consumers (B-126) kills the paged part a read step a loop turn, holding the
queue as a management walk does; changeMessagesPriority (B-161) changes the in-memory
messages and reads no page file; the ids a replay task works on are found by a walk in
slices (core, real page files, no sockets)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.core import (
    AddressSettings,
    IllegalState,
    Message,
    ProducerRequest,
    ProducerTarget,
    QueueConfig,
    RoutingType,
)
from amqpbroker.core import operations as ops
from amqpbroker.core.outcomes import Accepted
from amqpbroker.core.paging import READ_STEP_MESSAGES
from amqpbroker.management import AmqpManagement
from amqpbroker.protocol import message_of
from amqpbroker.protocol.moves import COPIER
from amqpbroker.store.paging import PageFiles
from tests.support.core_harness import CONN, Harness

LIMIT = 2_000  # max-size-bytes: a few dozen messages in memory, the rest paged
N = 1_000
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


def _amqp(i: int, colour: str = "red") -> bytes:
    message = ProtonMessage(body=f"{i:06d}" + "x" * 40, properties={"colour": colour})
    return bytes(message.encode())


def _number(data: bytes) -> int:
    message = ProtonMessage()
    message.decode(data)
    return int(str(message.body)[:6])


def _paging(files: PageFiles, *, purge_on_no_consumers: bool = False) -> Harness:
    # a consumer reads back up to max-read-page-bytes: as little as memory holds here
    settings = AddressSettings.of(max_size_bytes=LIMIT, max_read_page_bytes=LIMIT)
    h = Harness({"#": settings}, copier=COPIER)
    h.broker.enable_paging(files)
    for name in ("q", "other"):
        h.broker.create_address(name, {RoutingType.ANYCAST})
        h.broker.create_queue(
            QueueConfig(
                name=name,
                address=name,
                routing_type=RoutingType.ANYCAST,
                purge_on_no_consumers=purge_on_no_consumers and name == "q",
            )
        )
    return h


def _send(h: Harness, address: str, numbers: range, colour: str = "red") -> None:
    target = h.producer(address, "queue")
    for i in numbers:  # the properties in memory as in the bytes a page file keeps
        h.send(target, _amqp(i, colour), props={"colour": colour})


def _take_all(h: Harness, consumer: object) -> list[int]:
    got: list[int] = []
    while batch := h.take(consumer):  # type: ignore[arg-type]
        for d in batch:
            got.append(_number(d.message.data))
            h.settle(consumer, d, Accepted())  # type: ignore[arg-type]
    return got


def _backlog(h: Harness) -> object:
    """N messages in q, most of them paged, sent while a consumer without credit was
    attached (B-126: routing skips the queue while it has none); that consumer."""
    idle = h.consumer("q", "queue", credit=0)
    _send(h, "q", range(N))
    assert h.queue("q").pages.messages > N - 100
    return idle


# -- B-126 purge-on-no-consumers over a paged backlog -------------------------------------


def test_the_last_consumer_leaving_kills_the_paged_backlog_a_step_a_loop_turn(
    files: PageFiles,
) -> None:
    """B-126 over B-151: the detach kills what memory holds; the paged part goes a read
    step per loop turn (`tick`), never more, while another queue is served in between;
    in the end every message is killed once (reason purge-on-no-consumers) and the page
    files hold nothing. Before: the detach read and killed the whole paged part in one
    loop turn (~20 s of loop for 1M paged messages)."""
    h = _paging(files, purge_on_no_consumers=True)
    idle = _backlog(h)
    queue = h.queue("q")
    pages = queue.pages
    paged = pages.messages
    other = h.consumer("other", "queue", credit=100_000)
    to_other = h.producer("other", "queue")
    h.broker.detach_consumer(idle, closed=True)  # type: ignore[arg-type]
    assert pages.messages == paged  # nothing paged in the detach's own loop turn
    assert queue.counters.killed == N - paged
    turns = 0
    served: list[int] = []
    while queue.message_count:
        before = pages.messages
        h.advance(0)  # a loop turn: the queue's tick
        assert before - pages.messages <= READ_STEP_MESSAGES
        h.send(to_other, _amqp(turns))
        served.extend(_number(d.message.data) for d in h.take(other))
        turns += 1
        assert turns <= paged
    assert turns >= paged // READ_STEP_MESSAGES
    assert served == list(range(turns))
    assert queue.counters.killed_by_reason["purge-on-no-consumers"] == N
    assert not getattr(queue, "purging_pages", False)
    assert (pages.messages, pages.size_bytes) == (0, 0)
    h.advance(0)
    assert queue.counters.killed == N  # done: no step more


def test_a_consumer_attached_during_the_purge_gets_only_what_came_after(
    files: PageFiles,
) -> None:
    """A consumer that attaches while the paged part is being purged gets none of the
    purged messages (nothing is read back meanwhile), and gets what is sent after it
    attached, in order, once the purge is through."""
    h = _paging(files, purge_on_no_consumers=True)
    idle = _backlog(h)
    h.broker.detach_consumer(idle, closed=True)  # type: ignore[arg-type]
    h.advance(0)
    queue = h.queue("q")
    assert getattr(queue, "purging_pages", True)
    late = h.consumer("q", "queue", credit=100_000)
    _send(h, "q", range(N, N + 50))  # paged behind the rest (B-014)
    got = _take_all(h, late)
    while getattr(queue, "purging_pages", False):
        h.advance(0)
        got.extend(_take_all(h, late))
    got.extend(_take_all(h, late))
    assert got == list(range(N, N + 50))
    assert queue.counters.killed == N


def test_the_purge_waits_for_a_management_walk_and_takes_each_message_once(
    files: PageFiles,
) -> None:
    """A filtered move walking the queue when the last consumer leaves keeps it: the
    purge's steps wait (an at-once operation is refused meanwhile), then kill what the
    move left. Every message is moved or killed, never both (before: the purge read the
    page files under the walk and cleared them)."""
    h = _paging(files, purge_on_no_consumers=True)
    idle = h.consumer("q", "queue", credit=0)
    for i in range(N):
        _send(h, "q", range(i, i + 1), "blue" if i % 3 == 0 else "red")
    walk = ops.move_walk(h.broker, "q", to_queue="other", selector="colour = 'blue'")
    for _ in range(3):
        assert not walk.step()
    queue = h.queue("q")
    h.broker.detach_consumer(idle, closed=True)  # type: ignore[arg-type]
    killed = queue.counters.killed
    h.advance(0)
    assert queue.counters.killed == killed  # waiting for the walk
    assert getattr(queue, "purging_pages", True)
    while not walk.step():
        h.advance(0)
    with pytest.raises(IllegalState):
        ops.purge(h.broker, "q")  # the purge holds the queue now
    while getattr(queue, "purging_pages", False):
        h.advance(0)
    blue = [i for i in range(N) if i % 3 == 0]
    moved = _take_all(h, h.consumer("other", "queue", credit=100_000))
    assert sorted(moved) == blue
    assert walk.result == len(blue)
    assert queue.counters.killed == N - len(blue)
    assert queue.message_count == 0


# -- B-161 changeMessagesPriority over a paged backlog ------------------------------------


def test_change_priority_changes_the_messages_in_memory_and_reads_no_page_file(
    files: PageFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Artemis (`changeReferencesPriority` goes over the references it holds), the
    paged messages keep their priority and are not read: before, the operation walked
    every page file in one loop turn to change nothing there. By id, a paged id is
    not looked for either."""
    h = _paging(files)
    _send(h, "q", range(N))
    queue = h.queue("q")
    in_memory = queue.memory_count
    reads: list[object] = []
    browse_from = queue.pages.browse_from
    monkeypatch.setattr(queue.pages, "browse_from", lambda at: reads.append(at) or browse_from(at))
    assert ops.change_priority(h.broker, "q", priority=9, selector="colour = 'red'") == in_memory
    assert ops.change_priority(h.broker, "q", priority=8, ids=[N + 10**6]) == 0
    paged_id = next(iter(browse_from(queue.pages.position)))[0].msg_id
    assert ops.change_priority(h.broker, "q", priority=8, ids=[paged_id]) == 0
    assert reads == []
    c = h.consumer("q", "queue", credit=100_000)
    priorities: list[int] = []
    while batch := h.take(c):
        for d in batch:
            priorities.append(d.message.priority)
            h.settle(c, d, Accepted())
    assert priorities == [9] * in_memory + [4] * (N - in_memory)


# -- the ids of a replay task over a filter (management/tasks.py) -------------------------


def test_a_replay_tasks_ids_are_found_a_slice_at_a_time_over_the_page_files(
    files: PageFiles,
) -> None:
    """The ids a task created with a filter works on (`waiting_ids_walk`, what the HTTP
    API runs) are found in slices, the other queue served between them, and are what
    one pass gives: the matching waiting messages in memory and paged, in order. Before,
    they were found in one loop turn over every page file."""
    h = _paging(files)
    for i in range(N):
        _send(h, "q", range(i, i + 1), "blue" if i % 3 == 0 else "red")
    assert h.queue("q").pages.messages > N - 100
    selector = "colour = 'blue'"
    at_once = ops.waiting_ids(h.broker, "q", selector=selector)
    assert len(at_once) == len(range(0, N, 3))
    other = h.consumer("other", "queue", credit=100_000)
    to_other = h.producer("other", "queue")
    walk = ops.waiting_ids_walk(h.broker, "q", selector=selector)
    slices = 0
    while not walk.step():
        slices += 1
        h.send(to_other, _amqp(slices))
        assert _take_all(h, other) == [slices]
    assert slices >= N // SLICE - 1
    assert walk.result == at_once


def test_a_replay_tasks_steps_each_read_their_part_of_the_page_files_not_all_before(
    files: PageFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task moving the blue third of a paged queue 50 ids a step (as tasks.py steps
    it): each step reads the page files from where the previous one found its last id,
    not from the cursor (the red ones stay there, and each step read them all again:
    quadratic, 382 ms a step at 20k paged). Ids given out of order, or before where the
    last step stopped, are still all found."""
    h = _paging(files)
    for i in range(N):
        _send(h, "q", range(i, i + 1), "blue" if i % 3 == 0 else "red")
    queue = h.queue("q")
    pages = queue.pages
    read = [0]
    browse_from = pages.browse_from

    def counted(at: object) -> Iterator[object]:
        for item in browse_from(at):  # type: ignore[arg-type]
            read[0] += 1
            yield item

    monkeypatch.setattr(pages, "browse_from", counted)
    ids = ops.waiting_ids(h.broker, "q", selector="colour = 'blue'")
    read[0] = 0
    steps = [ids[at : at + 50] for at in range(0, len(ids), 50)]
    first, rest = steps[0], steps[1:]
    assert ops.move(h.broker, "q", to_queue="other", ids=first) == len(first)
    most = 0
    for part in rest:
        read[0] = 0
        assert ops.move(h.broker, "q", to_queue="other", ids=part) == len(part)
        most = max(most, read[0])
    assert most <= 3 * 50 + 3  # its own third of the files (before: up to all of them)
    # out of order and behind the last step: found all the same (from the cursor on)
    left = ops.waiting_ids(h.broker, "q")
    assert ops.move(h.broker, "q", to_queue="other", ids=[left[-1], left[0], left[7]]) == 3
    moved = _take_all(h, h.consumer("other", "queue", credit=100_000))
    blue = [i for i in range(N) if i % 3 == 0]
    red = [i for i in range(N) if i % 3 != 0]
    assert moved[: len(blue)] == blue
    assert sorted(moved[len(blue) :]) == sorted([red[-1], red[0], red[7]])


# -- the AMQP management address (B-160) over a paged queue ------------------------------


def _request(h: Harness, target: ProducerTarget, operation: str, *args: object) -> None:
    raw = bytes(
        ProtonMessage(
            id=1,
            reply_to="r",
            properties={"_AMQ_ResourceName": "queue.q", "_AMQ_OperationName": operation},
            body=json.dumps(list(args)),
        ).encode()
    )
    scanned = sections.scan(raw)
    message = Message(
        scanned.data,
        header_end=scanned.header_end,
        head_end=scanned.head_end(),
        reader=sections.READER,
    )
    h.broker.publish(message, target)


@pytest.mark.parametrize(
    ("operation", "args", "answer"),
    [
        ("removeMessages", ("colour = 'blue'",), len(range(0, N, 3))),
        ("countMessages", ("colour = 'blue'",), len(range(0, N, 3))),
        ("moveMessages", ("colour = 'blue'", "other"), len(range(0, N, 3))),
    ],
)
def test_an_amqp_management_walk_over_a_paged_queue_is_answered_after_its_slices(
    files: PageFiles, operation: str, args: tuple[object, ...], answer: int
) -> None:
    """B-160 over B-151: a filtered request to the management address walks the queue a
    slice per loop turn (`Broker.run_in_background`) and is answered at the end, with
    what one pass gives; another queue is served between the slices. Before, it walked
    every page file in the request's loop turn (~20 s at 1M paged)."""
    h = _paging(files)
    h.broker.management = AmqpManagement(h.broker)
    for i in range(N):
        _send(h, "q", range(i, i + 1), "blue" if i % 3 == 0 else "red")
    h.producer("r", "queue")
    replies = h.consumer("r", "queue", credit=10)
    management = h.broker.attach_producer(
        ProducerRequest(connection=CONN, address="activemq.management")
    )
    to_served = h.producer("served", "queue")
    served = h.consumer("served", "queue", credit=100_000)
    _request(h, management, operation, *args)
    assert h.take(replies) == []  # not in the request's own loop turn
    turns = 0
    while not (got := h.take(replies)):
        h.advance(0)
        turns += 1
        h.send(to_served, _amqp(10_000 + turns))
        assert _take_all(h, served) == [10_000 + turns]
        assert turns <= N
    assert turns >= N // SLICE - 2
    (reply,) = got
    decoded = ProtonMessage()
    decoded.decode(reply.message.data)
    assert decoded.properties == {"_AMQ_OperationSucceeded": True}
    assert json.loads(decoded.body) == [answer]
    left = N if operation == "countMessages" else N - answer
    assert h.queue("q").message_count == left


# -- B-113/B-114 auto-delete of a queue and its address with a paged backlog ------------


def test_auto_deleting_a_paged_queue_and_its_address_removes_their_page_files(
    files: PageFiles, tmp_path: Path
) -> None:
    """An auto-created queue that may be deleted with messages in it
    (`auto-delete-queues-message-count` -1, B-113) and has a paged backlog: the reaper's
    two scans delete it, its page directory goes with it (and its address's, B-114),
    and a queue auto-created again under that name starts empty, on new files."""
    settings = AddressSettings.of(
        max_size_bytes=LIMIT, max_read_page_bytes=LIMIT, auto_delete_queues_message_count=-1
    )
    h = Harness({"#": settings}, address_queue_scan_period_ms=1_000)
    h.broker.enable_paging(files)
    consumer = h.consumer("auto", "queue", credit=0)
    target = h.producer("auto", "queue")
    for i in range(N):
        h.send(target, _amqp(i))
    assert h.queue("auto").pages.messages > N - 100
    directory = tmp_path / "auto"
    assert any(path.is_file() for path in directory.rglob("*"))
    h.broker.detach_consumer(consumer, closed=True)  # used: it may go now
    h.advance(1_000)
    h.advance(1_000)  # B-111: the second scan deletes it
    assert "auto" not in h.broker.queues
    assert not directory.exists()
    h.advance(1_000)
    h.advance(1_000)
    assert "auto" not in h.broker.post_office.addresses
    h.send(h.producer("auto", "queue"), _amqp(N))
    assert h.queue("auto").message_count == 1
    assert _take_all(h, h.consumer("auto", "queue", credit=10)) == [N]
