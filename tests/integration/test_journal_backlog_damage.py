"""A journal backlog over a segment damaged after the open (ninth attack pass; issue 23,
B-151): the compact index's unloaded packs are rebuilt from their segment when the
backlog reaches them (`store/frames.py` `reload_pack`), trusting what the open checked.
A segment truncated, overwritten or removed meanwhile makes that rebuild fail: the
backlog passes that pack's references as lost (counted in the queue's `paged_lost`,
logged once with the segment), as a damaged page file's are, and the queue goes on
delivering the rest in order. It had raised out of every settle on the queue: each
consumer's connection closed with amqp:internal-error and the rest of the queue stuck."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from proton import Message as ProtonMessage
from support.client import QUEUE, connect, drain_round
from support.process import BrokerProcess, start_broker

from amqpbroker.amqp import sections
from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AddMessage, AddQueue, AddRef
from amqpbroker.store import FileJournal

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N = 3_000
CONFIG = "persistence:\n  enabled: true\nglobal-max-size: 100000\n"


def _write_journal(directory: Path) -> None:
    """Queue q holding messages 1..N (~1 KiB each), journaled as a broker does, in
    segments of 512 KiB: ~480 messages a segment, each segment's pack unloaded at open."""
    journal = FileJournal(
        directory, fsync=lambda fd: None, auto_compact=False, max_segment_bytes=512 * 1024
    )
    journal.append([AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)], sync=True)
    for i in range(1, N + 1):
        data = bytes(ProtonMessage(body=f"{i:08d}" + "x" * 1000, durable=True).encode())
        scanned = sections.scan(data)
        message = AddMessage(
            msg_id=i,
            address="q",
            data=data,
            first_ts=i,
            header_end=scanned.header_end,
            head_end=scanned.head_end(),
        )
        journal.append([message, AddRef(queue="q", msg_id=i)], sync=False)
    journal.flush()
    journal.close()


def _numbers(broker: BrokerProcess) -> list[int]:
    """Accept everything q holds, in rounds of credit drain: the message numbers."""
    conn = connect(broker.url)
    got: list[int] = []
    try:
        receiver = conn.create_receiver("q", options=QUEUE)
        while True:
            batch = drain_round(conn, receiver, 100)
            for message in batch:
                got.append(int(message.body[:8]))
                receiver.accept()
            if len(batch) < 100:
                return got
    finally:
        conn.close()


def _queue(broker: BrokerProcess) -> dict[str, object]:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v1/queues/q"
    with urllib.request.urlopen(url, timeout=30) as response:
        reply: dict[str, object] = json.loads(response.read())
    return reply


@pytest.mark.parametrize("damage", ["truncate", "empty", "zeros", "remove"])
def test_a_backlog_over_a_segment_damaged_after_the_open_passes_its_messages_as_lost(
    tmp_path: Path, damage: str
) -> None:
    journal = tmp_path / "data" / "journal"
    _write_journal(journal)
    broker = start_broker(tmp_path, CONFIG, log_level="info")
    try:
        segments = sorted(journal.glob("journal-*.seg"))
        assert len(segments) >= 5
        victim = segments[2]
        size = victim.stat().st_size
        if damage == "truncate":
            os.truncate(victim, 4096)
        elif damage == "empty":  # (mmap refuses an empty file: a ValueError, not OSError)
            os.truncate(victim, 0)
        elif damage == "zeros":
            victim.write_bytes(b"\0" * size)
        else:
            victim.unlink()
        got = _numbers(broker)
        assert broker.proc.poll() is None
        assert "internal error" not in broker.log()
        # Every message of the other segments comes, once and in order; the damaged
        # segment's are the ones missing, counted as lost.
        assert got == sorted(set(got))
        missing = sorted(set(range(1, N + 1)) - set(got))
        assert missing, "the damaged segment's messages cannot have come back"
        assert missing == list(range(missing[0], missing[-1] + 1))  # one segment's run
        assert got[-1] == N
        queue = _queue(broker)
        assert queue["paged_lost"] == len(missing)
        assert (queue["messages"], queue["paged_bytes"]) == (0, 0)  # nothing left counted
        log = broker.log()
        assert f"{victim}" in log
        assert f"{len(missing)} messages" in log
    finally:
        broker.stop()
