"""The message lifecycle event log: DATA_DIR/events/events-<UTC>.jsonl (B-170, B-171).

Theory of operation
-------------------
Two processes, so that the log costs the broker's event loop as little as possible. A
writer thread in the broker process, formatting ~4 µs a line at four lines per delivered
message, competed with the loop for the GIL and halved queue throughput.

* In the broker, `submit()` takes the `RawEvent` tuples the core recorded (on the loop
  thread), keeps the ones the level asks for (the core already records only those;
  `submit` filters again so the writer is right on its own), numbers them (`seq`, per
  broker, increasing from 1; numbers of dropped events are skipped, so a gap shows a
  drop) and collects them. At the end of the loop turn that recorded them (a `soon`
  callback, `start(soon=loop.call_soon)`: nothing waits for a timer), or as soon as
  FLUSH_EVENTS are collected, or at every submit without a loop, `flush()` sends them
  down a pipe as one frame (`frames.py`: a 4-byte length and `marshal.dumps((first_seq,
  now_ms, events))`, written with one `writev`: the two parts are never copied into one
  buffer). marshal runs at C speed and writes a message's bytes once per frame however
  many of its events are in it; and a message's later events carry `KNOWN` instead of
  its bytes while the writer process remembers them (`frames.KNOWN_WINDOW`,
  `Emitter.part`): the bytes cross once per message, not once per frame (issue 20).
  The pipe is non-blocking: what it does not take waits in a backlog and is retried
  FLUSH_SECONDS later and at the next flush, so the loop never blocks.
* The writer process (`child.py`, started by `start()` as `python -m
  amqpbroker.eventlog.child`) formats the lines,
  decodes amqp_message_id, props and body_hash from the message bytes, writes and rotates
  the files, and reports its counts (and its log records) back on a second pipe. It
  also keeps the disk budget (issue 17): it gzips rotated files, deletes the oldest
  under `max-total-bytes`/`max-age`, drops events when free space is below
  `min-free-bytes`, and reports the files' figures (`disk`) with its counts.

Bounds (B-170: never block; count drops): a frame is dropped, and its events counted, when
the events handed over but not yet written or dropped by the writer process would exceed
`queue_events`, or the backlog would exceed `queue_bytes`. After an I/O error the writer
process counts every event it gets as dropped and says so; from then on `submit` drops
at once. `dropped_total` (`amqpbroker_event_log_dropped_total`) is the sum of both sides.

`close()` sends what is collected (waiting for the pipe, up to its timeout) and closes the
pipe; the writer process writes everything, renames its `.part` file and exits, and
`close()` waits for it. A clean stop loses nothing. If the broker dies, the writer process
sees end-of-file and does the same with what reached it: a SIGKILL of the broker loses
the events of the loop turn it was in (not flushed yet) and the backlog the pipe had not
taken (only when the writer process is behind), never an earlier turn's. B-170 promises
no more (a bounded hand-off whose drops are counted; nothing is counted by a killed
process): `seq` numbers after the last written line are simply missing.

Thread rule: `submit`, `seal`, `flush` and the timer on the loop thread; `close` on the
loop thread, or on any one other thread after `seal` (what is collected belongs to the
loop thread: `submit` runs without the lock, which cost as much as the rest of it); the
counts on any thread. A lock keeps the frames, the pipes and the counts consistent
between the loop, `close` and the counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqpbroker.config import EventLogConfig
from amqpbroker.core import FAILURE_EVENTS, NO_DATA_LIMIT, EventLevel, RawEvent
from amqpbroker.eventlog.frames import KNOWN_WINDOW, LENGTH, dumps, take

# A frame's payload in C (`_frames.c`, setup.py C_MODULES: `payload_of`);
# marshal's in the pure-Python build (editable installs, no C compiler).
_sized_dumps: Callable[[Any], bytes] | None
try:
    from amqpbroker.eventlog._frames import dumps as _sized_dumps
except ImportError:
    _sized_dumps = None

log = logging.getLogger(__name__)

# The loop's side: a frame at the end of every loop turn with events (`soon`), or as soon
# as FLUSH_EVENTS are collected (a long turn). Each frame costs a `writev` that may wake
# the writer process, and marshal writes a shape or a message part once per frame.
FLUSH_EVENTS = 4096
# Without `soon` (tests, embedding), events wait for a timer this long; with it, this is
# only how soon a backlog the pipe did not take is tried again.
FLUSH_SECONDS = 0.01
# How often a flush reads the writer process's reports (~25 us a read): the counts may lag
# by this much; a frame about to be dropped for the bound reads them first.
STATUS_SECONDS = 0.05
DEFAULT_QUEUE_EVENTS = 1 << 18  # events handed over and not yet written (~3 s at full rate)
DEFAULT_QUEUE_BYTES = 64 << 20  # frames the pipe did not take yet
PIPE_BYTES = 1 << 20  # asked of the kernel for the frame pipe (Linux; 64 KiB otherwise)
# Without props or body_hash an event needs only the head of a message, where
# properties.message-id is: a megabyte message costs the hand-off no more than a small one.
HEAD_BYTES = 64 << 10
BODY_KEY_FILE = "event-log.key"  # in DATA_DIR: the key of `body-hash: keyed`
DiskFigures = tuple[int, int, int | None, int, int, int, int]  # see EventLogWriter.disk
NO_FILES: DiskFigures = (0, 0, None, 0, 0, 0, 0)  # before the writer process reports

Schedule = Callable[[float, Callable[[], None]], object]
Soon = Callable[[Callable[[], None]], object]
CHILD_MODULE = "amqpbroker.eventlog.child"


def _child_env() -> dict[str, str]:
    """This environment, with the directory this `amqpbroker` was imported from first on
    PYTHONPATH: the writer process runs the same code as the broker, whatever the working
    directory or installation."""
    root = str(Path(__file__).resolve().parents[2])
    paths = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + paths if paths else "")}


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def payload_of(frame: tuple[int, int, list[RawEvent]]) -> bytes:
    """A frame's payload (frames.py's format): `_frames.dumps` where the build has it (one
    pass, the result allocated once, each message's bytes copied into it once: marshal
    cost ~7.5k instructions a queue message, issue 20), else marshal's; a value the C
    refuses (an int or str subclass, a float, a huge int) goes to marshal too."""
    if _sized_dumps is not None:
        try:
            return _sized_dumps(frame)
        except ValueError:
            pass
    return dumps(frame)


def _rest(parts: list[Any], written: int) -> list[Any]:
    """What is left of the buffers `parts` once their first `written` bytes are written."""
    for i, part in enumerate(parts):
        size = len(part)
        if written < size:
            return [memoryview(part)[written:], *parts[i + 1 :]]
        written -= size
    return []


class EventLogWriter:
    """Hands lifecycle events to the writer process; never blocks the caller.

    `clock_ms` dates files and is sent with every frame (the writer process rotates by it).
    `data_limit` and `heads_only` are what the `Emitter`'s should be for this config.
    """

    def __init__(
        self,
        directory: Path,
        *,
        broker_name: str,
        config: EventLogConfig,
        clock_ms: Callable[[], int] = _wall_ms,
        queue_events: int = DEFAULT_QUEUE_EVENTS,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
    ) -> None:
        self.directory = directory
        self.broker = broker_name
        self.config = config
        level = EventLevel(config.level) if config.enabled else EventLevel.OFF
        # The event types submit keeps; None keeps all (`lifecycle`, the hot path).
        self._keep: frozenset[str] | None = {
            EventLevel.OFF: frozenset(),
            EventLevel.FAILURES: FAILURE_EVENTS,
            EventLevel.LIFECYCLE: None,
        }[level]
        whole = bool(config.properties or config.body_hash)
        self.data_limit = NO_DATA_LIMIT if whole else HEAD_BYTES
        self.heads_only = not whole  # what `Emitter.heads_only` should be
        self.known_window = KNOWN_WINDOW  # what `Emitter.known_window` should be
        # Called when a frame is dropped here (`Emitter.forget_sent`): the bytes of
        # messages it carried never reached the writer process, so they go again.
        self.on_drop: Callable[[], None] | None = None
        self._clock_ms = clock_ms
        self._queue_events = queue_events
        self._queue_bytes = queue_bytes
        self._lock = threading.Lock()
        self._seq = 0
        self._pending: list[RawEvent] = []
        self._pending_first = 1
        self._schedule: Schedule | None = None
        self._soon: Soon | None = None
        self._armed = False  # a flush is scheduled (end of turn, or the timer)
        # Frames not (fully) in the pipe yet: [[header, payload] or what is left of them
        # to write, bytes left, events in the frame].
        self._backlog: deque[list[Any]] = deque()
        self._backlog_bytes = 0
        self._handed = 0  # events put in frames (backlog or pipe)
        self._dropped_here = 0
        self._dropped_sealed = 0  # by submit after seal() or a failure: loop thread only
        # As the writer process last reported them.
        self._written = 0
        self._dropped_there = 0
        self._failed = False
        self._gone = False
        self._disk: DiskFigures = NO_FILES
        self._process: subprocess.Popen[bytes] | None = None
        self._frames_fd = -1
        self._status_fd = -1
        self._status_buf = bytearray()
        self._status_read_at = -math.inf  # time.monotonic() of the last read of the reports
        self._closed = False
        self._sealed = False  # submit takes no more events (loop thread; see seal())

    # -- counts (any thread) ----------------------------------------------------------
    @property
    def dropped_total(self) -> int:
        """Events numbered but never written: hand-off full, I/O error, or late."""
        with self._lock:
            self._read_status()
            return self._dropped_here + self._dropped_sealed + self._dropped_there

    @property
    def disk(self) -> DiskFigures:
        """The event files as the writer process last reported them: (bytes on disk,
        files, oldest file's last write in epoch ms or None, deleted files, deleted
        bytes, of those never compacted by `analyze`: files, bytes). Issue 17."""
        with self._lock:
            self._read_status()
            return self._disk

    @property
    def written_total(self) -> int:
        """Events the writer process has written."""
        with self._lock:
            self._read_status()
            return self._written

    @property
    def pending_events(self) -> int:
        """Events handed over (in the pipe or the backlog) that the writer process has not
        yet written or dropped: how far it is behind the loop (issue 20). Its work on them
        is still to come; the `queue_events` / `queue_bytes` bound drops what exceeds it."""
        with self._lock:
            self._read_status()
            return self._handed - self._written - self._dropped_there

    # -- loop thread ------------------------------------------------------------------
    def start(self, *, schedule: Schedule | None = None, soon: Soon | None = None) -> None:
        """Start the writer process (which creates the directory: an error there is the
        writer's, logged and counted, never the caller's).

        `soon(callback)` (the loop's `call_soon`) sends the events of a loop turn as one
        frame when the turn ends; `schedule(seconds, callback)` (the loop's `call_later`)
        retries a backlog the pipe did not take, and without `soon` lets events collect
        for FLUSH_SECONDS. With neither, every `submit` sends a frame.
        """
        with self._lock:
            if self._closed or self._process is not None or self._keep == frozenset():
                return
            self._schedule = schedule
            self._soon = soon
            config = {
                "directory": str(self.directory),
                "broker": self.broker,
                "properties": list(self.config.properties),
                "body_hash": self.config.body_hash,
                # The key of a keyed hash: read (or made) by the writer process, never
                # passed on its command line.
                "body_key_file": str(self.directory.parent / BODY_KEY_FILE),
                "max_file_bytes": self.config.max_file_bytes,
                "max_file_age": self.config.max_file_age,
                "compress": self.config.compress,
                "max_total_bytes": self.config.max_total_bytes,
                "max_age": self.config.max_age,
                "keep_until_analyzed": self.config.keep_until_analyzed,
                "min_free_bytes": self.config.min_free_bytes,
            }
            frames_r, frames_w = os.pipe()
            status_r, status_w = os.pipe()
            with contextlib.suppress(AttributeError, OSError):  # Linux only; best effort
                fcntl.fcntl(frames_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", CHILD_MODULE, json.dumps(config)],
                    stdin=frames_r,
                    stdout=status_w,
                    close_fds=True,
                    env=_child_env(),
                )
            except OSError as e:
                log.error("event log: cannot start the writer process (%s); dropping events", e)
                os.close(frames_w)
                os.close(status_r)
                self._fail()
                return
            finally:
                os.close(frames_r)  # the writer process has them now
                os.close(status_w)
            os.set_blocking(frames_w, False)
            os.set_blocking(status_r, False)
            self._frames_fd, self._status_fd = frames_w, status_r
            self._send_backlog()

    def submit(self, events: list[RawEvent]) -> None:
        """Number and collect a batch (the list is taken over, not copied); drop and count
        it when the writer is behind.

        Without the lock, which cost as much as the rest of it at a few calls per
        message: only the loop thread touches what is collected (`seal()` stops it before
        `close()` runs on another thread; `_fail()` leaves it to the next flush).
        """
        keep = self._keep
        if keep is not None:
            events = [e for e in events if e[0][0] in keep]
            if not events:
                return
        count = len(events)
        self._seq += count
        if self._sealed or self._failed:
            self._dropped_sealed += count
            return
        pending = self._pending
        if pending:
            pending += events
        else:
            self._pending_first = self._seq - count + 1
            self._pending = pending = events
        if len(pending) >= FLUSH_EVENTS:
            self.flush()
        elif not self._armed:
            if self._soon is not None:
                self._armed = True
                self._soon(self._on_timer)  # the end of this loop turn
            elif self._schedule is not None:
                self._armed = True
                self._schedule(FLUSH_SECONDS, self._on_timer)
            else:
                self.flush()

    def seal(self) -> None:
        """Take no more events (later ones are counted as dropped) and frame the collected
        ones, on the loop thread: the server's last step before `close()`, which then
        runs on another thread without racing a `submit`."""
        self._sealed = True
        self.flush()

    def flush(self) -> None:
        """Send what is collected now."""
        with self._lock:
            self._flush()

    def _on_timer(self) -> None:
        """The end of a loop turn (`soon`) or the timer: send what is collected."""
        with self._lock:
            self._armed = False
            if self._closed:
                return
            self._flush()
            if (self._pending or self._backlog) and self._schedule is not None:
                self._armed = True  # the pipe was full: try again soon
                self._schedule(FLUSH_SECONDS, self._on_timer)

    # -- any one thread -----------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Send what is collected, let the writer process write it all and rename the
        open `.part` file, and wait for it to exit.

        Idempotent. Waits at most about `timeout` seconds; a writer process stuck longer
        (a hung file system) is left to finish what reached it on its own.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return
            self._closed = self._sealed = True  # submit drops, the timer does nothing
            self._flush(final=True)
            process = self._process
            if process is None:  # never started: nothing numbered was written
                self._drop_backlog()
                return
        # Wait without the lock, so that a late submit or a metrics scrape never waits.
        while True:
            with self._lock:
                if not self._backlog or self._failed:
                    self._drop_backlog()  # a torn frame included: the writer ignores it
                    if self._frames_fd >= 0:
                        os.close(self._frames_fd)  # end of input: the writer finishes
                        self._frames_fd = -1
                    break
                frames_fd, status_fd = self._frames_fd, self._status_fd
            left = deadline - time.monotonic()
            if left <= 0:
                with self._lock:
                    self._failed = True  # gave up: what is left is dropped
                continue
            select.select([status_fd] if status_fd >= 0 else [], [frames_fd], [], left)
            with self._lock:
                self._read_status()
                self._send_backlog()
        while True:  # its last report, then end-of-file
            with self._lock:
                status_fd = self._status_fd
            left = deadline - time.monotonic()
            if status_fd < 0 or left <= 0 or not select.select([status_fd], [], [], left)[0]:
                break
            with self._lock:
                self._read_status()
        if status_fd < 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        if process.returncode is None:
            log.warning(
                "event log: writer process %d for %s did not finish within %.1fs; "
                "leaving it to finish alone",
                process.pid,
                self.directory,
                timeout,
            )
            with self._lock:
                if self._status_fd >= 0:
                    os.close(self._status_fd)
                    self._status_fd = -1
        elif process.returncode != 0:
            log.error(
                "event log: writer process for %s exited with code %d",
                self.directory,
                process.returncode,
            )

    # -- with the lock held -----------------------------------------------------------
    def _flush(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self._status_read_at >= STATUS_SECONDS:
            self._status_read_at = now
            self._read_status()
        events = self._pending
        if events:
            self._pending = []
            # A submit flushes at FLUSH_EVENTS, so a frame holds a few more; but one call
            # may record far more (a management purge): then frames of FLUSH_EVENTS, so
            # the hand-off's bound drops only what it cannot hold, not the whole call.
            step = FLUSH_EVENTS
            if len(events) < 2 * step:
                self._enqueue(events, final=final)
            else:
                first = self._pending_first
                for start in range(0, len(events), step):
                    self._pending_first = first + start
                    self._enqueue(events[start : start + step], final=final)
        self._send_backlog()

    def _enqueue(self, events: list[RawEvent], *, final: bool) -> None:
        """Encode a frame into the backlog, or drop it when a bound is reached (except
        the last one, from `close`, which waits for the pipe instead)."""
        count = len(events)
        in_flight = self._handed - self._written - self._dropped_there
        if not final and in_flight + count > self._queue_events:
            self._read_status()  # the counts may be STATUS_SECONDS old: drop on fresh ones
            in_flight = self._handed - self._written - self._dropped_there
        if self._failed or (not final and in_flight + count > self._queue_events):
            self._dropped(count)
            return
        payload = payload_of((self._pending_first, self._clock_ms(), events))
        size = len(payload)
        if not final and self._backlog_bytes + size > self._queue_bytes:
            self._dropped(count)
            return
        self._backlog.append([[LENGTH.pack(size), payload], LENGTH.size + size, count])
        self._backlog_bytes += LENGTH.size + size
        self._handed += count

    def _dropped(self, count: int) -> None:
        """Count a frame dropped here, and say so (`on_drop`)."""
        self._dropped_here += count
        if self.on_drop is not None:
            self.on_drop()

    def _send_backlog(self) -> None:
        """Write what the pipe takes, without waiting: a frame's header and payload with
        one `writev` (never copied into one buffer)."""
        fd = self._frames_fd
        backlog = self._backlog
        while backlog and fd >= 0:
            entry = backlog[0]
            parts = entry[0]
            try:
                written = os.writev(fd, parts)
            except BlockingIOError:
                return
            except OSError:  # the writer process is gone
                self._read_status()
                self._writer_gone()
                return
            self._backlog_bytes -= written
            if written < entry[1]:
                entry[0] = _rest(parts, written)
                entry[1] -= written
                return
            backlog.popleft()

    def _read_status(self) -> None:
        """Take in the writer process's reports; notice when it is gone."""
        fd = self._status_fd
        if fd < 0:
            return
        buf = self._status_buf
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                os.close(fd)
                self._status_fd = -1
                if not self._closed:
                    self._writer_gone()
                break
            buf += chunk
        for report in take(buf):
            written, dropped, failed, self._disk, records = report
            self._written, self._dropped_there = written, dropped
            if failed:
                self._failed = True
            for level, text in records:
                log.log(level, "%s", text)

    def _writer_gone(self) -> None:
        """The writer process died: what it did not report written is lost."""
        if self._gone:
            return
        self._gone = True
        process = self._process
        code = process.poll() if process is not None else None
        log.error(
            "event log: the writer process for %s exited (code %s); dropping events from now on",
            self.directory,
            code,
        )
        self._fail()
        self._dropped_here += self._handed - self._written - self._dropped_there
        self._handed = self._written + self._dropped_there
        if self._frames_fd >= 0:
            os.close(self._frames_fd)
            self._frames_fd = -1

    def _fail(self) -> None:
        """Stop handing over: count the frames not sent as dropped (what is collected is
        dropped and counted by the next flush: `_pending` is the loop thread's)."""
        self._failed = True
        self._drop_backlog()

    def _drop_backlog(self) -> None:
        """Count the frames not (fully) sent as dropped."""
        for _, _, count in self._backlog:
            self._dropped_here += count
            self._handed -= count
        self._backlog.clear()
        self._backlog_bytes = 0
