"""AMQP local transactions (B-140…B-144): the coordinator link and transactional work.

A client attaches a link whose target is a `coordinator`, declares a transaction on it
(`declare` → `declared{txn-id}`) and ends it with `discharge{txn-id, fail}`. In between:

* transfers carrying `transactional-state{txn-id}` are checked as routing would check
  them (permission, address, limits), answered `transactional-state{txn-id, accepted}`
  and *kept*: they are routed only on commit, and dropped on rollback (B-141). A send
  that fails the check is rejected and makes the transaction rollback-only; a commit
  checks all its sends again before routing any, so it routes all of them or none;
* dispositions `transactional-state{txn-id, accepted}` acknowledge on commit; on
  rollback an unsettled delivery stays acquired with its count + 1 (B-142, `hold`), a
  settled one goes back to its queue with the attempt counted (B-143);
* other outcomes inside a transaction (released, modified, rejected) apply at once
  (decision: only acceptance is deferred);
* a connection that ends with transactions open rolls them back (B-143, forced).

Everything one commit does happens in one loop step, so its durable records are one
journal append: all of a commit's sends and acknowledgements come back after a crash,
or none. Pre-settled consumers never take part (B-144): their deliveries were
acknowledged when sent.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cproton_ffi import lib
from proton import Condition, Delivery, Described, ulong

import amqpbroker.protocol.pnloop as pnloop
from amqpbroker.amqp import sections
from amqpbroker.core import (
    ACCEPTED,
    Broker,
    ClientError,
    ConnectionId,
    ConsumerId,
    DeliveryId,
)
from amqpbroker.protocol.dispositions import outcome_of
from amqpbroker.protocol.peer import PeerInvalidField, data_at, read_data
from amqpbroker.protocol.shell import ConsumerLink, Prepared, ProducerLink

log = logging.getLogger("amqpbroker.protocol.handler")  # kept from before the split (issue 18)

DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
_ACCEPTED_LIST = 0x24
_DECLARE = (0x31, "amqp:declare:list")
_DISCHARGE = (0x32, "amqp:discharge:list")
UNKNOWN_ID = "amqp:transaction:unknown-id"
MAX_TRANSACTIONS = 1024  # declared and not yet discharged, per connection (issue 15)
# The message bytes a connection's open transactions may keep until their discharge
# (issue 15 attack): kept sends are held in memory, outside every address limit and the
# global max size, so a peer that never discharged grew the broker without bound (540 MB
# from one connection). A send past it is refused with resource-limit-exceeded and its
# transaction can only roll back (B-154 style), so that a commit never routes a part.
MAX_TRANSACTION_BYTES = 64 * 1024 * 1024
# A declare or discharge is a few dozen bytes; the coordinator link takes none past this
# (issue 15 attack): max-message-size is a producer's limit, and proton buffered an
# endless multi-frame transfer on a coordinator link (200 MB in, the broker 196 MB larger
# with max-message-size 50000). Such a link is closed with message-size-exceeded.
MAX_CONTROL_BYTES = 64 * 1024
# Transaction ids are unique in the broker process, not per connection: the event log's
# `txn` (B-170) must tell two connections' transactions apart.
_TXN_IDS = itertools.count(1)


class ControlError(Exception):
    """A coordinator request the broker refuses (answered `rejected`)."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(eq=False)
class Transaction:
    """One declared transaction of a connection."""

    id: bytes
    # each kept send, decoded and checked when it arrived, routed on commit (B-141)
    sends: list[Prepared] = field(default_factory=list)
    # (consumer, delivery id, the unsettled wire delivery or None when settled)
    acks: list[tuple[ConsumerId, DeliveryId, Delivery | None]] = field(default_factory=list)
    kept_bytes: int = 0  # of `sends`, counted in the connection's `kept_bytes`
    rollback_only: str | None = None  # why a send was refused: the commit rolls back


def control_request(raw: bytes) -> tuple[str, list[Any]]:
    """Decode a coordinator transfer: ("declare", fields) or ("discharge", fields).

    Decoded by the bounded section codec (issue 15); a discharge's fields are checked:
    txn-id binary, fail boolean or null.
    """
    try:
        scanned = sections.scan(raw)
        data = scanned.data
        start = scanned.body_start
        if data[start : start + 3] != b"\x00\x53\x77":
            raise sections.SectionError("the body is not one amqp-value section")
        body, _ = sections.decode_first(data, start + 3)
    except (sections.SectionError, IndexError) as e:
        raise ControlError("amqp:decode-error", f"undecodable coordinator message: {e}") from e
    if isinstance(body, sections.Described) and type(body.value) is list:
        fields = body.value
        if body.descriptor in _DECLARE:
            return "declare", fields
        if body.descriptor in _DISCHARGE:
            if not fields or as_txn_id(fields[0]) is None:
                raise ControlError("amqp:invalid-field", "discharge.txn-id is not a binary")
            if len(fields) > 1 and fields[1] is not None and type(fields[1]) is not bool:
                raise ControlError("amqp:invalid-field", "discharge.fail is not a boolean")
            return "discharge", fields
    raise ControlError("amqp:not-implemented", "expected a declare or discharge")


def as_txn_id(value: object) -> bytes | None:
    """A txn-id as bytes (proton decodes binary as bytes or memoryview)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


def _state_fields(delivery: Delivery) -> list[Any]:
    """The fields of the peer's `transactional-state`, checked (issue 15).

    Raises:
        PeerDecodeError, PeerInvalidField: the state is malformed or not a list.
    """
    field = "transactional-state"
    value = read_data(
        data_at(lib.pn_disposition_data(lib.pn_delivery_remote(delivery._impl))), field
    )
    if value is None:
        return []
    if not isinstance(value, list):
        raise PeerInvalidField(field, "not a list")
    return value


def txn_id_of(delivery: Delivery) -> bytes | None:
    """The txn-id of a `transactional-state` (the first field of its list)."""
    fields = _state_fields(delivery)
    if not fields:
        return None
    txn_id = as_txn_id(fields[0])
    if txn_id is None:
        raise PeerInvalidField("transactional-state.txn-id", "not a binary")
    return txn_id


def is_accepted(delivery: Delivery) -> bool:
    """Whether a consumer's `transactional-state` carries the `accepted` outcome."""
    fields = _state_fields(delivery)
    if len(fields) < 2 or not isinstance(fields[1], Described):
        return False
    return fields[1].descriptor in (ulong(_ACCEPTED_LIST), "amqp:accepted:list")


def answer_declared(delivery: Delivery, txn_id: bytes) -> None:
    delivery.local.data = [txn_id]
    delivery.update(DECLARED)
    delivery.settle()


def answer_transactional_accepted(delivery: Delivery, txn_id: bytes) -> None:
    delivery.local.data = [txn_id, Described(ulong(_ACCEPTED_LIST), [])]
    delivery.update(TRANSACTIONAL_STATE)
    delivery.settle()


def answer_rejected(delivery: Delivery, condition: str, description: str) -> None:
    delivery.local.condition = Condition(condition, description)
    delivery.update(Delivery.REJECTED)
    delivery.settle()


class _Transactions:
    """`AmqpConnection`'s transactions: coordinator requests, kept sends and accepts,
    commit and rollback (a mixin: it declares the connection state it uses, which
    `AmqpConnection.__init__` sets)."""

    broker: Broker
    id: ConnectionId
    transactions: dict[bytes, Transaction]
    kept_bytes: int  # of the kept sends of every open transaction (MAX_TRANSACTION_BYTES)
    # the other part's (transfers.py)
    _prepare: Callable[[ProducerLink, bytes], Prepared]
    _check_send: Callable[[Prepared], None]
    _route: Callable[[Prepared], None]
    _stored: Callable[[Delivery, BaseException | None], None]

    def _on_control(self, delivery: Delivery, raw: bytes) -> None:
        try:
            kind, fields = control_request(raw)
            if kind == "declare":
                if fields and fields[0] is not None:
                    # Fourth attack pass: answered `declared`, a client took its work for
                    # part of a distributed transaction (transactions §4.5: global-id MUST
                    # NOT be set unless the coordinator offers distributed-transactions).
                    raise ControlError(
                        "amqp:not-implemented",
                        "distributed transactions are not supported (declare.global-id)",
                    )
                if len(self.transactions) >= MAX_TRANSACTIONS:
                    raise ControlError(
                        "amqp:resource-limit-exceeded",
                        f"more than {MAX_TRANSACTIONS} transactions on one connection",
                    )
                new_id = b"txn:%d" % next(_TXN_IDS)
                self.transactions[new_id] = Transaction(new_id)
                answer_declared(delivery, new_id)
                return
            named = as_txn_id(fields[0]) if fields else None
            txn = self.transactions.pop(named, None) if named is not None else None
            if txn is None:
                raise ControlError(UNKNOWN_ID, f"unknown transaction {named!r}")
            self.kept_bytes -= txn.kept_bytes
            if len(fields) > 1 and fields[1]:
                self._rollback(txn, forced=False)
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            elif txn.rollback_only is not None:
                self._rollback(txn, forced=False)
                answer_rejected(delivery, "amqp:transaction:rollback", txn.rollback_only)
            else:
                self._commit(txn, delivery)
        except ControlError as e:
            answer_rejected(delivery, e.condition, str(e))

    def _transactional_send(self, delivery: Delivery, producer: ProducerLink, raw: bytes) -> None:
        """B-141: kept until commit; answered transactional-state(accepted) now."""
        txn_id = txn_id_of(delivery)
        txn = self.transactions.get(txn_id) if txn_id is not None else None
        if txn is None:
            answer_rejected(delivery, UNKNOWN_ID, f"unknown transaction {txn_id!r}")
            return
        try:
            prepared = self._prepare(producer, raw)
            self._check_send(prepared)  # B-141: a routing error now, not at commit
        except (ClientError, sections.SectionError) as e:
            condition = e.condition if isinstance(e, ClientError) else "amqp:decode-error"
            txn.rollback_only = str(e)
            answer_rejected(delivery, condition, str(e))
            return
        if self.kept_bytes + len(raw) > MAX_TRANSACTION_BYTES:
            why = (
                f"the open transactions of this connection keep more than "
                f"{MAX_TRANSACTION_BYTES} bytes of messages: discharge them first"
            )
            txn.rollback_only = why
            answer_rejected(delivery, "amqp:resource-limit-exceeded", why)
            return
        txn.kept_bytes += len(raw)
        self.kept_bytes += len(raw)
        txn.sends.append(prepared)
        answer_transactional_accepted(delivery, txn.id)

    def _commit(self, txn: Transaction, discharge: Delivery) -> None:
        """Route the kept sends and acknowledge the accepted deliveries, in one step.

        Every send is checked again first (an address may have filled, a permission or an
        address gone since it arrived): one that would be refused rolls the whole
        transaction back, so a commit never routes a part of it (B-141).
        """
        errors = []
        for prepared in txn.sends:
            try:
                self._check_send(prepared)
            except ClientError as e:
                errors.append(str(e))
        if errors:
            self._rollback(txn, forced=False)
            answer_rejected(discharge, "amqp:transaction:rollback", "; ".join(errors)[:512])
            return
        store = self.broker.persistence
        stored_before = store.messages_added if store is not None else 0
        emitter = self.broker.emitter
        emitter.txn = txn.id.hex()  # B-170: the events of this commit carry it
        try:
            with self.broker.committing():
                for prepared in txn.sends:
                    try:
                        self._route(prepared)
                    except ClientError as e:  # checked above in this step: not expected
                        log.error("connection %s: a checked commit send failed: %s", self.id, e)
            for consumer, delivery_id, wire in txn.acks:
                self.broker.settle(consumer, delivery_id, ACCEPTED)
                if wire is not None:
                    wire.update(Delivery.ACCEPTED)
                    wire.settle()
        finally:
            emitter.txn = None
        if store is not None and store.must_wait(stored_before):
            store.when_stored(functools.partial(self._stored, discharge))
        else:
            discharge.update(Delivery.ACCEPTED)
            discharge.settle()

    def _rollback(self, txn: Transaction, *, forced: bool) -> None:
        """Drop the kept sends; B-142 for unsettled accepts, B-143 for the rest."""
        emitter = self.broker.emitter
        emitter.txn = txn.id.hex()  # B-170: `held` and `returned` carry it
        try:
            for consumer, delivery_id, wire in txn.acks:
                if wire is not None and not forced:
                    self.broker.hold(consumer, delivery_id)
                else:
                    self.broker.rollback_delivery(consumer, delivery_id)
        finally:
            emitter.txn = None

    def _transactional_outcome(self, delivery: Delivery, consumer: ConsumerLink[Any]) -> None:
        txn_id = txn_id_of(delivery)
        txn = self.transactions.get(txn_id) if txn_id is not None else None
        delivery_id = consumer.delivery_id(pnloop.key(delivery._impl))
        if txn is None:
            log.info(
                "connection %s: disposition in unknown transaction %r ignored", self.id, txn_id
            )
        elif is_accepted(delivery):
            txn.acks.append((consumer.id, delivery_id, None if delivery.settled else delivery))
        else:  # decision: only acceptance waits for the discharge
            outcome = outcome_of(delivery)
            if outcome is not None:
                self.broker.settle(consumer.id, delivery_id, outcome)
        if delivery.settled:
            delivery.settle()
