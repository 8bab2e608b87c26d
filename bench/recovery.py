"""Journal recovery speed (issue 23 item 4): N durable 1 KiB messages in one queue,
written straight to a journal, then the broker's start-up path timed: open the journal
(read and index every segment), replay it into a `JournalState`, and `recover()` the
messages into a `Broker`.

    .venv/bin/python bench/recovery.py                 # N=200000
    N=1000000 .venv/bin/python bench/recovery.py       # the issue's figure (~1.1 GB)
    PROFILE=1 N=200000 .venv/bin/python bench/recovery.py
    DIR=/tmp/j WRITE_ONLY=1 N=200000 .venv/bin/python bench/recovery.py   # write once,
    DIR=/tmp/j N=200000 perf stat -e instructions:u .venv/bin/python bench/recovery.py
                                    # then count the recovery's instructions (load-proof)

Prints the seconds of each phase and the messages per second of the whole, and per CPU
second (the figure to compare on a shared, loaded machine).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.config import parse_config
from amqpbroker.core.model import RoutingType
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.records import AddMessage, AddQueue, AddRef, Record
from amqpbroker.protocol import message_of
from amqpbroker.server import build_broker
from amqpbroker.store import FileJournal
from amqpbroker.store.recovery import collector_paused, recover

N = int(os.environ.get("N", "200000"))
BATCH = 1000


def write(directory: Path) -> None:
    message = ProtonMessage(body=b"x" * 1024, durable=True)
    data = message.encode()
    scanned = sections.scan(data)  # as the broker does once, when the message arrives
    seen = {"header_end": scanned.header_end, "head_end": scanned.head_end()}
    journal = FileJournal(directory, fsync=lambda fd: None, auto_compact=False)
    journal.append([AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)], sync=True)
    for start in range(1, N + 1, BATCH):
        records: list[Record] = []
        for msg_id in range(start, min(start + BATCH, N + 1)):
            records.append(AddMessage(msg_id=msg_id, address="q", data=data, first_ts=1, **seen))
            records.append(AddRef(queue="q", msg_id=msg_id))
        journal.append(records, sync=False)
    journal.flush()
    journal.close()


class _NoJournal:
    def append(self, records: object, *, sync: bool, on_durable: object = None) -> None:
        pass

    def on_resume(self, callback: object) -> None:
        pass


def main() -> None:
    kept = os.environ.get("DIR")  # a journal this bench wrote before: read it again
    with tempfile.TemporaryDirectory() as scratch:
        directory = kept or scratch
        if not kept or not any(Path(directory).glob("journal-*.seg")):
            started = time.monotonic()
            write(Path(directory))
            print(f"wrote {N} messages in {time.monotonic() - started:.1f} s")
            if os.environ.get("WRITE_ONLY"):
                return
        profile = cProfile.Profile() if os.environ.get("PROFILE") else None
        if profile is not None:
            profile.enable()
        c0 = time.process_time()
        t0 = time.monotonic()
        with collector_paused(freeze=True):  # as the broker process does
            journal = FileJournal(Path(directory), fsync=lambda fd: None, auto_compact=False)
            t1 = time.monotonic()
            state = journal.state()
            t2 = time.monotonic()
            broker = build_broker(parse_config("name: bench\n"))
            broker.enable_persistence(Persistence(_NoJournal()))
            recovered = recover(broker, state, message_of)
            t3 = time.monotonic()
        cpu = time.process_time() - c0
        if profile is not None:
            profile.disable()
        journal.close()
        assert recovered.refs == N, recovered
        print(
            f"open {t1 - t0:.2f} s, replay {t2 - t1:.2f} s, recover {t3 - t2:.2f} s: "
            f"{N / (t3 - t0):,.0f} messages/s; CPU {cpu:.2f} s: {N / cpu:,.0f} messages/CPU-s"
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
