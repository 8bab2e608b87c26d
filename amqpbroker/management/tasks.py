"""Replay tasks (issue 24): a retry or move of many messages, run by the broker, paced.

Like an AWS SQS message-move task: the caller (the console, `amqpbroker retry --rate`)
creates it and goes away; the broker works through it on the event loop, a chunk at a
time at the task's rate, and anyone can watch its progress (done/total) or cancel it.

- The messages are fixed when the task is created: the ids asked for, or the ids of the
  messages then waiting that match the filter. Later arrivals are not touched.
- Each step is one `ops.retry`/`ops.move` call over at most `CHUNK_MAX` ids, run on the
  loop between other work; the next step is scheduled at `start + done / rate`, so the
  loop is never held and no thread sleeps.
- The definition (ids included) and the progress are saved to DATA_DIR/tasks.json
  (`TaskFile`: written off the loop, fsync'd, renamed into place). After a restart the
  running tasks go on from the last saved `done`. Progress saved a little late only
  means a few ids are tried twice: a message retried or moved gets a new id (ids are
  unique across restarts), so its old id is simply not found again (reported, harmless).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqpbroker.core import ClientError, NotFound
from amqpbroker.core import operations as ops
from amqpbroker.core.broker import Broker

log = logging.getLogger(__name__)

FILE_NAME = "tasks.json"
CHUNK_MAX = 100  # ids per step: one step holds the loop for ~1 ms
BUSY_RETRY_S = 0.05  # a step waits this long while a management walk holds its queue
KEEP_FINISHED = 50  # finished tasks listed (and kept in the file), newest first
MAX_RUNNING = 100  # running at once: each is a timer and a list of ids in memory
MAX_RATE = 100_000.0  # msg/s
SAVE_INTERVAL_S = 1.0  # progress is saved at most this often (state changes at once)
KINDS = ("retry", "move")
RUNNING, COMPLETED, CANCELLED, FAILED = "running", "completed", "cancelled", "failed"


@dataclass
class Task:
    """One replay task: its definition (fixed) and its progress."""

    id: str
    kind: str  # "retry" (to the original address) or "move" (to `to_queue`)
    queue: str
    ids: list[int]
    rate: float  # msg/s
    created_ms: int
    to_queue: str | None = None
    filter: str | None = None
    expect: dict[int, dict[str, str | None]] | None = None  # retry: redrive-line checks
    by_id: bool = False  # asked for by id: report `skipped` and `not_found`
    status: str = RUNNING
    done: int = 0  # ids handled (moved, skipped or not found)
    moved: int = 0  # messages retried or moved
    skipped: list[dict[str, Any]] = field(default_factory=list)
    not_found: list[int] = field(default_factory=list)
    error: str | None = None
    finished_ms: int | None = None
    _definition: str | None = field(default=None, repr=False, compare=False)

    @property
    def total(self) -> int:
        return len(self.ids)

    def view(self) -> dict[str, Any]:
        """The API's view: everything but the ids (they may be many)."""
        answer: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "queue": self.queue,
            "to_queue": self.to_queue,
            "filter": self.filter,
            "rate": self.rate,
            "status": self.status,
            "done": self.done,
            "total": self.total,
            "created_ms": self.created_ms,
            "finished_ms": self.finished_ms,
            "error": self.error,
            ("retried" if self.kind == "retry" else "moved"): self.moved,
        }
        if self.by_id:
            answer["skipped"] = self.skipped
            answer["not_found"] = self.not_found
        return answer

    def record(self) -> str:
        """The task as saved: its definition (encoded once: the ids may be millions, and
        progress is saved every second) and its progress."""
        if self._definition is None:
            definition = {k: getattr(self, k) for k in DEFINITION if k != "expect"}
            definition["expect"] = (
                None if self.expect is None else {str(k): v for k, v in self.expect.items()}
            )
            self._definition = json.dumps(definition)
        progress = json.dumps({k: getattr(self, k) for k in PROGRESS})
        return f'{{"definition": {self._definition}, "progress": {progress}}}'

    @classmethod
    def from_record(cls, record: Any) -> Task:
        """The task a saved record holds, every field checked: the file is DATA_DIR's and
        may be damaged or crafted; a value of the wrong type raised at the start, or
        later on the loop (issue 15 attack).

        Raises:
            ValueError: not a record of this version's fields and types.
        """
        if not isinstance(record, dict):
            raise ValueError("a task record is not an object")
        definition, progress = record.get("definition"), record.get("progress")
        if not isinstance(definition, dict) or not isinstance(progress, dict):
            raise ValueError("a task record lacks its definition or progress")
        values = {**definition, **progress}
        for name, check in _FIELD_CHECKS.items():
            if name in values and not check(values[name]):
                raise ValueError(f"task field {name!r} has a value of the wrong type")
        expect = values.pop("expect", None)
        try:
            task = cls(**{k: values[k] for k in (*DEFINITION, *PROGRESS) if k in values})
        except TypeError as e:  # a required field missing
            raise ValueError(str(e)) from None
        task.expect = None if expect is None else {int(k): v for k, v in expect.items()}
        return task


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _are_ints(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _is_expect(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and all(
            isinstance(fields, dict) and all(_is_text_or_none(v) for v in fields.values())
            for fields in value.values()
        )
    )


# What each saved field may hold (`Task.from_record`).
_FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    "id": _is_text,
    "kind": lambda v: v in KINDS,
    "queue": _is_text,
    "ids": _are_ints,
    "rate": lambda v: (_is_int(v) or isinstance(v, float)) and 0 < v <= MAX_RATE,
    "created_ms": _is_int,
    "to_queue": _is_text_or_none,
    "filter": _is_text_or_none,
    "expect": _is_expect,
    "by_id": lambda v: isinstance(v, bool),
    "status": lambda v: v in (RUNNING, COMPLETED, CANCELLED, FAILED),
    "done": lambda v: _is_int(v) and v >= 0,
    "moved": lambda v: _is_int(v) and v >= 0,
    "skipped": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "not_found": _are_ints,
    "error": _is_text_or_none,
    "finished_ms": lambda v: v is None or _is_int(v),
}


DEFINITION = (
    "id",
    "kind",
    "queue",
    "ids",
    "rate",
    "created_ms",
    "to_queue",
    "filter",
    "expect",
    "by_id",
)
PROGRESS = ("status", "done", "moved", "skipped", "not_found", "error", "finished_ms")


def tasks_text(tasks: list[Task]) -> str:
    """DATA_DIR/tasks.json: a JSON list of task records."""
    return "[" + ",\n".join(task.record() for task in tasks) + "]\n"


class TaskFile:
    """DATA_DIR/tasks.json, written by a thread of its own: the loop hands over the text
    and goes on; the thread writes the newest text (older ones are skipped), fsyncs it and
    renames it into place, so a crash leaves the previous or the new file, never half."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: str | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tasks-file", daemon=True)
        self._thread.start()

    def load(self) -> list[Task]:
        """The saved tasks; a file that does not read is set aside, not fatal."""
        try:
            records = json.loads(self.path.read_text())
            if not isinstance(records, list):
                raise ValueError("not a list of task records")
            return [Task.from_record(r) for r in records]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError) as e:  # RecursionError: "[[[[..."
            aside = self.path.with_suffix(".json.unreadable")
            log.warning("%s does not read (%s): moved to %s", self.path, e, aside)
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return []

    def save(self, text: str) -> None:
        with self._cond:
            self._pending = text
            self._cond.notify()

    def close(self) -> None:
        """Write what is pending, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                text, self._pending = self._pending, None
                closed = self._closed
            if text is not None:
                self._write(text)
            if closed:
                return

    def _write(self, text: str) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:  # the tasks go on; only their resumption is at risk
            log.warning("cannot save replay tasks to %s: %s", self.path, e)


class TaskRunner:
    """Creates, paces, cancels and resumes tasks. Loop thread only (HTTP goes through the
    bridge). `call_later(delay_s, fn)` schedules on the loop; `now` is monotonic seconds;
    `after` applies the effects of a step (dispatch, flush) as after any command."""

    def __init__(
        self,
        broker: Broker,
        *,
        now: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], Any],
        save: Callable[[str], None],
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self.broker = broker
        self._now = now
        self._call_later = call_later
        self._save = save
        self._after = after
        self.tasks: dict[str, Task] = {}
        self._pace: dict[str, tuple[float, int]] = {}  # id -> (start time, done then)
        self._handles: dict[str, Any] = {}
        self._last_save = float("-inf")
        self._save_handle: Any = None

    # -- creating and controlling -------------------------------------------------------
    def check(self, kind: str, queue: str, *, rate: float, to_queue: str | None) -> None:
        """Refuse a task `create` would refuse (before a walk finds its messages)."""
        if kind not in KINDS:
            raise ClientError(f"'kind' must be one of {', '.join(KINDS)}")
        if sum(t.status == RUNNING for t in self.tasks.values()) >= MAX_RUNNING:
            raise ClientError(f"{MAX_RUNNING} tasks are running: cancel one or wait")
        if not 0 < rate <= MAX_RATE:
            raise ClientError(f"'rate' must be more than 0 and at most {MAX_RATE:g} msg/s")
        if queue not in self.broker.queues:
            raise NotFound(f"queue {queue} does not exist")
        if kind == "move":
            if not to_queue or to_queue not in self.broker.queues:
                raise NotFound(f"queue {to_queue} does not exist")
            if to_queue == queue:
                raise ClientError("cannot move messages to the same queue")

    def create(
        self,
        kind: str,
        queue: str,
        *,
        rate: float,
        filter: str | None = None,
        ids: list[int] | None = None,
        expect: dict[int, dict[str, str | None]] | None = None,
        to_queue: str | None = None,
        found: list[int] | None = None,
    ) -> Task:
        """A new running task over the matching waiting messages (or `ids`). `found`:
        the matching ones, found already by a walk in slices (`ops.waiting_ids_walk`,
        the HTTP API's way), else they are found here at once."""
        self.check(kind, queue, rate=rate, to_queue=to_queue)
        by_id = ids is not None
        if ids is None:
            ids = found
        if ids is None:
            ids = ops.waiting_ids(self.broker, queue, selector=filter)
        task = Task(
            id=uuid.uuid4().hex[:12],
            kind=kind,
            queue=queue,
            ids=list(dict.fromkeys(ids)),
            rate=float(rate),
            created_ms=self.broker.clock.now_ms(),
            to_queue=to_queue if kind == "move" else None,
            filter=filter,
            expect=expect,
            by_id=by_id,
        )
        self.tasks[task.id] = task
        self._trim()
        self._start(task)
        self._persist(now=True)
        return task

    def cancel(self, task_id: str) -> Task:
        task = self.get(task_id)
        if task.status == RUNNING:
            self._finish(task, CANCELLED)
        return task

    def get(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise NotFound(f"task {task_id} does not exist")
        return task

    def views(self) -> list[dict[str, Any]]:
        """Every task, newest first."""
        ordered = sorted(self.tasks.values(), key=lambda t: t.created_ms, reverse=True)
        return [t.view() for t in ordered]

    def resume(self, tasks: list[Task]) -> None:
        """Take over tasks saved by an earlier run; running ones go on where they were."""
        for task in tasks:
            self.tasks[task.id] = task
            if task.status == RUNNING:
                log.info(
                    "resuming %s task %s on %s at %d/%d",
                    task.kind,
                    task.id,
                    task.queue,
                    task.done,
                    task.total,
                )
                self._start(task)

    def stop(self) -> None:
        """Cancel the scheduled steps (the broker stops); save the progress now."""
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
        self._persist(now=True)

    # -- stepping ---------------------------------------------------------------------
    def _start(self, task: Task) -> None:
        self._pace[task.id] = (self._now(), task.done)
        self._schedule(task, 0.0)

    def _schedule(self, task: Task, delay_s: float) -> None:
        self._handles[task.id] = self._call_later(delay_s, lambda: self._step(task.id))

    def _step(self, task_id: str) -> None:
        self._handles.pop(task_id, None)
        task = self.tasks.get(task_id)
        if task is None or task.status != RUNNING:
            return
        queue = self.broker.queues.get(task.queue)
        if queue is not None and queue.walk is not None:  # a sliced operation holds it
            self._schedule(task, BUSY_RETRY_S)  # (core/operations `Walk`): its turn next
            return
        chunk = max(1, min(CHUNK_MAX, int(task.rate)))
        part = task.ids[task.done : task.done + chunk]
        try:
            self._apply(task, part)
        except (NotFound, ClientError) as e:
            task.error = str(e)
            self._finish(task, FAILED)
            return
        finally:
            self._after()
        task.done += len(part)
        if task.done >= task.total:
            self._finish(task, COMPLETED)
            return
        started, base = self._pace[task.id]
        due = started + (task.done - base) / task.rate
        self._schedule(task, max(0.0, due - self._now()))
        self._persist()

    def _apply(self, task: Task, part: list[int]) -> None:
        if task.kind == "move":
            assert task.to_queue is not None
            task.moved += ops.move(self.broker, task.queue, to_queue=task.to_queue, ids=part)
            return
        expect = None
        if task.expect:
            expect = {i: task.expect[i] for i in part if i in task.expect}
        result = ops.retry(self.broker, task.queue, ids=part, expect=expect)
        task.moved += result.retried
        if task.by_id:
            task.skipped += [{"msg_id": i, "reason": why} for i, why in result.skipped]
            task.not_found += list(result.not_found)

    def _finish(self, task: Task, status: str) -> None:
        task.status = status
        task.finished_ms = self.broker.clock.now_ms()
        handle = self._handles.pop(task.id, None)
        if handle is not None:
            handle.cancel()
        self._pace.pop(task.id, None)
        log.info(
            "%s task %s on %s %s: %d/%d",
            task.kind,
            task.id,
            task.queue,
            status,
            task.done,
            task.total,
        )
        self._persist(now=True)

    def _trim(self) -> None:
        finished = [t for t in self.tasks.values() if t.status != RUNNING]
        finished.sort(key=lambda t: t.created_ms, reverse=True)
        for task in finished[KEEP_FINISHED:]:
            del self.tasks[task.id]

    # -- saving -----------------------------------------------------------------------
    def _persist(self, *, now: bool = False) -> None:
        """Save at once on a change of state, else at most every SAVE_INTERVAL_S (a
        pending save is scheduled, so the last progress is never left unsaved)."""
        t = self._now()
        if not now and t - self._last_save < SAVE_INTERVAL_S:
            if self._save_handle is None:
                delay = self._last_save + SAVE_INTERVAL_S - t
                self._save_handle = self._call_later(delay, self._deferred_save)
            return
        self._last_save = t
        self._save(tasks_text(list(self.tasks.values())))

    def _deferred_save(self) -> None:
        self._save_handle = None
        self._persist(now=True)
