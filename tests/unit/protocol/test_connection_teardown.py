"""A closed connection is freed by reference counting alone (issue 23).

The broker-side `AmqpConnection` and its parts pointed at each other (its event handlers
are its own bound methods, `Transfers.owner` and `connection.transfers`, the SASL layer's
callbacks): a closed connection, with its Proton transport, buffers, links and unsettled
deliveries, waited for the cyclic collector, whose oldest generation may not run for a
long time on a broker with millions of long-lived objects. Here the collector is off:
what the socket's end lets go of must go at once.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator
from random import Random
from typing import Any

import pytest
from proton import Collector, Connection, Data, Event, Link, Message, Terminus, Transport
from support import frames as F
from support.sasl_layer import PASS, answering, plain_sasl

from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.core.security import PERMISSIONS, SecurityRepository
from amqpbroker.protocol import AmqpConnection, Shell, moves, transactions
from amqpbroker.protocol.sasl import Outcome


@pytest.fixture
def shell() -> Shell:
    """A broker whose role `app` may do anything (user `u` has it, when security is on)."""
    broker = Broker(
        settings=SettingsRepository(),
        clock=ManualClock(),
        rng=Random(0),
        copier=moves.COPIER,
        security=SecurityRepository({"#": {p: ("app",) for p in PERMISSIONS}}),
    )
    shell = Shell(broker)
    shell.roles_for = lambda user: frozenset({"app"}) if user == "u" else frozenset()
    return shell


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The cyclic collector off: only reference counting frees anything."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_plain_sasl = plain_sasl(PASS)  # every login passes


def _queue_capability(terminus: Terminus) -> None:
    """The terminus asks for an ANYCAST queue (B-004), as Artemis clients do."""
    terminus.capabilities.put_array(False, Data.SYMBOL)
    terminus.capabilities.enter()
    terminus.capabilities.put_symbol("queue")
    terminus.capabilities.exit()


class _Peer:
    """A client engine pumped against one broker-side connection, in memory."""

    def __init__(self, shell: Shell, *, secured: bool) -> None:
        self.server = AmqpConnection(shell, peer="memory", sasl=_plain_sasl if secured else None)
        self.transport = Transport()
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        if secured:
            self.connection.user, self.connection.password = "u", "p"
        self.transport.bind(self.connection)
        if secured:
            sasl = self.transport.sasl()
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True  # PLAIN without TLS, in memory
        else:
            self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection.container = "leaver"
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self.received = 0
        self.pump()

    def pump(self) -> None:
        for _ in range(100):
            moved = False
            pending = self.transport.pending()
            if pending > 0:
                self.server.feed(bytes(self.transport.peek(pending)))
                self.transport.pop(pending)
                moved = True
            self.server.shell.dirty.clear()
            out = self.server.output()
            while out:
                taken = self.transport.push(out[: self.transport.capacity()]) or 0
                out = out[max(taken, 0) :] if taken else b""
                moved = True
            while (event := self.collector.peek()) is not None:
                if event.type == Event.DELIVERY and event.delivery.link.is_receiver:
                    delivery = event.delivery
                    if delivery.readable and not delivery.partial:
                        delivery.link.recv(delivery.pending)
                        delivery.link.advance()
                        self.received += 1
                self.collector.pop()
            if not moved:
                break

    def receiver(self, address: str) -> Link:
        link = self.session.receiver(f"r-{address}")
        link.source.address = address
        _queue_capability(link.source)
        link.open()
        link.flow(10)
        self.pump()
        return link

    def send(self, address: str, count: int, *, durable: bool = False) -> None:
        link = self.session.sender(f"s-{address}")
        link.target.address = address
        _queue_capability(link.target)
        link.open()
        self.pump()
        for i in range(count):
            link.delivery(b"%d" % i)
            link.send(Message(body="x" * 100, durable=durable).encode())
            link.advance()
        self.pump()


def _parts(server: AmqpConnection) -> dict[str, weakref.ref[Any]]:
    """Weak references to the broker-side connection and the parts it frees with it.
    The compiled build's `Transfers` (a native class) takes no weak reference; there,
    the connection that owns it stands for it."""
    parts = {
        "connection": server,
        "transfers": server.transfers,
        "engine": server.transport,
        "proton connection": server.connection,
    }
    refs: dict[str, weakref.ref[Any]] = {}
    for name, part in parts.items():
        with contextlib.suppress(TypeError):  # no __weakref__ slot (mypyc)
            refs[name] = weakref.ref(part)
    assert "connection" in refs
    return refs


def _alive(parts: dict[str, weakref.ref[Any]]) -> list[str]:
    return [name for name, ref in parts.items() if ref() is not None]


def _socket_gone(server: AmqpConnection) -> None:
    """What `server.py` does when a socket closes: `socket_closed`, then a flush (the
    engine's last bytes go nowhere, the set of connections to flush is emptied)."""
    server.socket_closed()
    shell = server.shell
    for amqp in list(shell.dirty):
        amqp.output()
    shell.dirty.clear()


def _orderly(peer: _Peer) -> None:
    peer.connection.close()
    peer.pump()
    assert peer.server.closed
    _socket_gone(peer.server)  # the server closes the socket after the close frame


def _abrupt(peer: _Peer) -> None:
    _socket_gone(peer.server)  # the peer vanished: no close frame (B-054)


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("secured", [False, True], ids=["anonymous", "sasl"])
@pytest.mark.parametrize("end", [_orderly, _abrupt], ids=["close", "socket-lost"])
def test_closed_connection_with_unsettled_deliveries_is_freed_without_the_collector(
    shell: Shell, secured: bool, end: Callable[[_Peer], None]
) -> None:
    """Issue 23, B-053/B-054: a connection that consumed (deliveries unsettled) and
    produced, closed or lost, is freed when the socket is gone, by reference counting;
    its unsettled messages went back to the queue."""
    peer = _Peer(shell, secured=secured)
    assert peer.server.opened
    peer.send("q", 3)
    peer.receiver("q")
    assert peer.received == 3
    parts = _parts(peer.server)
    end(peer)
    del peer
    assert _alive(parts) == []
    assert shell.broker.queues["q"].message_count == 3  # returned, not lost
    assert shell.connections == {}


@pytest.mark.usefixtures("no_collector")
def test_connection_refused_by_sasl_is_freed_without_the_collector(shell: Shell) -> None:
    """Issue 23: a connection whose credentials were refused is freed once its socket
    is gone (the SASL layer's callbacks are the connection's own methods)."""
    refuse = plain_sasl(answering(lambda credentials: Outcome.AUTH))
    server = AmqpConnection(shell, peer="memory", sasl=refuse)
    ref = weakref.ref(server)
    server.feed(F.SASL_HEADER + F.frame(F.sasl_init("PLAIN", b"\x00u\x00bad"), kind=1))
    assert server.output()
    assert server.finished
    _socket_gone(server)
    del server
    assert ref() is None


@pytest.mark.usefixtures("no_collector")
def test_lost_connection_with_an_open_transaction_is_freed_without_the_collector(
    shell: Shell,
) -> None:
    """Issue 23, B-143: a connection lost with a transactional send in flight is freed
    by reference counting; the send was rolled back, not routed."""
    peer = F.RawPeer(AmqpConnection(shell, peer="memory"))
    peer.opened()
    coordinator = F.attach("txn", role_receiver=False, source=F.source("s"), target=F.coordinator())
    producer = F.attach(
        "p", handle=1, role_receiver=False, source=F.source("s"), target=F.target("q")
    )
    peer.send(F.frame(coordinator), F.frame(producer))
    peer.send(F.frame(F.transfer(delivery_id=0, tag=b"d"), payload=F.declare()))
    [txn] = peer.connection.transactions
    state = F.Node(transactions.TRANSACTIONAL_STATE, [F.enc(txn)])
    transfer = F.transfer(handle=1, delivery_id=1, tag=b"m", state=state)
    peer.send(F.frame(transfer, payload=F.message("x" * 1000)))
    assert peer.connection.kept_bytes > 0
    parts = _parts(peer.connection)
    _socket_gone(peer.connection)
    del peer
    assert _alive(parts) == []
    assert shell.connections == {}
    assert "q" not in shell.broker.queues or shell.broker.queues["q"].message_count == 0


def test_socket_closed_twice_is_harmless(shell: Shell) -> None:
    """The teardown is idempotent, and a finished connection's `output()` still
    answers (the server may flush it once more after the socket is gone)."""
    peer = _Peer(shell, secured=False)
    peer.send("q", 1, durable=True)
    server = peer.server
    server.socket_closed()
    server.socket_closed()
    assert server.closed
    assert isinstance(server.output(), bytes)  # the close frame, to nowhere
    assert shell.broker.queues["q"].message_count == 1
