"""Broker message ids are never reused, across restarts and kills (issue 16 item 2).

The event log and redrive lists name messages by these ids; before, non-durable messages
started again at the journal's high-water mark after a restart.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from support.client import Capabilities, connect
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUEUE = Capabilities("queue")


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
