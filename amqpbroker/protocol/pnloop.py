"""The hot path's engine calls, fused in C when the build has `_pnloop` (issue 20).

Each cffi call into proton converts its arguments and releases and retakes the GIL:
~1k instructions, ~20 of them a queue message (callgrind). `_pnloop.c`, built by setup.py
with cffi beside mypyc's modules, does the several calls of one step in one, without the
GIL release: the collector's next event with its delivery, link, remote state (and a
modified outcome's two flags), pending bytes and partial flag, or a link's credit and
drain flag (`next_event`); a transfer's
read and advance (`recv`); accept and settle (`accept`, and `accept_stored`, which lets
go of the reference a durable send kept); an outgoing transfer with its
tag (`send`). It calls proton through the function pointers of python-qpid-proton's own
binding (`bind`), so it links nothing.

Without it (editable installs, no compiler, no cffi at build time) every name here is
the same calls through proton's binding, one by one: `FAST` says which (`transfers.py`
runs its event loop with `next_event` only when FAST; the rest is the same code).
"""

from __future__ import annotations

from typing import Any, Final

from cproton_ffi import ffi, lib

_pn_delivery: Final = lib.pn_delivery
_pn_delivery_settle: Final = lib.pn_delivery_settle
_pn_delivery_update: Final = lib.pn_delivery_update
_pn_decref: Final = lib.pn_decref
_pn_link_advance: Final = lib.pn_link_advance
_pn_link_recv: Final = lib.pn_link_recv
_pn_link_send: Final = lib.pn_link_send
_from_buffer: Final = ffi.from_buffer
_PN_ACCEPTED: Final = lib.PN_ACCEPTED

# The order of `_pnloop.c`'s SLOTS.
FUNCTIONS: Final = (
    "pn_collector_peek",
    "pn_collector_pop",
    "pn_event_delivery",
    "pn_event_type",
    "pn_event_link",
    "pn_delivery_link",
    "pn_delivery_pending",
    "pn_delivery_partial",
    "pn_delivery_remote_state",
    "pn_link_recv",
    "pn_link_advance",
    "pn_delivery_update",
    "pn_delivery_settle",
    "pn_delivery",
    "pn_link_send",
    "pn_link_credit",
    "pn_link_get_drain",
    "pn_decref",
    "pn_delivery_remote",
    "pn_disposition_is_failed",
    "pn_disposition_is_undeliverable",
)
# The constants `_pnloop.c` has as numbers.
_C_CONSTANTS: Final = {
    "PN_DELIVERY": 28,
    "PN_LINK_FLOW": 26,
    "PN_ACCEPTED": 36,
    "PN_MODIFIED": 39,
}


def bind(module: Any) -> bool:
    """Give `module` (a built `_pnloop`) proton's functions; whether it can be used."""
    if any(getattr(lib, name) != value for name, value in _C_CONSTANTS.items()):
        return False  # another proton's numbering: the calls one by one
    pointers = ffi.new(
        "void *[]", [ffi.cast("void *", ffi.addressof(lib, name)) for name in FUNCTIONS]
    )
    return int(module.lib.amqpb_bind(pointers, len(FUNCTIONS))) == len(FUNCTIONS)


# A delivery's tag is written here and handed to `pn_delivery`, which copies it: one
# buffer for the loop thread, not a `from_buffer` cdata per transfer (issue 20).
_TAG_BYTES: Final = 24  # a delivery id in decimal: at most 20 digits
TAG: Final = ffi.new("char[]", _TAG_BYTES)
# The `pn_delivery_tag_t` (size, start = `TAG`) for each tag length, built once: cffi
# converted a `(size, TAG)` tuple into the struct on every transfer (~0.9k instructions,
# callgrind; issue 20), it copies a struct cdata as it is. The pointers own the memory the
# structs (`[0]`) view, so they are kept too.
_TAG_POINTERS: Final = tuple(
    ffi.new("pn_delivery_tag_t *", (size, TAG)) for size in range(_TAG_BYTES + 1)
)
TAG_STRUCTS: Final[tuple[Any, ...]] = tuple(pointer[0] for pointer in _TAG_POINTERS)


def _recv(link: Any, buffer: Any, size: int) -> int:
    received: int = _pn_link_recv(link, buffer, size)
    _pn_link_advance(link)
    return received


def _accept(delivery: Any) -> None:
    _pn_delivery_update(delivery, _PN_ACCEPTED)
    _pn_delivery_settle(delivery)


def _accept_stored(delivery: Any) -> None:
    _pn_delivery_update(delivery, _PN_ACCEPTED)
    _pn_delivery_settle(delivery)
    _pn_decref(delivery)


def _send(link: Any, delivery_id: int, data: Any, size: int, settle: bool) -> Any:
    tag = b"%d" % delivery_id
    length = len(tag)
    TAG[0:length] = tag
    delivery = _pn_delivery(link, TAG_STRUCTS[length])
    _pn_link_send(link, data, size)
    _pn_link_advance(link)
    if settle:
        _pn_delivery_settle(delivery)
    return delivery


def _load() -> Any:
    try:
        import amqpbroker.protocol._pnloop as _pnloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return _pnloop if bind(_pnloop) else None


_module: Final = _load()
FAST: Final[bool] = _module is not None
# Typed `Any`: each is a cffi function of `_pnloop` or its fallback above.
next_event: Final[Any] = _module.lib.amqpb_next if FAST else None
recv: Final[Any] = _module.lib.amqpb_recv if FAST else _recv
accept: Final[Any] = _module.lib.amqpb_accept if FAST else _accept
settle: Final[Any] = _module.lib.amqpb_settle if FAST else _pn_delivery_settle
accept_stored: Final[Any] = _module.lib.amqpb_accept_stored if FAST else _accept_stored
send: Final[Any] = _module.lib.amqpb_send if FAST else _send


def slots_of(module: Any) -> tuple[Any, Any]:
    """`module`'s (a built `_pnloop`) out-arrays of `next_event` (pointers, numbers): C
    globals of the loop thread, shared by every event loop (`_pnloop.c`)."""
    return module.lib.amqpb_pointers, module.lib.amqpb_numbers


def new_slots() -> tuple[Any, Any]:
    """The out-arrays of `next_event` (pointers, numbers) for an event loop."""
    assert _module is not None
    return slots_of(_module)
