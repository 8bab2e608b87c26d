"""Drive one Proton engine per connection and translate its events into Broker calls.

Theory of operation
-------------------
The server owns the sockets. For each connection it creates an `AmqpConnection`: a
`proton.Transport` in server mode bound to a `proton.Connection` with a `Collector`. Bytes
read from the socket are pushed into the transport (`feed`), the collector's events are
translated into `core.Broker` calls (`process`), and the bytes the engine wants to send are
popped and written back (`output`). No reactor, no proton threads.

This module is the engine glue: bytes in and out, the SASL seam, the event loop over the
collector, the connection and session events, and how a connection ends. The rest of
`AmqpConnection` lives in its parts, one subject each: `transfers.py` (the hot path, a
part by composition, `self.transfers`, so that mypyc compiles it: the event loop over the
collector, transfers in, dispositions back, consumer credit, settling after disk), and the
mixins `attach.py` (links: attach, detach) and `transactions.py` (coordinator and
transactional work). The broker's
effects are applied by `shell.py` after each batch of events; every connection touched is
marked dirty so the server flushes it.

Errors: one boundary per event. A `ClientError` refuses the link with its condition (a
malformed connection-level field closes the connection with it); any other exception is
logged with the connection and closes that connection only, with `amqp:internal-error`.

The SASL/TLS seam: `AmqpConnection.feed`/`output` carry the socket bytes (TLS is undone by
Python `ssl` below). With security enabled the broker's own `SaslServer` reads them first
and the engine gets nothing until the outcome is ok and the user and roles are set (issue
15); with security disabled Proton's built-in SASL offers ANONYMOUS and `roles` is None.
The server ticks each engine at `tick_at_s` (heartbeats, idle-timeout) and closes a
connection whose AMQP open has not arrived within the acceptor's handshake-timeout.

Output is bounded: one `output()` call returns at most `OUTPUT_CHUNK_BYTES`, and a
connection's consumers may hand the engine at most `ENGINE_WINDOW_BYTES` before the socket
has taken it (issue 15/16).

Loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cproton_ffi import ffi, lib
from proton import (
    SASL,
    Collector,
    Condition,
    Connection,
    Delivery,
    Endpoint,
    Event,
    Link,
    Session,
    Transport,
    symbol,
)

import amqpbroker.protocol.pnloop as pnloop
from amqpbroker.amqp import sections
from amqpbroker.amqp.frames import AMQP_HEADER, frame
from amqpbroker.core import ClientError, Window
from amqpbroker.protocol.attach import _Attach
from amqpbroker.protocol.handles import BEGIN, FRAMING_ERROR, HANDLE_IN_USE, PUSH, HandleWatch
from amqpbroker.protocol.peer import data_at, read_symbol_map, read_symbols, read_text
from amqpbroker.protocol.sasl import MAX_SASL_FRAME_BYTES, Identity, SaslServer
from amqpbroker.protocol.shell import ConsumerLink, Engine, Prepared, ProducerLink, Shell
from amqpbroker.protocol.transactions import Transaction, _Transactions
from amqpbroker.protocol.transfers import Transfers

# Makes the SASL layer of one connection: (on_authenticated, on_failure) -> SaslServer
SaslFactory = Callable[[Callable[[Identity, bytes], None], Callable[[str], None]], SaslServer]

log = logging.getLogger("amqpbroker.protocol.handler")  # kept from before the split (issue 18)

OFFERED_CAPABILITIES = [
    symbol("sole-connection-for-container"),
    symbol("DELAYED_DELIVERY"),
    symbol("SHARED-SUBS"),
    symbol("ANONYMOUS-RELAY"),
]
SOLE_CONNECTION = "sole-connection-for-container"
MAX_FRAME_SIZE = 131072  # B-021
# What one `output()` call collects at most: the server writes it and asks again unless the
# socket is over its high-water mark, so a slow reader never makes us copy a whole backlog.
OUTPUT_CHUNK_BYTES = 1024 * 1024
# Issue 15: what a connection's consumers may be handed (copied into the engine) before
# its output has been written; credit alone would let one non-reading consumer buffer a
# whole queue. Refilled when `output()` finds the engine empty (the socket took it all).
ENGINE_WINDOW_BYTES = 4 * 1024 * 1024
# Until the peer's open arrives (SASL included), frames are at most this big: before the
# open exchange a peer may send only 512-byte frames (AMQP 1.0 §2.4.1), and a peer that
# has proven nothing must not make the broker buffer 128 KiB per socket (issue 15 item 5).
HANDSHAKE_MAX_FRAME_SIZE = MAX_SASL_FRAME_BYTES
# Issue 15: what one connection may hold open, as RabbitMQ 4 bounds it by default
# (session_max_per_connection 64, link_max_per_session 256, `attach.py`). Proton would
# take 32768 sessions (~3.7 KB each) and 2**31 handles per session, and finds a link by
# name with a linear search: one peer could use gigabytes and seconds of loop time per
# attach.
MAX_SESSIONS = 64  # the open's channel-max is one less; Proton refuses a higher channel

_UNKNOWN_PROTOCOL = "Unknown protocol detected"
# Conditions Proton closes a connection with that AMQP 1.0 does not define (§2.8.15-18),
# as the spec spells what they mean (seventh attack pass): a client matching on the
# condition (Qpid JMS maps `amqp:not-allowed` to an IllegalStateException) saw neither.
# "amqp:not allowed" is Proton's typo for a disposition range whose last precedes its
# first; "amqp:session:invalid-field" a transfer's delivery-id out of sequence.
_PROTON_CONDITIONS = {
    b"amqp:not allowed": b"amqp:not-allowed",
    b"amqp:session:invalid-field": b"amqp:invalid-field",
}
# Proton closes with `amqp:invalid-field` for a detach, flow or transfer on a handle no
# link holds; AMQP 1.0 §2.7.4-2.7.6 names it `amqp:session:unattached-handle`.
_UNATTACHED = "no such handle"


class AmqpConnection(_Attach, _Transactions, Engine):
    """One AMQP connection: a proton engine fed with socket bytes. Loop thread only."""

    def __init__(
        self,
        shell: Shell[Any],
        *,
        peer: str,
        anycast_prefix: str | None = None,
        multicast_prefix: str | None = None,
        sasl: SaslFactory | None = None,
        reject_as_modified: bool = False,
        duplicate_detection: bool = True,
        max_message_size: int = 0,
        idle_timeout_ms: int = 0,
    ) -> None:
        self.shell = shell
        self.broker = shell.broker
        self.id = shell.new_connection_id()
        self.peer = peer
        self.anycast_prefix = anycast_prefix
        self.multicast_prefix = multicast_prefix
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = HANDSHAKE_MAX_FRAME_SIZE  # MAX_FRAME_SIZE at open
        self.transport.channel_max = MAX_SESSIONS - 1
        if idle_timeout_ms > 0:  # Artemis amqpIdleTimeout: the open advertises half of it
            self.transport.idle_timeout = idle_timeout_ms / 1000
        self.tick_at_s = 0.0  # when the server must next call transport.tick (0: never)
        self.opened = False  # the peer's AMQP open has arrived (the handshake is over)
        # Until the open is handled, bytes go to the engine a header or frame at a time
        # (`_push_handshake`): the part of the current one still to push, and the first
        # bytes of the next (its size) read so far.
        self._handshaking = True
        self._unit_left = 0
        self._unit_head = b""
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        # Broker-checked SASL (security enabled) or Proton's built-in ANONYMOUS. Security
        # is enabled exactly when the server hands over a SASL layer; then nothing
        # reaches the engine before authentication has set the user and roles.
        self.sasl: SaslServer | None = None
        self.security_enabled = sasl is not None
        self.user: str | None = None
        self._roles: frozenset[str] = frozenset()
        # After the broker's sasl-outcome the first bytes must be the AMQP header (AMQP 1.0
        # §5.3.2): the start of what came so far; None once checked (or no broker SASL).
        self._after_outcome: bytes | None = b"" if sasl is not None else None
        if sasl is not None:
            self.sasl = sasl(self._authenticated, self._sasl_failed)
        else:
            self._setup_sasl()
        self.transactions: dict[bytes, Transaction] = {}
        self.kept_bytes = 0  # of the transactions' kept sends (transactions.py)
        self._links_per_session: dict[Any, int] = {}  # pn_session_t -> links not yet ended
        self._sessions_begun = 0  # by the peer and not yet ended by it (_on_session_open)
        # Fourth attack pass: the peer's link handles per channel, read from its frames
        # (handles.py), and the session begun on each channel (learnt from its begin).
        self._handles = HandleWatch(MAX_FRAME_SIZE)
        self._beginning: int | None = None  # the channel of the begin being pushed
        self._channel_sessions: dict[int, Any] = {}  # channel -> pn_session_t
        self._sessions: list[Any] = []  # every pn_session_t opened and not yet ended
        self._attach_bytes: dict[Any, int] = {}  # pn_link_t -> its attach's bytes (attach.py)
        self.attach_bytes_total = 0
        self.window = Window(ENGINE_WINDOW_BYTES)  # issue 15: shared by its consumers
        self._resume_from = 0
        self._orderly = False
        self._socket_gone = False
        # Issue 15: after a framing error the socket closes once the close frame is out.
        self._hang_up = False
        self._input_closed = False  # the engine reads no more (framing error, idle-timeout)
        self._respelled = b""  # Proton's last output with its close re-spelled (`_spec_condition`)
        self._handlers: dict[int, Callable[[Event], None]] = {
            lib.PN_CONNECTION_REMOTE_OPEN: self._on_connection_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self._on_connection_close,
            lib.PN_SESSION_REMOTE_OPEN: self._on_session_open,
            lib.PN_SESSION_REMOTE_CLOSE: self._on_session_close,
            lib.PN_LINK_REMOTE_OPEN: self._on_link_open,
            lib.PN_LINK_REMOTE_DETACH: self._on_link_detach,
            lib.PN_LINK_REMOTE_CLOSE: self._on_link_close,
            lib.PN_TRANSPORT_ERROR: self._on_transport_error,
            lib.PN_TRANSPORT_TAIL_CLOSED: self._on_tail_closed,
            lib.PN_TRANSPORT_CLOSED: self._on_transport_closed,
        }
        # The hot path and the event loop (compiled by mypyc: setup.py). The link maps are
        # its, shared: keyed by the pn_link_t pointer, which it reads from events.
        self.transfers = Transfers(
            self,
            shell,
            self.id,
            peer,
            self._handlers,
            max_message_size=max_message_size,
            duplicate_detection=duplicate_detection,
            reject_as_modified=reject_as_modified,
            collector=self.collector._impl,
        )
        self.producers: dict[Any, ProducerLink] = self.transfers.producers
        self.consumers: dict[Any, ConsumerLink[Any]] = self.transfers.consumers
        self.coordinators: set[Any] = self.transfers.coordinators  # B-140
        shell.connections[self.id] = self
        shell.opened_total += 1

    # For transactions.py: the hot path's steps, called through `transfers` (bound
    # methods of it kept here would be one more reference cycle, `_let_go`).
    def _prepare(self, producer: ProducerLink, raw: bytes) -> Prepared:
        return self.transfers.prepare(producer, raw)

    def _check_send(self, prepared: Prepared) -> None:
        self.transfers.check(prepared)

    def _route(self, prepared: Prepared) -> None:
        self.transfers.route(prepared)

    def _stored(self, delivery: Delivery, error: BaseException | None) -> None:
        self.transfers.stored(delivery, error)

    def _setup_sasl(self) -> None:
        """Proton's built-in ANONYMOUS for now; broker-checked SASL replaces this seam."""
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        sasl.done(SASL.OK)

    @property
    def closed(self) -> bool:
        """The broker side is done with this connection (kept on `transfers`, which reads
        it per event)."""
        return self.transfers.closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self.transfers.closed = value

    @property
    def container_id(self) -> str:
        """The peer's open.container-id ("" until the open; kept on `transfers`)."""
        return self.transfers.container_id

    @container_id.setter
    def container_id(self, value: str) -> None:
        self.transfers.container_id = value

    @property
    def max_message_size(self) -> int:
        """B-152: the acceptor's max-message-size, 0 for no limit (kept on `transfers`)."""
        return self.transfers.max_message_size

    @max_message_size.setter
    def max_message_size(self, value: int) -> None:
        self.transfers.max_message_size = value

    @property
    def reject_as_modified(self) -> bool:
        """B-047: the acceptor's amqpRejectAsModified (kept on `transfers`)."""
        return self.transfers.reject_as_modified

    @reject_as_modified.setter
    def reject_as_modified(self, value: bool) -> None:
        self.transfers.reject_as_modified = value

    def resume_producers(self, address: str | None) -> bool:
        """B-151: see `Transfers.resume_producers`."""
        return self.transfers.resume_producers(address)

    @property
    def roles(self) -> frozenset[str] | None:
        """What the core checks permissions against: None only when security is disabled
        (B-154); with security on, no roles until authentication has finished."""
        if not self.security_enabled:
            return None
        return self._roles

    @property
    def awaiting_authentication(self) -> bool:
        """Credentials are being checked: stop reading the socket until they are."""
        return self.sasl is not None and self.sasl.checking

    # -- bytes in and out ---------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Socket bytes in: through the SASL layer first when the broker checks it."""
        sasl = self.sasl
        if sasl is not None and not sasl.done:
            sasl.feed(data)  # the bytes after a successful outcome go to _authenticated
            self.shell.dirty.add(self)
            return
        if self._after_outcome is not None:
            self._first_after_outcome(data)
            return
        self._push(data)

    def _authenticated(self, identity: Identity, rest: bytes) -> None:
        """The SASL outcome is ok: the identity first, then the engine gets the bytes."""
        self.user = identity.user
        self._roles = self.shell.roles_for(identity.user)
        self.shell.dirty.add(self)
        if rest:
            self._first_after_outcome(rest)

    def _first_after_outcome(self, data: bytes) -> None:
        """The bytes after the broker's sasl-outcome: the engine gets them only once they
        start with the AMQP header. Proton, which has no SASL layer of its own here, would
        otherwise run a second SASL exchange (for a SASL header it offered ANONYMOUS and
        let it in) or guess at another protocol (issue 15 attack)."""
        head = (self._after_outcome or b"") + data
        start = head[: len(AMQP_HEADER)]
        if not AMQP_HEADER.startswith(start):
            self._after_outcome = None
            self._push(AMQP_HEADER)  # the engine answers in AMQP: its header, then the close
            self._framing_error("expected the AMQP protocol header after the SASL outcome")
            self.shell.dirty.add(self)
            return
        if len(start) < len(AMQP_HEADER):
            self._after_outcome = head  # at most 7 bytes, until the rest of the header
            return
        self._after_outcome = None
        self._push(head)

    def _sasl_failed(self, why: str) -> None:
        self.shell.auth_failures += 1
        log.warning("connection %s from %s: %s; closing it", self.id, self.peer, why)
        self.closed = True
        self.shell.connections.pop(self.id, None)
        self.shell.dirty.add(self)  # the outcome goes out, then the socket is closed

    def _push(self, data: bytes | memoryview) -> None:
        """Push bytes into the engine and handle what they caused.

        A socket read can be 256 KiB, the engine takes ~16 KiB at a time: the rest is
        walked with a memoryview, not re-sliced (copied) after every push (issue 20).
        """
        if not self._handshaking:
            self._push_watched(data)
            return
        view = self._push_handshake(memoryview(data))
        if view:
            self._push_watched(view)

    def _push_watched(self, data: bytes | memoryview) -> None:
        """After the open: push what `HandleWatch` passes, and act on what it finds (a
        handle in use ends its session; a mistyped handle closes the connection)."""
        for kind, piece, channel, description in self._handles.split(data):
            if self.closed:
                return
            if kind == PUSH:
                if not self._push_all(memoryview(piece)):
                    return
            elif kind == BEGIN:
                self._beginning = channel  # `_on_session_open` learns the session's channel
                reading = self._push_all(memoryview(piece))
                self._beginning = None
                if not reading:
                    return
            elif kind == HANDLE_IN_USE:
                self._end_session(channel, description)
            elif kind == FRAMING_ERROR:
                self._framing_error(description)
                self.shell.dirty.add(self)
            else:
                log.warning(
                    "connection %s from %s: %s; closing it", self.id, self.peer, description
                )
                self._fail("amqp:invalid-field", description)
                self.shell.dirty.add(self)  # the close frame goes out, then the socket

    def _push_handshake(self, view: memoryview) -> memoryview:
        """Until the peer's open has been handled, push one protocol header or frame at
        a time, and what is left after it.

        Before the open, frames may be at most HANDSHAKE_MAX_FRAME_SIZE; the open's
        handler raises the limit to MAX_FRAME_SIZE. Pushed in one piece, the frames a
        client pipelines behind its open (an attach with a long name or many filters)
        were read against the small limit and closed the connection with a framing
        error (third attack pass). Only the sizes are read here; the engine checks them.
        """
        while view and self._handshaking and not self.closed:
            if self._unit_left:
                n = min(self._unit_left, len(view))
                self._unit_left -= n
            else:  # the first bytes of a header ("AMQP...", 8 bytes) or a frame's size
                n = min(4 - len(self._unit_head), len(view))
                self._unit_head += view[:n].tobytes()
                if len(self._unit_head) == 4:
                    head, self._unit_head = self._unit_head, b""
                    size = 8 if head == b"AMQP" else int.from_bytes(head, "big")
                    self._unit_left = max(size - 4, 0)
            if not self._push_all(view[:n]):
                return view[:0]  # the engine reads no more: the rest is dropped
            view = view[n:]
        return view

    def _push_all(self, view: memoryview) -> bool:
        """Push every byte of `view` unless the engine stops reading, handling the
        events after each push; whether the engine still reads."""
        impl = self.transport._impl
        reading = True
        while view:
            capacity = lib.pn_transport_capacity(impl)
            if capacity < 0:  # the engine's input side is closed (or failed)
                reading = False
                break
            chunk = view[:capacity]
            pushed = lib.pn_transport_push(impl, ffi.from_buffer(chunk), len(chunk))
            if pushed < 0:
                self.transport._check(pushed)  # raises proton's TransportException
            view = view[pushed:]
            self.process()
        self.process()
        return reading

    @property
    def finished(self) -> bool:
        """Whether the socket can be closed once `output()` has been written."""
        if self._respelled:
            return False
        if self._hang_up or (self.sasl is not None and self.sasl.failed):
            return True
        # Once the engine reads no more (a framing error, an expired idle-timeout), the
        # socket goes as soon as the engine has written its last bytes.
        if not (self.closed or self._input_closed):
            return False
        pending = self.transport.pending()
        if pending < 0:
            return True
        # Reading nothing, closed on our side and with nothing to write, the engine never
        # will: proton's SASL layer reads AMQP frames sent in place of a `sasl-init`, and
        # then writes nothing, not even a close (fuzz case open/type:0x10[2]+bytes:flip).
        return pending == 0 and self.closed and self._input_closed

    def output(self, limit: int = OUTPUT_CHUNK_BYTES) -> bytes:
        """Bytes to send now: the SASL layer's, then up to about `limit` of the engine's.

        b"" means the engine has nothing more; call again until then (issue 16 item 1).
        """
        sasl = self.sasl
        if sasl is not None and (sasl.output or not sasl.done):
            out = bytes(sasl.output)
            sasl.output.clear()
            if not sasl.done:
                return out
            return out + self._engine_output(limit)
        return self._engine_output(limit)

    def _engine_output(self, limit: int) -> bytes:
        """Pop output buffers until the engine has none or `limit` bytes are collected.

        Proton fills one output buffer per `pending()` call (a few frames): reading it once
        per flush left the rest of a large message or a backlog waiting for the next input
        or engine tick, a second later (issue 16 item 1).
        """
        transport = self.transport
        impl = transport._impl
        chunks: list[bytes] = []
        size = 0
        if self._respelled:
            chunks.append(self._respelled)
            size = len(self._respelled)
            self._respelled = b""
        # One engine buffer a call (`pnloop.output`: with `_pnloop` peeked straight into
        # the bytes returned, else through a buffer nobody zeroes first); one chunk
        # (nearly always) is returned as it is, not joined (the wrappers copied the
        # bytes three times more; issue 20).
        output, key = pnloop.output, pnloop.key(impl)
        while size < limit and (chunk := output(key)):
            chunks.append(chunk)
            size += len(chunk)
        if not size and self.window.room < ENGINE_WINDOW_BYTES:
            self._reopen_window()
        if self._hang_up and size < limit and transport.pending() >= 0:
            # Proton writes no close frame on a connection the peer never opened: ours.
            chunks.append(_close_frame(self.connection.condition))
            transport.close_head()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _reopen_window(self) -> None:
        """The engine holds no output (the socket took it all): the window is whole again
        but for what its sessions still hold, and consumers it stopped are dispatched to,
        with the credit and drain request they kept (issue 15); what that hands the
        engine, the next `output()` returns.

        A session keeps the transfers its peer's incoming-window does not let out yet
        (seventh attack pass): with a window of 0 and all the credit it likes, a consumer
        left the output empty while Proton held every message handed to it, and each
        empty `output()` handed it another window's worth: a whole queue (paged messages
        read back too) in the broker's memory, never sent."""
        held = 0
        for session in self._sessions:  # one C call each (Proton's list walk took three)
            held += lib.pn_session_outgoing_bytes(session)
        stalled = self.window.room <= 0
        self.window.room = ENGINE_WINDOW_BYTES - held
        if stalled and self.window.room > 0 and not self.closed:
            consumers = list(self.consumers.values())
            if consumers:  # a different first one each time: one queue cannot starve another
                self._resume_from = start = (self._resume_from + 1) % len(consumers)
                for consumer in consumers[start:] + consumers[:start]:
                    self.broker.resume(consumer.id)
            self.shell.apply_effects()
            self.shell.dirty.add(self)

    def socket_closed(self) -> None:
        """The socket is gone. Without a close frame first, that is an abrupt loss (B-054)."""
        self._socket_gone = True
        if self.sasl is not None:
            self.sasl.abandon()
        if not self.closed:
            self.transport.close_tail()
            self.process()
            self._finish(abrupt=not self._orderly)
        self._let_go()

    def _let_go(self) -> None:
        """Break the reference cycles between the connection and its parts once the
        socket is gone (issue 23): the event handlers are the connection's own bound
        methods, `transfers.owner` is the connection, the SASL layer's callbacks are its
        methods. Left as cycles, a closed connection (its Proton engine and buffers,
        links, unsettled deliveries) waited for the cyclic collector, whose oldest
        generation may not run for minutes on a broker holding millions of objects;
        without them, reference counting frees it when the server lets go.

        No event reaches the connection after this: the engine is fed and ticked only
        while its socket is open, and `Transfers.stored`/`settle_stored` (a journal
        answer after the socket went) check `closed` before calling their owner.
        `output()` still works (the server may flush the connection once more)."""
        self._handlers.clear()  # the dict `transfers.handlers` is too
        self.transfers.owner = _ENDED
        self.sasl = None

    # -- events -------------------------------------------------------------------------
    def process(self) -> None:
        """Handle every pending engine event, then apply the broker's effects
        (`Transfers.process_events`)."""
        self.transfers.process_events()

    def _refuse(self, error: ClientError, link: Any) -> None:
        """A malformed or mistyped field: on a delivery, end its link with the error;
        elsewhere (open, begin, ...) close the connection with it."""
        log.info("connection %s from %s: %s %s", self.id, self.peer, error.condition, error)
        if link is None:
            self._fail(error.condition, str(error))
            return
        consumer = self.consumers.get(link)
        if consumer is not None:
            self._drop_consumer(link, consumer, closed=True)
        self.close_link(Link.wrap(pnloop.pointer(link)), error.condition, str(error))

    def close_with_error(self, condition: str, description: str) -> None:
        """The broker ends this connection (a slow consumer's KILL): the error path."""
        log.info("connection %s from %s: closed by the broker: %s", self.id, self.peer, description)
        self._fail(condition, description)

    def _fail(self, condition: str, description: str) -> None:
        self._hang_up = True
        self.connection.condition = Condition(condition, description)
        self.connection.close()
        self._finish(abrupt=True)

    def _finish(self, *, abrupt: bool) -> None:
        if self.closed:
            return
        self.closed = True
        transactions, self.transactions = self.transactions, {}
        self.kept_bytes = 0
        for txn in transactions.values():
            self._rollback(txn, forced=True)  # B-143: before the links return the rest
        for link in list(self.consumers.values()):
            self.shell.consumers.pop(link.id, None)
        self.consumers.clear()
        self.producers.clear()
        self.broker.connection_closed(self.id, abrupt=abrupt)
        self.shell.connections.pop(self.id, None)
        log.info(
            "connection %s from %s (%s) closed%s",
            self.id,
            self.peer,
            self.container_id or "-",
            " abruptly" if abrupt else "",
        )

    def _on_connection_open(self, event: Event) -> None:
        connection = self.connection
        self.transport.max_frame_size = MAX_FRAME_SIZE  # what our open advertises (B-021)
        self._handshaking = False
        connection.container = self.broker.name
        connection.offered_capabilities = OFFERED_CAPABILITIES
        try:  # issue 15: the open's fields are the peer's, checked before use
            self.container_id = (
                read_text(lambda: connection.remote_container, "open.container-id") or ""
            )
            impl = connection._impl
            desired = read_symbols(
                data_at(lib.pn_connection_remote_desired_capabilities(impl)),
                "open.desired-capabilities",
            )
            read_symbols(
                data_at(lib.pn_connection_remote_offered_capabilities(impl)),
                "open.offered-capabilities",
            )
            read_symbol_map(data_at(lib.pn_connection_remote_properties(impl)), "open.properties")
            read_text(lambda: connection.remote_hostname, "open.hostname")
        except ClientError as e:
            log.info("refusing connection %s from %s: %s", self.id, self.peer, e)
            connection.open()
            self._fail(e.condition, str(e))
            return
        if SOLE_CONNECTION in desired and self._container_connected_elsewhere():
            self._refuse_duplicate_container()
            return
        connection.open()
        self.opened = True
        self.shell.on_opened(self)
        log.info(
            "connection %s from %s opened (container %s)",
            self.id,
            self.peer,
            self.container_id or "-",
        )

    def _container_connected_elsewhere(self) -> bool:
        return any(
            other is not self and not other.closed and other.container_id == self.container_id
            for other in self.shell.connections.values()
        )

    def _refuse_duplicate_container(self) -> None:
        """B-020: open with connection-establishment-failed, then close with
        amqp:invalid-field naming the container-id."""
        connection = self.connection
        connection.properties = {symbol("amqp:connection-establishment-failed"): True}
        connection.open()
        connection.condition = Condition(
            "amqp:invalid-field",
            f"a connection with container-id {self.container_id!r} already exists",
            {symbol("invalid-field"): symbol("container-id")},
        )
        connection.close()
        log.info(
            "refusing connection %s from %s: container-id %r is already connected "
            "(sole-connection-for-container)",
            self.id,
            self.peer,
            self.container_id,
        )
        self._finish(abrupt=False)

    def _on_connection_close(self, event: Event) -> None:
        if self.connection.state & Endpoint.LOCAL_UNINIT:
            self._framing_error("close before open")  # issue 15: proton would not answer it
            return
        self._orderly = True
        self.connection.close()
        self._finish(abrupt=False)  # B-053: an AMQP close is orderly

    def _on_transport_error(self, event: Event) -> None:
        condition = self.transport.condition
        description = condition.description if condition else ""
        if condition is not None:
            self._spec_condition(condition.name, description)
        if description.startswith(_UNKNOWN_PROTOCOL):
            # Proton quotes the peer's first bytes: after the broker's SASL outcome, a
            # second sasl-init with its password (issue 15 attack pass). Never log them.
            description = f"{_UNKNOWN_PROTOCOL} (the bytes are not logged)"
        log.warning("connection %s from %s: transport error %s", self.id, self.peer, description)

    def _spec_condition(self, name: str, description: str) -> None:
        """Re-spell the condition of the close frame Proton has just posted (its error
        path writes the frame at once, so the transport's condition is read too late) as
        AMQP's own (`_PROTON_CONDITIONS`, `_UNATTACHED`; seventh attack pass). The output
        Proton holds ends with that close; it is taken out, the close rewritten, and
        `output()` returns it first."""
        fixed = _PROTON_CONDITIONS.get(name.encode())
        if fixed is None and name == "amqp:invalid-field" and description.startswith(_UNATTACHED):
            fixed = b"amqp:session:unattached-handle"
        impl = self.transport._impl
        pending = lib.pn_transport_pending(impl)
        if fixed is None or pending <= 0:
            return
        buffer = ffi.new("char[]", pending)
        lib.pn_transport_peek(impl, buffer, pending)
        data = ffi.buffer(buffer)[:]
        last = _last_frame(data)
        if last < 0 or data[last + 8 : last + 11] != b"\x00\x53\x18":
            return  # not the close this is about: Proton's spelling stays
        lib.pn_transport_pop(impl, pending)
        condition = Condition(fixed.decode(), description)
        self._respelled += data[:last] + _close_frame(condition)

    def _on_tail_closed(self, event: Event) -> None:
        """The engine reads no more input. Unless the peer closed or the socket is gone,
        that is a framing error, which proton may leave unanswered: answer it now with
        `amqp:connection:framing-error`, then hang up (issue 15). An expired idle-timeout
        ends here too, with proton's own condition (B-054: an abrupt loss)."""
        self._input_closed = True
        if self._orderly or self._socket_gone or self._hang_up:
            return
        self._hang_up = True
        condition = self.transport.condition
        if condition is None:  # proton stopped reading without saying why
            log.warning("connection %s from %s: undecodable frame; closing it", self.id, self.peer)
            self.connection.condition = Condition(
                "amqp:connection:framing-error", "undecodable frame"
            )
        else:  # proton has written its own close frame (PN_TRANSPORT_ERROR logged it)
            self.connection.condition = condition
        self.connection.close()
        self._finish(abrupt=True)

    def _on_transport_closed(self, event: Event) -> None:
        self._finish(abrupt=not self._orderly)

    def _on_session_open(self, event: Event) -> None:
        if self.connection.state & Endpoint.REMOTE_UNINIT:
            # Proton accepts a begin before the open; AMQP does not (issue 15).
            self._framing_error("begin before open")
            return
        # Third attack pass: channel-max bounds channel numbers, not sessions. Proton
        # takes a begin on a channel in use as a new session and leaves the old one
        # unreachable (never ended, never freed): 60,000 begins on channel 0 (1.3 MB
        # sent) grew the broker by 190 MB. More sessions begun and not ended than there
        # are channels can only be such a reuse (AMQP 1.0 §2.5.5: an error).
        self._sessions_begun += 1
        if self._sessions_begun > MAX_SESSIONS:
            self._framing_error(f"a begin on a channel in use ({MAX_SESSIONS} sessions begun)")
            return
        if self._beginning is not None:
            self._channel_sessions[self._beginning] = event.session._impl
        self._sessions.append(event.session._impl)
        event.session.open()

    def _end_session(self, channel: int, description: str) -> None:
        """An attach on a handle in use (AMQP 1.0 §2.7.3): end its session with
        `amqp:session:handle-in-use`, its links' deliveries and credit given back as at
        the session's end (B-053); the attach never reached Proton, which would have
        left the link holding the handle unreachable until the connection closed
        (fourth attack pass). The peer's frames on the channel are dropped until its end
        (`HandleWatch`)."""
        impl = self._channel_sessions.get(channel)
        self.shell.dirty.add(self)  # the end (or close) frame goes out
        log.warning(
            "connection %s from %s: an attach on channel %d: %s; ending that session",
            self.id,
            self.peer,
            channel,
            description,
        )
        if impl is None:  # not a session the broker saw begin: the connection, then
            self._fail("amqp:session:handle-in-use", description)
            return
        session = Session.wrap(impl)
        self._release_session(session)
        session.condition = Condition("amqp:session:handle-in-use", description)
        session.close()

    def _release_session(self, session: Session) -> None:
        """What the session's links hold goes back: consumers detached (their unsettled
        deliveries return, B-053), producers and coordinators forgotten, attach bytes
        given back. Called at the session's end, from either side (idempotent)."""
        for impl, consumer in list(self.consumers.items()):
            if consumer.link.session == session:
                self._drop_consumer(impl, consumer, closed=False)
        for impl in [i for i, p in self.producers.items() if p.link.session == session]:
            del self.producers[impl]
            self.transfers.forget_incomplete(impl)
        for impl in [
            i for i in self.coordinators if lib.pn_link_session(pnloop.pointer(i)) == session._impl
        ]:
            self.coordinators.discard(impl)
            self.transfers.forget_incomplete(impl)
        self._links_per_session.pop(session._impl, None)
        for impl in [i for i in self._attach_bytes if lib.pn_link_session(i) == session._impl]:
            self.attach_bytes_total -= self._attach_bytes.pop(impl)

    def _framing_error(self, description: str) -> None:
        log.warning("connection %s from %s: %s; closing it", self.id, self.peer, description)
        self._hang_up = True
        self.connection.condition = Condition("amqp:connection:framing-error", description)
        self.connection.close()
        self.transport.close_tail()
        self._finish(abrupt=True)

    def _on_session_close(self, event: Event) -> None:
        session: Session = event.session
        self._release_session(session)
        for channel in [c for c, i in self._channel_sessions.items() if i == session._impl]:
            del self._channel_sessions[channel]
        self._sessions_begun -= 1
        if session._impl in self._sessions:
            self._sessions.remove(session._impl)
        session.close()
        # Issue 15: ended on both sides, so Proton may forget it and its links (else a
        # peer that begins and ends sessions, or attaches and detaches links, on one
        # long-lived connection grows the broker by ~3 KB each time).
        session.free()


class _Ended:
    """The owner of a finished connection's `Transfers` (`AmqpConnection._let_go`): no
    call may reach it; one that did would be a bug, so it says so."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"{name} called on a connection whose socket is gone")


_ENDED: Any = _Ended()


def _last_frame(data: bytes) -> int:
    """Where the last whole frame of `data` (the engine's output, from a frame boundary or
    the protocol header) starts; -1 if `data` is not whole frames."""
    pos = 8 if data.startswith(b"AMQP") else 0
    last = -1
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size < 8:
            return -1
        last, pos = pos, pos + size
    return last if pos == len(data) else -1


def _close_frame(condition: Condition | None) -> bytes:
    """An AMQP close frame carrying `condition` (for when proton will not write one)."""
    error = (
        None
        if condition is None
        else sections.Described(
            sections.ULong(0x1D),
            [sections.Symbol(condition.name), condition.description or ""],
        )
    )
    return frame(0x18, [error])
