"""Proton delivery state -> core outcome (B-041…B-048).

`MessagingHandler.on_released` fires for RELEASED *and* MODIFIED, so the adapter reads
`remote_state` itself and never relies on the reactor's classification.
"""

from __future__ import annotations

from cproton_ffi import ffi, lib
from proton import Delivery

from amqpbroker.core.outcomes import ACCEPTED, RELEASED, Modified, Outcome, Rejected
from amqpbroker.protocol.peer import PeerDecodeError, PeerInvalidField, data_at, read_symbol_map


def outcome_of(delivery: Delivery) -> Outcome | None:
    """The terminal outcome the consumer sent, or None for no or a non-terminal state
    (B-048: no action; the message stays acquired)."""
    state = delivery.remote_state
    if state == Delivery.ACCEPTED:
        return ACCEPTED
    if state == Delivery.RELEASED:
        return RELEASED
    if state == Delivery.MODIFIED:
        remote = delivery.remote
        return Modified(
            delivery_failed=bool(remote.failed), undeliverable_here=bool(remote.undeliverable)
        )
    if state == Delivery.REJECTED:
        return _rejected(lib.pn_disposition_condition(lib.pn_delivery_remote(delivery._impl)))
    return None


def _rejected(condition: object) -> Rejected:
    """The rejected outcome's error, checked (issue 15): its condition goes into a
    dead-letter copy as a symbol (B-079), so it must be one.

    Raises:
        PeerDecodeError, PeerInvalidField: naming the `rejected.error` field at fault.
    """
    if not lib.pn_condition_is_set(condition):
        return Rejected()
    name = _c_text(lib.pn_condition_get_name(condition), "rejected.error.condition")
    if name is not None and not name.isascii():
        raise PeerInvalidField("rejected.error.condition", "not a symbol (ASCII)")
    description = _c_text(lib.pn_condition_get_description(condition), "rejected.error.description")
    read_symbol_map(data_at(lib.pn_condition_info(condition)), "rejected.error.info")
    return Rejected(condition=name, description=description)


def _c_text(raw: object, field: str) -> str | None:
    if not raw:
        return None
    try:
        return bytes(ffi.string(raw)).decode("utf-8")
    except UnicodeDecodeError:
        raise PeerDecodeError(field, "not valid UTF-8") from None
