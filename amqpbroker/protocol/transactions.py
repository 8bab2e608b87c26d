"""AMQP local transactions (B-140…B-144): the coordinator link and transactional work.

A client attaches a link whose target is a `coordinator`, declares a transaction on it
(`declare` → `declared{txn-id}`) and ends it with `discharge{txn-id, fail}`. In between:

* transfers carrying `transactional-state{txn-id}` are answered
  `transactional-state{txn-id, accepted}` at once and *kept*: they are routed only on
  commit, and dropped on rollback (B-141);
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

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cproton_ffi import lib
from proton import Condition, Delivery, Described, ulong

from amqpbroker.core import ConsumerId, DeliveryId
from amqpbroker.protocol import sections
from amqpbroker.protocol.peer import PeerInvalidField, data_at, read_data

log = logging.getLogger(__name__)

DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
_ACCEPTED_LIST = 0x24
_DECLARE = (0x31, "amqp:declare:list")
_DISCHARGE = (0x32, "amqp:discharge:list")
UNKNOWN_ID = "amqp:transaction:unknown-id"


class ControlError(Exception):
    """A coordinator request the broker refuses (answered `rejected`)."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(eq=False)
class Transaction:
    """One declared transaction of a connection."""

    id: bytes
    # each kept send, as the call that routes it on commit (B-141)
    sends: list[Callable[[], None]] = field(default_factory=list)
    # (consumer, delivery id, the unsettled wire delivery or None when settled)
    acks: list[tuple[ConsumerId, DeliveryId, Delivery | None]] = field(default_factory=list)


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
