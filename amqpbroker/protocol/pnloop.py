"""The hot path's engine calls, fused in C when the build has `_pnloop` (issue 20).

Each cffi call into proton converts its arguments and its result (a new cdata object for
every pointer returned, ~0.7-1.2k instructions a call, callgrind). `_pnloop.c`, a plain
CPython extension built by setup.py beside mypyc's modules (METH_FASTCALL), does the
several calls of one step in one and takes and returns proton's pointers as ints, their
addresses: the collector's next event with its link, delivery, remote state (and a
modified outcome's two flags), pending bytes and partial flag, or a link's credit and
drain flag (`next_event`); the engine's output, one buffer straight into bytes
(`output`); a transfer's bytes, read and the link advanced (`recv`);
accept and settle (`accept`, and `accept_stored`, which lets go of the reference a
durable send kept); an outgoing transfer with its tag (`send`; `send_headed` for a redelivery's new
header before the stored bytes after the old one, not joined first); and the single calls the
hot path makes on a link or delivery. It calls proton through the function pointers of
python-qpid-proton's own binding (`bind`), so it links nothing.

With it, the maps the hot path reads by link or delivery (`Transfers.producers`,
`consumers`, `coordinators`, `incomplete`, `ConsumerLink.unsettled`) are keyed by those
ints: every key is made with `key` from a pointer, and `pointer` turns one back into a
cdata for proton's wrappers and binding on the rare paths. Without it (editable
installs, no compiler) the keys are the cdata pointers themselves and every name here is
proton's binding, one call at a time: `FAST` says which. There `next_event`, `send` and
`send_headed` are None: `Transfers` runs its own loop over the collector and
`ConsumerLink.send` makes the calls inline (a Python call more cost ~0.5k instructions a
message), so those two places are the fallback's only copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from cproton_ffi import ffi, lib

_pn_delivery_settle: Final = lib.pn_delivery_settle
_pn_delivery_update: Final = lib.pn_delivery_update
_pn_decref: Final = lib.pn_decref
_pn_link_advance: Final = lib.pn_link_advance
_pn_link_recv: Final = lib.pn_link_recv
_pn_transport_pending: Final = lib.pn_transport_pending
_pn_transport_peek: Final = lib.pn_transport_peek
_pn_transport_pop: Final = lib.pn_transport_pop
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
    "pn_link_current",
    "pn_delivery_aborted",
    "pn_delivery_settled",
    "pn_link_flow",
    "pn_incref",
    "pn_link_is_receiver",
    "pn_transport_pending",
    "pn_transport_peek",
    "pn_transport_pop",
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
    addresses = tuple(int(ffi.cast("uintptr_t", ffi.addressof(lib, name))) for name in FUNCTIONS)
    return int(module.bind(addresses)) == len(FUNCTIONS)


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


# A transfer of up to this many bytes is read into one buffer the loop thread reuses and
# copied out once (`ffi.unpack`): a bytearray, its cdata view and the copy to bytes were
# ~2k instructions a message (issue 20). Larger ones get a buffer of their own.
RECV_BYTES: Final = 64 * 1024
uncleared: Final = ffi.new_allocator(should_clear_after_alloc=False)
RECV_BUFFER: Final = uncleared("char[]", RECV_BYTES)


def _recv(link: Any, size: int) -> bytes | int:
    buffer = RECV_BUFFER if size <= RECV_BYTES else uncleared("char[]", size)
    received: int = _pn_link_recv(link, buffer, size)
    _pn_link_advance(link)
    return received if received < 0 else ffi.unpack(buffer, received)


def _accept(delivery: Any) -> None:
    _pn_delivery_update(delivery, _PN_ACCEPTED)
    _pn_delivery_settle(delivery)


def _accept_stored(delivery: Any) -> None:
    _pn_delivery_update(delivery, _PN_ACCEPTED)
    _pn_delivery_settle(delivery)
    _pn_decref(delivery)


def _output(transport: Any) -> bytes | None:
    pending: int = _pn_transport_pending(transport)
    if pending <= 0:
        return None if pending < 0 else b""
    buffer = uncleared("char[]", pending)  # filled whole by the engine: no zeroing
    _pn_transport_peek(transport, buffer, pending)
    _pn_transport_pop(transport, pending)
    data: bytes = ffi.buffer(buffer)[:]
    return data


def _load() -> Any:
    try:
        import amqpbroker.protocol._pnloop as _pnloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return _pnloop if bind(_pnloop) else None


def _key_of_address(impl: Any) -> Any:
    return impl if type(impl) is int else int(ffi.cast("uintptr_t", impl))


def _key_of_pointer(impl: Any) -> Any:
    return impl


def pointer(key: Any) -> Any:
    """A pointer of the hot path as proton's binding takes it: the cdata of an int key
    (`_pnloop`'s), a cdata as it is (the rare paths: wrappers, the binding's calls)."""
    return ffi.cast("void *", key) if type(key) is int else key


def calls(module: Any) -> dict[str, Any]:
    """The hot path's calls with `module` (a bound `_pnloop`) or, for None, proton's
    binding one call at a time: one place for both (the names below; the tests switch
    the pure-Python hot path with it, `support/pnloop.py`)."""
    if module is None:
        return {
            "FAST": False,
            "key": _key_of_pointer,
            "next_event": None,
            "recv": _recv,
            "accept": _accept,
            "settle": _pn_delivery_settle,
            "accept_stored": _accept_stored,
            "send": None,
            "send_headed": None,
            "incref": lib.pn_incref,
            "decref": _pn_decref,
            "link_credit": lib.pn_link_credit,
            "link_current": lib.pn_link_current,
            "link_flow": lib.pn_link_flow,
            "link_is_receiver": lib.pn_link_is_receiver,
            "delivery_aborted": lib.pn_delivery_aborted,
            "delivery_settled": lib.pn_delivery_settled,
            "delivery_partial": lib.pn_delivery_partial,
            "delivery_pending": lib.pn_delivery_pending,
            "remote_state": lib.pn_delivery_remote_state,
            "output": _output,
        }
    return {
        "FAST": True,
        "key": _key_of_address,
        "next_event": module.next,
        "recv": module.recv,
        "accept": module.accept,
        "settle": module.settle,
        "accept_stored": module.accept_stored,
        "send": module.send,
        "send_headed": module.send_headed,
        "incref": module.incref,
        "decref": module.decref,
        "link_credit": module.link_credit,
        "link_current": module.link_current,
        "link_flow": module.link_flow,
        "link_is_receiver": module.link_is_receiver,
        "delivery_aborted": module.delivery_aborted,
        "delivery_settled": module.delivery_settled,
        "delivery_partial": module.delivery_partial,
        "delivery_pending": module.delivery_pending,
        "remote_state": module.remote_state,
        "output": module.output,
    }


_module: Final = _load()
_calls: Final = calls(_module)
FAST: Final[bool] = _module is not None
# Typed `Any`: each is a function of `_pnloop` or its fallback above.
key: Final[Callable[[Any], Any]] = _calls["key"]  # a map key from a pointer (cdata or int)
next_event: Final[Any] = _calls["next_event"]
recv: Final[Any] = _calls["recv"]
accept: Final[Any] = _calls["accept"]
settle: Final[Any] = _calls["settle"]
accept_stored: Final[Any] = _calls["accept_stored"]
send: Final[Any] = _calls["send"]
send_headed: Final[Any] = _calls["send_headed"]
incref: Final[Any] = _calls["incref"]
decref: Final[Any] = _calls["decref"]
link_credit: Final[Any] = _calls["link_credit"]
link_current: Final[Any] = _calls["link_current"]
link_flow: Final[Any] = _calls["link_flow"]
link_is_receiver: Final[Any] = _calls["link_is_receiver"]
delivery_aborted: Final[Any] = _calls["delivery_aborted"]
delivery_settled: Final[Any] = _calls["delivery_settled"]
delivery_partial: Final[Any] = _calls["delivery_partial"]
delivery_pending: Final[Any] = _calls["delivery_pending"]
remote_state: Final[Any] = _calls["remote_state"]
# (transport) -> the engine's next output buffer as bytes, b"" for none, None once its
# output side is closed (`AmqpConnection._engine_output`)
output: Final[Any] = _calls["output"]
