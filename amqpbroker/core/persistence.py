"""Durable state changes as journal records (B-095…B-097), gathered per loop step.

The core calls the hooks below as it changes durable state: a durable message entering
a durable queue, leaving it, its delivery count changing, a redelivery being scheduled,
durable queues and addresses appearing and going. The hooks only collect records;
`flush()` (the shell calls it once per loop step) hands them to the journal as **one**
append, which the journal makes atomic. So a move (the original's `AckRef` and the copy's
`AddMessage` + `AddRef`) comes back whole after a crash or not at all, and a burst of
transfers read from one socket costs one append.

A durable send is settled to its producer only once its records are on disk
(`persistence.sync: true`): the handler registers a callback with `when_stored()`, which
the journal calls after the group commit that made the step durable. Records nobody waits
for (acknowledgements, counts, moves) are appended with `sync=False`; the journal syncs
them with the next group commit or shortly after (at-least-once: a lost ack redelivers).

When the journal fails (disk full, no file descriptors) the broker refuses durable sends
(`failure` is set, B-095 at-least-once for the rest) until the journal says it works
again (`resumed`, issue 15). The records of a failed append are gone, and with them may
go the `AddQueue` of a queue created in that step (auto-created by its first send):
`resumed` therefore journals the durable addresses and queues as they are now, so that
a message accepted after the recovery never names a queue the journal lacks.

Loop thread only: the journal adapter (server side) posts its callbacks back to the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from amqpbroker.core.model import Message, QueueConfig, RoutingType
from amqpbroker.core.records import (
    AckRef,
    AddAddress,
    AddMessage,
    AddQueue,
    AddRef,
    DeleteAddress,
    DeleteQueue,
    PageCursor,
    PageSkip,
    Record,
    ScheduledDelivery,
    UpdateDeliveryCount,
)

if TYPE_CHECKING:
    from amqpbroker.core.paging import PageStore
    from amqpbroker.core.refs import Ref

log = logging.getLogger(__name__)

OnStored = Callable[[BaseException | None], None]

# QueueConfig fields that AddQueue carries as fields of its own; the rest go in `extra`.
_QUEUE_RECORD_FIELDS = ("name", "address", "routing_type", "durable", "filter", "auto_created")


class RecordLog(Protocol):
    """What persistence needs of a journal (`store.journal.Journal` has it)."""

    def append(
        self, records: Sequence[Record], *, sync: bool, on_durable: OnStored | None = None
    ) -> None: ...

    def on_resume(self, callback: Callable[[], None]) -> None:
        """Call `callback()` on the loop thread each time the journal works again."""


class Persistence:
    """Collects the records of durable state changes and appends them once per step.

    Args:
        journal: where the records go; `on_durable` must be called on the loop thread.
        sync: `persistence.sync`: durable sends wait for the fsync of their records.
        max_redelivery_records: B-096: counts are written only while ≤ this (< 0: always).
        before_delivery: B-097 `persist-delivery-count-before-delivery`.
    """

    def __init__(
        self,
        journal: RecordLog,
        *,
        sync: bool = True,
        max_redelivery_records: int = 10,
        before_delivery: bool = False,
    ) -> None:
        self.journal = journal
        self.sync = sync
        self.max_redelivery_records = max_redelivery_records
        self.before_delivery = before_delivery
        self.messages_added = 0  # AddMessage records so far: the handler's "must wait?"
        self.failure: BaseException | None = None  # the journal stopped writing
        # Over `max-disk-usage` (core/diskguard.py): durable sends are refused while set.
        self.disk_full: BaseException | None = None
        # `DiskGuard.note_written` when max-disk-usage is checked: told about each
        # append's bytes (an estimate) so that it need not wait for its next scan.
        self.note_written: Callable[[int], None] | None = None
        # Why durable sends are refused now (the journal's failure, else the disk's
        # usage), None while they are taken: the one thing `Broker` checks per send.
        self.refusing: BaseException | None = None
        self._suspended = False
        # References recovery removed (a ring trimmed, a last value replaced): their
        # AckRefs are written once recovery ends (`suspended` set back to False).
        self._removed_while_suspended: list[Record] = []
        self._records: list[Record] = []
        self._moved_in: dict[str, PageStore] = {}  # queues a walk paged copies to (step)
        self._waiters: list[OnStored] = []
        self._written: list[OnStored] = []  # wait for the write only, not the sync
        # B-097: this step's dispatches carry counts that must be written first.
        self.dispatch_waits = False
        self._added: list[tuple[str, Ref]] = []  # this step's new references
        # Called with the references of an append that failed: the broker takes back
        # those still waiting, so a send refused to its producer is not delivered.
        self.on_lost: Callable[[list[tuple[str, Ref]]], None] = lambda refs: None
        # The durable topology as journaled (recovered ones too): what `resumed` writes.
        self._addresses: dict[str, AddAddress] = {}
        self._queues: dict[str, AddQueue] = {}
        # B-151 PAGE: makes this step's paged durable messages durable (the page files'
        # fsync) before the step's append, whose waiters settle their producers.
        self.before_flush: Callable[[], None] | None = None
        journal.on_resume(self.resumed)

    @property
    def suspended(self) -> bool:
        """Recovery: state comes from the journal, write nothing (but the removals)."""
        return self._suspended

    @suspended.setter
    def suspended(self, value: bool) -> None:
        self._suspended = value
        if not value and self._removed_while_suspended:
            self._records.extend(self._removed_while_suspended)
            self._removed_while_suspended = []

    # -- messages -------------------------------------------------------------------------
    def ref_added(self, queue: str, ref: Ref, *, scheduled_at_ms: int = 0) -> None:
        """A durable message entered a durable queue (its AddMessage once per message)."""
        if self._suspended:
            return
        message = ref.message
        records = self._records
        if not message.stored:
            message.stored = True
            self.messages_added += 1
            records.append(_add_message(message))
        records.append(_add_ref(queue, message.msg_id, ref.delivery_count))
        ref.stored_count = ref.delivery_count
        self._added.append((queue, ref))
        if scheduled_at_ms:
            records.append(
                ScheduledDelivery(queue=queue, msg_id=message.msg_id, at_ms=scheduled_at_ms)
            )

    def paged(self) -> None:
        """A durable message went to a durable queue's page files (B-151 PAGE): its
        producer waits for this step's flush, as for a journaled one."""
        if not self.suspended:
            self.messages_added += 1

    def page_read(self, queue: str, pages: PageStore) -> None:
        """Paged messages were read back into `queue` (their AddMessage/AddRef are in
        this step), or removed by a management walk (its moved copies are): journal the
        removed ones' positions (`PageSkip`) and the cursor with them; once it is on
        disk the page files before it may go."""
        position = pages.cursor
        if self.suspended or position is None:
            return  # (None: a recovered queue's part in the journal, store/backlog.py)
        records = self._records
        for skipped_page, offsets in pages.journal_skips():
            records.append(PageSkip(queue=queue, page=skipped_page, offsets=offsets))
        records.append(_page_cursor(queue, position, pages.committed))
        if pages.releasable:

            def release(error: BaseException | None) -> None:
                if error is None:
                    pages.release(position)

            self.when_stored(release)

    def moved_in(self, queue: str, pages: PageStore) -> None:
        """A management walk paged a copy to `queue` (B-151, issue 23): its cursor, with
        where its copies end (`committed`), goes into this step's append, the one that
        removes their originals (written at `flush`: the step's last copy counts)."""
        if not self.suspended:
            self._moved_in[queue] = pages

    def ref_removed(self, queue: str, ref: Ref) -> None:
        """Acknowledged, expired, dead-lettered, moved, purged: the reference is gone."""
        record = _ack_ref(queue, ref.message.msg_id)
        if self._suspended:  # recovery removed it (B-120, B-121): journal that afterwards
            self._removed_while_suspended.append(record)
        else:
            self._records.append(record)
        ref.stored_count = None

    def refs_removed(self, queue: str, msg_ids: list[int]) -> None:
        """References left in the journal at recovery (`store/backlog.py`) removed
        without being read back (purged, removed by management): acknowledged."""
        self._records.extend(_ack_ref(queue, msg_id) for msg_id in msg_ids)

    def count_changed(self, queue: str, ref: Ref) -> None:
        """B-095/B-096: persist the count unless it is past the cap or unchanged."""
        count = ref.delivery_count
        cap = self.max_redelivery_records
        if count == ref.stored_count or (cap >= 0 and count > cap) or self._suspended:
            return
        ref.stored_count = count
        self._records.append(
            UpdateDeliveryCount(queue=queue, msg_id=ref.message.msg_id, delivery_count=count)
        )

    def count_before_delivery(self, queue: str, ref: Ref) -> None:
        """B-097: the incremented count goes to the journal before the transfer does
        (the shell holds this step's dispatches until the append is written)."""
        before = len(self._records)
        self.count_changed(queue, ref)
        if len(self._records) != before:
            self.dispatch_waits = True

    def scheduled(self, queue: str, ref: Ref, at_ms: int) -> None:
        """A redelivery delay (B-065): after a restart it still waits until `at_ms`."""
        if not self.suspended:
            self._records.append(
                ScheduledDelivery(queue=queue, msg_id=ref.message.msg_id, at_ms=at_ms)
            )

    # -- queues and addresses -------------------------------------------------------------
    def queue_added(self, config: QueueConfig) -> None:
        extra = {
            name: getattr(config, name)
            for name in QueueConfig.__dataclass_fields__
            if name not in _QUEUE_RECORD_FIELDS and name != "extra"
        }
        if config.extra:
            extra["extra"] = dict(config.extra)
        record = AddQueue(
            name=config.name,
            address=config.address,
            routing_type=config.routing_type,
            durable=True,
            filter=config.filter,
            auto_created=config.auto_created,
            extra=extra,
        )
        self._queues[config.name] = record
        if not self.suspended:
            self._records.append(record)

    def queue_deleted(self, name: str) -> None:
        self._queues.pop(name, None)
        self._moved_in.pop(name, None)
        if not self.suspended:
            self._records.append(DeleteQueue(name=name))

    def address_changed(
        self, name: str, routing_types: set[RoutingType], auto_created: bool
    ) -> None:
        record = AddAddress(
            name=name,
            routing_types=tuple(sorted(routing_types, key=lambda t: t.value)),
            auto_created=auto_created,
        )
        self._addresses[name] = record
        if not self.suspended:
            self._records.append(record)

    def address_deleted(self, name: str) -> None:
        self._addresses.pop(name, None)
        if not self.suspended:
            self._records.append(DeleteAddress(name=name))

    # -- the step boundary ----------------------------------------------------------------
    def must_wait(self, messages_added_before: int) -> bool:
        """Whether a send must wait for `when_stored`: it added messages to the journal
        (`messages_added` moved since the caller read it) and `sync` is on."""
        return self.sync and self.messages_added != messages_added_before

    def when_stored(self, callback: OnStored) -> None:
        """Call `callback(error)` once this step's records are on disk (or failed)."""
        self._waiters.append(callback)

    def when_written(self, callback: OnStored) -> None:
        """Call `callback(error)` once this step's records are written (not synced): what
        a process crash cannot lose."""
        self._written.append(callback)

    def flush(self) -> None:
        """Append this step's records as one atomic append."""
        if self._moved_in:
            moved_in, self._moved_in = self._moved_in, {}
            for queue, pages in moved_in.items():
                position = pages.cursor
                if position is not None:
                    self._records.append(_page_cursor(queue, position, pages.committed))
        page_error: OSError | None = None
        if self.before_flush is not None:
            try:
                self.before_flush()
            except OSError as e:  # paged durable messages not synced: refuse, never pretend
                log.warning("paging: page files could not be synced: %s", e)
                page_error = e
        records = self._records
        written = self._written  # these wait in append order, even behind an empty append
        waiters = self._waiters + written if written else self._waiters
        sync = bool(self._waiters)
        self._waiters, self._written = [], []
        if page_error is not None:  # this step's producers are refused (at-least-once)
            for waiter in waiters:
                waiter(page_error)
            waiters = []
        if not records and not written:
            self._added.clear()
            for waiter in waiters:  # nothing was written for them after all
                waiter(self.failure)
            return
        self._records = []
        if self.note_written is not None and records:
            self.note_written(_estimated_bytes(records))
        added, self._added = self._added, []
        # Nothing waits on a step of acks and counts alone: no callback for the writer
        # thread and then the loop to run. A write error still fails the journal, and the
        # next append that is waited for hears of it.
        done = self._done(waiters, added) if waiters or added else None
        try:
            self.journal.append(records, sync=sync, on_durable=done)
        except ValueError as e:
            # A record the journal cannot encode (store's CodecError, a UnicodeEncodeError):
            # nothing was written and the journal works. This step is refused as a failed
            # append is; then, as after a journal that works again, the topology is
            # journaled anew and durable sends are taken (issue 15 attack: three peer
            # inputs, now refused where they enter, made every later durable send fail
            # until a restart).
            log.error("journal: this step's records cannot be encoded, refused: %s", e)
            if done is None:
                self._failed(e)
            else:
                done(e)
            self.resumed()
        except Exception as e:  # closed or failed journal: refuse, never pretend
            if done is None:
                self._failed(e)
            else:
                done(e)

    def _done(self, waiters: list[OnStored], added: list[tuple[str, Ref]]) -> OnStored:
        def done(error: BaseException | None) -> None:
            if error is not None:
                self._failed(error)
                if added:
                    self.on_lost(added)
            for waiter in waiters:
                waiter(error)

        return done

    def _failed(self, error: BaseException) -> None:
        # The journal logs the failure and its recovery (one warning, one info).
        if self.failure is None:
            self.failure = error
            self.refusing = error
            log.debug("refusing durable messages until the journal works again: %s", error)

    def resumed(self) -> None:
        """The journal works again: accept durable messages, and journal the durable
        addresses and queues as they are now (a failed append may have held some)."""
        if self.failure is None:
            return
        self.failure = None
        self.refusing = self.disk_full
        topology: list[Record] = [*self._addresses.values(), *self._queues.values()]
        if topology:
            try:
                self.journal.append(topology, sync=False)
            except Exception as e:  # closed meanwhile: refuse again, never pretend
                self._failed(e)
        log.debug("accepting durable messages again")

    def set_disk_full(self, cause: BaseException | None) -> None:
        """Refuse durable sends for `cause` (the data directory's file system is over
        `max-disk-usage`), or take them again (None) unless the journal itself failed:
        what the disk has left is kept for acks, rolls and compaction."""
        self.disk_full = cause
        self.refusing = self.failure or cause


# What a journal record takes beyond a message's bytes, about (its frame's header and
# fields; store/framing.py): for `DiskGuard`'s estimate between scans, not an exact size.
RECORD_ESTIMATE_BYTES = 64


def _estimated_bytes(records: list[Record]) -> int:
    """About what `records` take in the journal: each message's bytes and a record's
    overhead (`DiskGuard.note_written`)."""
    size = RECORD_ESTIMATE_BYTES * len(records)
    for record in records:
        if type(record) is AddMessage:
            size += len(record.data)
    return size


# The records written per durable message, built without the dataclass's keyword call:
# about a third of its cost (issue 20, durable path). Each sets every field the class
# declares (tests/unit/core/test_persistence_records.py compares with the constructor).
_new = object.__new__


def _add_message(message: Message) -> AddMessage:
    record: AddMessage = _new(AddMessage)
    record.msg_id = message.msg_id
    record.address = message.address
    record.durable = True
    record.data = message.data
    record.expiration_ms = message.expiration_ms
    record.first_ts = message.first_ts
    record.priority = message.priority
    record.header_end = message.header_end
    record.head_end = message.head_end
    header = message.header
    record.header_count = -1 if header is None else header.get("delivery-count", 0)
    return record


def _add_ref(queue: str, msg_id: int, delivery_count: int) -> AddRef:
    record: AddRef = _new(AddRef)
    record.queue = queue
    record.msg_id = msg_id
    record.delivery_count = delivery_count
    return record


def _page_cursor(queue: str, position: tuple[int, int], committed: tuple[int, int]) -> PageCursor:
    return PageCursor(
        queue=queue,
        page=position[0],
        offset=position[1],
        committed_page=committed[0],
        committed_offset=committed[1],
    )


def _ack_ref(queue: str, msg_id: int) -> AckRef:
    record: AckRef = _new(AckRef)
    record.queue = queue
    record.msg_id = msg_id
    return record
