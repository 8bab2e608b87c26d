"""The lifecycle event-log writer (B-170, B-171): fields, order, seq, drops, levels,
rotation, `.part` files, props and body hash, errors.

The writer thread is real; waits are bounded (`threading.Event`, `join`, `wait_until`).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
from proton import Message as ProtonMessage
from support.waiting import wait_until

from amqpbroker.config import EventLogConfig
from amqpbroker.core import FAILURE_EVENTS, LifecycleEvent, Message
from amqpbroker.core.lifecycle import EVENT_FIELDS, EVENT_TYPES
from amqpbroker.eventlog import EventLogWriter
from amqpbroker.protocol import sections


def event(kind: str = "acked", **kw: Any) -> LifecycleEvent:
    fields: dict[str, Any] = {"ts": 1, "event": kind, "msg_id": 7, "address": "a"}
    fields.update(kw)
    return LifecycleEvent(**fields)


def body_section(data: bytes) -> bytes:
    return data[sections.scan(data).body_start :]


class FakeClock:
    """Epoch ms that a test sets; the writer reads it from its own thread."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def writer(
    directory: Path, *, clock: FakeClock | None = None, queue_batches: int = 1024, **config: Any
) -> EventLogWriter:
    return EventLogWriter(
        directory,
        broker_name="b1",
        config=EventLogConfig(**config),
        body_section=body_section,
        clock_ms=clock or FakeClock(1_700_000_000_000),
        queue_batches=queue_batches,
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
    w = writer(tmp_path, queue_batches=1)
    w.submit([event()])
    w.submit([event(), event()])  # the queue holds one batch: dropped
    assert w.dropped_total == 2
    w.start()
    wait_until(lambda: w.written_total == 1, message="the queue drained")
    w.submit([event()])
    w.close()
    w.submit([event()])  # after close: dropped, still numbered
    assert [r["seq"] for r in records(tmp_path)] == [1, 4]
    assert w.dropped_total == 3


def test_busy_writer_never_blocks_submit_and_the_gap_shows(tmp_path: Path) -> None:
    """B-170: the broker never blocks on the log; a writer stuck on one batch makes later
    batches drop once the queue is full."""
    entered, release = threading.Event(), threading.Event()

    def slow_body(data: bytes) -> bytes:
        entered.set()
        assert release.wait(5)
        return body_section(data)

    message = Message(encoded(body=b"x"), reader=sections.READER)
    w = EventLogWriter(
        tmp_path,
        broker_name="b1",
        config=EventLogConfig(body_hash=True),
        body_section=slow_body,
        queue_batches=1,
    )
    w.start()
    w.submit([event(message=message)])  # seq 1: the writer takes it and blocks
    assert entered.wait(5)
    started = time.monotonic()
    w.submit([event(message=message)])  # seq 2: queued
    w.submit([event(message=message), event(message=message)])  # seq 3, 4: dropped
    assert time.monotonic() - started < 1
    assert w.dropped_total == 2
    release.set()
    wait_until(lambda: w.written_total == 2, message="the queue drained")
    w.submit([event(message=message)])  # seq 5
    w.close()
    assert [r["seq"] for r in records(tmp_path)] == [1, 2, 5]
    assert w.dropped_total == 2


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
    wait_until(lambda: part.exists() and line_count(part) == 2, message="2 flushed lines")
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
    """B-170: a file older than max-file-age (by the injected clock) is renamed before
    the next event is written."""
    clock = FakeClock(0)
    w = writer(tmp_path, clock=clock, max_file_age=1000)
    w.start()
    w.submit([event()])
    wait_until(lambda: [line_count(p) for p in tmp_path.glob("*.part")] == [1])
    clock.now = 999
    w.submit([event()])
    wait_until(lambda: [line_count(p) for p in tmp_path.glob("*.part")] == [2])
    clock.now = 1000
    w.submit([event()])
    w.close()
    assert [line_count(f) for f in sorted(tmp_path.glob("*.jsonl"))] == [2, 1]


def test_rotation_by_age_while_no_events_arrive(tmp_path: Path) -> None:
    """B-170: an idle broker's last file still becomes `.jsonl` once it is max-file-age
    old, without waiting for another event or shutdown."""
    clock = FakeClock(0)
    w = writer(tmp_path, clock=clock, max_file_age=50)
    w.start()
    w.submit([event()])
    wait_until(lambda: [line_count(p) for p in tmp_path.glob("*.part")] == [1])
    clock.now = 50
    [done] = wait_until(lambda: list(tmp_path.glob("*.jsonl")), message="the idle rotation")
    assert not list(tmp_path.glob("*.part"))
    assert line_count(done) == 1
    w.close()
    assert list(tmp_path.iterdir()) == [done]


# -- props and body_hash ---------------------------------------------------------------------


def test_props_are_the_allow_listed_values_as_strings(tmp_path: Path) -> None:
    """B-170: props holds only the allow-listed application-properties that are present,
    as strings; amqp_message_id is the string form of properties.message-id."""
    tagged = Message(
        encoded(id="m-1", body=b"x", properties={"tenant": 42, "region": "eu", "pii": "x"}),
        reader=sections.READER,
    )
    untagged = Message(encoded(body=b"y"), reader=sections.READER)
    w = writer(tmp_path, properties=("tenant", "region", "absent"))
    w.start()
    w.submit([event(message=tagged), event(message=untagged), event()])
    w.close()
    first, second, third = records(tmp_path)
    assert first["props"] == {"tenant": "42", "region": "eu"}
    assert first["amqp_message_id"] == "m-1"
    assert first["body_hash"] is None  # body-hash is off by default
    assert second["props"] == {}
    assert second["amqp_message_id"] is None
    assert third["props"] is None  # no message to read


def test_props_and_body_hash_are_off_by_default(tmp_path: Path) -> None:
    """B-170: the allow-list is empty and body-hash false by default: both null."""
    message = Message(encoded(body=b"x", properties={"a": 1}), reader=sections.READER)
    w = writer(tmp_path)
    w.start()
    w.submit([event(message=message)])
    w.close()
    [record] = records(tmp_path)
    assert (record["props"], record["body_hash"]) == (None, None)


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
    w.submit(
        [
            event(message=Message(data, reader=sections.READER)),
            event(message=Message(same_body, reader=sections.READER)),
        ]
    )
    w.close()
    first, second = records(tmp_path)
    assert first["body_hash"] == hashlib.sha256(body).hexdigest()[:16]
    assert second["body_hash"] == first["body_hash"]
    assert b"secret".hex() not in json.dumps(first)


def test_body_hash_needs_a_body_section_function(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="body_section"):
        EventLogWriter(tmp_path, broker_name="b", config=EventLogConfig(body_hash=True))


def test_undecodable_message_still_gets_its_events(tmp_path: Path) -> None:
    """B-170: a message whose properties the decoder rejects is still logged, with
    amqp_message_id and props null; the next message is unaffected."""

    class BrokenReader:
        def properties(self, data: bytes) -> dict[str, Any]:
            raise sections.SectionError("bad map")

        def application_properties(self, data: bytes) -> dict[str, Any]:
            raise sections.SectionError("bad map")

        def message_annotations(self, data: bytes) -> dict[str, Any]:
            raise sections.SectionError("bad map")

    broken = Message(encoded(body=b"x"), reader=BrokenReader())
    fine = Message(encoded(id="ok", body=b"x", properties={"t": "a"}), reader=sections.READER)
    w = writer(tmp_path, properties=("t",), body_hash=True)
    w.start()
    w.submit([event(message=broken), event(message=fine)])
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
    wait_until(lambda: w.dropped_total == 2, message="the failed batch counted")
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
    wait_until(lambda: list(directory.glob("*.part")), message="the first file")
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
    (a full disk), the file keeps its `.part` name; the batch is counted as dropped."""

    class FullDisk(io.StringIO):
        def __init__(self, real: IO[str]) -> None:
            super().__init__()
            self.real = real
            self.writes = 0

        def write(self, text: str) -> int:
            self.writes += 1
            if self.writes == 2:
                self.real.write(text[: len(text) // 2 + 10])  # 1.x lines of 2
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.real.write(text)

        def flush(self) -> None:
            self.real.flush()

        def close(self) -> None:
            self.real.close()
            super().close()

    class Writer(EventLogWriter):
        def _open(self, now_ms: int) -> None:
            super()._open(now_ms)
            assert self._file is not None
            self._file = FullDisk(self._file)

    w = Writer(tmp_path, broker_name="b1", config=EventLogConfig())
    w.start()
    w.submit([event()])
    w.submit([event(), event()])
    w.close()
    assert not list(tmp_path.glob("*.jsonl"))
    [part] = tmp_path.glob("*.jsonl.part")
    content = part.read_text()
    assert content.count("\n") == 2  # batch 1, half of batch 2: a torn last line
    assert not content.endswith("\n")
    assert w.dropped_total == 2


def test_writer_survives_a_batch_it_cannot_format(tmp_path: Path) -> None:
    """A bug (here a non-integer ts) costs that batch, counted as dropped; the writer
    thread goes on with the next one."""
    w = writer(tmp_path)
    w.start()
    w.submit([event(ts="not-an-int"), event()])
    w.submit([event()])
    w.close()
    assert [r["seq"] for r in records(tmp_path)] == [3]
    assert w.dropped_total == 2


def test_close_gives_up_on_a_stuck_writer_within_its_timeout(tmp_path: Path) -> None:
    """close(timeout) returns even if the writer is stuck (a hung file system) and the
    queue is full; the writer finishes on its own, and only then renames its file."""
    entered, release = threading.Event(), threading.Event()

    def stuck_body(data: bytes) -> bytes:
        entered.set()
        assert release.wait(5)
        return body_section(data)

    message = Message(encoded(body=b"x"), reader=sections.READER)
    w = EventLogWriter(
        tmp_path,
        broker_name="b1",
        config=EventLogConfig(body_hash=True),
        body_section=stuck_body,
        queue_batches=1,
    )
    w.start()
    w.submit([event(message=message)])  # the writer takes it and sticks
    assert entered.wait(5)
    w.submit([event()])  # fills the queue: close() cannot even queue its stop marker
    started = time.monotonic()
    w.close(timeout=0.05)
    assert time.monotonic() - started < 2
    assert not list(tmp_path.glob("*.jsonl"))
    release.set()
    w._thread.join(5)
    assert not w._thread.is_alive()
    assert [r["seq"] for r in records(tmp_path)] == [1, 2]
