"""`export_jsonl`: what a stopped broker's journal holds, as JSON-ready dicts.

Theory of operation
-------------------
Opens the journal read-only (sharing the directory lock, so never beside a running
broker), replays it into a `JournalState` and yields addresses, queues, then the live
messages: nothing on disk changes.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

from amqpbroker.store.file_journal import FileJournal

# --- export --------------------------------------------------------------------------


def export_jsonl(directory: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """What a stopped broker's journal holds, one JSON-ready dict per line.

    Addresses first, then queues, then one dict per live message with its queues and
    delivery counts (B-095). Opens the journal read-only: changes nothing on disk, and
    refuses while a broker has it open.
    """
    journal = FileJournal(directory, read_only=True)
    try:
        state = journal.state()
    finally:
        journal.close()
    for address in state.addresses:
        yield {
            "kind": "address",
            "name": address.name,
            "routing_types": [t.value for t in address.routing_types],
        }
    for queue in state.queues:
        yield {
            "kind": "queue",
            "name": queue.name,
            "address": queue.address,
            "routing_type": queue.routing_type.value,
            "durable": queue.durable,
            "filter": queue.filter,
            "auto_created": queue.auto_created,
            "extra": queue.extra,
        }
    refs: dict[int, list[dict[str, Any]]] = {}
    for ref in state.refs():
        refs.setdefault(ref.msg_id, []).append(
            {
                "queue": ref.queue,
                "delivery_count": ref.delivery_count,
                "scheduled_at_ms": ref.scheduled_at_ms,
            }
        )
    for msg_id, message in state.messages.items():
        yield {
            "kind": "message",
            "msg_id": msg_id,
            "address": message.address,
            "durable": message.durable,
            "priority": message.priority,
            "expiration_ms": message.expiration_ms,
            "first_ts": message.first_ts,
            "size": len(message.data),
            "data_base64": base64.b64encode(message.data).decode("ascii"),
            "queues": refs.get(msg_id, []),
        }
