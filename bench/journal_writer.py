"""CPU per durable message of the journal, without sockets or a disk sync.

Drives a `FileJournal` (fsync replaced by a no-op) with the records a steady
produce/consume load makes: per loop step 7 messages (AddMessage + AddRef), and the acks
of messages stored ACK_LAG steps earlier. Prints the CPU of the calling thread (which
encodes and frames, as the event loop does) and of the journal's own threads (the writer:
writing and indexing, all of it holding the GIL against the loop), per message.

    .venv/bin/python bench/journal_writer.py            # N=60000
    N=300000 .venv/bin/python bench/journal_writer.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from amqpbroker.core.model import RoutingType
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.store import FileJournal

N = int(os.environ.get("N", "60000"))
STEP = 7  # messages per loop step (one append)
ACK_LAG = 20  # steps between a message's append and its ack's
DATA = b"x" * 1024


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        journal = FileJournal(Path(directory), fsync=lambda fd: None)
        queue = AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)
        journal.append([queue], sync=True)
        journal.flush()
        started_all, started_main = time.process_time(), time.thread_time()
        acks: list[list[Record]] = []
        msg_id = 0
        for step in range(N // STEP):
            records: list[Record] = []
            for _ in range(STEP):
                msg_id += 1
                records += [AddMessage(msg_id=msg_id, address="q", data=DATA)]
                records += [AddRef(queue="q", msg_id=msg_id)]
            acks.append([AckRef(queue="q", msg_id=m) for m in range(msg_id - STEP + 1, msg_id + 1)])
            if len(acks) > ACK_LAG:
                records += acks.pop(0)
            journal.append(records, sync=True)
            if step % 50 == 0:
                journal.flush()  # a sync now and then, like the group commits
        journal.flush()
        main_cpu = time.thread_time() - started_main
        other_cpu = time.process_time() - started_all - main_cpu
        journal.close()
    print(
        f"{N} messages: calling thread {main_cpu / N * 1e6:.1f} µs/msg, "
        f"journal threads {other_cpu / N * 1e6:.1f} µs/msg"
    )


if __name__ == "__main__":
    main()
