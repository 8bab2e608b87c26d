"""The event-log writer process: frames of lifecycle events in, JSON lines out (B-170).

`writer.EventLogWriter.start()` runs this module (`python -m amqpbroker.eventlog.child`)
in a child process, so that formatting (~4 µs a line, four lines per delivered message)
never competes with the broker's event loop for the GIL. It imports only the standard
library, `amqp.sections`, `frames` (the frame format, shared with the broker) and
`retention` (the retention decision, standard library only): it starts in well under a
second and never loads the broker.

Theory of operation
-------------------
stdin carries frames from the broker (`frames.py`): `(first_seq, now_ms, events)` with
`events` a list of `RawEvent` tuples numbered from `first_seq` (core/lifecycle.py has the
layout). Each frame becomes JSON
objects with exactly the B-170 fields in order (EVENT_FIELDS; absent values null); the
frames of one read are written with one `write` on an unbuffered file: a reader of the
`.part` file sees every frame as soon as the read is processed, and a failed write is
charged to the frames it carried. The broker sends a frame at the end of every loop
turn, so under a light load a read of less than GATHER_BYTES is followed by a
GATHER_SECONDS pause: frames gather in the pipe, and this process formats, writes and
reports about a hundred times a second instead of once or twice per message. From the
message bytes an event carries it decodes only what the config asks for
(`amqp_message_id` always; allow-listed application-properties; the body hash), once per
message; the parts of a line that depend only on the message, only on the queue, or only
on the event's count, link and reason are cached too, so the common line is one f-string
of five cached texts and three numbers (~40% cheaper than formatting the fields); the
compiled build runs that loop in C (`_lines.c`: the same steps, caches and bytes; every
text is still made and escaped here; issue 20). The
caches of texts are cleared whole when full: they are rebuilt from the decoded fields.
Those are kept by message for at least KNOWN_WINDOW events after the last event that
carried the message's bytes (two generations of that many events), because the broker's
later events of the message carry `KNOWN` (0) instead of the bytes (`Emitter.part`; issue
20); a dropped frame's bytes are read all the same. A message it cannot decode still gets
its events, with those fields null.

Files: `events-<UTC timestamp>.jsonl.part`, renamed to `.jsonl` when it reaches
`max_file_bytes`, when it is older than `max_file_age` (checked with the broker's clock,
`now_ms`, when a frame arrives, and with this process's monotonic clock while idle), and
at end of input; so a reader never sees a half-written `.jsonl`. Names sort in write
order. End of input is the broker's `close()`, or the broker's death: either way what
arrived is written and the last file renamed. A torn frame at the end (the broker gave up
sending it) is ignored: the broker counted its events as dropped.

Disk budget (issue 17): with `compress` (the default) a rotated file is gzipped here,
off the broker's loop (with ISA-L when the `isal` wheel loads, else zlib; issue 20),
straight from `.part` to `.jsonl.gz` (never a plain `.jsonl` first: `analyze` would read
both). After every rotation, and every RETENTION_SECONDS,
`retention.decide_retention` picks the oldest finished files to delete (over
`max_total_bytes`, older than `max_age`; never one `analyze` has not compacted when
`keep_until_analyzed`); deletions are counted and logged. Before every frame, free space
on the file system (statvfs at most every SPACE_CHECK_SECONDS) must be at least
`min_free_bytes`, or the frame is dropped and counted: the journal shares the disk.

An I/O error is logged once; the file being written stays `.part` (it may end in a torn
line), and every later event is counted as dropped. A frame it cannot format (a bug) is
logged once, counted as dropped, and the next frame goes on.

stdout carries status frames back (`frames.py`): `(written_total, dropped_total, failed,
files, log_records)` (`files`: `ChildWriter.stats()`, the disk figures), after every read
and at exit. They are written without blocking and at
most PIPE_BUF bytes, so each arrives whole or not at all; one that does not fit is simply
superseded by the next (the counts are totals; log records wait). Log records are
`(level, text)` pairs that the broker logs under its own logger and handlers.
SIGINT/SIGTERM are ignored: the broker decides when the log ends, by closing stdin.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import gzip
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import stat
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from amqpbroker.amqp import sections
from amqpbroker.eventlog.frames import KNOWN_WINDOW, LENGTH, dumps, framed, take
from amqpbroker.eventlog.retention import (
    AUTO_FREE_BYTES,
    AUTO_FREE_FRACTION,
    AUTO_TOTAL_BYTES,
    AUTO_TOTAL_FRACTION,
    COMPACTED_MARKER,
    EventFile,
    RetentionLimits,
    auto_limit,
    decide_retention,
)

_READ_BYTES = 1 << 20
# After a read of less than GATHER_BYTES, wait GATHER_SECONDS before the next: the broker
# sends a frame at the end of every loop turn, and under a light load that is one or two
# messages' events; each read costs this process a format, a file write and a report
# (~30 us), so frames gather in the pipe instead (at most ~100 reads a second; the pipe
# holds them, and a broker that dies leaves them there for us).
GATHER_BYTES = 64 << 10
GATHER_SECONDS = 0.01
_STATUS_MAX = 4000  # < PIPE_BUF (4096): a status frame is written whole or not at all
_LOG_TEXT_MAX = 1500
_TEXT_CACHE = 65536  # messages whose line texts are remembered (`_cache_message`)
_JSON_CACHE = 65536  # names whose JSON text is remembered
# Retention runs after every rotation and at least this often (max-age while idle).
RETENTION_SECONDS = 60.0
# Third attack pass: the most of COMPACTED_MARKER read (a file name is ~40 bytes: room
# for a million files). The marker is written by `analyze`, maybe another user's: one
# nested deep killed this process (RecursionError), and one that never ends (a FIFO, a
# link to /dev/zero) would hold or fill it.
MAX_MARKER_BYTES = 64 << 20
# Free space (statvfs) is read at most this often; in between, bytes written since the
# last reading are subtracted from it.
SPACE_CHECK_SECONDS = 1.0
# gzip level of rotated files: measured on broker events (docs/decisions.md), level 1
# gives most of level 6's ratio at a fraction of its CPU.
GZIP_LEVEL = 1
# ISA-L's deflate (the `isal` wheel, a dependency) when it loads: level 1 took ~1 us a
# benchmark message against zlib's ~5 (40x against 43x smaller), the largest part of the
# writer's CPU after formatting (issue 20); stdlib gzip otherwise (same files, same level).
_GzipFile: type[gzip.GzipFile] = gzip.GzipFile
with contextlib.suppress(ImportError):
    from isal import igzip

    _GzipFile = igzip.GzipFile
_COPY_BYTES = 1 << 20
# `_format`'s loop in C (`_lines.c`, built with the compiled build only: setup.py
# C_MODULES): the same bytes for a fraction of the CPU (issue 20). None: `_format` does it.
_c: ModuleType | None
try:
    from amqpbroker.eventlog import _lines as _c
except ImportError:  # the pure-Python build (editable installs, no C compiler)
    _c = None
_c_lines: Callable[..., bytes] | None = None if _c is None else _c.lines
# B-170: the JSONL fields, in order; the one list of them (the process that writes the
# lines owns it: the core builds events as shapes, this process adds seq, broker, props and
# body_hash). `_format` and `_line` write them in this order.
EVENT_FIELDS = (
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
_BROKEN = ("null", "null", "null")
_SHA256_BLOCK = 64  # what a message we cannot decode contributes


def _s(value: str | None) -> str:
    return "null" if value is None else _encode_string(value)


def _n(value: int | None) -> str:
    return "null" if value is None else str(int(value))


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


def hmac_pads(key: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """SHA-256 states after the HMAC key's inner and outer pads (RFC 2104): a message's
    HMAC is then two `copy()`s, its body and one more block. `hmac.digest` sets the key
    up again on every call (OpenSSL 3): ~5.6 us a 1 KiB body against ~2.6 (issue 20)."""
    if len(key) > _SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_SHA256_BLOCK, b"\0")
    return (
        hashlib.sha256(bytes([b ^ 0x36 for b in key])),
        hashlib.sha256(bytes([b ^ 0x5C for b in key])),
    )


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
    for name in EVENT_FIELDS:
        if name in fixed:
            value = fixed[name].replace("%", "%%")
        else:
            value = "%d" if name in _INT_FIELDS else "%s"
        parts.append(f'"{name}":{value}')
    return "{" + ",".join(parts) + "}\n"


class ChildWriter:
    """Formats frames and owns the event files. One per writer process."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        report: Callable[[], None],
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.directory = Path(config["directory"])
        self.broker_json = _encode_string(config["broker"])
        self.template = template({"broker": self.broker_json})
        self.properties: tuple[str, ...] = tuple(config["properties"])
        keyed = config["body_hash"] == "keyed"
        self.body_hash: bool = keyed or bool(config["body_hash"])
        self.body_key: bytes | None = None
        self.max_file_bytes: int = config["max_file_bytes"]
        self.max_file_age: int = config["max_file_age"]  # ms
        self.compress: bool = config.get("compress", False)
        self._report = report
        self._statvfs = statvfs
        self.written_total = 0
        self.dropped_total = 0
        self.failed = False
        self.logs: list[tuple[int, str]] = []
        if keyed:
            self.body_key = self._body_key(Path(config["body_key_file"]))
            self.body_hash = self.body_key is not None
        self._pads = None if self.body_key is None else hmac_pads(self.body_key)
        # Retention and the free-space floor (issue 17): `None` limits are a share of the
        # data directory's file system, worked out once here.
        fs_bytes = self._fs_bytes()
        self.limits = RetentionLimits(
            max_total_bytes=auto_limit(
                config.get("max_total_bytes", -1),
                fs_bytes=fs_bytes,
                fraction=AUTO_TOTAL_FRACTION,
                cap=AUTO_TOTAL_BYTES,
            ),
            max_age_ms=config.get("max_age", -1),
            keep_until_analyzed=config.get("keep_until_analyzed", False),
        )
        self.min_free_bytes = auto_limit(
            config.get("min_free_bytes", 0),
            fs_bytes=fs_bytes,
            fraction=AUTO_FREE_FRACTION,
            cap=AUTO_FREE_BYTES,
        )
        self.space_check_seconds = SPACE_CHECK_SECONDS
        self._next_retention = 0.0  # time.monotonic(): at once
        self._space_read_at = -float("inf")
        self._free_bytes = 0
        self._written_since_space = 0
        self._low_space = False
        self._space_warned = False
        self._retention_warned = False
        self._compress_warned = False
        self._over_warned = False  # over max-total-bytes with files keep-until-analyzed keeps
        # Reported to the broker (metrics): the files on disk as the last retention pass
        # found them (the open file's bytes are added as it grows), and what was deleted.
        self._disk_base_bytes = 0
        self._disk_files = 0
        self._oldest_mtime_ms: int | None = None
        self.deleted_files = 0
        self.deleted_bytes = 0
        self.deleted_unanalyzed_files = 0
        self.deleted_unanalyzed_bytes = 0
        self._file: IO[bytes] | None = None
        self._path: Path | None = None
        # Formatted lines of this read's frames (`write_frames`) and their events.
        self._unwritten: list[bytes] = []
        self._unwritten_counts: list[int] = []
        self._wrote = 0  # bytes of the last `_write_all` written
        self._file_bytes = 0
        self._opened_ms = 0  # broker clock
        self._opened_mono = 0.0  # this process's clock, for rotation while idle
        self._last_name_ms = -1
        # Decoded fields by msg_id, in two generations of KNOWN_WINDOW events (`_age`):
        # what `_info` holds moves to `_info_old` at the next turn and is gone at the one
        # after, so what arrived at seq s is kept at least until seq s + KNOWN_WINDOW.
        self._info: dict[int, tuple[str, str, str]] = {}
        self._info_old: dict[int, tuple[str, str, str]] = {}
        self._info_until = KNOWN_WINDOW + 1  # the seq from which `_age` turns
        self._unknown_warned = False
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
        self._tidy()
        while True:
            if time.monotonic() >= self._next_retention:
                self._retain()
                gc.collect()  # the only collection when `run()` turned them off
            ready, _, _ = select.select([fd_in], [], [], self._seconds_to_wait())
            if not ready:
                self._rotate_if_due(None)
                self._report()
                continue
            chunk = os.read(fd_in, _READ_BYTES)
            if not chunk:
                break
            buf += chunk
            self.write_frames(take(buf))
            self._report()
            if len(chunk) < GATHER_BYTES:
                time.sleep(GATHER_SECONDS)  # let a light load's small frames gather
        self._rotate()

    def write_frame(self, first_seq: int, now_ms: int, events: list[tuple[Any, ...]]) -> None:
        """Write one frame's events, or count them as dropped."""
        self.write_frames([(first_seq, now_ms, events)])

    def write_frames(self, frames: list[tuple[int, int, list[tuple[Any, ...]]]]) -> None:
        """Write the frames of one read, each checked and formatted on its own (rotation,
        free space, a format bug), with one `write` of their lines (one per file, when
        one rotates): under a light load the broker sends a frame or two per message."""
        for first_seq, now_ms, events in frames:
            count = len(events)
            if self.failed:
                self.dropped_total += count
                continue
            if first_seq >= self._info_until:
                self._age(first_seq)
            self._rotate_if_due(now_ms)
            if not self._space_ok():  # the journal shares the disk and has priority
                self._read_only(events)
                self.dropped_total += count
                continue
            if self._file is None and not self._guard(functools.partial(self._open, now_ms)):
                self._read_only(events)
                self.dropped_total += count
                continue
            try:
                blob = self._lines(first_seq, events)
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
                continue
            self._unwritten.append(blob)
            self._unwritten_counts.append(count)
            self._file_bytes += len(blob)  # rotation by size counts what waits, too
            self._written_since_space += len(blob)
        self._write_unwritten()

    def _age(self, first_seq: int) -> None:
        """A generation turns: the older one goes (see `_info`)."""
        self._info_old = self._info
        self._info = {}
        self._info_until = first_seq + KNOWN_WINDOW

    def _read_only(self, events: list[tuple[Any, ...]]) -> None:
        """Read the message bytes of a frame that is dropped: its messages' later events
        carry `KNOWN`, and their lines still need what the bytes say."""
        for event in events:
            msg_id, _, size, _, data = event[2]
            if type(data) is bytes:
                self._message_info(msg_id, data, size)

    def _write_unwritten(self) -> None:
        """Write the formatted lines that wait: a frame counts as written if all its
        lines were, else as dropped (a write that fails part-way took some frames)."""
        blobs, counts = self._unwritten, self._unwritten_counts
        if not blobs:
            return
        self._unwritten, self._unwritten_counts = [], []
        blob = blobs[0] if len(blobs) == 1 else b"".join(blobs)
        ok = self._guard(lambda: self._write_all(blob))
        end = 0
        for frame, count in zip(blobs, counts, strict=True):
            end += len(frame)
            if ok or end <= self._wrote:
                self.written_total += count
            else:
                self.dropped_total += count

    def _lines(self, first_seq: int, events: list[tuple[Any, ...]]) -> bytes:
        """The lines of a frame's events as UTF-8: `_format`'s, by `_lines.c` when built
        (the same steps and bytes; it hands `_format` any event that is not the common
        line), else by `_format` itself."""
        if _c_lines is None:
            return self._format(first_seq, events).encode()
        return _c_lines(
            first_seq,
            events,
            self._info,
            self._messages,
            self._shapes,
            self._message_info,
            self._cache_message,
            self._cache_shape,
            self._format,
        )

    def _format(self, first_seq: int, events: list[tuple[Any, ...]]) -> str:
        """The lines of a frame's events, numbered from `first_seq`.

        The common case (sent, enqueued, dispatched, acked: ~4 lines a message; and a
        consumer's `returned`, whose extra is only its delay: a redelivery's fifth line,
        issue 20) is cached texts around ts, seq and the count, inline in this loop: a
        call per line was a tenth of the writer's CPU. Numbers as `{ts}`, not `{ts:d}`:
        a format spec costs ~0.5 us a line (issue 20), and they are plain ints (marshal;
        `frames._plain`).
        """
        lines: list[str] = []
        append = lines.append
        messages = self._messages
        shapes = self._shapes
        info = self._info
        # Texts by id(shape) for this frame: its events hold the shapes (so no id is
        # reused meanwhile), and the broker sends one tuple per shape, so this skips
        # hashing and comparing the nested tuple for most lines (issue 20).
        by_id: dict[int, tuple[str, str, str]] = {}
        for seq, (shape, ts, part, delivery_count, extra) in enumerate(events, first_seq):
            data = part[4]
            if type(data) is bytes and part[0] not in info:
                # Its bytes came (again): what they say is kept from this seq (`_info`).
                self._message_info(part[0], data, part[2])
            if data is None:
                append(self._line(seq, shape, ts, part, delivery_count, extra))
                continue
            if extra is None:
                texts = by_id.get(id(shape))
                if texts is None:
                    texts = shapes.get(shape)
                    if texts is None:
                        texts = self._cache_shape(shape, shape, None)
                    by_id[id(shape)] = texts
            elif (  # only target_queues: a `sent` event (inline: a call a line costs)
                extra[2] is not None
                and extra[0] is None
                and extra[1] is None
                and extra[3] is None
                and extra[4] is None
                and extra[5] is None
                and extra[6] is None
                and extra[7] is None
            ):
                key = (shape, extra[2])
                texts = shapes.get(key)
                if texts is None:
                    texts = self._cache_shape(key, shape, extra[2])
            elif (  # only an int delay_ms: a consumer's `returned` (a redelivery's return)
                type(extra[4]) is int
                and extra[0] is None
                and extra[1] is None
                and extra[2] is None
                and extra[3] is None
                and extra[5] is None
                and extra[6] is None
                and extra[7] is None
            ):
                delayed = (shape, None, extra[4])
                texts = shapes.get(delayed)
                if texts is None:
                    texts = self._cache_shape(delayed, shape, None, extra[4])
            else:
                append(self._line(seq, shape, ts, part, delivery_count, extra))
                continue
            message = messages.get(part[0])
            if message is None:
                message = self._cache_message(*part)
            append(
                f'{{"ts":{ts},"seq":{seq},{texts[0]}{message[0]}{texts[1]}{message[1]}'
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
        self, msg_id: int, durable: bool, size: int, first_ts: int, data: bytes | int
    ) -> tuple[str, str, str]:
        """The text of `_format`'s common line that depends only on the message."""
        amqp_json, props, body_hash = self._message_info(msg_id, data, size)
        text = (
            f'"broker":{self.broker_json},"msg_id":{msg_id},"amqp_message_id":{amqp_json},',
            f'"durable":{"true" if durable else "false"},"size":{size},',
            f'"first_ts":{first_ts},"error_condition":null,"error_description":null,'
            f'"props":{props},"body_hash":{body_hash}}}\n',
        )
        cache = self._messages
        if len(cache) >= _TEXT_CACHE:
            # Start afresh: they are rebuilt from `_message_info`. (Evicting the oldest
            # entry one by one is not O(1): a dict iterates over the slots of deleted
            # entries until it is rebuilt.)
            cache.clear()
        cache[msg_id] = text
        return text

    def _cache_shape(
        self,
        key: Any,
        shape: tuple[Any, ...],
        targets: tuple[str, ...] | None,
        delay_ms: int | None = None,
    ) -> tuple[str, str, str]:
        """The texts of `_format`'s common line that depend only on the event's shape (and a
        `sent`'s target queues, or a `returned`'s delay): a few, repeated for every
        message."""
        j = self._json
        kind, (address, queue, routing_type), by, reason = shape
        connection, link = by or (None, None)
        queues = "null" if targets is None else "[" + ",".join([j[q] for q in targets]) + "]"
        texts = (
            f'"event":{j[kind]},',
            f'"address":{j[address]},"queue":{j[queue]},"routing_type":{j[routing_type]},',
            f'"connection":{j[connection]},"link":{j[link]},"txn":null,"reason":{j[reason]},'
            f'"target_address":null,"target_queues":{queues},"copy_msg_id":null,'
            f'"delay_ms":{_n(delay_ms)},',
        )
        if len(self._shapes) >= _JSON_CACHE:
            self._shapes.clear()
        self._shapes[key] = texts
        return texts

    def _body_key(self, path: Path) -> bytes | None:
        """The key of `body-hash: keyed` (issue 22 item 3): 32 random bytes in `path`,
        made on first use (mode 0600). None, and an error logged, when it cannot be read
        or made: events then carry no body_hash (and `analyze` says so) rather than a
        hash nobody can compare.

        The key is written to a temporary file, synced, then linked into place (`link`
        fails if a key exists: two writers never make two keys), so a kill or a full disk
        mid-write never leaves a short key. A short one left by an older version is not
        a key any hash was made with: it is replaced (crash pass, 2026-11-29)."""
        for _ in range(2):
            try:
                key = path.read_bytes()
                if len(key) >= 16:
                    return key
                self.log(
                    logging.WARNING,
                    f"event log: {path} is torn ({len(key)} bytes, never used): a new key",
                )
                self._write_key(path, replace=True)
            except FileNotFoundError:
                try:
                    self._write_key(path, replace=False)
                except FileExistsError:
                    continue
                except OSError as e:
                    self.log(logging.ERROR, f"event log: cannot create {path} ({e}): no body_hash")
                    return None
            except OSError as e:
                self.log(logging.ERROR, f"event log: cannot read {path} ({e}): no body_hash")
                return None
        return None

    @staticmethod
    def _write_key(path: Path, *, replace: bool) -> None:
        """32 random bytes into `path`, whole or not at all (see `_body_key`)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(temp, path)
            else:
                os.link(temp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()

    def _message_info(self, msg_id: int, data: bytes | int, size: int) -> tuple[str, str, str]:
        """The decoded fields of message `msg_id`, from `data`: its bytes, or `KNOWN` (an
        int) when an earlier event brought them."""
        info = self._info.get(msg_id)
        if info is not None:
            return info
        if type(data) is bytes:
            # Decoded again only if it aged out; kept a generation more either way.
            info = self._info_old.get(msg_id)
            if info is None:
                return self._decode(data, size, msg_id)
            self._info[msg_id] = info
            return info
        info = self._info_old.get(msg_id)
        if info is not None:
            return info
        # Never happens unless a frame with the bytes was lost without the broker knowing.
        if not self._unknown_warned:
            self.log(
                logging.WARNING,
                f"event log: message {msg_id} not known; writing its events without "
                "amqp_message_id, props and body_hash",
            )
            self._unknown_warned = True
        return _BROKEN

    def _decode(self, data: bytes, size: int, msg_id: int) -> tuple[str, str, str]:
        """(amqp_message_id, props, body_hash) as JSON text, from the message bytes;
        remembered by msg_id (a message's bytes never change what these say)."""
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
                body = memoryview(data)[sections.scan(data).body_start :]
                pads = self._pads
                if pads is None:
                    body_hash = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                else:  # HMAC-SHA256 (RFC 2104) from the key's two precomputed states
                    inner = pads[0].copy()
                    inner.update(body)
                    outer = pads[1].copy()
                    outer.update(inner.digest())
                    body_hash = '"' + outer.hexdigest()[:16] + '"'
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
        self._info[msg_id] = info  # bounded: `_age`
        return info

    # -- files ----------------------------------------------------------------------------
    def _write_all(self, blob: bytes) -> None:
        """Write `blob`; `_wrote` says how much of it went out, also when a write fails."""
        assert self._file is not None
        self._wrote = 0
        view = memoryview(blob)
        while view:
            written = self._file.write(view) or 0
            self._wrote += written
            view = view[written:]

    def _seconds_to_wait(self) -> float:
        """How long to wait for frames before the open file is too old, or retention is
        due."""
        now = time.monotonic()
        left = self._next_retention - now
        if self._file is not None:
            left = min(left, self._opened_mono + self.max_file_age / 1000 - now)
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
        self._disk_files += 1
        if self._oldest_mtime_ms is None:
            self._oldest_mtime_ms = now_ms
        self._file_bytes = 0
        self._opened_ms = now_ms
        self._opened_mono = time.monotonic()
        self._last_name_ms = name_ms

    def _rotate(self) -> None:
        """Close the current `.part` file and rename it to `.jsonl` (unless a write failed:
        then it may end in a torn line and stays `.part`)."""
        if self._file is None or self._path is None:
            return
        self._write_unwritten()  # they belong to this file
        file, path = self._file, self._path
        self._file, self._path = None, None
        self._disk_base_bytes += self._file_bytes
        self._file_bytes = 0
        if self._guard(file.close) and not self.failed:
            self._finish(path)
        self._retain()

    def _finish(self, part: Path) -> None:
        """`.part` -> `.jsonl.gz` (with `compress`) or `.jsonl`. The compressed file is
        written as `.jsonl.gz.tmp` and renamed, then the `.part` removed: a reader (and
        `analyze`'s file stream, which tracks files by name) sees each file under one
        final name only. If compressing fails (a full disk), the file stays plain."""
        final = part.with_suffix("")
        if self.compress:
            gz = final.with_name(final.name + ".gz")
            tmp = gz.with_name(gz.name + ".tmp")
            try:
                with (
                    part.open("rb") as src,
                    tmp.open("wb") as raw,
                    _GzipFile(
                        filename=final.name, mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL
                    ) as out,
                ):
                    shutil.copyfileobj(src, out, _COPY_BYTES)
                os.replace(tmp, gz)
                part.unlink()
                return
            except OSError as e:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                if gz.exists():  # compressed and renamed; only the unlink failed
                    return
                if not self._compress_warned:
                    self.log(
                        logging.WARNING,
                        f"event log: cannot compress {part.name} ({e}); keeping it as {final.name}",
                    )
                    self._compress_warned = True
        self._guard(lambda: os.replace(part, final))

    # -- retention and the disk budget (issue 17) -----------------------------------------
    def _fs_bytes(self) -> int:
        """Size of the events directory's file system (its nearest existing ancestor);
        if unknown, huge (then the limits that depend on it are their caps)."""
        path = self.directory.resolve()
        while not path.exists() and path.parent != path:
            path = path.parent
        try:
            st = self._statvfs(str(path))
        except OSError:
            return 1 << 62
        return st.f_blocks * st.f_frsize

    def _space_ok(self) -> bool:
        """Whether free space on the events file system is above `min_free_bytes`:
        statvfs at most every SPACE_CHECK_SECONDS, less what was written since."""
        if self.min_free_bytes <= 0:
            return True
        now = time.monotonic()
        if now - self._space_read_at >= self.space_check_seconds:
            self._space_read_at = now
            path = self.directory if self.directory.exists() else self.directory.parent
            try:
                st = self._statvfs(str(path))
            except OSError as e:
                if not self._space_warned:
                    self.log(logging.WARNING, f"event log: cannot read free space ({e})")
                    self._space_warned = True
                return True
            self._free_bytes = st.f_bavail * st.f_frsize
            self._written_since_space = 0
        free = self._free_bytes - self._written_since_space
        low = free < self.min_free_bytes
        if low != self._low_space:
            self._low_space = low
            if low:
                self.log(
                    logging.WARNING,
                    f"event log: {free} bytes free on the file system of {self.directory}, "
                    f"below event-log.min-free-bytes ({self.min_free_bytes}); dropping "
                    "events until there is more (the journal has priority)",
                )
            else:
                self.log(
                    logging.WARNING,
                    f"event log: {free} bytes free again on the file system of "
                    f"{self.directory}; writing events again",
                )
        return not low

    def _compacted(self) -> frozenset[str]:
        """Names of the files an `analyze` run has compacted (its marker), if any."""
        try:
            data = json.loads(_read_regular(self.directory / COMPACTED_MARKER, MAX_MARKER_BYTES))
            names = data["files"] if isinstance(data, dict) else None
            if isinstance(names, list):
                return frozenset(n for n in names if isinstance(n, str))
        except FileNotFoundError:
            return frozenset()
        except (OSError, ValueError, KeyError, RecursionError):
            pass
        if not self._retention_warned:
            self.log(
                logging.WARNING,
                f"event log: cannot read {self.directory / COMPACTED_MARKER}; "
                "treating every file as not yet compacted",
            )
            self._retention_warned = True
        return frozenset()

    def _scan(self) -> list[EventFile]:
        """The event files on disk (`.part` and `.tmp` ones as unfinished)."""
        compacted = self._compacted()
        files = []
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return []
        for entry in entries:
            name = entry.name
            if not name.startswith("events-"):
                continue
            finished = name.endswith((".jsonl", ".jsonl.gz"))
            if not finished and not name.endswith((".part", ".tmp")):
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            mtime_ms = st.st_mtime_ns // 1_000_000
            files.append(EventFile(name, st.st_size, mtime_ms, finished, name in compacted))
        return files

    def _tidy(self) -> None:
        """At start: remove what an interrupted compression left (a `.jsonl.gz.tmp`, or a
        `.part` whose `.jsonl.gz` is complete)."""
        with contextlib.suppress(OSError):
            for path in self.directory.glob("events-*.jsonl.gz.tmp"):
                path.unlink()
            for path in self.directory.glob("events-*.jsonl.part"):
                if path.with_name(path.stem + ".gz").exists():
                    path.unlink()

    def _retain(self) -> None:
        """Delete what `decide_retention` says; count and log it; refresh the disk
        figures the broker reports."""
        self._next_retention = time.monotonic() + RETENTION_SECONDS
        files = self._scan()
        doomed = decide_retention(files, self.limits, now_ms=time.time_ns() // 1_000_000)
        gone: set[str] = set()
        lost_files = lost_bytes = 0
        for f in doomed:
            try:
                (self.directory / f.name).unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                self.log(logging.WARNING, f"event log: cannot delete {f.name} ({e})")
                continue
            gone.add(f.name)
            self.deleted_files += 1
            self.deleted_bytes += f.size_bytes
            if not f.compacted:
                lost_files += 1
                lost_bytes += f.size_bytes
        if gone:
            self.deleted_unanalyzed_files += lost_files
            self.deleted_unanalyzed_bytes += lost_bytes
            limits = self.limits
            text = (
                f"event log: deleted {len(gone)} old event files (max-total-bytes "
                f"{limits.max_total_bytes}, max-age {limits.max_age_ms} ms)"
            )
            if lost_files:
                self.log(
                    logging.WARNING,
                    f"{text}; {lost_files} of them ({lost_bytes} bytes) were not compacted "
                    "by `amqpbroker analyze`: their events are lost to analysis "
                    "(event-log.keep-until-analyzed keeps them)",
                )
            else:
                self.log(logging.INFO, text)
        kept = [f for f in files if f.name not in gone]
        total = sum(f.size_bytes for f in kept)
        over = 0 <= self.limits.max_total_bytes < total and self.limits.keep_until_analyzed
        if over and not self._over_warned:
            self.log(
                logging.WARNING,
                f"event log: {total} bytes in {self.directory}, over max-total-bytes "
                f"({self.limits.max_total_bytes}), kept because `amqpbroker analyze` has not "
                "compacted them (keep-until-analyzed); min-free-bytes still protects the disk",
            )
        self._over_warned = over
        open_name = self._path.name if self._path is not None else None
        self._disk_base_bytes = sum(f.size_bytes for f in kept if f.name != open_name)
        self._disk_files = len(kept)
        self._oldest_mtime_ms = min((f.mtime_ms for f in kept), default=None)

    def stats(self) -> tuple[int, int, int | None, int, int, int, int]:
        """(disk bytes, files, oldest file's last write in epoch ms, deleted files,
        deleted bytes, of those not compacted: files, bytes): what the broker exports."""
        return (
            self._disk_base_bytes + self._file_bytes,
            self._disk_files,
            self._oldest_mtime_ms,
            self.deleted_files,
            self.deleted_bytes,
            self.deleted_unanalyzed_files,
            self.deleted_unanalyzed_bytes,
        )

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
    """Sends `(written_total, dropped_total, failed, files, logs)` to the broker (`files`:
    `ChildWriter.stats()`), never blocking except in `close()`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.writer: ChildWriter | None = None
        self._sent: tuple[Any, ...] | None = None
        self._open = True
        os.set_blocking(fd, False)

    def report(self, *, final: bool = False) -> None:
        writer = self.writer
        if writer is None or not self._open:
            return
        while True:
            counts = (writer.written_total, writer.dropped_total, writer.failed, writer.stats())
            if counts == self._sent and not writer.logs:
                return
            logs: list[tuple[int, str]] = []
            for record in writer.logs:  # as many as fit in one atomic write
                size = LENGTH.size + len(dumps((*counts, [*logs, record])))
                if logs and size > _STATUS_MAX:
                    break
                logs.append(record)
            payload = dumps((*counts, logs))
            try:
                os.write(self.fd, framed(payload))
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


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (else OSError):
    opened without blocking (a FIFO's open waits for a writer) and read no further."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes")
    return data


def run() -> None:
    """Entry point of the writer process (argv[1]: the JSON config)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Yield the CPU to the broker when both want it (a 2-core machine): lower weight, and
    # no preempting the broker when a frame wakes us. The pipe absorbs the lag.
    with contextlib.suppress(AttributeError, OSError):
        os.nice(10)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    # No automatic garbage collection: what this process makes per frame (unmarshalled
    # tuples, texts) holds no reference cycles and dies by reference counting, while the
    # collector walked every frame's ~20k live tuples, and again in older generations:
    # ~4% of its instructions (issue 20). `ChildWriter.run` collects once a minute, so a
    # cycle an error path might make (a traceback) is still freed.
    gc.disable()
    if _c is not None:
        _c.keep_memory()  # each read's megabytes reused, not faulted in again (`_lines.c`)
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
    # Done: the files are closed and the last status is sent. No interpreter teardown:
    # with the caches full it was a collection over ~10^5 texts and tuples and their
    # deallocation, tens of ms of a broker's shutdown for nothing (issue 20).
    sys.stdout.flush()  # (stderr's: a stray print, `run`)
    sys.stderr.flush()
    os._exit(0)
