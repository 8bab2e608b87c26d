"""Broker message ids are never reused, across restarts and kills (issue 16 item 2).

The event log and redrive lists name messages by these ids; before, non-durable messages
started again at the journal's high-water mark after a restart.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from support.client import QUEUE, connect
from support.process import BrokerProcess, retry_ids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def http(broker: BrokerProcess, path: str) -> Any:
    url = f"http://127.0.0.1:{broker.ports['http']}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def send_and_read_ids(broker: BrokerProcess, address: str, count: int) -> list[int]:
    """Send `count` non-durable messages; the broker ids they got (browsed, left queued)."""
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        for n in range(count):
            sender.send(Message(body=f"m{n}", durable=False))
    finally:
        conn.close()
    rows = http(broker, f"/api/v1/queues/{address}/messages?limit=1000")
    return [row["msg_id"] for row in rows]


@pytest.mark.parametrize(
    ("persistence", "stop"),
    [("true", "term"), ("true", "kill"), ("false", "term"), ("false", "kill")],
)
def test_ids_after_a_restart_are_new(
    spawn: Any, tmp_path: Path, persistence: str, stop: str
) -> None:
    """Issue 16 item 2: ids given out after a restart (or kill -9) were never used before,
    also for non-durable messages and with persistence disabled."""
    config = f"persistence:\n  enabled: {persistence}\n"
    broker: BrokerProcess = spawn(tmp_path, config)
    before = send_and_read_ids(broker, "ids", 3)
    if stop == "term":
        assert broker.stop() == 0, broker.log()
    else:
        broker.kill()
    broker = spawn(tmp_path, config)
    after = send_and_read_ids(broker, "ids", 3)
    assert len(before) == len(after) == 3
    assert min(after) > max(before)
    assert broker.stop() == 0, broker.log()


def dead_letter(broker: BrokerProcess, address: str, *amqp_ids: str) -> None:
    """Send non-durable messages with these message-ids and reject them all."""
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        for amqp_id in amqp_ids:
            sender.send(Message(id=amqp_id, body=amqp_id, durable=False))
        receiver = conn.create_receiver(address, options=QUEUE)
        for _ in amqp_ids:
            receiver.receive(timeout=5)
            receiver.reject()
    finally:
        conn.close()


def redrive_lines(broker: BrokerProcess, dlq: str) -> list[dict[str, Any]]:
    """What `analyze` writes to redrive.jsonl for every message of `dlq`."""
    rows = http(broker, f"/api/v1/queues/{dlq}/messages?limit=1000")
    return [
        {
            "msg_id": row["msg_id"],
            "queue": dlq,
            "original_address": row["message_annotations"]["x-opt-ORIG-ADDRESS"],
            "original_queue": row["message_annotations"]["x-opt-ORIG-QUEUE"],
            "reason": "rejected",
            "error_condition": None,
            "amqp_message_id": row["properties"]["message-id"],
        }
        for row in rows
    ]


def retry_cli(broker: BrokerProcess, queue: str, ids_file: Path, *more: str) -> str:
    done = retry_ids(broker, queue, ids_file, *more)
    assert done.returncode == 0, done.stderr
    return done.stdout


SETTINGS = """
persistence:
  enabled: true
address-settings:
  "#":
    dead-letter-address: DLA
    auto-create-dead-letter-resources: true
"""


@pytest.mark.parametrize("rate", [(), ("--rate", "1000")])
def test_a_redrive_list_from_before_a_restart_retries_nothing_else(
    spawn: Any, tmp_path: Path, rate: tuple[str, ...]
) -> None:
    """Issue 16 item 2, the field report: a redrive list written before a restart named
    ids that after it belonged to other (poison) messages, and `retry --ids` sent those.
    Now the ids are new, so the list's are reported as not found and nothing moves."""
    broker: BrokerProcess = spawn(tmp_path, SETTINGS)
    dead_letter(broker, "orders", "o-1", "o-2")
    redrive = tmp_path / "redrive.jsonl"
    redrive.write_text(
        "".join(json.dumps(line) + "\n" for line in redrive_lines(broker, "DLQ.orders"))
    )
    assert broker.stop() == 0, broker.log()
    broker = spawn(tmp_path, SETTINGS)
    dead_letter(broker, "orders", "poison-1", "poison-2")
    out = retry_cli(broker, "DLQ.orders", redrive, *rate)
    listed = [json.loads(line)["msg_id"] for line in redrive.read_text().splitlines()]
    assert out.splitlines() == [
        "retried 0 message(s) from DLQ.orders",
        f"not found in DLQ.orders (2): {listed[0]} {listed[1]}",
    ]
    assert len(http(broker, "/api/v1/queues/DLQ.orders/messages")) == 2
    assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize("rate", [(), ("--rate", "1000")])
def test_retry_skips_lines_that_do_not_match_their_message(
    spawn: Any, tmp_path: Path, rate: tuple[str, ...]
) -> None:
    """Issue 16 item 2: each redrive line is checked against the message its id names
    (DLQ, original address and queue, amqp_message_id); mismatches are skipped with why."""
    broker: BrokerProcess = spawn(tmp_path, SETTINGS)
    dead_letter(broker, "orders", "o-1", "o-2", "o-3")
    good, other_id, other_dlq = redrive_lines(broker, "DLQ.orders")
    other_id["amqp_message_id"] = "o-9"
    other_dlq["queue"] = "DLQ.payments"
    redrive = tmp_path / "redrive.jsonl"
    redrive.write_text(
        "".join(json.dumps(line) + "\n" for line in (good, other_id, other_dlq)) + "424242\n"
    )
    out = retry_cli(broker, "DLQ.orders", redrive, *rate)
    assert out.splitlines() == [
        "retried 1 message(s) from DLQ.orders",
        f"skipped {other_id['msg_id']}: amqp_message_id is 'o-2', expected 'o-9'",
        f"skipped {other_dlq['msg_id']}: queue is 'DLQ.orders', expected 'DLQ.payments'",
        "not found in DLQ.orders (1): 424242",
    ]
    back = http(broker, "/api/v1/queues/orders/messages")
    assert [row["properties"]["message-id"] for row in back] == ["o-1"]
    assert broker.stop() == 0, broker.log()


def test_retry_endpoint_validates_expect(spawn: Any, tmp_path: Path) -> None:
    """`expect` maps msg_id strings to objects of known fields with string/null values."""
    broker: BrokerProcess = spawn(tmp_path, SETTINGS)
    dead_letter(broker, "orders", "o-1")
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/DLQ.orders/retry"
    for expect in ([], {"x": {}}, {"1": {"color": "red"}}, {"1": {"queue": 5}}, {"1": []}):
        request = urllib.request.Request(
            url,
            data=json.dumps({"ids": [1], "expect": expect}).encode(),
            method="POST",
            headers={"X-Requested-By": "test"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400
        refused.value.close()
    assert broker.stop() == 0, broker.log()


def test_an_unreadable_reservation_stops_the_start(spawn: Any, tmp_path: Path) -> None:
    """Issue 16 item 2: never guess where ids start; say what the file is for."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "message-ids").write_text("garbage\n")
    with pytest.raises(AssertionError, match="holds where new message ids start"):
        spawn(tmp_path)
