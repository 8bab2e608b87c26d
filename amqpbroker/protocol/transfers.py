"""Transfers in and dispositions back: the hot path of a connection (issue 18 split).

Theory of operation
-------------------
A producer's transfer arrives as a `PN_DELIVERY` event on a receiving link. The frames
are checked against max-message-size as they come (B-152: the link ends with
`amqp:link:message-size-exceeded`); proton buffers a partial delivery until its last
frame. Then the bytes are read once, scanned for the few fields the core needs
(`sections.scan`: header, the positions of the other sections, no body decode) and
published as a `core.Message` (`message_of`): scheduled delivery (B-015), the anonymous
relay's `to` (B-009), the routing-type annotation and the duplicate id (B-012, decoded
only when its key's bytes are there) are read from the sections only when present. The
transfer is settled `accepted` at once, or, when the step wrote durable records, after
the journal has them on disk (`_settle_stored`: one callback per connection and loop
step, the `pn_delivery_t` kept with `pn_incref`). A `ClientError` rejects the transfer
(B-023: security and address-full keep their condition, all else `failed`); a malformed
message is rejected with `amqp:decode-error`. Producer credit is topped up to 1000 when it
falls below 300, unless the address is full under BLOCK (B-021, B-151).

A consumer's disposition comes back on a sending link: `dispositions.outcome_at` reads the
outcome (rejected is modified{delivery-failed} under `amqpRejectAsModified`, B-047; no
outcome leaves the message acquired, B-048) and `Broker.settle` applies it. Outgoing
transfers are `shell.ConsumerLink.send`. Transactional transfers and dispositions go to
`transactions.py`; coordinator links' transfers are its control requests.

Everything here reads events with the C API (`cproton_ffi`): no wrapper object per
message. `Transfers` is the connection's event loop over the collector (`process_events`:
transfers, dispositions and consumer credit here, the rare events to the connection's
handlers), a part of `AmqpConnection` by composition: a class of its own, which mypyc
compiles (setup.py), holding the state the hot path reads and calling the connection
(`Owner`) for the rest (transactions, closing a link, errors).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

from cproton_ffi import ffi, lib
from proton import Condition, Delivery, Event, Link

import amqpbroker.protocol.pnloop as pnloop
from amqpbroker.amqp import sections
from amqpbroker.core import (
    DUPLICATE_ID,
    FAILED,
    Broker,
    ClientError,
    ConnectionId,
    DeliveryId,
    Message,
    Rejected,
    annotated_routing_type,
)
from amqpbroker.core.broker import Hot, publish_message, set_consumer_credit, settle_delivery
from amqpbroker.protocol.dispositions import outcome_at
from amqpbroker.protocol.peer import name_for_log
from amqpbroker.protocol.shell import (
    ConsumerLink,
    Prepared,
    ProducerLink,
    Shell,
    wrong_direction,
)
from amqpbroker.protocol.transactions import MAX_CONTROL_BYTES, TRANSACTIONAL_STATE

log = logging.getLogger("amqpbroker.protocol.handler")  # kept from before the split (issue 18)

# What one connection's incomplete messages may hold together (B-152): this many times
# max-message-size, and at least MIN_INCOMPLETE_BYTES (room for a few clients' largest
# messages interleaved on one connection); no bound when max-message-size is 0.
INCOMPLETE_FACTOR = 4
MIN_INCOMPLETE_BYTES = 16 * 1024 * 1024
PRODUCER_CREDIT = 1000  # B-021 amqpCredits
PRODUCER_LOW_CREDIT = 300  # B-021 amqpLowCredits
_DUPLICATE_ID_KEY: Final = DUPLICATE_ID.encode()
_TRANSACTIONAL_STATE: Final = TRANSACTIONAL_STATE
_MAX_CONTROL_BYTES: Final = MAX_CONTROL_BYTES
# Typed `int`: compiled, a comparison with one is a C comparison, not a generic
# `PyObject_RichCompare` of two objects (~100 instructions each, issue 20).
_PN_DELIVERY: Final[int] = lib.PN_DELIVERY
_PN_TRANSPORT_CLOSED: Final[int] = lib.PN_TRANSPORT_CLOSED
_PN_TRANSPORT_TAIL_CLOSED: Final[int] = lib.PN_TRANSPORT_TAIL_CLOSED
_PN_LINK_FLOW: Final[int] = lib.PN_LINK_FLOW
_PN_MODIFIED: Final[int] = lib.PN_MODIFIED
_STATE_FAR: Final[int] = 255  # `pnloop.next_event`: a state of 255 or more, read it again
_PASSED_CONDITIONS = ("amqp:unauthorized-access", "amqp:resource-limit-exceeded")
# The C API of `_events` (without `_pnloop`: its pointers are cdata), bound once:
# compiled (setup.py), a `Final` name is a C static, so a call costs no module-dict
# lookup of `lib` and no attribute lookup on it.
_pn_collector_peek: Final = lib.pn_collector_peek
_pn_collector_pop: Final = lib.pn_collector_pop
_pn_delivery_link: Final = lib.pn_delivery_link
_pn_event_delivery: Final = lib.pn_event_delivery
_pn_event_link: Final = lib.pn_event_link
_pn_event_type: Final = lib.pn_event_type
_pn_link_get_drain: Final = lib.pn_link_get_drain
_pn_link_recv: Final = lib.pn_link_recv
_pn_link_advance: Final = lib.pn_link_advance
_pn_delivery_update: Final = lib.pn_delivery_update
_pn_delivery_settle: Final = lib.pn_delivery_settle
_PN_ACCEPTED: Final[int] = lib.PN_ACCEPTED
_unpack: Final = ffi.unpack
_RECV_BYTES: Final = pnloop.RECV_BYTES
_RECV_BUFFER: Final = pnloop.RECV_BUFFER
_uncleared: Final = pnloop.uncleared
# The engine calls of the code both loops share (`pnloop.py`): with `_pnloop` they take
# the int keys of its loop, one C call each; without, proton's binding.
_FAST: Final[bool] = pnloop.FAST
_pointer: Final = pnloop.pointer
_next_event: Final = pnloop.next_event
_recv: Final = pnloop.recv
_accept: Final = pnloop.accept
_settle: Final = pnloop.settle
_accept_stored: Final = pnloop.accept_stored
_incref: Final = pnloop.incref
_decref: Final = pnloop.decref
_link_credit: Final = pnloop.link_credit
_link_current: Final = pnloop.link_current
_link_flow: Final = pnloop.link_flow
_link_is_receiver: Final = pnloop.link_is_receiver
_delivery_aborted: Final = pnloop.delivery_aborted
_delivery_settled: Final = pnloop.delivery_settled
_delivery_partial: Final = pnloop.delivery_partial
_delivery_pending: Final = pnloop.delivery_pending
_remote_state: Final = pnloop.remote_state


class Owner(Protocol):
    """What the hot path calls back on its connection (`AmqpConnection`): the rare paths."""

    def _on_control(self, delivery: Delivery, raw: bytes) -> None: ...

    def _transactional_send(
        self, delivery: Delivery, producer: ProducerLink, raw: bytes
    ) -> None: ...

    def _transactional_outcome(self, delivery: Delivery, consumer: ConsumerLink[Any]) -> None: ...

    def close_link(self, link: Link, condition: str, description: str) -> None: ...

    def _refuse(self, error: ClientError, link: Any) -> None: ...

    def _fail(self, condition: str, description: str) -> None: ...


def incomplete_limit(max_message_size: int) -> int:
    """The bytes a connection's incomplete messages may hold (`_check_incomplete`)."""
    return max(INCOMPLETE_FACTOR * max_message_size, MIN_INCOMPLETE_BYTES)


class Transfers:
    """A connection's event loop and hot path: transfers in, dispositions and credit.

    A part of `AmqpConnection` by composition (`connection.transfers`), not a mixin, so
    that mypyc compiles it (setup.py: a native mixin's methods refuse the class that
    combines them). It holds the state the hot path reads (the link maps, which the
    connection shares, `closed`, `container_id`) and calls its `owner` for the rest.
    """

    def __init__(
        self,
        owner: Owner,
        shell: Shell[Any],
        connection_id: ConnectionId,
        peer: str,
        handlers: dict[int, Callable[[Event], None]],
        *,
        max_message_size: int,
        duplicate_detection: bool,
        reject_as_modified: bool,
        collector: Any,
    ) -> None:
        self.owner = owner
        self.shell = shell
        self.broker: Broker = shell.broker
        self.hot: Hot = self.broker.hot  # what the per-message calls read (`core.broker.Hot`)
        self.id = connection_id
        self.peer = peer
        self.handlers = handlers  # the rare events, through proton's wrappers
        self.max_message_size = max_message_size  # B-152: 0 for no limit
        self.duplicate_detection = duplicate_detection  # B-012 amqpDuplicateDetection
        self.reject_as_modified = reject_as_modified  # B-047
        self.collector = collector  # the pn_collector_t
        self.collector_key = pnloop.key(collector)  # as `_pnloop` takes it
        self.container_id = ""
        self.closed = False  # the broker side is done with this connection
        # Keyed by the pn_link_t pointer's `pnloop.key`, which the hot path reads from
        # events directly (its address, an int, with `_pnloop`).
        self.producers: dict[Any, ProducerLink] = {}
        self.consumers: dict[Any, ConsumerLink[Any]] = {}
        self.coordinators: set[Any] = set()  # transaction coordinator links (B-140)
        # link -> bytes of its incomplete message, and their sum (`_check_incomplete`)
        self.incomplete: dict[Any, int] = {}
        self.incomplete_bytes = 0
        self.awaiting: list[Any] | None = None  # durable sends of this loop step
        # Bytes of the transfers dropped after the engine buffered them (aborted, over
        # max-message-size, on an ended link): the engine keeps their buffers for its
        # next deliveries until the connection is freed, which the server then makes
        # happen (`MemoryReturner.released`, issue 23).
        self.dropped_bytes = 0

    def process_events(self) -> None:
        """Handle every pending engine event, then apply the broker's effects.

        Transfers, dispositions and flow are read with the C API (no wrapper objects per
        message); the rare events go to the connection's handlers with proton's wrappers.
        """
        if _FAST:
            self._events_fused()
        else:
            self._events()
        self.awaiting = None  # the step ends: its sends wait for this step's append
        self.shell.apply_effects()
        self.shell.dirty.add(self.owner)

    def _events_fused(self) -> None:
        """The event loop with `pnloop.next_event`: one C call an event reads the next
        event with its link, delivery, remote state, pending bytes and partial flag (and
        pops the one before), where `_events` makes four to seven (issue 20). The
        numbers come packed in its result (`_pnloop.c`): C arithmetic when compiled; the
        pointers come as ints, the keys of the link maps (`pnloop.key`)."""
        collector = self.collector_key
        handlers = self.handlers
        owner = self.owner
        producers, consumers = self.producers, self.consumers
        next_event = _next_event
        pop_previous = 0
        while True:
            # (packed, link, the delivery or else the event): typed, compiled, an
            # unpacking of a tuple, not of an object (`_pnloop.c`)
            event: tuple[int, Any, Any] | None = next_event(collector, pop_previous)
            if event is None:
                break
            packed, link, other = event
            pop_previous = 1
            kind = packed & 0xFF
            if self.closed and kind != _PN_TRANSPORT_CLOSED and kind != _PN_TRANSPORT_TAIL_CLOSED:
                continue  # issue 15: as in `_events`
            try:
                if kind == _PN_DELIVERY:
                    delivery = other
                    state = packed >> 9 & 0xFF
                    if state == _STATE_FAR:
                        state = _remote_state(delivery)  # (255 or more: never seen)
                    if link in producers:
                        self.transfer(delivery, link, packed >> 19, packed >> 8 & 1, state)
                    elif (consumer := consumers.get(link)) is not None and (
                        known := consumer.unsettled.get(delivery)
                    ) is not None:  # one we sent: its id, one dict read (issue 20)
                        # A modified outcome's flags, read in the same C call (B-044).
                        modified = packed >> 17 & 3 if state == _PN_MODIFIED else -1
                        self.disposition(delivery, consumer, state, modified, known)
                    else:
                        self.on_other_delivery(delivery, link, consumer)
                elif kind == _PN_LINK_FLOW:
                    self.link_flow(link, packed >> 9, packed >> 8 & 1)
                else:
                    handler = handlers.get(kind)
                    if handler is not None:
                        handler(Event.wrap(_pointer(other)))
            except ClientError as e:  # issue 15: a field of the peer's is malformed
                owner._refuse(e, link if kind == _PN_DELIVERY else None)
            except Exception:
                self._internal_error(kind)

    def _internal_error(self, kind: int) -> None:
        """A bug of the broker's at an engine event: logged with its traceback and the
        connection closed with internal-error, the one policy of both event loops."""
        log.exception(
            "internal error on connection %s (%s) at event %s: closing it",
            self.id,
            self.container_id or self.peer,
            kind,
        )
        self.owner._fail("amqp:internal-error", "internal error")

    def on_other_delivery(
        self, delivery: Any, link: Any, consumer: ConsumerLink[Any] | None
    ) -> None:
        """A delivery event neither on a producer link nor one the broker sent: a
        coordinator's transfer, a late disposition, or the peer's transfer on a link the
        broker sends on."""
        if consumer is None and _link_is_receiver(link):
            self.on_transfer(delivery, link)
        elif _link_current(link) == delivery:  # ours are never current
            # The peer sent on a link it receives on; proton keeps that
            # delivery as the link's next to send and would hold back a
            # detach behind it, so the connection ends (issue 15).
            self.owner._refuse(wrong_direction(), None)
        else:
            self.on_disposition(delivery, consumer)

    def _events(self) -> None:
        """The event loop through proton's binding, a call at a time (no `_pnloop`)."""
        collector = self.collector
        handlers = self.handlers
        owner = self.owner
        producers, consumers = self.producers, self.consumers
        peek, pop, event_type = _pn_collector_peek, _pn_collector_pop, _pn_event_type
        # A pointer's truth is whether it is NULL: cheaper than comparing it with
        # `ffi.NULL` (a generic rich comparison of two cdata objects, issue 20).
        while event := peek(collector):
            # A PN_DELIVERY event, and only that kind, has a delivery: one C call fewer
            # for the two events of every message than reading the kind first (issue 20).
            delivery = _pn_event_delivery(event)
            kind: int = _PN_DELIVERY if delivery else event_type(event)
            if self.closed and kind != _PN_TRANSPORT_CLOSED and kind != _PN_TRANSPORT_TAIL_CLOSED:
                pop(collector)  # issue 15: nothing a peer sends after the end is acted on
                continue  # (but the engine's end of input is seen: `finished` needs it)
            try:
                if kind == _PN_DELIVERY:
                    link = _pn_delivery_link(delivery)
                    # Producer links receive, consumer links send: the maps answer for
                    # nearly every delivery without a C call (cffi releases and retakes
                    # the GIL around each: ~370 instructions, issue 20); a delivery in its
                    # consumer link's `unsettled` is one the broker sent, never the
                    # peer's (no `pn_link_current` check).
                    if link in producers:
                        partial = _delivery_partial(delivery)
                        self.transfer(
                            delivery,
                            link,
                            _delivery_pending(delivery),
                            partial,
                            0 if partial else _remote_state(delivery),
                        )
                    elif (consumer := consumers.get(link)) is not None and (
                        known := consumer.unsettled.get(delivery)
                    ) is not None:  # one we sent, and its id (issue 20)
                        state = _remote_state(delivery)
                        self.disposition(delivery, consumer, state, -1, known)
                    else:
                        self.on_other_delivery(delivery, link, consumer)
                elif kind == _PN_LINK_FLOW:
                    self.on_link_flow(_pn_event_link(event))
                else:
                    handler = handlers.get(kind)
                    if handler is not None:
                        handler(Event.wrap(event))
            except ClientError as e:  # issue 15: a field of the peer's is malformed
                owner._refuse(
                    e,
                    _pn_delivery_link(_pn_event_delivery(event)) if kind == _PN_DELIVERY else None,
                )
            except Exception:
                self._internal_error(kind)
            pop(collector)

    def on_transfer(self, delivery: Any, link: Any) -> None:
        """A transfer's delivery event, read through proton's binding."""
        partial = _delivery_partial(delivery)
        self.transfer(
            delivery,
            link,
            _delivery_pending(delivery),
            partial,
            0 if partial else _remote_state(delivery),
        )

    def transfer(self, delivery: Any, link: Any, size: int, partial: int, state: int) -> None:
        """A transfer's delivery event: `size` its pending bytes, `partial` whether more
        frames follow, `state` its remote state (read only when not partial)."""
        if not size and _link_current(link) != delivery:
            # A delivery read already (its bytes are gone, an aborted one's pending is 1):
            # the peer's disposition of it (settling a durable send before the broker
            # has). `recv` reads the link's current delivery, whichever that is: it read
            # zero bytes of the next, still partial, and advanced past it, so an empty
            # message was routed (a consumer's client failed on it) and the next one was
            # dropped, its credit given back twice (fifth attack pass).
            return
        limit = self.max_message_size
        if (
            (size > _MAX_CONTROL_BYTES or (limit and size > limit))
            and not _delivery_aborted(delivery)
            and self._too_large(delivery, link, size)  # B-152: as the frames arrive
        ):
            return
        if partial:  # proton buffers the frames until the last one
            if link not in self.producers and link not in self.coordinators:
                _settle(delivery)  # a link the broker ended: dropped as it comes
                self.dropped_bytes += size
            elif limit:  # bounded with the connection's other incomplete messages
                self._check_incomplete(delivery, link, size, limit)
            return
        if self.incomplete:
            if _delivery_aborted(delivery):  # (its bytes are gone: the count was kept)
                self.dropped_bytes += self.incomplete.get(link, 0)
            self.forget_incomplete(link)
        # The bytes, the link advanced; an aborted delivery reads as PN_ABORTED (an int
        # < 0): no C call to ask (issue 20). With `_pnloop`, proton copies into the
        # bytes object itself (one call, no buffer of the loop's and its copy).
        received: bytes | int
        if _FAST:
            received = _recv(link, size)
        else:  # inline (a constant's branch): a call more costs pure Python ~0.5k
            buffer = _RECV_BUFFER if size <= _RECV_BYTES else _uncleared("char[]", size)
            count: int = _pn_link_recv(link, buffer, size)
            _pn_link_advance(link)
            received = count if count < 0 else _unpack(buffer, count)
        producer = self.producers.get(link)
        if producer is None or type(received) is not bytes:
            if link in self.coordinators and not _delivery_aborted(delivery):
                raw = received if type(received) is bytes else b""
                self.owner._on_control(Delivery.wrap(_pointer(delivery)), raw)
                self._top_up(link, None)
            else:
                _settle(delivery)
                if producer is not None:
                    _link_flow(link, 1)  # B-152: an aborted transfer's credit back
            return
        if producer.credit <= 0 and _link_credit(link) < 0:
            self._over_credit(delivery, producer)
            return
        raw = received
        if state == _TRANSACTIONAL_STATE:
            self.owner._transactional_send(Delivery.wrap(_pointer(delivery)), producer, raw)
            self._top_up(link, producer)
            return
        store = self.hot.persistence
        stored_before = store.messages_added if store is not None else 0
        try:
            self.publish(producer, raw)
        except ClientError as e:
            # B-023: security and address-full keep their condition; all else is `failed`
            # (B-009: even a missing address on the anonymous relay, as Artemis does).
            condition = e.condition if e.condition in _PASSED_CONDITIONS else "failed"
            _reject(delivery, condition, str(e))
            _settle(delivery)
        except sections.SectionError as e:
            log.info(
                "rejecting malformed message on connection %s link %r: %s",
                self.id,
                name_for_log(producer.link),
                e,
            )
            _reject(delivery, "amqp:decode-error", str(e))
            _settle(delivery)
        else:
            if store is not None and store.must_wait(stored_before):
                # Settled once its journal records are on disk (the group commit): one
                # callback per connection and loop step, the pn_delivery_t kept alive.
                awaiting = self.awaiting
                if awaiting is None:
                    awaiting = self.awaiting = []
                    store.when_stored(functools.partial(self.settle_stored, awaiting))
                _incref(delivery)
                awaiting.append(delivery)
            elif _FAST:
                _accept(delivery)  # and settled
            else:
                _pn_delivery_update(delivery, _PN_ACCEPTED)
                _pn_delivery_settle(delivery)
        self._top_up(link, producer)

    def _over_credit(self, delivery: Any, producer: ProducerLink) -> None:
        """A transfer the broker gave no credit for (AMQP 1.0 2.6.7): dropped, and its
        link detached with transfer-limit-exceeded (third attack pass). Proton counts
        the credit below zero and hands the transfer on: a producer ignoring credit went
        past a full BLOCK address without bound. `producer.credit` (at least the link's
        credit before this transfer, B-021) is checked first, so the engine is asked
        only when the credit may be spent."""
        _settle(delivery)
        description = "a transfer without link credit"
        log.info("connection %s link %r: %s", self.id, name_for_log(producer.link), description)
        self.owner.close_link(producer.link, "amqp:link:transfer-limit-exceeded", description)

    def _too_large(self, delivery: Any, link: Any, size: int) -> bool:
        """B-152: whether the delivery is over its link's limit (the acceptor's
        max-message-size for a producer, `MAX_CONTROL_BYTES` for a coordinator); if so,
        detach the link with message-size-exceeded and drop what arrived."""
        if link in self.coordinators:
            if size <= _MAX_CONTROL_BYTES:
                return False
            what, limit = "control message", _MAX_CONTROL_BYTES
            closing = Link.wrap(_pointer(link))
        else:
            limit = self.max_message_size
            if not limit or size <= limit:
                return False
            producer = self.producers.get(link)
            what, closing = "message", None if producer is None else producer.link
        _settle(delivery)
        self.dropped_bytes += size
        if closing is None:
            return True  # detached already: the rest of the message is discarded as it comes
        description = f"{what} of {size} bytes or more exceeds max-message-size {limit}"
        log.info("connection %s link %r: %s", self.id, closing.name, description)
        self.owner.close_link(closing, "amqp:link:message-size-exceeded", description)
        return True

    def _check_incomplete(self, delivery: Any, link: Any, size: int, limit: int) -> None:
        """B-152: the incomplete messages of the whole connection hold at most
        `incomplete_limit(limit)` bytes; the link whose frame passes it is detached with
        resource-limit-exceeded and its part dropped. max-message-size bounds one
        message, and each link may have one in progress: one connection held 16,384
        times max-message-size (64 sessions of 256 links; 82 MB from 2,048 links at
        max-message-size 50000, issue 15 attack). Counted here, link by link (proton's
        session byte counts keep the frames of a dropped part that follow)."""
        held = self.incomplete_bytes + size - self.incomplete.get(link, 0)
        allowed = incomplete_limit(limit)
        if held <= allowed:
            self.incomplete[link] = size
            self.incomplete_bytes = held
            return
        self.forget_incomplete(link)
        _settle(delivery)
        self.dropped_bytes += size
        producer = self.producers.get(link)
        # (or a coordinator)
        closing = Link.wrap(_pointer(link)) if producer is None else producer.link
        description = (
            f"incomplete messages on this connection hold {held} bytes, over {allowed} "
            f"({INCOMPLETE_FACTOR} times max-message-size {limit})"
        )
        log.info("connection %s link %r: %s", self.id, closing.name, description)
        self.owner.close_link(closing, "amqp:resource-limit-exceeded", description)

    def forget_incomplete(self, link: Any) -> None:
        """The message in progress on `link` (a pn_link_t) ended: completed, dropped, or
        the link ended (every place that forgets a producer or coordinator calls this)."""
        self.incomplete_bytes -= self.incomplete.pop(link, 0)

    def _top_up(self, link: Any, producer: ProducerLink | None) -> None:
        """B-021: credit back to `PRODUCER_CREDIT` once it falls below the low mark.

        A producer's `credit` is an upper bound of the link's (each transfer takes one;
        a peer's flow resets it, `on_link_flow`), so the engine is asked only near the
        low mark: one C call a message less (~1k instructions, issue 20)."""
        if producer is not None:
            producer.credit -= 1
            if producer.credit >= PRODUCER_LOW_CREDIT:
                return
        credit = _link_credit(link)
        if credit < PRODUCER_LOW_CREDIT and (
            producer is None or self.broker.producer_may_send(producer.target, to=producer.last_to)
        ):
            _link_flow(link, PRODUCER_CREDIT - credit)
            credit = PRODUCER_CREDIT
        if producer is not None:
            producer.credit = credit

    def resume_producers(self, address: str | None) -> bool:
        """Top up credit of producer links to an address that has room again, of anonymous
        relays, and of all when the broker-wide limit has room again (None) (B-151)."""
        resumed = False
        may_send = self.broker.producer_may_send
        for impl, producer in self.producers.items():
            target = producer.target
            if address is None or target.address == address or target.address is None:
                credit = _link_credit(impl)
                if credit < PRODUCER_LOW_CREDIT and may_send(target, to=producer.last_to):
                    _link_flow(impl, PRODUCER_CREDIT - credit)
                    resumed = True
        return resumed

    def settle_stored(self, deliveries: list[Any], error: BaseException | None) -> None:
        """The journal answered for this step's durable sends (C API: the hot path)."""
        closed = self.closed
        for delivery in deliveries:
            if closed:
                _decref(delivery)
            elif error is None:
                _accept_stored(delivery)  # accepted, settled, let go: one C call
            else:
                self.stored(Delivery.wrap(_pointer(delivery)), error)
                _decref(delivery)
        if not closed:
            self.shell.dirty.add(self.owner)

    def stored(self, delivery: Delivery, error: BaseException | None) -> None:
        """The journal answered for a durable send: accept it, or refuse it (disk full)."""
        if self.closed:
            return  # the client never saw it accepted: at-least-once, it may resend
        if error is None:
            delivery.update(Delivery.ACCEPTED)
        else:
            cause = error.__cause__ or error
            delivery.local.condition = Condition(
                "amqp:resource-limit-exceeded", f"the broker could not store the message: {cause}"
            )
            delivery.update(Delivery.REJECTED)
        delivery.settle()
        self.shell.dirty.add(self.owner)

    def publish(self, producer: ProducerLink, raw: bytes) -> None:
        self.route(self.prepare(producer, raw))

    def prepare(self, producer: ProducerLink, raw: bytes) -> Prepared:
        """Decode what routing needs from a transfer (B-008/B-009/B-012/B-015).

        Raises:
            SectionError: the message is malformed.
        """
        scanned = sections.scan(raw)
        message = message_of(scanned, origin_container=self.container_id)
        target = producer.target
        message_routing_type = None
        to = None
        delivery_delay_ms = 0
        if scanned.message_annotations is not None:
            message.deliver_at_ms, delivery_delay_ms = _scheduled_delivery(
                message.get_annotations()
            )
        if scanned.message_annotations is not None and target.routing_type is None:
            message_routing_type = annotated_routing_type(
                message.get_annotations(), jms_dest=target.address is None
            )
        if target.address is None and scanned.properties is not None:
            value = message.get_properties().get("to")
            to = producer.last_to = value if isinstance(value, str) else None
        duplicate_id = None
        app = scanned.application_properties
        if (
            self.duplicate_detection
            and app is not None
            # (`find` with bounds, ~1k instructions compiled; `in` on the section's copy
            # measured 2.4k, issue 20)
            and (scanned.data.find(_DUPLICATE_ID_KEY, app[0], app[1]) >= 0)
        ):  # decode only when the key's bytes are there (B-012)
            value = message.get_application_properties().get(DUPLICATE_ID)
            duplicate_id = value if isinstance(value, str | bytes) else None
        return Prepared(message, target, to, message_routing_type, duplicate_id, delivery_delay_ms)

    def check(self, prepared: Prepared) -> None:
        """B-141: raise what routing `prepared` would raise now (`Broker.check_publish`)."""
        self.broker.check_publish(
            prepared.target,
            durable=prepared.message.durable,
            to=prepared.to,
            message_routing_type=prepared.message_routing_type,
        )

    def route(self, prepared: Prepared) -> None:
        # `Broker.publish` as a module function: compiled, a direct C call (issue 20).
        publish_message(
            self.hot,
            prepared.message,
            prepared.target,
            prepared.to,
            prepared.message_routing_type,
            prepared.duplicate_id,
            prepared.delivery_delay_ms,
        )

    def on_disposition(self, delivery: Any, consumer: ConsumerLink[Any] | None) -> None:
        """A consumer's disposition of `delivery` (`consumer`: its link, None for a link
        that is no longer, or never was, a consumer)."""
        self.disposition(
            delivery,
            consumer,
            _remote_state(delivery) if consumer is not None else 0,
        )

    def disposition(
        self,
        delivery: Any,
        consumer: ConsumerLink[Any] | None,
        state: int,
        modified: int = -1,
        known: DeliveryId | None = None,
    ) -> None:
        """`on_disposition` with the delivery's remote `state` read (and, of a modified
        one, its flags when `pnloop.next_event` read them: `outcome_at`; `known`: its id
        in `consumer.unsettled`, when the caller read it)."""
        outcome = None
        if consumer is not None:
            if state == _TRANSACTIONAL_STATE:
                self.owner._transactional_outcome(Delivery.wrap(_pointer(delivery)), consumer)
                return
            outcome = outcome_at(delivery, state, modified)
        if self.reject_as_modified and type(outcome) is Rejected:  # (final: no subclass)
            outcome = FAILED  # B-047: rejected behaves exactly like modified{df=true}
        if outcome is None:
            if _delivery_settled(delivery):
                if consumer is not None:
                    consumer.unsettled.pop(delivery, None)  # proton may free it now
                _settle(delivery)  # B-048: no outcome: stays acquired
            return
        assert consumer is not None
        if known is None:
            known = consumer.delivery_id(delivery)
        else:
            del consumer.unsettled[delivery]  # as `delivery_id` does, without its read
        settle_delivery(self.hot, consumer.id, known, outcome)
        _settle(delivery)

    def on_link_flow(self, link: Any) -> None:
        """Credit and drain of a consumer link go to the core (B-037); a producer link's
        flow from the client is informational."""
        consumer = self.consumers.get(link)
        if consumer is not None:
            set_consumer_credit(  # `Broker.set_credit`: a direct call when compiled
                self.hot,
                consumer.id,
                consumer.credit(_link_credit(link)),
                bool(_pn_link_get_drain(link)),
            )
            return
        self.link_flow(link, 0, 0)

    def link_flow(self, link: Any, credit: int, drain: int) -> None:
        """`on_link_flow` with the link's `credit` and `drain` read (`pnloop.next_event`)."""
        consumer = self.consumers.get(link)
        if consumer is not None:
            set_consumer_credit(self.hot, consumer.id, consumer.credit(credit), bool(drain))
            return
        producer = self.producers.get(link)
        if producer is not None:
            # The peer may advance its delivery-count (AMQP 2.6.7), which takes credit
            # without a transfer: the bound is unknown again (`_top_up` asks the engine).
            producer.credit = 0


def _reject(delivery_impl: Any, condition: str, description: str) -> None:
    delivery = Delivery.wrap(_pointer(delivery_impl))
    delivery.local.condition = Condition(condition, description)
    delivery.update(Delivery.REJECTED)


def message_of(scanned: sections.Scanned, *, origin_container: str | None = None) -> Message:
    """The core's view of a scanned message: the bytes plus the few fields it reads."""
    message = Message(
        scanned.data,
        durable=scanned.durable,
        priority=scanned.priority,
        ttl_ms=scanned.ttl,
        expiration_ms=scanned.absolute_expiry_time or 0,
        header_end=scanned.header_end,
        head_end=sections.head_end(scanned),  # a direct call, not a method (issue 20)
        header={"delivery-count": scanned.delivery_count}
        if scanned.delivery_count or scanned.first_acquirer
        else None,
        origin_container=origin_container,
        reader=sections.READER,
    )
    if (group := scanned.group) is not None:
        message.group_id, message.group_sequence = group  # B-127
    return message


def _scheduled_delivery(annotations: dict[str, Any]) -> tuple[int, int]:
    """B-015: (x-opt-delivery-time, epoch ms; x-opt-delivery-delay, ms after receipt, which
    the broker adds to its time of the publish); the time wins over the delay; a value
    that is not a number is ignored (B-153). (0, 0): not scheduled."""
    at = annotations.get("x-opt-delivery-time")
    if isinstance(at, int) and not isinstance(at, bool):
        return at, 0
    delay = annotations.get("x-opt-delivery-delay")
    if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0:
        return 0, delay
    return 0, 0
