"""The lifecycle event log of a scripted scenario, compared as data (B-170, B-171)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from proton import Message
from support.client import QUEUE, connect, settle_modified
from support.event_files import finished_files, read_events
from support.metrics import scrape
from support.process import start_broker
from support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_scripted_scenario_produces_exactly_these_events(tmp_path: Path) -> None:
    """send -> enqueued -> dispatched -> returned(modified-failed) -> dispatched ->
    dead-lettered(rejected) -> the copy enqueued on DLQ.orders; then the copy acked."""
    broker = start_broker(
        tmp_path,
        """
        event-log: {enabled: true, level: lifecycle, properties: [tenant]}
        address-settings:
          "#": {dead-letter-address: DLA, auto-create-dead-letter-resources: true}
        """,
    )
    try:
        conn = connect(broker.url, container="app")
        conn.create_sender("orders", options=QUEUE).send(
            Message(id="order-1", body="x", properties={"tenant": "acme", "secret": "s"})
        )
        receiver = conn.create_receiver("orders", name="worker", options=QUEUE)
        receiver.receive(timeout=5)
        settle_modified(receiver)
        receiver.receive(timeout=5)
        receiver.reject()
        dlq = conn.create_receiver("DLA::DLQ.orders", name="triage")
        dlq.receive(timeout=5)
        dlq.accept()
        conn.close()
    finally:
        assert broker.stop() == 0
    events = read_events(broker.data_dir / "events")
    assert not list((broker.data_dir / "events").glob("*.part"))
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    original = next(e["msg_id"] for e in events if e["event"] == "sent")
    copy = next(e["copy_msg_id"] for e in events if e["event"] == "dead-lettered")
    mine = [
        (e["event"], e["msg_id"] == copy, e["queue"], e["reason"], e["delivery_count"], e["link"])
        for e in events
        if e["msg_id"] in (original, copy)
    ]
    assert mine == [
        ("sent", False, None, None, None, None),
        ("enqueued", False, "orders", "route", 0, None),
        ("dispatched", False, "orders", None, 1, "worker"),
        ("returned", False, "orders", "modified-failed", 1, "worker"),
        ("dispatched", False, "orders", None, 2, "worker"),
        ("dead-lettered", False, "orders", "rejected", 2, None),
        ("enqueued", True, "DLQ.orders", "move", 0, None),
        ("dispatched", True, "DLQ.orders", None, 1, "triage"),
        ("acked", True, "DLQ.orders", "accepted", 1, "triage"),
    ]
    dead = next(e for e in events if e["event"] == "dead-lettered")
    assert dead["target_address"] == "DLA"
    assert dead["amqp_message_id"] == "order-1"
    assert dead["props"] == {"tenant": "acme"}  # the allow-list only
    assert dead["connection"] is None
    sent = next(e for e in events if e["event"] == "sent")
    assert sent["connection"] == "app"
    assert sent["broker"] == "test-broker"


def test_below_the_free_space_floor_events_are_dropped_and_durable_sends_accepted(
    tmp_path: Path,
) -> None:
    """Issue 17 / B-170: with `min-free-bytes` above the disk's free space the event log
    drops every event (counted in amqpbroker_event_log_dropped_total) and writes no file,
    while the journal still takes durable sends: the journal has priority."""
    broker = start_broker(
        tmp_path,
        """
        persistence: {enabled: true}
        event-log: {enabled: true, level: lifecycle, min-free-bytes: 4611686018427387904}
        """,
    )
    dropped = ("amqpbroker_event_log_dropped_total", frozenset())
    try:
        conn = connect(broker.url)
        sender = conn.create_sender("durable.orders", options=QUEUE)
        sender.send(Message(body="kept", durable=True))  # raises unless accepted
        receiver = conn.create_receiver("durable.orders", options=QUEUE)
        assert receiver.receive(timeout=5).body == "kept"
        receiver.accept()
        conn.close()
        values = wait_until(
            lambda: (m := scrape(broker.ports["http"]))[dropped] >= 4 and m,
            message="4 dropped events (sent, enqueued, dispatched, acked)",
        )
        assert values["amqpbroker_event_log_files", frozenset()] == 0
    finally:
        assert broker.stop() == 0, broker.log()
    assert read_events(broker.data_dir / "events") == []
    assert "below event-log.min-free-bytes" in broker.log()


def test_retention_deletes_old_files_and_metrics_show_the_disk(tmp_path: Path) -> None:
    """Issue 17: a file older than max-age (7 days by default) is deleted at start and
    counted as never compacted; the disk gauges show the open file."""
    events = tmp_path / "data" / "events"
    events.mkdir(parents=True)
    old = events / "events-20200101T000000000Z.jsonl.gz"
    old.write_bytes(b"x" * 100)
    then = time.time() - 8 * 86_400
    os.utime(old, (then, then))
    broker = start_broker(tmp_path, "event-log: {enabled: true, level: lifecycle}")
    try:
        conn = connect(broker.url)
        conn.create_sender("metered", options=QUEUE).send(Message(body="x"))
        conn.close()
        files = ("amqpbroker_event_log_files", frozenset())
        values = wait_until(
            lambda: (m := scrape(broker.ports["http"]))[files] == 1 and m,
            message="the open event file",
        )
        not_compacted = frozenset({("compacted", "false")})
        assert values["amqpbroker_event_log_files_deleted_total", not_compacted] == 1
        assert values["amqpbroker_event_log_deleted_bytes_total", not_compacted] == 100
        assert values["amqpbroker_event_log_disk_bytes", frozenset()] > 0
        assert values["amqpbroker_event_log_oldest_file_age_seconds", frozenset()] < 600
        # Issue 20: the writer process's lag, 0 once it wrote what it was handed.
        pending = ("amqpbroker_event_log_pending_events", frozenset())
        wait_until(lambda: scrape(broker.ports["http"])[pending] == 0, message="no lag")
    finally:
        assert broker.stop() == 0, broker.log()
    assert not old.exists()
    assert "not compacted by `amqpbroker analyze`" in broker.log()


def test_a_killed_broker_keeps_the_events_of_every_turn_before_the_last(tmp_path: Path) -> None:
    """B-170 durability, issue 20 (a frame at the end of every loop turn): SIGKILL the
    broker right after a client saw its last request settled. The writer process outlives
    it and finishes the file with every event of the turns before the one the broker
    died in: all the deliveries' `acked` events are there, seq from 1 without a gap. (With
    the old 10 ms flush timer they could still be waiting in the broker.)"""
    broker = start_broker(tmp_path, "event-log: {enabled: true, level: lifecycle}\n")
    try:
        conn = connect(broker.url, container="app")
        sender = conn.create_sender("work", options=QUEUE)
        for i in range(20):
            sender.send(Message(id=f"w-{i}", body="x"))
        receiver = conn.create_receiver("work", name="worker", options=QUEUE)
        for _ in range(20):
            receiver.receive(timeout=5)
            receiver.accept()
        # Barriers on the same connection, so after the accepts on the wire: the broker
        # settles the first in the turn it read the accepts (or later), the second in a
        # later turn, after the first turn's end flushed its events.
        barrier = conn.create_sender("barrier", options=QUEUE)
        barrier.send(Message(id="b-1", body="x"))
        barrier.send(Message(id="b-2", body="x"))
    finally:
        broker.kill()
    events_dir = broker.data_dir / "events"

    def finished() -> bool:
        return bool(finished_files(events_dir)) and not list(events_dir.glob("*.part"))

    wait_until(finished, message="the writer process finishing the file")
    events = read_events(events_dir)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    acked = [e["amqp_message_id"] for e in events if e["event"] == "acked"]
    assert acked == [f"w-{i}" for i in range(20)]
    assert "b-1" in {e["amqp_message_id"] for e in events if e["event"] == "sent"}
