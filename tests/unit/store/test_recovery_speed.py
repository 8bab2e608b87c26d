"""Issue 23 item 4: recovery decodes the journal once and scans no message again."""

from __future__ import annotations

from pathlib import Path

from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.core.model import RoutingType
from amqpbroker.core.persistence import _add_message
from amqpbroker.core.records import AddQueue, AddRef, Record
from amqpbroker.protocol import message_of
from amqpbroker.store import FileJournal
from amqpbroker.store.recovery import _message

QUEUE = AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)


def _journal(directory: Path) -> FileJournal:
    return FileJournal(directory, fsync=lambda fd: None)


def test_the_first_replay_after_opening_gives_what_the_files_hold(tmp_path: Path) -> None:
    """The open's decoded records serve the first replay: the same as reading the files;
    after an append, replay reads the files (the new record is there)."""
    with _journal(tmp_path) as journal:
        journal.append([QUEUE], sync=True)
        journal.append([AddRef(queue="q", msg_id=1)], sync=True)
        journal.flush()
    with _journal(tmp_path) as journal:
        first = list(journal.replay())
        journal.append([AddRef(queue="q", msg_id=2)], sync=True)
        again = list(journal.replay())
    with FileJournal(tmp_path, read_only=True) as files:
        expected: list[Record] = list(files.replay())
    assert first == expected[:2]
    assert again == expected
    assert len(expected) == 3


def test_a_recovered_message_needs_no_scan_and_equals_a_scanned_one() -> None:
    """The scan's findings are journaled with the message (AddMessage.header_end ...):
    recovery builds the same core Message without scanning it."""
    for sent in (
        ProtonMessage(body="hello", durable=True, priority=7),
        ProtonMessage(body=b"x" * 100, durable=True, delivery_count=3, ttl=5.0),
        ProtonMessage(body="no header"),
    ):
        scanned = message_of(sections.scan(bytes(sent.encode())))
        scanned.msg_id, scanned.address, scanned.durable = 5, "q", True
        record = _add_message(scanned)
        assert record.header_end >= 0
        recovered = _message(record, message_of)
        old_style = _message(
            type(record)(**{**{f: getattr(record, f) for f in record.__slots__}, "header_end": -1}),
            message_of,
        )
        for field in ("data", "header_end", "head_end", "header", "priority", "expiration_ms"):
            assert getattr(recovered, field) == getattr(old_style, field), field
