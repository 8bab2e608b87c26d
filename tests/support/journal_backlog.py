"""A journal of N durable messages in queue q, more than a budget of `global-max-size`,
and a broker restarted from it as the server does (issue 23, `store/backlog.py`): shared
by the journal backlog's tests and the unloaded packs' (`tests/unit/store`)."""

from __future__ import annotations

from pathlib import Path

from proton import Message as ProtonMessage

from amqpbroker.amqp import sections
from amqpbroker.core import AddressSettings
from amqpbroker.core.model import RoutingType
from amqpbroker.core.outcomes import Accepted
from amqpbroker.core.persistence import Persistence
from amqpbroker.core.records import (
    AddMessage,
    AddQueue,
    AddRef,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)
from amqpbroker.protocol import message_of
from amqpbroker.store import FileJournal
from amqpbroker.store.paging import PageFiles
from amqpbroker.store.recovery import recover
from support.core_harness import Harness

N = 300
BODY = 1000  # bytes of padding: ~1 KiB a message
BUDGET = 40 * 1024  # ~40 messages in memory


def amqp(i: int, ttl_ms: int = 0) -> bytes:
    message = ProtonMessage(body=f"message-{i:05d}" + "x" * BODY, durable=True)
    if ttl_ms:
        message.ttl = ttl_ms / 1000
    return bytes(message.encode())


def open_journal(directory: Path, **kw: object) -> FileJournal:
    return FileJournal(directory, fsync=lambda fd: None, auto_compact=False, **kw)  # type: ignore[arg-type]


def append_messages(journal: FileJournal, queue: str, n: int) -> None:
    """Messages 1..n in `queue` (its address of the same name), as a broker journals them."""
    for i in range(1, n + 1):
        data = amqp(i)
        scanned = sections.scan(data)
        message = AddMessage(
            msg_id=i,
            address=queue,
            data=data,
            first_ts=i,
            header_end=scanned.header_end,
            head_end=scanned.head_end(),
        )
        journal.append([message, AddRef(queue=queue, msg_id=i)], sync=False)


def write(directory: Path, records: list[Record] | None = None) -> None:
    """N durable messages in queue q, as a broker journals them; message 7 was delivered
    twice (count 2), message 9 waits until t=10^15 (B-065)."""
    journal = open_journal(directory)
    journal.append([AddQueue(name="q", address="q", routing_type=RoutingType.ANYCAST)], sync=True)
    append_messages(journal, "q", N)
    journal.append(
        [
            UpdateDeliveryCount(queue="q", msg_id=N - 7, delivery_count=2),
            ScheduledDelivery(queue="q", msg_id=N - 9, at_ms=10**15),
            *(records or []),
        ],
        sync=True,
    )
    journal.close()


class Restarted:
    """A broker started from `directory` as the server does: the journal opened with the
    body budget, recovery with the same limit, then the page files."""

    def __init__(self, directory: Path, budget: int = BUDGET) -> None:
        self.journal = open_journal(directory / "journal", body_budget=budget)
        self.h = Harness({"#": AddressSettings.of()}, global_max_size=budget)
        self.persistence = Persistence(self.journal)
        self.h.broker.enable_persistence(self.persistence)
        state = self.journal.state()
        self.recovered = recover(
            self.h.broker, state, message_of, read=self.journal.read_message, budget=budget
        )
        self.files = PageFiles(
            directory / "paging", message_of=message_of, page_size_bytes=lambda a: 8192
        )
        durable = {q.name: q.address for q in self.h.broker.queues.values() if q.store is not None}
        self.h.broker.enable_paging(
            self.files,
            paged=tuple(
                self.files.recover(
                    durable, state.page_cursors, state.page_skips, state.page_commits
                )
            ),
        )
        self.persistence.before_flush = self.files.flush

    def close(self) -> None:
        self.persistence.flush()
        self.journal.flush()
        self.files.close()
        self.journal.close()

    def drain(self, limit: int = 10**9) -> list[tuple[str, int]]:
        """Accept up to `limit` messages: (body prefix, delivery count) of each."""
        h = self.h
        consumer = h.consumer("q", "queue", credit=0)
        got: list[tuple[str, int]] = []
        while len(got) < limit:
            h.broker.set_credit(consumer, min(20, limit - len(got)))
            batch = h.take(consumer)
            if not batch:
                break
            for d in batch:
                decoded = ProtonMessage()
                decoded.decode(d.message.data)
                got.append((str(decoded.body)[:13], d.wire_count))
                h.settle(consumer, d, Accepted())
            self.persistence.flush()
        h.broker.detach_consumer(consumer, closed=True)
        return got


def expected(ids: range) -> list[tuple[str, int]]:
    return [(f"message-{i:05d}", 2 if i == N - 7 else 0) for i in ids if i != N - 9]
