"""Memory per queued message: N 1 KiB messages into one queue nobody consumes, built as
the adapter builds them, through the core (and, DURABLE=1, the file journal), in this
process, no sockets. Prints the RSS growth per message and, with TRACE=1, where Python
allocated it (tracemalloc, by file): the per-message cost of the core and the store.

    N=100000 PYTHONPATH=$PWD .venv/bin/python bench/queued_memory.py
    N=100000 DURABLE=1 PYTHONPATH=$PWD .venv/bin/python bench/queued_memory.py
    N=50000 DURABLE=1 TRACE=1 PYTHONPATH=$PWD .venv/bin/python bench/queued_memory.py

The broker's own figure (README "Memory") is the RSS of `amqpbroker run` under a real
client; this one leaves out the protocol, which holds nothing per queued message.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.config import load_config
from amqpbroker.core import ConnectionId, ProducerRequest, SystemClock
from amqpbroker.core.persistence import OnStored, Persistence
from amqpbroker.core.records import Record
from amqpbroker.protocol.transfers import message_of
from amqpbroker.server import build_broker
from amqpbroker.store.file_journal import FileJournal

REPO = Path(__file__).resolve().parent.parent
BATCH = 100


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Direct:
    """The journal as `Persistence` sees it, without an event loop."""

    def __init__(self, journal: FileJournal) -> None:
        self.journal = journal

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
    ) -> None:
        self.journal.append(records, sync=sync, on_durable=on_durable)

    def on_resume(self, callback: Callable[[], None]) -> None:
        pass


def main() -> None:
    n = int(os.environ.get("N", "100000"))
    durable = os.environ.get("DURABLE") == "1"
    trace = os.environ.get("TRACE") == "1"
    broker = build_broker(load_config(REPO / "config" / "broker.yaml"), clock=SystemClock())
    with tempfile.TemporaryDirectory() as tmp:
        journal = FileJournal(Path(tmp) / "journal") if durable else None
        persistence = None
        if journal is not None:
            persistence = Persistence(_Direct(journal), sync=True)
            broker.enable_persistence(persistence)
        target = broker.attach_producer(
            ProducerRequest(connection=ConnectionId(1), address="q", capabilities=("queue",))
        )
        proton = ProtonMessage(body="x" * 1000, durable=durable)
        proton.properties = {"k": "v"}
        raw = bytes(proton.encode())

        def send(count: int) -> None:
            for i in range(count):
                data = bytes(bytearray(raw))  # its own bytes, as read from a socket
                message = message_of(sections.scan(data), origin_container="producer")
                broker.publish(message, target)
                broker.take_effects()
                broker.emitter.take_raw()
                if persistence is not None and i % BATCH == BATCH - 1:
                    persistence.flush()
            if persistence is not None:
                persistence.flush()

        send(1000)  # warm-up: allocator pools, caches
        gc.collect()
        time.sleep(0.5)
        if trace:
            tracemalloc.start()
            before_snapshot = tracemalloc.take_snapshot()
        before = rss()
        send(n)
        if journal is not None:
            # The index lags the disk by up to 64 syncs or 4 MiB (a bound, not a cost per
            # message): index it all, else where that window ends moves the figure by
            # +-100 B. compact() indexes what is synced first (and finds nothing to do).
            journal.compact()
        gc.collect()
        after = rss()
        print(
            f"{'durable' if durable else 'non-durable'} N={n}: "
            f"{(after - before) / n:.0f} bytes RSS per queued message "
            f"({len(raw)} bytes on the wire; queue holds {broker.queues['q'].message_count})"
        )
        if trace:
            snapshot = tracemalloc.take_snapshot()
            for stat in snapshot.compare_to(before_snapshot, "lineno")[:15]:
                print(f"  {stat.size_diff / n:7.1f} B/msg  {stat.traceback}")
        if journal is not None:
            journal.close()


if __name__ == "__main__":
    main()
