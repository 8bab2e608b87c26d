"""Proton delivery state -> core outcome (B-041…B-048).

`MessagingHandler.on_released` fires for RELEASED *and* MODIFIED, so the adapter reads
`remote_state` itself and never relies on the reactor's classification.
"""

from __future__ import annotations

from typing import Any, Final

from cproton_ffi import ffi, lib
from proton import Delivery

import amqpbroker.protocol.pnloop as pnloop
from amqpbroker.core.outcomes import ACCEPTED, FAILED, RELEASED, Modified, Outcome, Rejected
from amqpbroker.protocol.peer import PeerDecodeError, PeerInvalidField, data_at, read_symbol_map

# `Final`: compiled (setup.py), a C static, not a module-dict lookup per use (issue 20);
# the states typed `int`, so that comparing one with `state` is a C comparison.
_ACCEPTED: Final[int] = lib.PN_ACCEPTED
_RELEASED: Final[int] = lib.PN_RELEASED
_MODIFIED: Final[int] = lib.PN_MODIFIED
_REJECTED: Final[int] = lib.PN_REJECTED
_is_failed: Final = lib.pn_disposition_is_failed
_is_undeliverable: Final = lib.pn_disposition_is_undeliverable
_delivery_remote: Final = lib.pn_delivery_remote
_pointer: Final = pnloop.pointer  # the hot path's delivery (an int with `_pnloop`) as cdata
_ACCEPTED_OUTCOME: Final = ACCEPTED
_RELEASED_OUTCOME: Final = RELEASED
# The four modified outcomes, built once (issue 20: a frozen dataclass built per
# disposition was a measurable part of a redelivery), indexed by
# 2 x delivery-failed + undeliverable-here; delivery-failed alone is `FAILED`, which
# `Queue.settle` recognises without reading its fields.
_MODIFIED_OUTCOMES: Final[tuple[Modified, ...]] = (  # variadic: one object, not boxed per use
    Modified(),
    Modified(undeliverable_here=True),
    FAILED,
    Modified(delivery_failed=True, undeliverable_here=True),
)


def outcome_at(delivery: Any, state: int, modified: int = -1) -> Outcome | None:
    """The terminal outcome the consumer sent, from the engine's delivery (a `pn_delivery_t`
    pointer: the hot path, no wrapper) and its remote `state`; None for no or a
    non-terminal state (B-048: no action; the message stays acquired). `modified`: of a
    modified state, 2 x delivery-failed + undeliverable-here when the caller read them
    already (`pnloop.next_event`: three cffi calls a redelivery fewer), else -1."""
    if state == _ACCEPTED:
        return _ACCEPTED_OUTCOME
    if state == _RELEASED:
        return _RELEASED_OUTCOME
    if state == _MODIFIED:
        if modified >= 0:
            return _MODIFIED_OUTCOMES[modified]
        # (an int key only from the fused loop's rare paths: no call for a cdata)
        remote = _delivery_remote(_pointer(delivery) if type(delivery) is int else delivery)
        failed = 2 if _is_failed(remote) else 0
        return _MODIFIED_OUTCOMES[failed + (1 if _is_undeliverable(remote) else 0)]
    if state == _REJECTED:
        return _rejected(lib.pn_disposition_condition(lib.pn_delivery_remote(_pointer(delivery))))
    return None


def outcome_of(delivery: Delivery) -> Outcome | None:
    """`outcome_at` for a wrapped delivery."""
    return outcome_at(delivery._impl, delivery.remote_state)


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
