"""Journal recovery speed (issue 23 item 4): N durable 1 KiB messages in one queue,
written straight to a journal, then the broker's start-up path timed: open the journal
(read and index every segment), replay it into a `JournalState`, and `recover()` the
messages into a `Broker`.

    .venv/bin/python bench/recovery.py                 # N=200000
    N=1000000 .venv/bin/python bench/recovery.py       # the issue's figure (~1.1 GB)
    ACKED=0.9 N=1000000 .venv/bin/python bench/recovery.py   # 90% consumed: 100k live
    BUDGET=67108864 N=1000000 .venv/bin/python bench/recovery.py  # 64 MiB global-max-size
    DRAIN=1 BUDGET=67108864 N=1000000 .venv/bin/python bench/recovery.py  # and then read
                                    # the journal backlog back, its acks journaled
    MIXED=1 BUDGET=67108864 N=1000000 .venv/bin/python bench/recovery.py  # and a short-
                                    # lived message of queue r after each of q's
    PROFILE=1 N=200000 .venv/bin/python bench/recovery.py
    DIR=/tmp/j WRITE_ONLY=1 N=200000 .venv/bin/python bench/recovery.py   # write once,
    DIR=/tmp/j N=200000 perf stat -e instructions:u .venv/bin/python bench/recovery.py
                                    # then count the recovery's instructions (load-proof)

Prints the seconds of each phase and the messages per second of the whole, and the CPU
seconds (user + system, of each phase too) and messages per CPU second: the figures to
compare on a shared, loaded machine.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.config import parse_config
from amqpbroker.core.model import RoutingType
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.records import AckRef, AddMessage, AddQueue, AddRef, Record
from amqpbroker.protocol import message_of
from amqpbroker.server import build_broker
from amqpbroker.store import FileJournal
from amqpbroker.store.recovery import collector_paused, recover

N = int(os.environ.get("N", "200000"))
# The share of messages consumed (acknowledged in the append after theirs), as a broker
# under load leaves its journal: N messages written, N * (1 - ACKED) live at the restart.
ACKED = float(os.environ.get("ACKED", "0"))
BATCH = 1000
# global-max-size at the restart (bytes; < 0: none): messages past it stay in the journal
# (issue 23, store/backlog.py), as the broker process does with its limit.
BUDGET = int(os.environ.get("BUDGET", "-1"))
# After the recovery, read the queue's journal backlog back 1,000 messages at a time, as
# a consumer's credit would, each read's acks appended to the journal and indexed, and
# compaction run every 100 reads (issue 23: the drain of a recovered backlog).
DRAIN = bool(os.environ.get("DRAIN"))
# Mixed traffic (issue 23, twelfth pass): MIXED messages of a second queue, r, after each
# of q's, acknowledged in the append after theirs (a consumer of r keeping up while q's
# backlog builds), with MIXED_BODY-byte bodies: short-lived messages whose ids interleave
# with the backlog's in every segment.
MIXED = int(os.environ.get("MIXED", "0"))
MIXED_BODY = int(os.environ.get("MIXED_BODY", "128"))


def write(directory: Path) -> None:
    message = ProtonMessage(body=b"x" * 1024, durable=True)
    data = bytes(message.encode())  # (proton may hand a bytearray)
    scanned = sections.scan(data)  # as the broker does once, when the message arrives
    seen = {"header_end": scanned.header_end, "head_end": scanned.head_end()}
    other = bytes(ProtonMessage(body=b"y" * MIXED_BODY, durable=True).encode())
    scanned = sections.scan(other)
    other_seen = {"header_end": scanned.header_end, "head_end": scanned.head_end()}
    journal = FileJournal(directory, fsync=lambda fd: None, auto_compact=False)
    queues = [AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)]
    if MIXED:
        queues.append(AddQueue(name="r", address="r", routing_type=RoutingType.ANYCAST))
    journal.append(queues, sync=True)
    next_id = 1
    for start in range(1, N + 1, BATCH):
        records: list[Record] = []
        backlog: list[int] = []
        others: list[int] = []
        for _ in range(start, min(start + BATCH, N + 1)):
            records.append(AddMessage(msg_id=next_id, address="q", data=data, first_ts=1, **seen))
            records.append(AddRef(queue="q", msg_id=next_id))
            backlog.append(next_id)
            next_id += 1
            for _ in range(MIXED):  # queue r's, acked in the next append
                records.append(
                    AddMessage(msg_id=next_id, address="r", data=other, first_ts=1, **other_seen)
                )
                records.append(AddRef(queue="r", msg_id=next_id))
                others.append(next_id)
                next_id += 1
        journal.append(records, sync=False)
        acks = [AckRef(queue="q", msg_id=m) for m in backlog[: int(len(backlog) * ACKED)]]
        acks += [AckRef(queue="r", msg_id=m) for m in others]
        if acks:
            journal.append(acks, sync=False)
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
            journal = FileJournal(
                Path(directory), fsync=lambda fd: None, auto_compact=False, body_budget=BUDGET
            )
            t1, c1 = time.monotonic(), time.process_time()
            state = journal.state()
            t2, c2 = time.monotonic(), time.process_time()
            broker = build_broker(parse_config("name: bench\n"))
            broker.enable_persistence(Persistence(_NoJournal()))
            recovered = recover(broker, state, message_of, read=journal.read_message, budget=BUDGET)
            t3 = time.monotonic()
        cpu = time.process_time() - c0
        if DRAIN:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
            drained, seconds = _drain(broker, journal)
            print(
                f"drain: {drained} messages read back and acked in {seconds:.2f} CPU-s "
                f"({drained / seconds:,.0f} messages/CPU-s); peak RSS {rss} MiB before it, "
                f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB after"
            )
        if profile is not None:
            profile.disable()
        journal.close()
        live = N - sum(int((min(s + BATCH, N + 1) - s) * ACKED) for s in range(1, N + 1, BATCH))
        assert recovered.refs == live, recovered
        print(
            f"open {t1 - t0:.2f} s, replay {t2 - t1:.2f} s, recover {t3 - t2:.2f} s: "
            f"{N / (t3 - t0):,.0f} messages/s; CPU {cpu:.2f} s (open {c1 - c0:.2f}, replay "
            f"{c2 - c1:.2f}, recover {c0 + cpu - c2:.2f}): {N / cpu:,.0f} messages/CPU-s; "
            f"{live} live; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB"
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def _drain(broker: Any, journal: FileJournal) -> tuple[int, float]:
    """Read the journal backlog of queue q back and ack it (`DRAIN`): messages, CPU-s."""
    pages = broker.queues["q"].pages
    if pages is None:
        return 0, 0.0
    c0 = time.process_time()
    drained = reads = 0
    while True:
        messages = pages.read(max_bytes=-1, max_messages=1000)
        if not messages:
            break
        drained += len(messages)
        journal.append([AckRef(queue="q", msg_id=m.msg_id) for m in messages], sync=False)
        journal.flush()
        reads += 1
        if reads % 100 == 0:
            journal.compact()
    journal.flush()
    journal.compact()
    return drained, time.process_time() - c0


if __name__ == "__main__":
    main()
