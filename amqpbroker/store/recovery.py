"""Start-up with a journal: rebuild the broker from it.

`recover()` runs before any acceptor listens. It replays the journal into a
`JournalState` (the journal module owns the liveness rules), then recreates, in this
order: addresses, durable queues, and every live message reference in append order with
its last persisted delivery count (B-095) and its scheduled time (B-065/B-015). Nothing
is journaled again while it does so (`Persistence.suspended`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import struct
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Final, cast

from amqpbroker.amqp import sections
from amqpbroker.core.broker import Broker
from amqpbroker.core.model import Message, QueueConfig, priority_level
from amqpbroker.core.records import AddMessage, AddQueue
from amqpbroker.store.backlog import JournalBacklog
from amqpbroker.store.codec import MessageLayout, MessageRow, add_message_of_row
from amqpbroker.store.journal import JournalState
from amqpbroker.store.locs import Run, pack_view
from amqpbroker.store.state import ROW, StoredMessage

log = logging.getLogger(__name__)

# The longest run of references restored in one call: a run's list of tuples is garbage
# once restored, so a bounded one is made of the same few pages again, not of fresh heap
# for every reference (issue 23 item 4, fifth pass: ~70 MB less at the peak for 1M).
RUN_MAX: Final = 4096
_LAYOUT: Final = 11  # the length of a `codec.MessageLayout`: a message without its body
# `JournalBacklog.refs`'s six values of a reference as the bytes of its `array('q')`
# (native order): one `frombytes`, not `extend` with a tuple of six ints, each converted
# through the generic argument parser (issue 23, eighth pass: ~5% of a 1M recovery).
_SIX: Final = struct.Struct("=6q").pack

_QUEUE_FIELDS = {f.name for f in fields(QueueConfig)}

# The core's view of a stored message's scanned bytes: the protocol adapter's `message_of`,
# handed in by the server so that the store never imports the adapter (issue 18).
MessageOf = Callable[[sections.Scanned], Message]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What recovery put back (logged at start; tests read it)."""

    addresses: int
    queues: int
    messages: int
    refs: int
    orphans: int  # references to a queue that no longer exists (kept in the journal)


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off while the journal is opened and recovered.

    Recovery creates millions of objects that all stay alive (records, index slots,
    messages): each young collection promotes them, and every older one walks the whole
    growing heap again, which was about half of recovery's CPU time (issue 23 item 4:
    100k messages, 2.25 CPU-s with the collector, 1.25 without). Recovery makes no
    reference cycles worth waiting for. Restores the collector only if it was on.

    Everything allocated meanwhile is in the youngest generation: the first collection
    after would walk it all (~1 s per 200k messages). `freeze` (the broker process, which
    `tune_gc`s anyway) moves the heap out of the collector's sight first, as `tune_gc`.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


# Reads a live message back from the journal (`FileJournal.read_message`).
ReadMessage = Callable[[int], MessageRow | None]


def recover(
    broker: Broker,
    state: JournalState,
    message_of: MessageOf,
    *,
    run_max: int = RUN_MAX,
    read: ReadMessage | None = None,
    budget: int = -1,
) -> Recovered:
    """Rebuild addresses, queues and messages of `state` into `broker` (see module doc);
    at most `run_max` references in one `Broker.restore_many` call.

    `budget` (bytes, < 0: none; the broker's `global-max-size`) with `read`: messages go
    into memory until their bodies pass it (or until one the open left without its body,
    `FileJournal(body_budget=)`); the rest of each plain queue, from there on, stays in
    the journal as a `JournalBacklog` (store/backlog.py), read back as the queue drains,
    as paged messages are (issue 23: memory bounded during recovery)."""
    persistence = broker.persistence
    if persistence is not None:
        persistence.suspended = True
    try:
        return _recover(broker, state, message_of, run_max, read, budget)
    finally:
        if persistence is not None:
            persistence.suspended = False


def _recover(
    broker: Broker,
    state: JournalState,
    message_of: MessageOf,
    run_max: int,
    read: ReadMessage | None,
    budget: int,
) -> Recovered:
    for address in state.addresses:
        broker.create_address(
            address.name, set(address.routing_types), auto_created=address.auto_created
        )
    queues = 0
    for record in state.queues:
        if record.name in broker.queues:
            continue  # configured queues exist already; configuration wins
        broker.create_address(
            record.address, {record.routing_type}, auto_created=record.auto_created
        )
        broker.create_queue(_queue_config(record))
        queues += 1
    messages: dict[int, Message] = {}
    stored = state.stored_messages()
    refs = orphans = 0
    # Each run of references to one queue goes back in one call (issue 23 item 4), up to
    # `run_max`, in append order: the same order, and the same calls, as one at a time.
    run: list[tuple[Message, int, int]] = []
    run_queue = ""
    backlogs: dict[str, JournalBacklog] = {}
    backlog: JournalBacklog | None = None
    used = 0  # bytes of bodies put in memory
    for name, parts in state.ref_parts():
        if run:
            refs, orphans = _restore_run(broker, run_queue, run, refs, orphans)
        run, run_queue = [], name
        backlog = backlogs.get(name)
        for part in parts:
            if isinstance(part, Run):  # references the compact index holds, bodiless
                if backlog is None and budget >= 0 and read is not None:
                    backlog = _backlog(broker, name, read, message_of)
                    if backlog is not None:
                        backlogs[name] = backlog
                if backlog is not None:
                    backlog.adopt_run(part)  # no row a reference (issue 23, tenth pass)
                    refs += len(part)
                    continue
                rows = _run_rows(part)  # a queue that keeps all in memory: read them
            else:
                rows = part
            end = len(rows)
            i = 0
            while i < end:
                if len(run) >= run_max:
                    refs, orphans = _restore_run(broker, run_queue, run, refs, orphans)
                    run = []
                msg_id = rows[i]
                # (`ROW` longs: id, count, scheduled at, then size, first_ts, expiration of
                # a message the open left in its file, `BODILESS`: size >= 0)
                bodiless = rows[i + 3] >= 0
                if (
                    backlog is None
                    and budget >= 0
                    and read is not None
                    and (used >= budget or bodiless or _bodiless(stored[msg_id]))
                ):
                    backlog = _backlog(broker, name, read, message_of)
                    if backlog is not None:
                        backlogs[name] = backlog
                if backlog is not None:
                    if bodiless and min(rows[i + 3 :: ROW]) >= 0:
                        backlog.adopt(rows, i // ROW)  # the rest, all bodiless: no copy
                        refs += (end - i) // ROW
                        break
                    if bodiless:  # a run of them: their rows are the backlog's, as they are
                        j = i + ROW
                        while j < end and rows[j + 3] >= 0:
                            j += ROW
                        backlog.refs.extend(rows[i:j])
                        refs += (j - i) // ROW
                        i = j
                        continue
                    _left(backlog, stored[msg_id], rows[i + 1], rows[i + 2])
                    refs += 1
                    i += ROW
                    continue
                message = messages.get(msg_id)
                if message is None:
                    item = None if bodiless else stored[msg_id]
                    if item is None or _bodiless(item):  # no body read at open: read now
                        assert read is not None  # (not a plain queue, or no budget here)
                        row = read(msg_id)
                        assert row is not None, msg_id
                        item = row
                    assert not isinstance(item, tuple) or len(item) != _LAYOUT
                    message = messages[msg_id] = _message(
                        cast(AddMessage | MessageRow, item), message_of
                    )
                    used += message.size
                run.append((message, rows[i + 1], rows[i + 2]))
                i += ROW
    if run:
        refs, orphans = _restore_run(broker, run_queue, run, refs, orphans)
    for name, backlog in backlogs.items():
        backlog.added()
        broker.queues[name].attach_pages(backlog)
    broker.reserve_message_ids(state.max_msg_id)
    if orphans:
        log.warning(
            "journal: %d message references name queues that do not exist; left alone", orphans
        )
    return Recovered(len(state.addresses), queues, len(messages), refs, orphans)


def _backlog(
    broker: Broker, name: str, read: ReadMessage, message_of: MessageOf
) -> JournalBacklog | None:
    """A journal backlog for queue `name`, if it is a plain queue (last-value, ring and
    non-destructive queues stay in memory, as with paging: decisions.md)."""
    queue = broker.queues.get(name)
    if queue is None or queue.kind is not None:
        return None
    persistence = broker.persistence

    def ack(msg_ids: list[int]) -> None:
        if persistence is not None:
            persistence.refs_removed(name, msg_ids)

    def materialise(row: MessageRow) -> Message:
        message = _message_of_row(row, message_of)
        message.stored = True
        return message

    return JournalBacklog(
        read=read, materialise=materialise, ack=ack, open_tail=lambda: broker.page_store(queue)
    )


def _run_rows(run: Run) -> array[int]:
    """A run's references as rows (`ROW` longs each: id, count 0, no schedule, size):
    for a queue that keeps every message in memory (last-value, ring, non-destructive:
    recovery reads their bodies now)."""
    rows = array("q")
    ids, _, _, sizes = pack_view(run.pack)
    for i in range(run.start, run.end):
        rows.frombytes(_SIX(ids[i], 0, 0, sizes[i], 0, 0))
    return rows


def _bodiless(item: StoredMessage) -> bool:
    """Whether the open left this message's body in the journal (a layout)."""
    return isinstance(item, tuple) and len(item) == _LAYOUT


def _left(backlog: JournalBacklog, item: StoredMessage, count: int, at_ms: int) -> None:
    """Leave a reference in the journal: what the backlog keeps of it, appended to its
    array in one call (`JournalBacklog.add`'s six values)."""
    refs = backlog.refs
    if isinstance(item, AddMessage):
        refs.frombytes(
            _SIX(item.msg_id, count, at_ms, len(item.data), item.first_ts, item.expiration_ms)
        )
    elif len(item) == _LAYOUT:  # (msg_id, address, durable, start, stop, expiration, first_ts..)
        layout = cast(MessageLayout, item)
        refs.frombytes(_SIX(layout[0], count, at_ms, layout[4] - layout[3], layout[6], layout[5]))
    else:  # a row: (msg_id, address, durable, data, expiration_ms, first_ts, ...)
        row = cast(MessageRow, item)
        refs.frombytes(_SIX(row[0], count, at_ms, len(row[3]), row[5], row[4]))


def _restore_run(
    broker: Broker, queue: str, run: list[tuple[Message, int, int]], refs: int, orphans: int
) -> tuple[int, int]:
    """Restore `run` into `queue`; the counts of restored and orphaned references after."""
    if broker.restore_many(queue, run):
        return refs + len(run), orphans
    return refs, orphans + len(run)


def _queue_config(record: AddQueue) -> QueueConfig:
    extra = dict(record.extra)
    nested = extra.pop("extra", {})
    known = {k: v for k, v in extra.items() if k in _QUEUE_FIELDS}
    return QueueConfig(
        name=record.name,
        address=record.address,
        routing_type=record.routing_type,
        durable=True,
        filter=record.filter,
        auto_created=record.auto_created,
        extra=dict(nested) if isinstance(nested, dict) else {},
        **known,
    )


def _message(stored: AddMessage | MessageRow, message_of: MessageOf) -> Message:
    if isinstance(stored, tuple):
        return _message_of_row(stored, message_of)
    record = stored
    scanned: sections.Scanned | None = None
    if record.header_end < 0:  # an older journal's: scanned again
        try:
            scanned = sections.scan(record.data)
        except sections.SectionError as e:
            # Fifth attack pass: a record with a right checksum whose message does not
            # decode (no broker wrote it) ended the start with a traceback, no file
            # named and no --skip-corrupt-journal way past it. Restored as its bytes,
            # as a record of the current layout is (never scanned at the open).
            log.error("journal: message %d does not decode (%s); kept as stored", record.msg_id, e)
    if scanned is None:  # scanned when it was stored: no need to scan again
        return Message(
            record.data,
            msg_id=record.msg_id,
            durable=True,
            priority=record.priority,
            expiration_ms=record.expiration_ms,  # computed once (B-080/B-083)
            header_end=max(record.header_end, 0),
            head_end=record.head_end,
            header=None if record.header_count < 0 else {"delivery-count": record.header_count},
            address=record.address,
            first_ts=record.first_ts,
            reader=sections.READER,
        )
    message = message_of(scanned)
    message.msg_id = record.msg_id
    message.address = record.address
    message.first_ts = record.first_ts
    message.expiration_ms = record.expiration_ms  # computed once (B-080/B-083)
    message.ttl_ms = None
    message.priority = priority_level(record.priority)
    message.durable = True
    return message


def _message_of_row(row: MessageRow, message_of: MessageOf) -> Message:
    """`_message` of the open's row of an AddMessage (`codec.MessageRow`): its fields by
    index, no record in between (issue 23 item 4)."""
    (
        msg_id,
        address,
        _,
        data,
        expiration_ms,
        first_ts,
        priority,
        header_end,
        head_end,
        header_count,
    ) = row
    if header_end < 0:  # an older journal's: scanned again
        return _message(add_message_of_row(row), message_of)
    return Message(
        data,
        msg_id=msg_id,
        durable=True,
        priority=priority,
        expiration_ms=expiration_ms,  # computed once (B-080/B-083)
        header_end=header_end,
        head_end=head_end,
        header=None if header_count < 0 else {"delivery-count": header_count},
        address=address,
        first_ts=first_ts,
        reader=sections.READER,
    )
