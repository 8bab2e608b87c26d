"""The lifecycle event-log writer (B-170, B-171): fields, order, seq, drops, levels,
rotation, `.part` files, props and body hash, errors.

The writer process is real; waits are bounded (`wait_until`, `wait`). A stuck writer is
a stopped one (SIGSTOP); a full disk is a file-size limit the writer process inherits.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import hmac
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from proton import Message as ProtonMessage
from proton import ulong
from support.core_harness import Harness
from support.event_files import FINISH_SECONDS, PatientWriter, read_events, wait_for_writer

from amqpbroker.amqp import sections
from amqpbroker.config import EventLogConfig
from amqpbroker.core import FAILURE_EVENTS, Accepted, LifecycleEvent, RawEvent
from amqpbroker.core.lifecycle import EVENT_TYPES, KNOWN, Emitter
from amqpbroker.core.model import Message
from amqpbroker.eventlog import HEAD_BYTES, EventLogWriter, child, frames
from amqpbroker.eventlog import writer as writer_module
from amqpbroker.eventlog.child import EVENT_FIELDS
from amqpbroker.eventlog.writer import BODY_KEY_FILE


def event(kind: str = "acked", **kw: Any) -> RawEvent:
    fields: dict[str, Any] = {"ts": 1, "event": kind, "msg_id": 7, "address": "a"}
    fields.update(kw)
    return LifecycleEvent(**fields).raw()


class FakeClock:
    """Epoch ms that a test sets; the writer sends it with every frame."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def writer(
    directory: Path, *, clock: FakeClock | None = None, queue_events: int = 1024, **config: Any
) -> EventLogWriter:
    config.setdefault("compress", False)  # these tests read the rotated files as text
    return PatientWriter(
        directory,
        broker_name="b1",
        config=EventLogConfig(**config),
        clock_ms=clock or FakeClock(1_700_000_000_000),
        queue_events=queue_events,
    )


def records(directory: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(pattern)):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def encoded(**kw: Any) -> bytes:
    return sections.scan(bytes(ProtonMessage(**kw).encode())).data


def process(w: EventLogWriter) -> subprocess.Popen[bytes]:
    assert w._process is not None
    return w._process


@contextmanager
def stopped(w: EventLogWriter) -> Iterator[None]:
    """The writer process stopped (a writer stuck on a hung file system), then resumed."""
    pid = process(w).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# -- B-170 record ------------------------------------------------------------------------


def test_record_has_every_field_in_table_order_with_nulls(tmp_path: Path) -> None:
    """B-170: exactly the table's fields, in its order; one that does not apply is null,
    never omitted."""
    w = writer(tmp_path)
    w.start()
    w.submit([event("sent")])
    w.close()
    [record] = records(tmp_path)
    assert list(record) == list(EVENT_FIELDS)
    assert list(EVENT_FIELDS) == [
        *("ts", "seq", "event", "broker", "msg_id", "amqp_message_id", "address", "queue"),
        *("routing_type", "durable", "size", "delivery_count", "connection", "link", "txn"),
        *("reason", "target_address", "target_queues", "copy_msg_id", "delay_ms", "first_ts"),
        *("error_condition", "error_description", "props", "body_hash"),
    ]
    assert record == {
        **dict.fromkeys(EVENT_FIELDS),
        "ts": 1,
        "seq": 1,
        "event": "sent",
        "broker": "b1",
        "msg_id": 7,
        "address": "a",
        "durable": False,
        "size": 0,
        "first_ts": 0,
    }


def test_record_carries_every_field_value_with_its_json_type(tmp_path: Path) -> None:
    """B-170: integers, strings, a boolean, target_queues as an array of strings, the error
    description cut to 512 characters."""
    w = writer(tmp_path)
    w.start()
    w.submit(
        [
            event(
                "dead-lettered",
                ts=1_700_000_000_123,
                msg_id=41,
                amqp_message_id="order-1",
                address="orders",
                queue="orders",
                routing_type="ANYCAST",
                durable=True,
                size=1234,
                delivery_count=3,
                connection="app",
                link="worker",
                txn="0a1b",
                reason="rejected",
                target_address="DLA",
                target_queues=("DLQ.orders", "audit"),
                copy_msg_id=42,
                delay_ms=0,
                first_ts=1_700_000_000_000,
                error_condition="app:poison",
                error_description="é" + "x" * 600,
            )
        ]
    )
    w.close()
    [record] = records(tmp_path)
    assert record["target_queues"] == ["DLQ.orders", "audit"]
    assert record["error_description"] == "é" + "x" * 511
    assert (record["durable"], record["delivery_count"], record["copy_msg_id"]) == (True, 3, 42)
    assert (record["delay_ms"], record["txn"]) == (0, "0a1b")
    assert record["error_condition"] == "app:poison"
    assert record["amqp_message_id"] == "order-1"


# -- seq and drops -------------------------------------------------------------------------


def test_seq_starts_at_one_and_increases_in_submit_order(tmp_path: Path) -> None:
    """B-170: seq is a per-broker increasing event number, assigned in submit order."""
    w = writer(tmp_path)
    w.start()
    w.submit([event("sent"), event("enqueued")])
    w.submit([event("dispatched")])
    w.submit([event("acked")])
    w.close()
    assert [(r["seq"], r["event"]) for r in records(tmp_path)] == [
        (1, "sent"),
        (2, "enqueued"),
        (3, "dispatched"),
        (4, "acked"),
    ]
    assert w.dropped_total == 0


def test_full_queue_drops_and_counts_and_seq_gap_shows_it(tmp_path: Path) -> None:
    """B-170: when the hand-off is full the events are dropped and counted; their seq
    numbers are skipped, so the gap is visible. (The writer is not started yet.)"""
    w = writer(tmp_path, queue_events=1)
    w.submit([event()])
    w.submit([event(), event()])  # the hand-off holds one event: dropped
    assert w.dropped_total == 2
    w.start()
    wait_for_writer(lambda: w.written_total == 1, message="the hand-off drained")
    w.submit([event()])
    w.close()
    w.submit([event()])  # after close: dropped, still numbered
    assert [r["seq"] for r in records(tmp_path)] == [1, 4]
    assert w.dropped_total == 3


def test_busy_writer_never_blocks_submit_and_the_gap_shows(tmp_path: Path) -> None:
    """B-170: the broker never blocks on the log; a stuck writer makes later batches drop
    once the hand-off is full."""
    data = encoded(body=b"x")
    w = writer(tmp_path, queue_events=2, body_hash=True)
    w.start()
    with stopped(w):
        started = time.monotonic()
        w.submit([event(data=data)])  # seq 1
        w.submit([event(data=data)])  # seq 2
        w.submit([event(data=data), event(data=data)])  # seq 3, 4: dropped
        assert time.monotonic() - started < 1
        assert w.dropped_total == 2
    wait_for_writer(lambda: w.written_total == 2, message="the hand-off drained")
    w.submit([event(data=data)])  # seq 5
    w.close()
    assert [r["seq"] for r in records(tmp_path)] == [1, 2, 5]
    assert w.dropped_total == 2


def test_pending_events_count_what_the_writer_process_has_yet_to_write(tmp_path: Path) -> None:
    """Issue 20: `pending_events` (amqpbroker_event_log_pending_events) is how far the
    writer process is behind: handed over, neither written nor dropped; dropped events
    are not pending."""
    w = writer(tmp_path, queue_events=3)
    w.start()
    assert w.pending_events == 0
    with stopped(w):
        w.submit([event(), event()])  # seq 1, 2: handed over, unwritten
        w.submit([event(), event()])  # seq 3, 4: over the bound, dropped here
        assert w.pending_events == 2
        assert w.dropped_total == 2
    wait_for_writer(lambda: w.pending_events == 0, message="the writer caught up")
    assert w.written_total == 2
    w.close()
    assert w.pending_events == 0


def test_a_frame_is_dropped_for_the_bound_only_on_fresh_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-170: flushes read the writer process's reports only every STATUS_SECONDS (a read
    costs the loop ~25 µs), so the counts may be stale; a frame that would cross the bound
    on stale counts reads them again first, and is not dropped if the writer caught up."""
    monkeypatch.setattr(writer_module, "STATUS_SECONDS", 3600.0)  # only the first flush reads
    w = writer(tmp_path, queue_events=2)
    w.start()
    w.submit([event(), event()])  # a frame of two: the hand-off is full
    wait_for_writer(lambda: len(records(tmp_path, "*.part")) == 2, message="the writer wrote them")
    w.submit([event(), event()])  # stale counts say full; fresh ones say empty
    w.close()
    assert [r["seq"] for r in records(tmp_path)] == [1, 2, 3, 4]
    assert w.dropped_total == 0


# -- levels --------------------------------------------------------------------------------


def test_level_failures_writes_only_the_failure_events(tmp_path: Path) -> None:
    """B-170: level `failures` keeps returned, held, dead-lettered, expired, killed,
    replaced, moved and unrouted; filtered events take no seq (no false gaps)."""
    w = writer(tmp_path, level="failures")
    w.start()
    w.submit([event(kind) for kind in sorted(EVENT_TYPES)])
    w.close()
    written = records(tmp_path)
    assert {r["event"] for r in written} == FAILURE_EVENTS
    assert [r["seq"] for r in written] == list(range(1, len(FAILURE_EVENTS) + 1))
    assert w.dropped_total == 0


def test_level_lifecycle_writes_every_event(tmp_path: Path) -> None:
    """B-170: level `lifecycle` writes every B-171 event type."""
    w = writer(tmp_path, level="lifecycle")
    w.start()
    w.submit([event(kind) for kind in sorted(EVENT_TYPES)])
    w.close()
    assert [r["event"] for r in records(tmp_path)] == sorted(EVENT_TYPES)


@pytest.mark.parametrize("config", [{"level": "off"}, {"enabled": False}])
def test_level_off_writes_nothing(tmp_path: Path, config: dict[str, Any]) -> None:
    """B-170: level `off` (or the log disabled): no events, no files, nothing dropped."""
    w = writer(tmp_path, **config)
    w.start()
    w.submit([event(kind) for kind in sorted(EVENT_TYPES)])
    w.close()
    assert list(tmp_path.iterdir()) == []
    assert w.dropped_total == 0


# -- files ---------------------------------------------------------------------------------


def test_file_is_part_while_written_and_shows_recent_events(tmp_path: Path) -> None:
    """B-170: the open file is `events-<UTC>.jsonl.part`, flushed when the writer runs out
    of work; only `close()` renames it to `.jsonl`."""
    w = writer(tmp_path, clock=FakeClock(1_795_349_594_007))  # 2026-11-22T12:13:14.007Z
    w.start()
    w.submit([event("sent"), event("enqueued")])
    part = tmp_path / "events-20261122T121314007Z.jsonl.part"
    wait_for_writer(lambda: part.exists() and line_count(part) == 2, message="2 flushed lines")
    assert not list(tmp_path.glob("*.jsonl"))
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events-20261122T121314007Z.jsonl"]


def test_close_is_idempotent_and_works_unstarted(tmp_path: Path) -> None:
    """close() twice, or without start(), neither raises nor leaves a `.part` file."""
    w = writer(tmp_path)
    w.start()
    w.submit([event()])
    w.close()
    w.close()
    w.start()  # after close: no new thread
    assert not list(tmp_path.glob("*.part"))
    assert len(list(tmp_path.glob("events-*.jsonl"))) == 1
    unstarted = writer(tmp_path / "never")
    unstarted.close()
    unstarted.close()
    assert not (tmp_path / "never").exists()


def test_rotation_by_size_names_sort_in_write_order(tmp_path: Path) -> None:
    """B-170: a file that reached max-file-bytes is renamed and a new one started; names
    sort in write order even when rotations share a millisecond."""
    w = writer(tmp_path, max_file_bytes=10)  # every line is longer: one batch a file
    w.start()
    for _ in range(3):
        w.submit([event(), event()])
    w.close()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert [line_count(f) for f in files] == [2, 2, 2]
    assert [r["seq"] for r in records(tmp_path)] == [1, 2, 3, 4, 5, 6]
    assert not list(tmp_path.glob("*.part"))


def test_rotation_by_age_when_the_next_event_arrives(tmp_path: Path) -> None:
    """B-170: a file older than max-file-age (by the broker's clock, sent with the
    events) is renamed before the next event is written."""
    clock = FakeClock(0)
    w = writer(tmp_path, clock=clock, max_file_age=60_000)
    w.start()
    w.submit([event()])
    wait_for_writer(lambda: [line_count(p) for p in tmp_path.glob("*.part")] == [1])
    clock.now = 59_999
    w.submit([event()])
    wait_for_writer(lambda: [line_count(p) for p in tmp_path.glob("*.part")] == [2])
    clock.now = 60_000
    w.submit([event()])
    w.close()
    assert [line_count(f) for f in sorted(tmp_path.glob("*.jsonl"))] == [2, 1]


def test_rotation_by_age_while_no_events_arrive(tmp_path: Path) -> None:
    """B-170: an idle broker's last file still becomes `.jsonl` once it is max-file-age
    old, without waiting for another event or shutdown (measured by the writer)."""
    w = writer(tmp_path, max_file_age=300)
    w.start()
    w.submit([event()])
    wait_for_writer(lambda: [line_count(p) for p in tmp_path.glob("*.part")] == [1])
    [done] = wait_for_writer(lambda: list(tmp_path.glob("*.jsonl")), message="the idle rotation")
    assert not list(tmp_path.glob("*.part"))
    assert line_count(done) == 1
    w.close()
    assert list(tmp_path.iterdir()) == [done]


# -- props and body_hash ---------------------------------------------------------------------


def test_props_are_the_allow_listed_values_as_strings(tmp_path: Path) -> None:
    """B-170: props holds only the allow-listed application-properties that are present,
    as strings; amqp_message_id is the string form of properties.message-id."""
    tagged = encoded(id="m-1", body=b"x", properties={"tenant": 42, "region": "eu", "pii": "x"})
    untagged = encoded(body=b"y")
    w = writer(tmp_path, properties=("tenant", "region", "absent"))
    w.start()
    w.submit([event(msg_id=1, data=tagged), event(msg_id=2, data=untagged), event(msg_id=3)])
    w.close()
    first, second, third = records(tmp_path)
    assert first["props"] == {"tenant": "42", "region": "eu"}
    assert first["amqp_message_id"] == "m-1"
    assert first["body_hash"] is not None  # body-hash is keyed by default (issue 22)
    assert second["props"] == {}
    assert second["amqp_message_id"] is None
    assert third["props"] is None  # no message to read


def test_props_are_off_and_body_hash_keyed_by_default(tmp_path: Path) -> None:
    """B-170: the allow-list is empty by default. Issue 22 item 3: body_hash is on by
    default as an HMAC-SHA-256 with a random key made in DATA_DIR/event-log.key (0600):
    the same body gives the same hash, and without the key the hash says nothing about
    the content (not the plain SHA-256 a dictionary attack could match)."""
    data_dir = tmp_path / "data"
    events = data_dir / "events"
    events.mkdir(parents=True)
    w = writer(events)
    w.start()
    w.submit([event(msg_id=1, data=encoded(body=b"x", properties={"a": 1}))])
    w.submit([event(msg_id=2, data=encoded(body=b"x"))])
    w.close()
    first, second = records(events)
    key = (data_dir / BODY_KEY_FILE).read_bytes()
    assert len(key) == 32
    assert (data_dir / BODY_KEY_FILE).stat().st_mode & 0o777 == 0o600
    body = encoded(body=b"x")[sections.scan(encoded(body=b"x")).body_start :]
    assert first["props"] is None
    assert first["body_hash"] == hmac.digest(key, body, "sha256").hex()[:16]
    assert first["body_hash"] != hashlib.sha256(body).hexdigest()[:16]
    assert second["body_hash"] == first["body_hash"]
    again = writer(events)  # a restart keeps the key: hashes compare across runs
    again.start()
    again.submit([event(msg_id=3, data=encoded(body=b"x"))])
    again.close()
    assert {r["body_hash"] for r in records(events)} == {first["body_hash"]}


@pytest.mark.parametrize("key_bytes", [16, 32, 63, 64, 65, 200])
def test_the_precomputed_hmac_is_hmac_sha256(key_bytes: int) -> None:
    """Issue 20: the writer process hashes a body from the key's two precomputed SHA-256
    states (`child.hmac_pads`) instead of `hmac.digest` (half its CPU); the hash must stay
    HMAC-SHA-256 for any key length a key file may hold (longer than a block: hashed)."""
    key = bytes(range(key_bytes))
    for body in (b"", b"x", b"y" * 1024, bytes(range(256)) * 40):
        inner, outer = child.hmac_pads(key)
        inner.update(body)
        outer.update(inner.digest())
        assert outer.hexdigest() == hmac.digest(key, body, "sha256").hex()


def test_body_hash_false_writes_null(tmp_path: Path) -> None:
    """`body-hash: false`: no hash, no key file."""
    w = writer(tmp_path / "events", body_hash=False)
    w.start()
    w.submit([event(data=encoded(body=b"x"))])
    w.close()
    [record] = records(tmp_path / "events")
    assert record["body_hash"] is None
    assert not (tmp_path / BODY_KEY_FILE).exists()


def test_body_hash_is_sha256_prefix_of_the_encoded_body_sections(tmp_path: Path) -> None:
    """B-170: body_hash is the first 16 hex digits of the SHA-256 of the encoded body
    sections (from the first body section on; header and properties excluded)."""
    data = encoded(id="m-1", body=b"secret", durable=True, properties={"a": 1}, inferred=True)
    same_body = encoded(id="m-2", body=b"secret", durable=True, properties={"a": 2}, inferred=True)
    scanned = sections.scan(data)
    body = data[scanned.body_start :]
    assert body.endswith(b"secret")
    w = writer(tmp_path, body_hash=True)
    w.start()
    w.submit([event(msg_id=1, data=data), event(msg_id=2, data=same_body)])
    w.close()
    first, second = records(tmp_path)
    assert first["body_hash"] == hashlib.sha256(body).hexdigest()[:16]
    assert second["body_hash"] == first["body_hash"]
    assert b"secret".hex() not in json.dumps(first)


def test_a_long_message_hands_over_only_its_head_without_props_or_body_hash(
    tmp_path: Path,
) -> None:
    """Cost: without props or body_hash an event carries only the head of the message
    (where properties.message-id is); amqp_message_id and size are still right."""
    data = encoded(id="big-1", body=b"x" * (2 * HEAD_BYTES))
    plain = writer(tmp_path, body_hash=False)
    assert plain.data_limit == HEAD_BYTES
    assert writer(tmp_path).data_limit > len(data)  # keyed by default: the whole body
    assert writer(tmp_path, properties=("a",)).data_limit > len(data)
    assert writer(tmp_path, body_hash=True).data_limit > len(data)
    emitter = Emitter()
    emitter.data_limit = plain.data_limit
    head = data[: emitter.data_limit]
    plain.start()
    plain.submit([event(data=head, size=len(data))])
    plain.close()
    [record] = records(tmp_path)
    assert (record["amqp_message_id"], record["size"]) == ("big-1", len(data))


def test_undecodable_message_still_gets_its_events(tmp_path: Path) -> None:
    """B-170: a message whose properties the decoder rejects is still logged, with
    amqp_message_id, props and body_hash null; the next message is unaffected."""
    broken = bytes.fromhex("005373c00201ff") + encoded(body=b"x")  # properties: bad type
    with pytest.raises(sections.SectionError):
        sections.READER.properties(broken)
    fine = encoded(id="ok", body=b"x", properties={"t": "a"})
    w = writer(tmp_path, properties=("t",), body_hash=True)
    w.start()
    w.submit([event(msg_id=1, data=broken, size=len(broken)), event(msg_id=2, data=fine)])
    w.close()
    first, second = records(tmp_path)
    assert (first["amqp_message_id"], first["props"], first["body_hash"]) == (None, None, None)
    assert (second["amqp_message_id"], second["props"]) == ("ok", {"t": "a"})
    assert w.dropped_total == 0


# -- errors ----------------------------------------------------------------------------------


def test_unwritable_directory_counts_drops_and_never_raises(tmp_path: Path) -> None:
    """B-170: an I/O error in the writer is logged once; submit never raises; every event
    from then on is counted as dropped."""
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    w = writer(blocker / "events")
    w.start()
    w.submit([event(), event()])
    wait_for_writer(lambda: w.dropped_total == 2, message="the failed batch counted")
    w.submit([event()])  # after the failure: dropped at once
    w.close()
    assert w.dropped_total == 3
    assert w.written_total == 0


def test_directory_removed_after_start_counts_drops(tmp_path: Path) -> None:
    """B-170: the events directory vanishing under the writer loses events, not the
    broker; a file that failed mid-way is never presented as a complete `.jsonl`."""
    directory = tmp_path / "events"
    w = writer(directory, max_file_bytes=10)
    w.start()
    w.submit([event()])
    wait_for_writer(lambda: list(directory.glob("*.part")), message="the first file")
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    directory.write_text("now a file")  # the next file cannot be created
    w.submit([event()])  # rotation: the rename fails
    w.close()
    assert w.dropped_total == 1
    assert directory.read_text() == "now a file"


def test_failed_write_leaves_a_part_file_never_a_torn_jsonl(tmp_path: Path) -> None:
    """B-170: a reader never sees a half-written `.jsonl`: when a write fails part-way
    (a full disk: here the file-size limit the writer process inherits), the file keeps
    its `.part` name; the batch is counted as dropped."""
    probe = writer(tmp_path / "probe")
    probe.start()
    probe.submit([event()])
    probe.close()
    [line] = (tmp_path / "probe").glob("*.jsonl")
    size = len(line.read_bytes())  # every line below has this length (same digits)
    directory = tmp_path / "events"
    w = writer(directory)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 * size + 10, hard))
    try:
        w.start()  # the writer process inherits the limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    w.submit([event()])
    w.submit([event(), event()])
    w.close()
    assert not list(directory.glob("*.jsonl"))
    [part] = directory.glob("*.jsonl.part")
    content = part.read_text()
    assert content.count("\n") == 2  # batch 1, half of batch 2: a torn last line
    assert not content.endswith("\n")
    assert w.dropped_total == 2


def test_writer_survives_a_batch_it_cannot_format(tmp_path: Path) -> None:
    """A bug (here a non-integer ts) costs that batch, counted as dropped; the writer
    thread goes on with the next one."""
    w = writer(tmp_path)
    w.start()
    good = event()
    # built by hand: the compiled LifecycleEvent refuses a str ts at construction
    bad = (good[0], "not-an-int", *good[2:])
    w.submit([bad, event()])
    w.submit([event()])
    w.close()
    assert [r["seq"] for r in records(tmp_path)] == [3]
    assert w.dropped_total == 2


def test_close_gives_up_on_a_stuck_writer_within_its_timeout(tmp_path: Path) -> None:
    """close(timeout) returns even if the writer is stuck (a hung file system); the
    writer finishes on its own, and only then renames its file."""
    w = writer(tmp_path)
    w.start()
    with stopped(w):
        w.submit([event()])
        w.submit([event()])
        started = time.monotonic()
        w.close(timeout=0.05)
        assert time.monotonic() - started < 2
        assert not list(tmp_path.glob("*.jsonl"))
    assert process(w).wait(FINISH_SECONDS) == 0
    assert [r["seq"] for r in records(tmp_path)] == [1, 2]


# -- the hand-off to the writer process ------------------------------------------------------


class ManualTimer:
    """`schedule(seconds, callback)` that fires only when the test says so."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def __call__(self, seconds: float, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def fire(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


def test_events_collect_until_the_timer_and_close_writes_the_rest(tmp_path: Path) -> None:
    """With a loop timer, submits collect into one frame that goes out when the timer
    fires; close() sends what is still collected: a clean stop loses nothing."""
    timer = ManualTimer()
    w = writer(tmp_path)
    w.start(schedule=timer)
    w.submit([event("sent")])
    w.submit([event("enqueued")])
    assert len(timer.callbacks) == 1  # one timer for the frame being collected
    timer.fire()
    wait_for_writer(lambda: w.written_total == 2, message="the first frame")
    w.submit([event("dispatched"), event("acked")])
    w.close()  # the timer never fired for these
    timer.fire()  # a late timer after close does nothing
    assert [(r["seq"], r["event"]) for r in records(tmp_path)] == [
        (1, "sent"),
        (2, "enqueued"),
        (3, "dispatched"),
        (4, "acked"),
    ]
    assert w.dropped_total == 0


def test_seal_then_close_on_another_thread_writes_what_came_before_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    """The server's stop: seal() on the loop thread frames what is collected; events the
    loop submits later are numbered and counted as dropped (a seq gap, never a silent
    loss) while close() on another thread writes the rest and waits for the writer."""
    timer = ManualTimer()
    w = writer(tmp_path)
    w.start(schedule=timer)
    w.submit([event("sent"), event("enqueued")])
    w.seal()
    closer = threading.Thread(target=w.close)
    closer.start()
    for _ in range(50):  # the loop goes on submitting while close() runs
        w.submit([event("acked")])
    closer.join(10)
    assert not closer.is_alive()
    assert [(r["seq"], r["event"]) for r in records(tmp_path)] == [(1, "sent"), (2, "enqueued")]
    assert w.dropped_total == 50
    assert w.written_total == 2


def test_values_of_str_and_int_subclasses_are_written_as_plain_values(tmp_path: Path) -> None:
    """AMQP symbols and typed ints (str/int subclasses, which marshal refuses) in an
    event are written as the plain string or number."""
    w = writer(tmp_path)
    w.start()
    w.submit(
        [
            event(
                "dead-lettered",
                error_condition=sections.Symbol("app:poison"),
                delivery_count=sections.UInt(3),
            )
        ]
    )
    w.close()
    [record] = records(tmp_path)
    assert (record["error_condition"], record["delivery_count"]) == ("app:poison", 3)


def test_a_dead_writer_process_costs_events_never_the_broker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """B-170: if the writer process dies, submit never raises; what it had not written
    and everything later is counted as dropped, and the death is logged."""
    w = writer(tmp_path)
    w.start()
    w.submit([event()])
    wait_for_writer(lambda: w.written_total == 1, message="the first event")
    process(w).kill()
    process(w).wait(FINISH_SECONDS)
    for _ in range(3):
        w.submit([event()])
    w.close()
    assert w.dropped_total == 3
    assert "writer process" in caplog.text


def test_the_writer_process_finishes_the_log_when_the_broker_dies(tmp_path: Path) -> None:
    """B-170: a broker killed without close(): the writer process sees end of input,
    writes what reached it and finishes its file (gzipped: the default, issue 17), so
    nothing is left `.part`."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from amqpbroker.config import EventLogConfig
        from amqpbroker.core import LifecycleEvent
        from amqpbroker.eventlog import EventLogWriter
        w = EventLogWriter(Path({str(tmp_path)!r}), broker_name="b1", config=EventLogConfig())
        w.start()
        w.submit([LifecycleEvent(ts=1, event="sent", msg_id=1, address="a").raw()])
        print(w._process.pid, flush=True)
        os._exit(0)  # no close(): as if the broker were killed
        """
    )
    broker = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    pid = int(broker.stdout)
    [done] = wait_for_writer(
        lambda: list(tmp_path.glob("*.jsonl.gz")),
        message="the finished file",
    )
    wait_for_writer(
        lambda: not Path(f"/proc/{pid}").exists(),
        message="the writer's exit",
    )
    assert [r["event"] for r in read_events(tmp_path)] == ["sent"]
    assert not list(tmp_path.glob("*.part"))
    assert done.exists()


def test_readable_events_round_trip_through_the_recorded_tuple() -> None:
    """`LifecycleEvent` is the readable form of what the core records (`RawEvent`)."""
    full = LifecycleEvent(
        ts=5,
        event="dead-lettered",
        msg_id=1,
        address="orders",
        queue="orders",
        routing_type="ANYCAST",
        durable=True,
        size=9,
        delivery_count=2,
        connection="app",
        link="w",
        txn="0a",
        reason="rejected",
        target_address="DLA",
        target_queues=("DLQ.orders",),
        copy_msg_id=2,
        delay_ms=0,
        first_ts=4,
        error_condition="app:x",
        error_description="why",
        amqp_message_id="m",
        data=b"\x00",
    )
    bare = LifecycleEvent(ts=5, event="acked", msg_id=1, address="orders")
    assert LifecycleEvent.of(full.raw()) == full
    assert LifecycleEvent.of(bare.raw()) == bare
    assert bare.raw()[-1] is None  # no rare fields: no extra tuple
    emitter = Emitter()
    emitter.events.append(full.raw())
    assert emitter.take() == [full]
    assert emitter.take_raw() == []


@pytest.mark.parametrize(
    "message_id",
    ["order-1", "é" * 3, "x" * 300, uuid.UUID(int=7), ulong(5), 5, b"bin", None],
    ids=["str8", "utf8", "str32", "uuid", "ulong", "int", "binary", "none"],
)
@pytest.mark.parametrize("annotated", [False, True], ids=["plain", "annotated"])
def test_amqp_message_id_is_the_string_form_of_any_message_id(
    tmp_path: Path, message_id: object, annotated: bool
) -> None:
    """B-170: amqp_message_id is str(properties.message-id) as the section decoder gives
    it, whatever its AMQP type and whatever sections come before the properties."""
    annotations = {"x-opt-a": "b" * 300} if annotated else None
    data = encoded(id=message_id, body=b"x", durable=True, annotations=annotations)
    value = sections.READER.properties(data).get("message-id")
    w = writer(tmp_path)
    w.start()
    w.submit([event(data=data)])
    w.close()
    [record] = records(tmp_path)
    assert record["amqp_message_id"] == (None if value is None else str(value))
    if isinstance(message_id, int):
        assert record["amqp_message_id"] == "5"  # the number, not "ULong(5)"


def test_the_writer_process_module_loads_no_broker_code() -> None:
    """Issue 18: the writer process is started as a module (`python -m
    amqpbroker.eventlog.child`, no `-c` program) and loads only the codec, the frame format
    and the retention decision (and, in the compiled build, its own C line writer
    `_lines`), not the core or the config: it starts fast and small."""
    code = (
        "import sys\n"
        "sys.argv = ['child', '{}']\n"
        "import amqpbroker.eventlog.child\n"
        "print(sorted(m for m in sys.modules if m.startswith('amqpbroker')))\n"
    )
    env = writer_module._child_env()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    loaded = set(ast.literal_eval(out.stdout))
    assert "amqpbroker.eventlog.child" in loaded
    assert loaded <= {
        "amqpbroker",
        "amqpbroker.amqp",  # the codec: read lazily, for props and message ids
        "amqpbroker.amqp.sections",
        "amqpbroker.eventlog",
        "amqpbroker.eventlog._lines",  # the compiled build's line writer (`child._c`)
        "amqpbroker.eventlog.child",
        "amqpbroker.eventlog.frames",
        "amqpbroker.eventlog.retention",
    }, loaded
    assert child.__name__ == writer_module.CHILD_MODULE


def test_events_carry_the_time_of_their_call_into_the_broker() -> None:
    """B-170 `ts` (epoch ms, as the schema says) comes from the broker's one clock, read
    once per call into the broker (issue 18: no second time source for events); a later
    call's events carry its later time."""
    h = Harness()
    h.clock.advance(123)
    target = h.producer("q", "queue")
    h.send(target)
    sent, enqueued = h.broker.emitter.take()
    assert sent.ts == enqueued.ts == h.clock.now_ms() == 1_700_000_000_123
    c = h.consumer("q", "queue")
    [d] = h.take(c)
    h.clock.advance(5)
    h.settle(c, d, Accepted())
    dispatched, acked = h.broker.emitter.take()
    assert (dispatched.ts, acked.ts) == (1_700_000_000_123, 1_700_000_000_128)


def test_sent_events_share_a_shape_per_address_and_producer_container() -> None:
    """Cost (B-171): `sent`, one a message, reuses the shape of its address and producer
    container (marshal writes it once a frame); another container gets its own, and the
    readable event still names each one's connection."""
    from amqpbroker.protocol import message_of

    h = Harness()
    target = h.producer("q", "queue")
    for container in ("c-1", "c-1", "c-2"):
        message = message_of(sections.scan(encoded(body=b"x")), origin_container=container)
        h.broker.publish(message, target)
    sent = [e for e in h.broker.emitter.take_raw() if e[0][0] == "sent"]
    assert sent[0][0] is sent[1][0]
    assert sent[2][0] is not sent[0][0]
    readable = [LifecycleEvent.of(e) for e in sent]
    assert [(e.address, e.connection, e.target_queues) for e in readable] == [
        ("q", "c-1", ("q",)),
        ("q", "c-1", ("q",)),
        ("q", "c-2", ("q",)),
    ]


def test_events_carry_only_the_head_of_a_message_up_to_its_properties(tmp_path: Path) -> None:
    """Cost: without props or body_hash an event carries the message only up to the end of
    its properties section (`Message.head_end`, found by the scan at arrival); the writer
    still gets amqp_message_id from it, and a message without properties gets null."""
    from amqpbroker.protocol import message_of

    with_id = message_of(sections.scan(encoded(id="m-1", body=b"x" * 500, durable=True)))
    without = message_of(sections.scan(encoded(body=b"y" * 500, durable=True)))
    assert 0 < with_id.head_end < 100
    assert 0 < without.head_end < 100
    w = writer(tmp_path, body_hash=False)
    assert w.heads_only
    assert not writer(tmp_path, properties=("a",)).heads_only
    h = Harness()
    h.broker.emitter.heads_only = w.heads_only
    target = h.producer("q", "queue")
    for message in (with_id, without):
        h.broker.publish(message, target)
    events = h.broker.emitter.take_raw()
    readable = [LifecycleEvent.of(e) for e in events]
    assert [e.event for e in readable] == ["sent", "enqueued", "sent", "enqueued"]
    assert {e.data for e in readable[:2]} == {with_id.data[: with_id.head_end]}
    assert {e.data for e in readable[2:]} == {without.data[: without.head_end]}
    # one part per message, shared by its events: marshal writes it once per frame
    assert events[0][2] is events[1][2]
    assert events[2][2] is events[3][2]
    # ... and not kept while the message waits in the queue (memory of a deep queue)
    assert with_id.event_part is None
    assert without.event_part is None
    w.start()
    w.submit(events)
    w.close()
    ids = [(r["event"], r["amqp_message_id"], r["size"]) for r in records(tmp_path)]
    assert ids == [
        ("sent", "m-1", with_id.size),
        ("enqueued", "m-1", with_id.size),
        ("sent", None, without.size),
        ("enqueued", None, without.size),
    ]


def test_events_of_a_message_whose_expiry_the_broker_rewrote_carry_the_new_head(
    tmp_path: Path,
) -> None:
    """B-081/B-083: an expiry-delay override rewrites the message (absolute-expiry-time
    added to properties), which moves the end of its head; its events carry the new head
    (not a stale cut of the old bytes), and the writer still reads its message-id."""
    from amqpbroker.core import AddressSettings
    from amqpbroker.protocol import message_of
    from amqpbroker.protocol.moves import COPIER

    message = message_of(sections.scan(encoded(id="m-7", body=b"z" * 200, durable=True)))
    old_head = message.data[: message.head_end]
    h = Harness({"#": AddressSettings.of(expiry_delay=60_000)}, copier=COPIER)
    h.broker.emitter.heads_only = True
    h.broker.emitter.message_part(message)  # as if an event had been built before
    h.broker.publish(message, h.producer("q", "queue"))
    events = h.broker.emitter.take_raw()
    assert [LifecycleEvent.of(e).event for e in events] == ["sent", "enqueued"]
    head = LifecycleEvent.of(events[0]).data
    assert message.head_end == sections.scan(message.data).head_end()
    assert head == message.data[: message.head_end] != old_head
    assert sections.scan(message.data).absolute_expiry_time == message.expiration_ms > 0
    w = writer(tmp_path)
    w.start()
    w.submit(events)
    w.close()
    assert [r["amqp_message_id"] for r in records(tmp_path)] == ["m-7", "m-7"]


# -- the hand-off per loop turn (issue 20) ---------------------------------------------------


class ManualLoop(ManualTimer):
    """A loop whose turns the test ends: `soon(callback)` runs at `end_turn()`, as in the
    next loop iteration; as `schedule(seconds, callback)` it is a ManualTimer."""

    def __init__(self) -> None:
        super().__init__()
        self.soon_callbacks: list[Callable[[], None]] = []

    def soon(self, callback: Callable[[], None]) -> None:
        self.soon_callbacks.append(callback)

    def end_turn(self) -> None:
        callbacks, self.soon_callbacks = self.soon_callbacks, []
        for callback in callbacks:
            callback()


def varied_events() -> list[RawEvent]:
    """Every event type, common shapes and rare fields, messages with bytes (message-id,
    props, body hash) and without, a txn, target queues, a str subclass."""
    out: list[RawEvent] = []
    for i in range(60):
        data = encoded(id=f"m-{i}", body=b"b" * (i * 37), properties={"tenant": f"t{i % 3}"})
        common = {"msg_id": i, "data": data, "size": len(data), "first_ts": 1000 + i}
        out.append(event("sent", target_queues=("q1",), connection="p", **common))
        out.append(event("enqueued", queue="q1", routing_type="ANYCAST", reason="route", **common))
        out.append(event("dispatched", queue="q1", connection="c", link="l", **common))
        if i % 7 == 3:
            out.append(
                event(
                    "dead-lettered",
                    queue="q1",
                    reason="rejected",
                    target_address="DLA",
                    copy_msg_id=10_000 + i,
                    error_condition=sections.Symbol("app:poison"),
                    error_description="x" * 600,
                    delivery_count=2,
                    **common,
                )
            )
        else:
            out.append(event("acked", queue="q1", reason="accepted", txn="ab" if i % 5 else None))
    for kind in sorted(EVENT_TYPES):
        out.append(event(kind, msg_id=99, delay_ms=5, target_queues=("a", "b")))
    return out


def file_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.jsonl")))


def test_a_batch_per_loop_turn_writes_the_same_lines_as_one_frame_per_event(
    tmp_path: Path,
) -> None:
    """B-170, issue 20: events handed over as one frame per loop turn (several submits a
    turn, turns of every size, frames split at the cap) make a file byte-identical to
    the one written when every event is its own frame, seq 1.. without a gap."""
    events = varied_events()
    config: dict[str, Any] = {"properties": ["tenant"], "body_hash": True}
    one = writer(tmp_path / "one", queue_events=1 << 20, **config)
    one.start()  # no loop: a frame per submit
    for e in events:
        one.submit([e])
    one.close()
    loop = ManualLoop()
    batched = writer(tmp_path / "batched", queue_events=1 << 20, **config)
    batched.start(schedule=loop, soon=loop.soon)
    rest = list(events)
    size = 1
    while rest:  # turns of 1, 2, 3, ... events, two submits a turn
        turn, rest = rest[:size], rest[size:]
        batched.submit(turn[: len(turn) // 2])
        batched.submit(turn[len(turn) // 2 :])
        assert len(loop.soon_callbacks) <= 1  # one end-of-turn flush, however many submits
        loop.end_turn()
        size += 1
    wait_for_writer(lambda: batched.written_total == len(events), message="every batch written")
    assert not loop.callbacks  # nothing waited for a timer
    batched.close()
    expected = file_bytes(tmp_path / "one")
    assert file_bytes(tmp_path / "batched") == expected
    assert [r["seq"] for r in records(tmp_path / "one")] == list(range(1, len(events) + 1))
    assert one.dropped_total == batched.dropped_total == 0


def test_a_long_turn_goes_out_in_capped_frames_and_partial_writes_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: a turn of more than FLUSH_EVENTS events is handed over in a frame as
    soon as FLUSH_EVENTS are collected, each written with one writev (header and
    payload, never copied together); a frame the pipe took only in part (here every
    writev takes at most 1000 bytes) is finished by the next writes. Nothing is lost,
    repeated or reordered."""
    calls: list[tuple[int, int]] = []  # (buffers, bytes asked) of every writev
    real_writev = os.writev

    def writev(fd: int, buffers: list[Any]) -> int:
        calls.append((len(buffers), sum(len(b) for b in buffers)))
        return real_writev(fd, [b"".join(bytes(b) for b in buffers)[:1000]])

    monkeypatch.setattr(os, "writev", writev)
    monkeypatch.setattr(writer_module, "FLUSH_EVENTS", 50)
    loop = ManualLoop()
    w = writer(tmp_path, queue_events=1 << 20)
    w.start(schedule=loop, soon=loop.soon)
    data = encoded(id="m", body=b"x" * 300)
    for i in range(100):  # one turn: a message's three events a submit
        w.submit([event(kind, msg_id=i, data=data) for kind in ("sent", "enqueued", "acked")])
        assert len(loop.soon_callbacks) <= 1
    loop.end_turn()
    w.close()
    assert [r["seq"] for r in records(tmp_path)] == list(range(1, 301))
    frames = [size for n, size in calls if n == 2]  # a new frame: its length and payload
    assert len(frames) == 6  # five of 17 messages' 51 events at once, the rest at the end
    assert any(n == 1 for n, _ in calls)  # what was left of a frame after a partial write
    assert w.dropped_total == 0


def test_a_killed_broker_loses_only_the_turn_it_was_in(tmp_path: Path) -> None:
    """B-170 durability with a frame per loop turn (issue 20): every event of a turn that
    ended reaches the writer process, which outlives a SIGKILLed broker and finishes the
    file; only the events of the turn the broker died in (not flushed yet) are lost,
    never an earlier one's (with the 10 ms timer, up to 10 ms of turns were)."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from amqpbroker.config import EventLogConfig
        from amqpbroker.core import LifecycleEvent
        from amqpbroker.eventlog import EventLogWriter
        soon = []
        w = EventLogWriter(Path({str(tmp_path)!r}), broker_name="b1", config=EventLogConfig())
        w.start(schedule=lambda seconds, callback: None, soon=soon.append)
        def turn(kinds):
            for kind in kinds:
                w.submit([LifecycleEvent(ts=1, event=kind, msg_id=1, address="a").raw()])
        turn(["sent", "enqueued"])
        soon.pop()()  # the end of the first turn
        turn(["dispatched"])
        soon.pop()()  # the end of the second
        turn(["acked"])  # the broker dies in the third
        print(w._process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    broker = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert broker.returncode == -signal.SIGKILL, broker.stderr
    pid = int(broker.stdout)
    wait_for_writer(
        lambda: list(tmp_path.glob("*.jsonl.gz")),
        message="the finished file",
    )
    wait_for_writer(
        lambda: not Path(f"/proc/{pid}").exists(),
        message="the writer's exit",
    )
    assert [(r["seq"], r["event"]) for r in read_events(tmp_path)] == [
        (1, "sent"),
        (2, "enqueued"),
        (3, "dispatched"),
    ]
    assert not list(tmp_path.glob("*.part"))


class CountingFile:
    """The writer process's open file, counting writes; with `room`, a disk that takes
    that many more bytes and then fails (ENOSPC)."""

    def __init__(self, file: Any, room: int | None = None) -> None:
        self.file = file
        self.room = room
        self.writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        if self.room is None:
            return int(self.file.write(data))
        if self.room <= 0:
            raise OSError(28, "No space left on device")
        taken = int(self.file.write(bytes(data[: self.room])))
        self.room -= taken
        return taken

    def close(self) -> None:
        self.file.close()


def child_writer(directory: Path) -> child.ChildWriter:
    config = {
        "directory": str(directory),
        "broker": "b1",
        "properties": [],
        "body_hash": False,
        "max_file_bytes": 1 << 20,
        "max_file_age": 60_000,
        "min_free_bytes": 0,
    }
    return child.ChildWriter(config, report=lambda: None)


def test_the_frames_of_one_read_are_written_with_one_write(tmp_path: Path) -> None:
    """Issue 20: the broker sends a frame per loop turn; the writer process writes the
    frames of one read with one write, the lines in seq order, each frame counted."""
    w = child_writer(tmp_path)
    w.write_frames([(1, 1, [event("sent")])])  # opens the file
    counting = w._file = CountingFile(w._file)
    w.write_frames([(2, 1, [event("enqueued")]), (3, 1, [event("dispatched"), event("acked")])])
    assert counting.writes == 1
    assert (w.written_total, w.dropped_total) == (4, 0)
    w._rotate()
    assert [(r["seq"], r["event"]) for r in records(tmp_path)] == [
        (1, "sent"),
        (2, "enqueued"),
        (3, "dispatched"),
        (4, "acked"),
    ]


def test_a_write_that_fails_part_way_counts_the_frames_it_took_as_written(
    tmp_path: Path,
) -> None:
    """B-170 counts (issue 20, frames written together): when the disk fills part-way
    through the write of several frames, the frames wholly written count as written, the
    torn one and the rest as dropped, and the file stays `.part`."""
    w = child_writer(tmp_path)
    w.write_frames([(1, 1, [event("sent")])])
    size = w._file_bytes  # every line below has this length (same digits)
    w._file = CountingFile(w._file, room=size + 10)
    w.write_frames([(2, 1, [event("sent")]), (3, 1, [event("sent")]), (4, 1, [event("sent")])])
    assert (w.written_total, w.dropped_total, w.failed) == (2, 2, True)
    w._rotate()
    [part] = tmp_path.glob("*.jsonl.part")
    assert part.read_text().count("\n") == 2  # seq 1 and 2, then a torn line


def test_one_submit_of_more_than_the_hand_off_holds_is_framed_in_capped_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B-170, issue 20 (a frame per loop turn), attacked: one call that records more
    events than `queue_events` (a management purge of 300,000 messages) went out as one
    frame, which the bound dropped whole: every event lost with an idle writer process,
    and a frame of any size marshalled first. Now a frame holds at most FLUSH_EVENTS:
    what the hand-off holds is written, only the rest is dropped (and counted)."""
    monkeypatch.setattr(writer_module, "FLUSH_EVENTS", 50)
    w = writer(tmp_path, queue_events=150)
    w.start()
    w.submit([event(msg_id=i) for i in range(200)])
    w.close()
    written = [r["seq"] for r in records(tmp_path)]
    assert written[:150] == list(range(1, 151))
    assert len(written) + w.dropped_total == 200


def test_a_key_file_torn_by_a_kill_is_replaced(tmp_path: Path) -> None:
    """Crash pass (2026-11-29): a kill (or a full disk) between creating event-log.key and
    writing it left a 0-byte key, and every later start logged "too short" and wrote no
    body_hash, for ever. A key that short was never used for a hash: a new one is made
    (written aside and moved in, so no later kill can tear it)."""
    data_dir = tmp_path / "data"
    events = data_dir / "events"
    events.mkdir(parents=True)
    (data_dir / BODY_KEY_FILE).write_bytes(b"")
    w = writer(events)
    w.start()
    w.submit([event(msg_id=1, data=encoded(body=b"x"))])
    w.close()
    (first,) = records(events)
    assert first["body_hash"] is not None
    assert len((data_dir / BODY_KEY_FILE).read_bytes()) == 32
    assert [p.name for p in data_dir.iterdir() if p.is_file()] == [BODY_KEY_FILE]


def test_a_key_that_cannot_be_written_leaves_no_key_and_no_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash pass (2026-11-29): ENOSPC while writing a new key killed the event-log child
    with a traceback (only the open was guarded) and left a 0-byte key behind. Now: an
    error, no body_hash, and no key file, so the next start makes one."""
    from amqpbroker.eventlog.child import ChildWriter

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    child = ChildWriter.__new__(ChildWriter)
    child.logs = []
    path = tmp_path / BODY_KEY_FILE
    assert child._body_key(path) is None
    assert "No space left" in child.logs[-1][1]
    assert list(tmp_path.iterdir()) == []


# -- a message's bytes cross once (issue 20) ----------------------------------------------


def known_after_first(events: list[RawEvent]) -> list[RawEvent]:
    """`events` as `Emitter.part` hands them over: a message's events after the first one
    with its bytes carry `KNOWN` instead."""
    seen: set[int] = set()
    out: list[RawEvent] = []
    for shape, ts, part, count, extra in events:
        if part[4] is not None:
            if part[0] in seen:
                part = (*part[:4], KNOWN)
            seen.add(part[0])
        out.append((shape, ts, part, count, extra))
    return out


def test_events_carrying_known_write_the_lines_of_events_carrying_the_bytes(
    tmp_path: Path,
) -> None:
    """B-170, issue 20: a message's later events carry `KNOWN`, not its bytes; the writer
    process writes exactly the lines (amqp_message_id, props, body_hash included) it
    writes when every event carries them, frame by frame or batched."""
    events = varied_events()
    light = known_after_first(events)
    assert sum(1 for e in light if e[2][4] is KNOWN) > 100
    config: dict[str, Any] = {"properties": ["tenant"], "body_hash": True}
    full = writer(tmp_path / "full", queue_events=1 << 20, **config)
    full.start()
    full.submit(list(events))
    full.close(timeout=60)  # a loaded machine starts the writer process slowly
    framed = writer(tmp_path / "framed", queue_events=1 << 20, **config)
    framed.start()  # no loop: a frame per submit, so most KNOWN parts are in later frames
    for e in light:
        framed.submit([e])
    framed.close(timeout=60)
    expected = file_bytes(tmp_path / "full")
    assert b'"body_hash":"' in expected
    assert b'"props":{"tenant"' in expected
    assert file_bytes(tmp_path / "framed") == expected
    assert framed.dropped_total == 0


def message_with_id(msg_id: int) -> tuple[int, bytes]:
    return msg_id, encoded(id=f"m-{msg_id}", body=b"x")


def test_the_writer_process_remembers_a_message_for_known_window_events(
    tmp_path: Path,
) -> None:
    """Issue 20: what a message's bytes say is kept at least KNOWN_WINDOW events after the
    last event that carried them (two generations), bytes arriving again renew it, and a
    frame dropped for low disk space still teaches them; a `KNOWN` part of a message
    long forgotten gets null fields and one warning, never a lost line."""
    window = frames.KNOWN_WINDOW
    w = child_writer(tmp_path)
    msg_id, data = message_with_id(1)
    renewed_id, renewed = message_with_id(2)
    dropped_id, dropped = message_with_id(3)

    def ev(seq_msg: int, data: bytes | int) -> RawEvent:
        # `KNOWN` is no `LifecycleEvent.data` (bytes or None, checked in the compiled
        # build): put it in the part as `Emitter.part` does
        shape, ts, part, count, extra = event("acked", msg_id=seq_msg, size=10)
        return shape, ts, (*part[:4], data), count, extra

    w.write_frames([(1, 1, [ev(msg_id, data), ev(renewed_id, renewed)])])
    w._space_ok = lambda: False  # type: ignore[method-assign]
    w.write_frames([(3, 1, [ev(dropped_id, dropped)])])
    del w._space_ok
    w.write_frames([(window, 1, [ev(msg_id, KNOWN), ev(dropped_id, KNOWN)])])  # still known
    w.write_frames([(window + 2, 1, [ev(renewed_id, renewed)])])  # a generation turns
    w._messages.clear()  # the line texts too, as when that cache fills
    w.write_frames([(2 * window + 2, 1, [ev(renewed_id, KNOWN), ev(msg_id, KNOWN)])])
    w._rotate()
    lines = [(r["seq"], r["msg_id"], r["amqp_message_id"]) for r in records(tmp_path)]
    assert lines == [
        (1, 1, "m-1"),
        (2, 2, "m-2"),
        (window, 1, "m-1"),  # 1 + window - 1: still known
        (window + 1, 3, "m-3"),  # from the dropped frame
        (window + 2, 2, "m-2"),
        (2 * window + 2, 2, "m-2"),  # renewed at window + 2
        (2 * window + 3, 1, None),  # last carried at seq 1: forgotten
    ]
    assert [text for _, text in w.logs if "not known" in text] == [
        "event log: message 1 not known; writing its events without amqp_message_id, "
        "props and body_hash"
    ]


def test_emitter_sends_a_message_s_bytes_once_while_the_writer_remembers_them() -> None:
    """Issue 20: within a hand-off a message's events share one part (its bytes); later
    ones carry `KNOWN` until `known_window` events after the bytes went, then the bytes
    again; a frame dropped in the broker (`forget_sent`) sends them again; without a
    writer process that remembers (`known_window` 0) every event carries them."""
    data = encoded(id="m-1", body=b"x")
    message = Message(data, msg_id=1, first_ts=5)
    emitter = Emitter()
    emitter.known_window = 10

    def record(message: Message) -> Any:
        """Record an event of `message` as `Queue.note` does; its part."""
        part = emitter.part(message)
        emitter.events.append((("acked", (None, None, None), None, None), 1, part, None, None))
        return part

    first = record(message)
    assert first == (1, False, message.size, 5, data)
    assert record(message) is first  # the same hand-off: the same tuple
    emitter.take_raw()
    later = record(message)
    assert later == (1, False, message.size, 5, KNOWN)
    emitter.take_raw()
    emitter.events.extend([event()] * 7)  # the bytes went with number 0; this is number 10
    again = record(message)
    assert again == first  # the window is over: the bytes again
    assert record(message) is again
    emitter.take_raw()
    assert record(message)[4] is KNOWN
    emitter.forget_sent()
    assert record(message)[4] is data
    plain = Emitter()
    other = Message(data, msg_id=2)
    part = plain.part(other)
    plain.take_raw()
    plain.events.extend([event()] * 100)
    assert plain.part(other) is part


def test_a_frame_dropped_in_the_broker_makes_the_emitter_send_the_bytes_again(
    tmp_path: Path,
) -> None:
    """Issue 20: the server wires the writer's `on_drop` to `Emitter.forget_sent`; a frame
    dropped for the bound calls it (the writer process never saw those bytes)."""
    w = writer(tmp_path, queue_events=2)
    calls: list[int] = []
    w.on_drop = lambda: calls.append(1)
    w.start()
    with stopped(w):
        w.submit([event(), event(), event()])  # over the bound of 2: dropped
    w.close()
    assert calls == [1]
    assert w.dropped_total == 3


def test_the_fast_lines_are_the_generic_lines_byte_for_byte(tmp_path: Path) -> None:
    """Issue 20: `_format`'s common line (cached texts; a frame's shape texts found by
    `id(shape)`, `{ts}` without a format spec) must be the bytes `_line`, the one generic
    B-170 template, writes: for shared shape tuples, an equal shape in another tuple, a
    `sent` with target queues (its extra shared, as `Queue.event_routed` is, also with
    another shape and another extra), two frames reusing a shape, a redelivery count, a
    consumer's `returned` (its extra only a delay: shared at 0, or its own)."""
    from amqpbroker.eventlog.child import ChildWriter

    config = {
        "directory": str(tmp_path / "events"),
        "broker": "b1",
        "properties": [],
        "body_hash": "keyed",
        "body_key_file": str(tmp_path / "key"),
        "max_file_bytes": 1 << 20,
        "max_file_age": 60_000,
        "min_free_bytes": None,
    }
    fast = ChildWriter(config, report=lambda: None)
    generic = ChildWriter(config, report=lambda: None)
    sent = event("sent", target_queues=("q1", "q2"), connection="c1", link="l1")
    other_sent = event("sent", target_queues=("q3",), connection="c2", link="l9")
    enqueued = event("enqueued", queue="q1", routing_type="ANYCAST", reason="route")
    dispatched = event("dispatched", queue="q1", routing_type="ANYCAST", link="l2")
    shape_twin = tuple(list(dispatched[0]))  # equal to dispatched's shape, another tuple
    returned = event("returned", queue="q1", link="l2", reason="modified-failed", delay_ms=0)
    later = event("returned", queue="q1", link="l2", reason="released", delay_ms=250)
    frames: list[list[RawEvent]] = [[], []]
    for msg_id in range(1, 7):
        data = encoded(body=b"x" * msg_id, id=f"m{msg_id}")
        part = (msg_id, msg_id % 2 == 0, len(data), 1_700_000_000_000 + msg_id, data)
        frame = frames[msg_id // 4]
        frame.append((sent[0], 10 + msg_id, part, None, sent[4]))
        if msg_id % 2:  # the same extra with another producer's shape, and another extra
            frame.append((other_sent[0], 10 + msg_id, part, None, sent[4]))
            frame.append((sent[0], 10 + msg_id, part, None, other_sent[4]))
        frame.append((enqueued[0], 11 + msg_id, part, None, None))
        shape = shape_twin if msg_id == 5 else dispatched[0]
        frame.append((shape, 12 + msg_id, part, msg_id % 3, None))
        back = returned if msg_id % 2 else later
        frame.append((back[0], 13 + msg_id, (*part[:4], 0), 1, back[4]))
    seq = 1
    for frame in frames:
        lines = fast._format(seq, frame).encode()
        expected = "".join(
            generic._line(s, shape, ts, part, count, extra)
            for s, (shape, ts, part, count, extra) in enumerate(frame, seq)
        ).encode()
        assert lines == expected
        seq += len(frame)
