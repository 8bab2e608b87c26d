"""Journal record types: what the broker writes to storage, as values.

Treat records as immutable. They are not `frozen` dataclasses only because three of them
are built per durable message and a frozen dataclass costs about three times as much to
construct (the same trade-off as `core.lifecycle.LifecycleEvent`).

Every record type has a fixed numeric id (`RecordType`), written on disk with each record.
Like Artemis `JournalRecordIds`, an id is never reused or renumbered: a retired type keeps
its number, commented out, and a new type takes a new number. Where Artemis has the same
record, we use its number; numbers from 100 up are ours.

Fields are plain values (int, str, bytes, bool, tuples, small dicts, `RoutingType`) so that
`store/codec.py` can encode them without knowing the broker. Fields may be appended to a
record type later (with a default); they are never removed, reordered or retyped.

What the records mean to the journal (which records are *live* and kept by compaction):

* `AddMessage` is live while some `AddRef` for its `msg_id` has no `AckRef`. Write a
  message and its references in one `append`: a message without references is dropped
  on recovery, and an `AddRef` for a message that is gone is ignored.
* `AddRef` is live until its `AckRef`, or a `DeleteQueue` of its queue.
* `UpdateDeliveryCount` and `ScheduledDelivery` are live while their reference is, and
  only the latest one per reference (B-095: the last persisted count wins).
* `PageCursor`: the latest one per queue, until `DeleteQueue`.
* `PageSkip`: until its queue's `PageCursor` has passed every position it names, or a
  `DeleteQueue` (Artemis keeps its page-cursor acks until the page is complete).
* `AddQueue` until `DeleteQueue`; `AddAddress` until `DeleteAddress`; a later add of the
  same name replaces the earlier one.
* `AckRef`, `DeleteQueue`, `DeleteAddress` are tombstones: kept only while the record they
  cancel is still on disk. The `Tx*` records are placeholders (transactions come later) and
  are not kept by compaction yet.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from amqpbroker.core.model import DEFAULT_PRIORITY, RoutingType


@enum.unique
class RecordType(enum.IntEnum):
    """On-disk record type ids (u16). Never reuse or renumber one."""

    TX_PREPARE = 17  # Artemis JournalImpl.PREPARE_RECORD
    TX_COMMIT = 18  # Artemis JournalImpl.COMMIT_RECORD
    TX_ROLLBACK = 19  # Artemis JournalImpl.ROLLBACK_RECORD
    ADD_QUEUE = 21  # Artemis JournalRecordIds.QUEUE_BINDING_RECORD
    ADD_REF = 32  # Artemis JournalRecordIds.ADD_REF
    ACK_REF = 33  # Artemis JournalRecordIds.ACKNOWLEDGE_REF
    UPDATE_DELIVERY_COUNT = 34  # Artemis JournalRecordIds.UPDATE_DELIVERY_COUNT
    SCHEDULED_DELIVERY = 36  # Artemis JournalRecordIds.SET_SCHEDULED_DELIVERY_TIME
    ADD_ADDRESS = 44  # Artemis JournalRecordIds.ADDRESS_BINDING_RECORD
    ADD_MESSAGE = 45  # Artemis JournalRecordIds.ADD_MESSAGE_PROTOCOL
    DELETE_QUEUE = 101  # Artemis deletes the QUEUE_BINDING_RECORD by record id
    DELETE_ADDRESS = 102  # Artemis deletes the ADDRESS_BINDING_RECORD by record id
    PAGE_CURSOR = 103  # Artemis keeps page-cursor acks (PAGE_CURSOR_COMPLETE and others)
    PAGE_SKIP = 104  # Artemis JournalRecordIds.ACKNOWLEDGE_CURSOR, a page's worth at once


@dataclass(slots=True, kw_only=True)
class AddMessage:
    """A durable message: the encoded sections as received and the fields the core reads.

    `first_ts` is the epoch ms the broker first accepted it (kept across moves);
    `expiration_ms` is the absolute expiry, 0 for none.
    """

    type_id: ClassVar[RecordType] = RecordType.ADD_MESSAGE

    msg_id: int
    address: str
    durable: bool = True
    data: bytes = field(repr=False)
    expiration_ms: int = 0
    first_ts: int = 0
    priority: int = DEFAULT_PRIORITY
    # What the section scan found (`core.Message` fields), so that recovery need not scan
    # every message again (issue 23 item 4). header_end -1: not recorded (older journals).
    header_end: int = -1
    head_end: int = 0
    header_count: int = -1  # the producer's header delivery-count; -1: no such header


@dataclass(slots=True, kw_only=True)
class AddRef:
    """Message `msg_id` is in queue `queue`, with broker delivery count `delivery_count`."""

    type_id: ClassVar[RecordType] = RecordType.ADD_REF

    queue: str
    msg_id: int
    delivery_count: int = 0


@dataclass(slots=True, kw_only=True)
class AckRef:
    """The reference of `msg_id` in `queue` is gone (acknowledged, expired, moved, ...)."""

    type_id: ClassVar[RecordType] = RecordType.ACK_REF

    queue: str
    msg_id: int


@dataclass(slots=True, kw_only=True)
class UpdateDeliveryCount:
    """The persisted delivery count of a reference (B-095, B-096, B-097)."""

    type_id: ClassVar[RecordType] = RecordType.UPDATE_DELIVERY_COUNT

    queue: str
    msg_id: int
    delivery_count: int


@dataclass(slots=True, kw_only=True)
class ScheduledDelivery:
    """A reference may not be delivered before `at_ms` (epoch ms): redelivery delay, B-065."""

    type_id: ClassVar[RecordType] = RecordType.SCHEDULED_DELIVERY

    queue: str
    msg_id: int
    at_ms: int


@dataclass(slots=True, kw_only=True)
class AddQueue:
    """A durable queue bound to `address`; `extra` holds the rest of its configuration.

    `extra` takes JSON-like values (str, int, float, bool, None, lists, dicts); lists come
    back from the journal as tuples.
    """

    type_id: ClassVar[RecordType] = RecordType.ADD_QUEUE

    name: str
    address: str
    routing_type: RoutingType
    durable: bool = True
    filter: str | None = None
    auto_created: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class DeleteQueue:
    """Queue `name` is gone, and with it every reference it held."""

    type_id: ClassVar[RecordType] = RecordType.DELETE_QUEUE

    name: str


@dataclass(slots=True, kw_only=True)
class AddAddress:
    """An address and the routing types it supports."""

    type_id: ClassVar[RecordType] = RecordType.ADD_ADDRESS

    name: str
    routing_types: tuple[RoutingType, ...]
    auto_created: bool = False  # auto-created addresses are reaped again (B-111)


@dataclass(slots=True, kw_only=True)
class DeleteAddress:
    """Address `name` is gone (its queues are deleted by their own records)."""

    type_id: ClassVar[RecordType] = RecordType.DELETE_ADDRESS

    name: str


@dataclass(slots=True, kw_only=True)
class PageCursor:
    """Queue `queue` has read its page files up to (`page`, `offset`) (B-151 PAGE): what
    came before is in the journal or gone (`store/paging.py`)."""

    type_id: ClassVar[RecordType] = RecordType.PAGE_CURSOR

    queue: str
    page: int
    offset: int
    # where the last copy a management walk paged here ends (`store/paging.py`, kind 3):
    # a restart passes those after it (their move's append was lost, issue 23)
    committed_page: int = 0
    committed_offset: int = 0


@dataclass(slots=True, kw_only=True)
class PageSkip:
    """Queue `queue` removed the paged messages ending at `offsets` of page file `page`
    (a management walk took them, issue 23): a read back passes them. Journaled with the
    step that took them (a move's copies), so that a crash mid-walk repeats no move."""

    type_id: ClassVar[RecordType] = RecordType.PAGE_SKIP

    queue: str
    page: int
    offsets: tuple[int, ...]


@dataclass(slots=True, kw_only=True)
class TxPrepare:
    """Placeholder for transactions (issue 5): not yet written by the broker."""

    type_id: ClassVar[RecordType] = RecordType.TX_PREPARE

    txn_id: int


@dataclass(slots=True, kw_only=True)
class TxCommit:
    """Placeholder for transactions (issue 5): not yet written by the broker."""

    type_id: ClassVar[RecordType] = RecordType.TX_COMMIT

    txn_id: int


@dataclass(slots=True, kw_only=True)
class TxRollback:
    """Placeholder for transactions (issue 5): not yet written by the broker."""

    type_id: ClassVar[RecordType] = RecordType.TX_ROLLBACK

    txn_id: int


Record = (
    AddMessage
    | AddRef
    | AckRef
    | UpdateDeliveryCount
    | ScheduledDelivery
    | AddQueue
    | DeleteQueue
    | AddAddress
    | DeleteAddress
    | PageCursor
    | PageSkip
    | TxPrepare
    | TxCommit
    | TxRollback
)

RECORD_CLASSES: dict[RecordType, type[Record]] = {
    cls.type_id: cls
    for cls in (
        AddMessage,
        AddRef,
        AckRef,
        UpdateDeliveryCount,
        ScheduledDelivery,
        AddQueue,
        DeleteQueue,
        AddAddress,
        DeleteAddress,
        PageCursor,
        PageSkip,
        TxPrepare,
        TxCommit,
        TxRollback,
    )
}
