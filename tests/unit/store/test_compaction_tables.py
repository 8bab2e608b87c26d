"""Issue 23 (memory a drain frees comes back): after compaction deleted what a drain's
acks killed, the index's dicts that held their tombstones give their tables back (a
dict keeps its largest table when its entries go)."""

from __future__ import annotations

import sys
from pathlib import Path

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.store import FileJournal
from amqpbroker.store.journal import JournalState


def test_the_tombstones_tables_shrink_once_compaction_retired_them(tmp_path: Path) -> None:
    n = 6000
    appends: list[list[Record]] = [
        [AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)]
    ]
    appends += [
        [AddMessage(msg_id=m, address="q", data=b"x" * 100), AddRef(queue="q", msg_id=m)]
        for m in range(1, n + 1)
    ]
    with FileJournal(
        tmp_path, fsync=lambda fd: None, auto_compact=False, max_segment_bytes=1 << 20
    ) as journal:
        for records in appends:
            journal.append(records, sync=False)
        journal.flush()
        acks: list[Record] = [AckRef(queue="q", msg_id=m) for m in range(1, n + 1)]
        journal.append(acks, sync=True)  # tombstones: their adds are in older segments
        journal.flush()
        with journal._lock:
            journal._index_synced()
        grown = sys.getsizeof(journal._targets)
        assert grown > 65536  # (an entry per ack whose add is in an older segment)
        journal.compact()
        assert len(journal._targets) < 100
        assert sys.getsizeof(journal._targets) < grown // 8
        assert all(sys.getsizeof(s.items) <= 65536 for s in journal._segments)
        appends.append(acks)
    with FileJournal(tmp_path, fsync=lambda fd: None, auto_compact=False) as journal:
        model = JournalState.of(r for records in appends for r in records)
        assert journal.state().ref_rows() == model.ref_rows()
