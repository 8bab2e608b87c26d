"""The lifecycle event-log writer (B-170): fields, order, seq, drops, rotation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from proton import Message as ProtonMessage

from amqpbroker.config import EventLogConfig
from amqpbroker.core import LifecycleEvent, Message
from amqpbroker.core.lifecycle import EVENT_FIELDS
from amqpbroker.eventlog import EventLogWriter
from amqpbroker.protocol import sections


def event(kind: str = "acked", **kw: object) -> LifecycleEvent:
    return LifecycleEvent(
        ts=1,
        event=kind,
        msg_id=7,
        address="a",
        queue="q",  # type: ignore[arg-type]
        **kw,
    )


def lines(directory: Path, pattern: str = "*.jsonl") -> list[dict[str, object]]:
    out = []
    for path in sorted(directory.glob(pattern)):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def writer(tmp_path: Path, **config: object) -> EventLogWriter:
    return EventLogWriter(
        tmp_path,
        broker_name="b1",
        config=EventLogConfig(**config),  # type: ignore[arg-type]
        body_section=lambda d: d[sections.scan(d).body_start :],
    )


def test_every_field_in_order_with_nulls(tmp_path: Path) -> None:
    """B-170: exactly the fields, in the table order; a field that does not apply is null."""
    w = writer(tmp_path)
    w.start()
    w.submit([event(reason="accepted")])
    w.close()
    [record] = lines(tmp_path)
    assert list(record) == list(EVENT_FIELDS)
    assert record["seq"] == 1
    assert record["broker"] == "b1"
    assert record["txn"] is None
    assert record["props"] is None


def test_seq_increases_and_gaps_show_drops(tmp_path: Path) -> None:
    """B-170: a full queue drops and counts; seq keeps counting so the gap is visible."""
    w = writer(tmp_path)
    w._queue.maxsize = 1  # the writer is not started: the queue fills
    w.submit([event()])
    w.submit([event(), event()])  # dropped
    assert w.dropped_total == 2
    w.start()
    w.submit([event()])
    w.close()
    assert [r["seq"] for r in lines(tmp_path)] == [1, 4]


def test_part_file_is_renamed_on_close(tmp_path: Path) -> None:
    """B-170: `.jsonl.part` while written, `.jsonl` after rotation or shutdown."""
    w = writer(tmp_path)
    w.start()
    w.submit([event()])
    w.close()
    w.close()  # idempotent
    assert not list(tmp_path.glob("*.part"))
    assert len(list(tmp_path.glob("events-*.jsonl"))) == 1


def test_rotation_by_size_and_by_age(tmp_path: Path) -> None:
    now = [0]
    w = EventLogWriter(
        tmp_path / "size",
        broker_name="b",
        clock_ms=lambda: now[0],
        config=EventLogConfig(max_file_bytes=10),
    )
    w.start()
    for _ in range(3):
        w.submit([event()])
    w.close()
    assert len(list((tmp_path / "size").glob("*.jsonl"))) == 3
    batch_times = iter([0, 500, 1500])  # the writer reads the clock once per batch
    w = EventLogWriter(
        tmp_path / "age",
        broker_name="b",
        clock_ms=lambda: next(batch_times),
        config=EventLogConfig(max_file_age=1000),
    )
    w.start()
    for _ in range(3):
        w.submit([event()])
    w.close()
    files = sorted((tmp_path / "age").glob("*.jsonl"))
    assert [len(f.read_text().splitlines()) for f in files] == [2, 1]


def test_props_allow_list_and_body_hash(tmp_path: Path) -> None:
    """B-170: only allow-listed application properties, as strings; first 16 hex of the
    SHA-256 of the encoded body sections; amqp_message_id from the message."""
    raw = ProtonMessage(
        id="m-1", body=b"secret", properties={"tenant": 42, "pii": "x"}, inferred=True
    ).encode()
    scanned = sections.scan(bytes(raw))
    message = Message(scanned.data, reader=sections.READER)
    w = writer(tmp_path, properties=("tenant",), body_hash=True)
    w.start()
    w.submit([event(message=message)])
    w.close()
    [record] = lines(tmp_path)
    assert record["props"] == {"tenant": "42"}
    body = scanned.data[scanned.body_start :]
    assert record["body_hash"] == hashlib.sha256(body).hexdigest()[:16]
    assert record["amqp_message_id"] == "m-1"


def test_write_error_drops_without_raising(tmp_path: Path) -> None:
    """An unwritable directory: submit never raises; events are counted as dropped."""
    target = tmp_path / "file-not-dir"
    target.write_text("x")
    w = EventLogWriter(target / "events", broker_name="b", config=EventLogConfig())
    w._thread.start()  # skip mkdir in start(): the directory cannot be created
    w.submit([event(), event()])
    w.close()
    assert w.dropped_total == 2
