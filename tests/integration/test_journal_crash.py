"""SIGKILL of a process appending to a FileJournal with small segments and compaction on.

The child appends a steady add/ack load (acks a few syncs behind their adds, so the
compaction index lags and skips short-lived messages) and prints every append the journal
confirmed durable. The parent kills it at a random moment, reopens the journal and checks
that every message confirmed added and never acked (one in three) is still there, and no
message whose ack was confirmed came back: compaction never dropped a live record,
whatever the index knew when the kill came.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.waiting import wait_until

from amqpbroker.store import FileJournal, JournalState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHILD = r"""
import json, sys, threading
from pathlib import Path
from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef
from amqpbroker.store import FileJournal

journal = FileJournal(Path(sys.argv[1]), max_segment_bytes=8192, auto_compact=True,
                      fsync=lambda fd: None)
out_lock = threading.Lock()

def confirm(kind, ids):
    def done(error):
        if error is None:
            with out_lock:
                print(json.dumps([kind, ids]), flush=True)
    return done

start = int(sys.argv[2])
journal.append([AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)], sync=True)
msg_id, pending = start, []
while True:
    added = list(range(msg_id, msg_id + 5))
    msg_id += 5
    records = []
    for i in added:
        records += [AddMessage(msg_id=i, address="q", data=b"m" * 100), AddRef(queue="q", msg_id=i)]
    journal.append(records, sync=True, on_durable=confirm("add", added))
    pending.append(added)
    if len(pending) > 12:  # ack a batch from a dozen appends ago, keep one in three
        acked = [i for i in pending.pop(0) if i % 3]
        journal.append([AckRef(queue="q", msg_id=i) for i in acked], sync=True,
                       on_durable=confirm("ack", acked))
"""


def run_and_kill(directory: Path, start: int, after: float) -> list[str]:
    """Run the child until it confirmed an append, then `after` seconds more; SIGKILL it.
    Its confirmations, as printed."""
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(start)],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        stdout = child.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
        reader.start()
        try:
            wait_until(lambda: bool(lines), timeout=30, message="the child's first append")
            time.sleep(after)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            reader.join(timeout=30)
    return lines


@pytest.mark.parametrize("seed", range(4))
def test_no_live_record_is_lost_when_killed_during_compaction(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    added: set[int] = set()
    acked: set[int] = set()
    start = 1
    for _ in range(3):  # kill, reopen and go on, three times over the same directory
        lines = run_and_kill(tmp_path, start, rng.uniform(0.2, 1.0))
        for line in lines:
            kind, ids = json.loads(line)
            (added if kind == "add" else acked).update(ids)
        assert added, "the child confirmed nothing before the kill"
        journal = FileJournal(tmp_path, auto_compact=False)
        try:
            state = JournalState.of(journal.replay())
            assert len(list(tmp_path.glob("journal-*.seg"))) > 1  # it rolled: compaction ran
        finally:
            journal.close()
        live = set(state.messages)
        kept = {i for i in added if i % 3 == 0}  # never acked (others: their ack may be
        missing = kept - live  # on disk, unconfirmed when the kill came)
        assert not missing, f"confirmed, never acked, gone after the kill: {sorted(missing)[:10]}"
        assert not (live & acked), "a confirmed ack came back"
        start = max(state.max_msg_id, *added) + 1000
