"""The lifecycle event log of a scripted scenario, compared as data (B-170, B-171)."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Message
from support.client import Capabilities, connect, settle_modified
from support.event_files import read_events
from support.process import start_broker

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
        conn.create_sender("orders", options=Capabilities("queue")).send(
            Message(id="order-1", body="x", properties={"tenant": "acme", "secret": "s"})
        )
        receiver = conn.create_receiver("orders", name="worker", options=Capabilities("queue"))
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
