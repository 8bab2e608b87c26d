"""Replay tasks (issue 24, "Replay as a managed task"; B-161 retry and move): paced by a
manual clock, cancelled, saved and resumed, without sockets or an event loop."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support.core_harness import Harness

from amqpbroker.core import AddressSettings, ClientError, NotFound, Rejected
from amqpbroker.management import tasks
from amqpbroker.management.tasks import Task, TaskFile, TaskRunner

DLA = {"#": AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)}


class ManualLoop:
    """`call_later` and a monotonic clock that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[list[object]] = []  # [due, fn, cancelled]

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Handle:
        entry: list[object] = [self.now + delay, fn, False]
        self.timers.append(entry)
        return _Handle(entry)

    def run_until(self, t: float) -> None:
        """Run every timer due up to `t`, in order, advancing the clock to each."""
        while True:
            due = [e for e in self.timers if not e[2] and float(e[0]) <= t]  # type: ignore[arg-type]
            if not due:
                break
            entry = min(due, key=lambda e: float(e[0]))  # type: ignore[arg-type]
            self.timers.remove(entry)
            self.now = max(self.now, float(entry[0]))  # type: ignore[arg-type]
            entry[1]()  # type: ignore[operator]
        self.now = t


class _Handle:
    def __init__(self, entry: list[object]) -> None:
        self.entry = entry

    def cancel(self) -> None:
        self.entry[2] = True


def dead_letters(h: Harness, address: str, count: int) -> list[int]:
    target = h.producer(address, "queue")
    for i in range(count):
        h.send(target, b"m%d" % i, props={"n": i})
    c = h.consumer(address, "queue")
    for d in h.take(c):
        h.settle(c, d, Rejected())
    h.broker.detach_consumer(c, closed=True)
    return [r.message.msg_id for r in h.queue(f"DLQ.{address}").refs()]


def runner(h: Harness, loop: ManualLoop, saved: list[str]) -> TaskRunner:
    return TaskRunner(h.broker, now=lambda: loop.now, call_later=loop.call_later, save=saved.append)


def test_a_retry_task_is_paced_at_its_rate() -> None:
    """Issue 24: 25 messages at 10 msg/s go back in chunks of 10 at 0 s, 1 s and 2 s;
    nothing runs ahead of the rate, and the task completes with done == total."""
    h = Harness(DLA)
    dead_letters(h, "orders", 25)
    loop = ManualLoop()
    run = runner(h, loop, [])
    task = run.create("retry", "DLQ.orders", rate=10)
    assert (task.done, task.total, task.status) == (0, 25, "running")
    loop.run_until(0.0)
    assert task.done == 10
    assert h.queue("orders").message_count == 10
    loop.run_until(0.99)
    assert task.done == 10  # the next chunk is due at 1.0 s
    loop.run_until(1.0)
    assert task.done == 20
    loop.run_until(2.0)
    assert (task.done, task.moved, task.status) == (25, 25, "completed")
    assert h.queue("DLQ.orders").message_count == 0
    assert h.queue("orders").message_count == 25


def test_a_move_task_moves_the_messages_that_matched_when_it_was_created() -> None:
    """Issue 24: the messages are fixed at creation (later arrivals are not touched)."""
    h = Harness(DLA)
    dead_letters(h, "orders", 4)
    h.producer("parked", "queue")
    loop = ManualLoop()
    run = runner(h, loop, [])
    task = run.create("move", "DLQ.orders", rate=100, to_queue="parked", filter="n < 2")
    assert task.total == 2
    dead_letters(h, "orders", 1)  # arrives after: not part of the task
    loop.run_until(1.0)
    assert (task.status, task.moved) == ("completed", 2)
    assert h.queue("parked").message_count == 2
    assert h.queue("DLQ.orders").message_count == 3
    assert "not_found" not in task.view()  # by filter: nothing to report per id


def test_cancel_stops_a_task_between_chunks() -> None:
    h = Harness(DLA)
    dead_letters(h, "orders", 5)
    loop = ManualLoop()
    run = runner(h, loop, [])
    task = run.create("retry", "DLQ.orders", rate=2)
    loop.run_until(0.0)
    assert task.done == 2
    run.cancel(task.id)
    loop.run_until(10.0)
    assert (task.status, task.done) == ("cancelled", 2)
    assert h.queue("DLQ.orders").message_count == 3


def test_ids_report_skipped_and_not_found_and_expect_is_checked() -> None:
    """Issue 16 item 2 kept: by id, a task reports ids not waiting and ids whose redrive
    line does not match."""
    h = Harness(DLA)
    ids = dead_letters(h, "orders", 3)
    loop = ManualLoop()
    run = runner(h, loop, [])
    expect = {ids[1]: {"queue": "DLQ.elsewhere"}}
    task = run.create("retry", "DLQ.orders", rate=100, ids=[ids[0], ids[1], 999_999], expect=expect)
    loop.run_until(1.0)
    view = task.view()
    assert view["status"] == "completed"
    assert view["retried"] == 1
    assert view["not_found"] == [999_999]
    assert [s["msg_id"] for s in view["skipped"]] == [ids[1]]


def test_a_task_resumes_from_its_saved_progress() -> None:
    """Issue 24: a restart resumes a running task where its saved `done` says; a chunk
    done twice finds its ids gone (not found), never retries a message twice."""
    h = Harness(DLA)
    dead_letters(h, "orders", 6)
    loop = ManualLoop()
    saved: list[str] = []
    run = runner(h, loop, saved)
    task = run.create("retry", "DLQ.orders", rate=2)
    loop.run_until(0.0)
    run.stop()  # the broker stops after one chunk
    records = json.loads(saved[-1])
    assert records[0]["progress"]["done"] == 2
    again = runner(h, loop, saved)
    again.resume([Task.from_record(r) for r in records])
    resumed = again.get(task.id)
    loop.run_until(loop.now + 2.0)
    assert (resumed.status, resumed.done, resumed.moved) == ("completed", 6, 6)
    assert h.queue("orders").message_count == 6


def test_progress_saves_are_throttled_but_never_lost() -> None:
    """The file is written at most every SAVE_INTERVAL_S while a task runs; the last
    progress still gets saved (a deferred save)."""
    h = Harness(DLA)
    dead_letters(h, "orders", 30)
    loop = ManualLoop()
    saved: list[str] = []
    run = runner(h, loop, saved)
    run.create("retry", "DLQ.orders", rate=20)  # 20 msg/s in chunks of 20: 1.5 s
    loop.run_until(0.5)
    loop.run_until(5.0)
    assert json.loads(saved[-1])[0]["progress"]["status"] == "completed"
    assert len(saved) <= 4


def test_bad_tasks_are_refused() -> None:
    h = Harness(DLA)
    dead_letters(h, "orders", 1)
    run = runner(h, ManualLoop(), [])
    with pytest.raises(NotFound):
        run.create("retry", "nope", rate=1)
    with pytest.raises(NotFound):
        run.create("move", "DLQ.orders", rate=1, to_queue="nope")
    with pytest.raises(ClientError):
        run.create("retry", "DLQ.orders", rate=0)
    with pytest.raises(ClientError):
        run.create("move", "DLQ.orders", rate=1, to_queue="DLQ.orders")
    with pytest.raises(ClientError, match="Invalid filter"):
        run.create("retry", "DLQ.orders", rate=1, filter="color = ")
    for _ in range(tasks.MAX_RUNNING):
        run.create("retry", "DLQ.orders", rate=1)
    with pytest.raises(ClientError, match="tasks are running"):
        run.create("retry", "DLQ.orders", rate=1)


def test_a_task_whose_queue_goes_away_fails_with_the_reason() -> None:
    h = Harness(DLA)
    dead_letters(h, "orders", 3)
    loop = ManualLoop()
    run = runner(h, loop, [])
    task = run.create("retry", "DLQ.orders", rate=1)
    loop.run_until(0.0)
    h.broker.delete_queue("DLQ.orders")
    loop.run_until(5.0)
    assert task.status == "failed"
    assert task.error is not None
    assert "DLQ.orders" in task.error


def test_the_task_file_is_replaced_whole_and_an_unreadable_one_set_aside(tmp_path: Path) -> None:
    path = tmp_path / tasks.FILE_NAME
    store = TaskFile(path)
    task = Task(
        id="t1",
        kind="retry",
        queue="Q",
        ids=[1, 2],
        rate=1.0,
        created_ms=5,
        expect={1: {"queue": "Q"}},
    )
    store.save(tasks.tasks_text([task]))
    store.close()
    reader = TaskFile(path)
    [loaded] = reader.load()
    assert loaded == task
    path.write_text("{not json")
    assert reader.load() == []
    assert path.with_suffix(".json.unreadable").exists()
    reader.close()


_GOOD = {
    "definition": {
        "id": "t1",
        "kind": "retry",
        "queue": "Q",
        "ids": [1],
        "rate": 1.0,
        "created_ms": 5,
    },
    "progress": {"status": "running", "done": 0},
}


def _crafted(**changes: object) -> str:
    definition = {**_GOOD["definition"], **changes}
    return json.dumps([{"definition": definition, "progress": _GOOD["progress"]}])


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # RecursionError out of json.loads
        '{"definition": {}}',  # not a list
        "[1]",
        '[{"definition": [], "progress": {}}]',
        '[{"definition": {"id": "t"}, "progress": {}}]',  # required fields missing
        _crafted(ids="abc"),
        _crafted(ids=[1, "2"]),
        _crafted(rate="fast"),
        _crafted(rate=-1),
        _crafted(kind="delete"),
        _crafted(queue=["Q"]),
        _crafted(expect=["not", "a", "map"]),  # AttributeError out of .items()
        _crafted(expect={"x": {"queue": "Q"}}),
        _crafted(by_id="yes"),
        _crafted(created_ms=True),
    ],
)
def test_a_crafted_task_file_is_set_aside_not_raised(tmp_path: Path, text: str) -> None:
    """Issue 15 attack (B-160): DATA_DIR/tasks.json may be damaged or crafted. Nested
    deep it raised RecursionError, an `expect` that is a list AttributeError, out of the
    start; a field of the wrong type was taken and failed later, on the loop. Each is
    now a file that does not read: moved aside, no tasks."""
    path = tmp_path / tasks.FILE_NAME
    path.write_text(text)
    reader = TaskFile(path)
    try:
        assert reader.load() == []
    finally:
        reader.close()
    assert not path.exists()
    assert path.with_suffix(".json.unreadable").read_text() == text


def test_a_good_crafted_record_still_loads(tmp_path: Path) -> None:
    """The checks above refuse types, not records: the smallest good one loads."""
    path = tmp_path / tasks.FILE_NAME
    path.write_text(_crafted())
    reader = TaskFile(path)
    [task] = reader.load()
    reader.close()
    assert (task.id, task.ids, task.rate, task.status) == ("t1", [1], 1.0, "running")


def test_a_task_definition_is_encoded_once() -> None:
    """Progress is saved every second: the ids (maybe millions) are not re-encoded each
    time, so a save costs the loop the progress fields only."""
    task = Task(id="t", kind="retry", queue="Q", ids=list(range(100_000)), rate=1.0, created_ms=0)
    first = task.record()
    task.ids = []  # not looked at again
    task.done = 7
    again = json.loads(task.record())
    assert len(again["definition"]["ids"]) == 100_000
    assert again["progress"]["done"] == 7
    assert first != task.record()
