"""The event-log writer process: frames of lifecycle events in, JSON lines out (B-170).

`eventlog.EventLogWriter.start()` runs `run()` in a child process, so that formatting
(~4 µs a line, four lines per delivered message) never competes with the broker's event
loop for the GIL. It imports only the standard library and `protocol.sections`: it starts
in well under a second and never loads the broker.

Theory of operation
-------------------
stdin carries frames from the broker: a 4-byte little-endian length, then
`marshal.dumps((first_seq, now_ms, events))` with `events` a list of `RawEvent` tuples
numbered from `first_seq` (core/lifecycle.py has the layout). Each frame becomes JSON
objects with exactly the B-170 fields in order (FIELDS; absent values null), written with
one `write` on an unbuffered file: a reader of the `.part` file sees every frame as soon
as it is written, and a failed write is charged to the frame it belongs to. From the
message bytes an event carries it decodes only what the config asks for
(`amqp_message_id` always; allow-listed application-properties; the body hash), once per
message; the parts of a line that depend only on the message, only on the queue, or only
on the event's count, link and reason are cached too, so the common line is one f-string
of five cached texts and three numbers (~40% cheaper than formatting the fields). The
caches are cleared whole when full: everything can be rebuilt from the event itself. A
message it cannot decode still gets its events, with those fields null.

Files: `events-<UTC timestamp>.jsonl.part`, renamed to `.jsonl` when it reaches
`max_file_bytes`, when it is older than `max_file_age` (checked with the broker's clock,
`now_ms`, when a frame arrives, and with this process's monotonic clock while idle), and
at end of input; so a reader never sees a half-written `.jsonl`. Names sort in write
order. End of input is the broker's `close()`, or the broker's death: either way what
arrived is written and the last file renamed. A torn frame at the end (the broker gave up
sending it) is ignored: the broker counted its events as dropped.

An I/O error is logged once; the file being written stays `.part` (it may end in a torn
line), and every later event is counted as dropped. A frame it cannot format (a bug) is
logged once, counted as dropped, and the next frame goes on.

stdout carries status frames back (same framing): `(written_total, dropped_total, failed,
log_records)`, after every read and at exit. They are written without blocking and at
most PIPE_BUF bytes, so each arrives whole or not at all; one that does not fit is simply
superseded by the next (the counts are totals; log records wait). Log records are
`(level, text)` pairs that the broker logs under its own logger and handlers.
SIGINT/SIGTERM are ignored: the broker decides when the log ends, by closing stdin.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import marshal
import os
import select
import signal
import struct
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_LEN = struct.Struct("<I")
_READ_BYTES = 1 << 20
_STATUS_MAX = 4000  # < PIPE_BUF (4096): a status frame is written whole or not at all
_LOG_TEXT_MAX = 1500
_INFO_CACHE = 65536  # messages whose decoded fields are remembered
_JSON_CACHE = 65536  # names whose JSON text is remembered
# B-170: core.lifecycle.EVENT_FIELDS (a test checks they are equal; importing core here
# would double this process's start-up time). `_format` and `_line` write them in this order.
FIELDS = (
    "ts",
    "seq",
    "event",
    "broker",
    "msg_id",
    "amqp_message_id",
    "address",
    "queue",
    "routing_type",
    "durable",
    "size",
    "delivery_count",
    "connection",
    "link",
    "txn",
    "reason",
    "target_address",
    "target_queues",
    "copy_msg_id",
    "delay_ms",
    "first_ts",
    "error_condition",
    "error_description",
    "props",
    "body_hash",
)
_INT_FIELDS = frozenset({"ts", "seq", "msg_id", "size", "first_ts"})
_encode_string = json.encoder.encode_basestring_ascii  # the C encoder json.dumps uses
_BROKEN = ("null", "null", "null")  # what a message we cannot decode contributes


def _s(value: str | None) -> str:
    return "null" if value is None else _encode_string(value)


def _n(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def _only_target_queues(extra: tuple[Any, ...]) -> bool:
    """Whether a RawEvent's rare fields hold target_queues only (a `sent` event)."""
    return (
        extra[2] is not None
        and extra[0] is None
        and extra[1] is None
        and extra[3] is None
        and extra[4] is None
        and extra[5] is None
        and extra[6] is None
        and extra[7] is None
    )


def _message_id_json(data: bytes) -> str | None:
    """JSON text of properties.message-id for the usual encodings (absent, null, string,
    uuid), found by walking the first sections; None: ask `sections.READER` (which also
    decides what an odd or malformed message gets). ~10x cheaper than decoding the
    whole properties list, once per message."""
    pos = 0
    try:
        while True:
            if data[pos] != 0x00 or data[pos + 1] != 0x53:
                return None  # a descriptor in another form
            code, constructor = data[pos + 2], data[pos + 3]
            if code == 0x73:  # properties
                break
            if code > 0x73:
                return "null"  # sections come in order: there is none
            if constructor == 0x45:  # list0
                pos += 4
            elif constructor in (0xC0, 0xC1):  # list8, map8
                pos += 5 + data[pos + 4]
            elif constructor in (0xD0, 0xD1):  # list32, map32
                pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "big")
            else:
                return None
        if constructor == 0x45:
            return "null"
        if constructor == 0xC0:
            count, pos = data[pos + 5], pos + 6
        elif constructor == 0xD0:
            count, pos = int.from_bytes(data[pos + 8 : pos + 12], "big"), pos + 12
        else:
            return None
        if count == 0 or data[pos] == 0x40:  # no fields, or a null message-id
            return "null"
        kind = data[pos]
        if kind == 0xA1:  # str8-utf8
            end = pos + 2 + data[pos + 1]
            return _encode_string(data[pos + 2 : end].decode()) if end <= len(data) else None
        if kind == 0x98:  # uuid
            return (
                f'"{uuid.UUID(bytes=data[pos + 1 : pos + 17])}"' if pos + 17 <= len(data) else None
            )
    except (IndexError, ValueError):  # a truncated head, bad UTF-8: the full decoder decides
        return None
    return None


class _JsonText(dict[str | None, str]):
    """JSON text of strings that repeat (addresses, queues, links, reasons...), cached:
    a dict hit is a few times cheaper than encoding."""

    def __missing__(self, value: str | None) -> str:
        if len(self) >= _JSON_CACHE:
            self.clear()
        text = self[value] = _s(value)
        return text


def template(fixed: dict[str, str]) -> str:
    """`{"ts":%d,"seq":%d,"event":%s,...}`: ints as %d, `fixed` fields as the JSON text
    given, everything else pre-encoded as %s (a %-template is ~5x cheaper than a dict for
    json.dumps). Every value is ASCII."""
    parts = []
    for name in FIELDS:
        if name in fixed:
            value = fixed[name].replace("%", "%%")
        else:
            value = "%d" if name in _INT_FIELDS else "%s"
        parts.append(f'"{name}":{value}')
    return "{" + ",".join(parts) + "}\n"


class ChildWriter:
    """Formats frames and owns the event files. One per writer process."""

    def __init__(self, config: dict[str, Any], *, report: Callable[[], None]) -> None:
        from amqpbroker.protocol import sections  # here: the broker process never needs it

        self.directory = Path(config["directory"])
        self.broker_json = _encode_string(config["broker"])
        self.template = template({"broker": self.broker_json})
        self.properties: tuple[str, ...] = tuple(config["properties"])
        self.body_hash: bool = config["body_hash"]
        self.max_file_bytes: int = config["max_file_bytes"]
        self.max_file_age: int = config["max_file_age"]  # ms
        self._sections = sections
        self._report = report
        self.written_total = 0
        self.dropped_total = 0
        self.failed = False
        self.logs: list[tuple[int, str]] = []
        self._file: IO[bytes] | None = None
        self._path: Path | None = None
        self._file_bytes = 0
        self._opened_ms = 0  # broker clock
        self._opened_mono = 0.0  # this process's clock, for rotation while idle
        self._last_name_ms = -1
        self._info: dict[int, tuple[str, str, str]] = {}
        # The common line (`_format`) is five cached texts and three numbers: the fields that
        # depend only on the message (three pieces: broker..amqp_message_id,
        # durable..size, first_ts..body_hash), only on the queue (address..routing_type),
        # and only on the event's count, connection, link, reason and target queues (a
        # few combinations, repeated for every message).
        self._messages: dict[int, tuple[str, str, str]] = {}
        self._shapes: dict[Any, tuple[str, str, str]] = {}
        self._json = _JsonText()
        self._decode_warned = False
        self._bug_logged = False

    # -- frames ---------------------------------------------------------------------------
    def run(self, fd_in: int) -> None:
        """Read frames until end of input, then rename the last file."""
        buf = bytearray()
        while True:
            ready, _, _ = select.select([fd_in], [], [], self._seconds_to_age_limit())
            if not ready:
                self._rotate_if_due(None)
                self._report()
                continue
            chunk = os.read(fd_in, _READ_BYTES)
            if not chunk:
                break
            buf += chunk
            pos = 0
            while len(buf) - pos >= 4:
                (size,) = _LEN.unpack_from(buf, pos)
                if len(buf) - pos - 4 < size:
                    break
                with memoryview(buf) as view:
                    frame = marshal.loads(view[pos + 4 : pos + 4 + size])
                pos += 4 + size
                self.write_frame(*frame)
            del buf[:pos]
            self._report()
        self._rotate()

    def write_frame(self, first_seq: int, now_ms: int, events: list[tuple[Any, ...]]) -> None:
        """Write one frame's events, or count them as dropped."""
        count = len(events)
        if self.failed:
            self.dropped_total += count
            return
        self._rotate_if_due(now_ms)
        if self._file is None and not self._guard(lambda: self._open(now_ms)):
            self.dropped_total += count
            return
        try:
            blob = self._format(first_seq, events).encode()
        except Exception:
            # A bug must not stop the log: say so once, count the frame, go on.
            if not self._bug_logged:
                self.log(
                    logging.ERROR,
                    f"event log: cannot format a batch of {count} events; dropping it\n"
                    + traceback.format_exc(),
                )
                self._bug_logged = True
            self.dropped_total += count
            return
        if self._guard(lambda: self._write_all(blob)):
            self._file_bytes += len(blob)
            self.written_total += count
        else:
            self.dropped_total += count

    def _format(self, first_seq: int, events: list[tuple[Any, ...]]) -> str:
        """The lines of a frame's events, numbered from `first_seq`.

        The common case (sent, enqueued, dispatched, acked: ~4 lines a message) is cached
        texts around ts, seq and the count, inline in this loop: a call per line was a
        tenth of the writer's CPU.
        """
        lines: list[str] = []
        append = lines.append
        messages = self._messages
        shapes = self._shapes
        for seq, (shape, ts, part, delivery_count, extra) in enumerate(events, first_seq):
            if part[4] is None or not (extra is None or _only_target_queues(extra)):
                append(self._line(seq, shape, ts, part, delivery_count, extra))
                continue
            message = messages.get(part[0])
            if message is None:
                message = self._cache_message(*part)
            key = shape if extra is None else (shape, extra[2])
            texts = shapes.get(key)
            if texts is None:
                texts = self._cache_shape(key, shape, None if extra is None else extra[2])
            append(
                f'{{"ts":{ts:d},"seq":{seq:d},{texts[0]}{message[0]}{texts[1]}{message[1]}'
                f'"delivery_count":{"null" if delivery_count is None else delivery_count},'
                f"{texts[2]}{message[2]}"
            )
        return "".join(lines)

    def _line(
        self,
        seq: int,
        shape: tuple[Any, ...],
        ts: int,
        part: tuple[Any, ...],
        delivery_count: int | None,
        extra: tuple[Any, ...] | None,
    ) -> str:
        """One JSON object with the B-170 fields in order, for any event."""
        j = self._json  # names repeat: their JSON text is cached
        kind, (address, queue, routing_type), by, reason = shape
        msg_id, durable, size, first_ts, data = part
        connection, link = by or (None, None)
        if data is None:
            amqp_json, props, body_hash = "null", "null", "null"
        else:
            amqp_json, props, body_hash = self._message_info(msg_id, data, size)
        if extra is None:
            txn = target_address = queues = copy_msg_id = delay_ms = None
            condition = description = amqp_id = None
        else:
            txn, target_address, queues, copy_msg_id, delay_ms, condition, description, amqp_id = (
                extra
            )
        if amqp_id is not None:
            amqp_json = _encode_string(amqp_id)
        return self.template % (
            ts,
            seq,
            j[kind],
            msg_id,
            amqp_json,
            j[address],
            j[queue],
            j[routing_type],
            "true" if durable else "false",
            size,
            _n(delivery_count),
            j[connection],
            j[link],
            _s(txn),
            j[reason],
            j[target_address],
            "null" if queues is None else "[" + ",".join([j[q] for q in queues]) + "]",
            _n(copy_msg_id),
            _n(delay_ms),
            first_ts,
            j[condition],
            _s(description[:512] if description else description),
            props,
            body_hash,
        )

    def _cache_message(
        self, msg_id: int, durable: bool, size: int, first_ts: int, data: bytes
    ) -> tuple[str, str, str]:
        """The text of `_format`'s common line that depends only on the message."""
        amqp_json, props, body_hash = self._message_info(msg_id, data, size)
        text = (
            f'"broker":{self.broker_json},"msg_id":{msg_id:d},"amqp_message_id":{amqp_json},',
            f'"durable":{"true" if durable else "false"},"size":{size:d},',
            f'"first_ts":{first_ts:d},"error_condition":null,"error_description":null,'
            f'"props":{props},"body_hash":{body_hash}}}\n',
        )
        cache = self._messages
        if len(cache) >= _INFO_CACHE:
            cache.clear()  # see _decode
        cache[msg_id] = text
        return text

    def _cache_shape(
        self, key: Any, shape: tuple[Any, ...], targets: tuple[str, ...] | None
    ) -> tuple[str, str, str]:
        """The texts of `_format`'s common line that depend only on the event's shape (and a
        `sent`'s target queues): a few, repeated for every message."""
        j = self._json
        kind, (address, queue, routing_type), by, reason = shape
        connection, link = by or (None, None)
        queues = "null" if targets is None else "[" + ",".join([j[q] for q in targets]) + "]"
        texts = (
            f'"event":{j[kind]},',
            f'"address":{j[address]},"queue":{j[queue]},"routing_type":{j[routing_type]},',
            f'"connection":{j[connection]},"link":{j[link]},"txn":null,"reason":{j[reason]},'
            f'"target_address":null,"target_queues":{queues},"copy_msg_id":null,'
            '"delay_ms":null,',
        )
        if len(self._shapes) >= _JSON_CACHE:
            self._shapes.clear()
        self._shapes[key] = texts
        return texts

    def _message_info(self, msg_id: int, data: bytes, size: int) -> tuple[str, str, str]:
        info = self._info.get(msg_id)
        return self._decode(data, size, msg_id) if info is None else info

    def _decode(self, data: bytes, size: int, msg_id: int) -> tuple[str, str, str]:
        """(amqp_message_id, props, body_hash) as JSON text, from the message bytes;
        remembered by msg_id (a message's bytes never change what these say)."""
        sections = self._sections
        try:
            amqp_json = _message_id_json(data)
            if amqp_json is None:
                value = sections.READER.properties(data).get("message-id")
                amqp_json = "null" if value is None else _encode_string(str(value))
            props = "null"
            if self.properties:
                app = sections.READER.application_properties(data)
                props = json.dumps({k: str(app[k]) for k in self.properties if k in app})
            body_hash = "null"
            if self.body_hash:
                body = data[sections.scan(data).body_start :]
                body_hash = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            info = (amqp_json, props, body_hash)
        except ValueError as e:  # sections.SectionError: bytes the decoder rejects
            # The head of a long message (Emitter.data_limit) may end inside a section:
            # then the properties were not in it, which is no error.
            if len(data) == size and not self._decode_warned:
                self.log(
                    logging.WARNING,
                    f"event log: cannot decode message {msg_id} ({e}); writing its events "
                    "without amqp_message_id, props and body_hash",
                )
                self._decode_warned = True
            info = _BROKEN
        cache = self._info
        if len(cache) >= _INFO_CACHE:
            # Start afresh: what is still needed is decoded again from the bytes every
            # event carries. (Evicting the oldest entry one by one is not O(1): a dict
            # iterates over the slots of deleted entries until it is rebuilt.)
            cache.clear()
        cache[msg_id] = info
        return info

    # -- files ----------------------------------------------------------------------------
    def _write_all(self, blob: bytes) -> None:
        assert self._file is not None
        view = memoryview(blob)
        while view:
            written = self._file.write(view)
            view = view[written or 0 :]

    def _seconds_to_age_limit(self) -> float | None:
        """How long to wait for frames before the open file is too old."""
        if self._file is None:
            return None
        left = self._opened_mono + self.max_file_age / 1000 - time.monotonic()
        return max(left, 0.0)

    def _rotate_if_due(self, now_ms: int | None) -> None:
        """Rename the open file if it is full or too old: by the broker's clock when a
        frame arrives (`now_ms`), by ours while idle (None)."""
        if self._file is None:
            return
        if now_ms is None:
            too_old = (time.monotonic() - self._opened_mono) * 1000 >= self.max_file_age
        else:
            too_old = now_ms - self._opened_ms >= self.max_file_age
        if too_old or self._file_bytes >= self.max_file_bytes:
            self._rotate()

    def _open(self, now_ms: int) -> None:
        # Never reuse or go below the previous name's millisecond, so names sort in
        # write order even when files rotate within one millisecond.
        name_ms = max(now_ms, self._last_name_ms + 1)
        stamp = datetime.datetime.fromtimestamp(name_ms / 1000, datetime.UTC)
        base = f"events-{stamp:%Y%m%dT%H%M%S}{name_ms % 1000:03d}Z"
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{base}.jsonl.part"
        counter = 1
        while path.exists() or path.with_suffix("").exists():  # left by an earlier run
            path = self.directory / f"{base}-{counter}.jsonl.part"
            counter += 1
        self._file = path.open("xb", buffering=0)
        self._path = path
        self._file_bytes = 0
        self._opened_ms = now_ms
        self._opened_mono = time.monotonic()
        self._last_name_ms = name_ms

    def _rotate(self) -> None:
        """Close the current `.part` file and rename it to `.jsonl` (unless a write failed:
        then it may end in a torn line and stays `.part`)."""
        if self._file is None or self._path is None:
            return
        file, path = self._file, self._path
        self._file, self._path = None, None
        if self._guard(file.close) and not self.failed:
            self._guard(lambda: os.replace(path, path.with_suffix("")))

    def _guard(self, action: Callable[[], object]) -> bool:
        try:
            action()
        except OSError as e:
            if not self.failed:
                self.log(
                    logging.ERROR,
                    f"event log: cannot write to {self.directory} ({e}); "
                    "dropping events from now on",
                )
            self.failed = True
            return False
        return True

    def log(self, level: int, text: str) -> None:
        """Queue a log record for the broker to log (it owns the handlers)."""
        self.logs.append((level, text[:_LOG_TEXT_MAX]))


class StatusPipe:
    """Sends `(written_total, dropped_total, failed, logs)` to the broker, never blocking
    except in `close()`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.writer: ChildWriter | None = None
        self._sent: tuple[int, int, bool] | None = None
        self._open = True
        os.set_blocking(fd, False)

    def report(self, *, final: bool = False) -> None:
        writer = self.writer
        if writer is None or not self._open:
            return
        while True:
            counts = (writer.written_total, writer.dropped_total, writer.failed)
            if counts == self._sent and not writer.logs:
                return
            logs: list[tuple[int, str]] = []
            for record in writer.logs:  # as many as fit in one atomic write
                size = _LEN.size + len(marshal.dumps((*counts, [*logs, record])))
                if logs and size > _STATUS_MAX:
                    break
                logs.append(record)
            payload = marshal.dumps((*counts, logs))
            try:
                os.write(self.fd, _LEN.pack(len(payload)) + payload)
            except BlockingIOError:
                if not final:
                    return  # the broker is behind on reading: the next report supersedes
                select.select([], [self.fd], [], 5)
                continue
            except OSError:  # the broker closed its end: nobody to tell
                self._open = False
                return
            self._sent = counts
            del writer.logs[: len(logs)]
            if not writer.logs and not final:
                return


def run() -> None:
    """Entry point of the writer process (argv[1]: the JSON config)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Yield the CPU to the broker when both want it (a 2-core machine): lower weight, and
    # no preempting the broker when a frame wakes us. The pipe absorbs the lag.
    with contextlib.suppress(AttributeError, OSError):
        os.nice(10)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    config = json.loads(sys.argv[1])
    status_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print must not corrupt the status frames
    status = StatusPipe(status_fd)
    writer = ChildWriter(config, report=status.report)
    status.writer = writer
    try:
        writer.run(sys.stdin.fileno())
    finally:
        status.report(final=True)


if __name__ == "__main__":
    run()
