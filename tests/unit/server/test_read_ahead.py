"""The order of work in a loop turn when a producer bursts (issue 20, docs/decisions.md).

A read of READ_AHEAD_MIN_BYTES or more is followed by more reads of the same socket in the
same turn, each handled and its output written before the next is read, at most
READ_AHEAD_MAX_READS of them: a burst is routed and delivered in one stretch, while the
consumers' acknowledgements and the event-log frame wait for the next turn. A small read
(the socket was drained), a paused reader or a TLS transport reads nothing more. With a
real socket pair and a fake engine, so the order is seen exactly.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpbroker.config import parse_config
from amqpbroker.server import (
    READ_AHEAD_MAX_READS,
    READ_AHEAD_MIN_BYTES,
    BrokerServer,
    _AmqpProtocol,
)

READ = 2 * READ_AHEAD_MIN_BYTES  # the fake transport's max_size: one read takes at most this


class FakeEngine:
    """An `AmqpConnection` that logs what it is fed and answers each feed with output of
    `out_ratio` times its size (the deliveries of the transfers it was fed; 0: the
    messages stay queued)."""

    finished = False
    awaiting_authentication = False

    def __init__(self, server: BrokerServer, log: list[tuple[str, int]]) -> None:
        self.server = server
        self.log = log
        self.owed = 0
        self.out_ratio = 1.0

    def feed(self, data: bytes) -> None:
        self.log.append(("feed", len(data)))
        self.owed += int(len(data) * self.out_ratio)
        self.server.shell.dirty.add(self)  # type: ignore[arg-type]

    def output(self) -> bytes:
        out, self.owed = b"d" * self.owed, 0
        return out


class FakeTransport:
    """A plain socket transport over `sock` (read by the protocol's read-ahead)."""

    def __init__(self, sock: socket.socket | None, log: list[tuple[str, int]]) -> None:
        self._sock = sock
        self.max_size = READ
        self.log = log
        self.closing = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.log.append(("write", len(data)))

    def is_closing(self) -> bool:
        return self.closing

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    try:
        yield ours, peer
    finally:
        ours.close()
        peer.close()


def _wired(
    tmp_path: Path, sock: socket.socket | None
) -> tuple[_AmqpProtocol, FakeTransport, list[tuple[str, int]]]:
    """A protocol on `sock`, its transport, and the log of what its engine was fed and
    what was written, in order."""
    config = parse_config("event-log: {enabled: false}\n", source="test.yaml")
    server = BrokerServer(config, data_dir=tmp_path)
    protocol = _AmqpProtocol(server, config.acceptors[0])
    log: list[tuple[str, int]] = []
    engine = FakeEngine(server, log)
    transport = FakeTransport(sock, log)
    protocol.transport = transport  # type: ignore[assignment]
    protocol.amqp = engine  # type: ignore[assignment]
    server.sockets[engine] = protocol  # type: ignore[index]
    return protocol, transport, log


def _first_read(sock: socket.socket) -> bytes:
    return sock.recv(READ)  # what the loop's transport would have read


def _received(protocol: _AmqpProtocol, data: bytes) -> None:
    async def turn() -> None:  # the server schedules its timers on the running loop
        protocol.data_received(data)

    asyncio.run(turn())


def test_a_burst_is_read_on_each_read_handled_and_written_before_the_next(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    ours, peer = pair
    protocol, _, log = _wired(tmp_path, ours)
    peer.sendall(b"t" * (READ * 2 + 1000))  # a burst: two full reads and a bit
    _received(protocol, _first_read(ours))
    assert log == [
        ("feed", READ),
        ("write", READ),
        ("feed", READ),
        ("write", READ),
        ("feed", 1000),
        ("write", 1000),
    ]


def test_at_most_read_ahead_max_reads_more_in_one_turn(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    ours, peer = pair
    protocol, _, log = _wired(tmp_path, ours)
    peer.sendall(b"t" * (READ * (READ_AHEAD_MAX_READS + 3)))
    _received(protocol, _first_read(ours))
    feeds = [entry for entry in log if entry[0] == "feed"]
    assert feeds == [("feed", READ)] * (1 + READ_AHEAD_MAX_READS)
    left = READ * (READ_AHEAD_MAX_READS + 3) - READ * (1 + READ_AHEAD_MAX_READS)
    assert len(ours.recv(4 * READ)) == left  # the rest waits for the loop's next turn


def test_a_small_read_is_not_followed(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    # A read below READ_AHEAD_MIN_BYTES found the socket nearly empty: the other
    # connections (a consumer's credit) come first; what arrived since waits its turn.
    ours, peer = pair
    protocol, _, log = _wired(tmp_path, ours)
    peer.sendall(b"t" * (READ_AHEAD_MIN_BYTES - 1))
    _received(protocol, _first_read(ours))
    peer.sendall(b"t" * READ)
    assert log == [("feed", READ_AHEAD_MIN_BYTES - 1), ("write", READ_AHEAD_MIN_BYTES - 1)]
    assert len(ours.recv(4 * READ)) == READ


@pytest.mark.parametrize("out_ratio", [0.0, 0.4])
def test_no_read_ahead_when_messages_pile_up(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket], out_ratio: float
) -> None:
    # Less than half of what was read went out (no consumer, or one out of credit): the
    # other connections' input, maybe that consumer's credit, comes before more transfers.
    ours, peer = pair
    protocol, _, log = _wired(tmp_path, ours)
    engine = protocol.amqp
    engine.out_ratio = out_ratio  # type: ignore[union-attr]
    peer.sendall(b"t" * (READ * 3))
    _received(protocol, _first_read(ours))
    assert [entry for entry in log if entry[0] == "feed"] == [("feed", READ)]


def test_no_read_ahead_while_paused_or_closing(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    ours, peer = pair
    protocol, transport, log = _wired(tmp_path, ours)
    peer.sendall(b"t" * (READ * 3))
    protocol.paused = True  # over the write high-water mark: take no more input
    _received(protocol, _first_read(ours))
    protocol.paused = False
    transport.reading = False  # reading paused (credentials being checked)
    _received(protocol, _first_read(ours))
    transport.reading = True
    transport.closing = True
    _received(protocol, _first_read(ours))
    assert [entry for entry in log if entry[0] == "feed"] == [("feed", READ)] * 3


def test_no_read_ahead_without_a_plain_socket(tmp_path: Path) -> None:
    # A TLS transport decrypts in the loop: its raw socket is never read here.
    protocol, _, log = _wired(tmp_path, None)
    _received(protocol, b"t" * READ)
    assert log == [("feed", READ), ("write", READ)]


def test_the_peers_end_of_file_is_left_to_the_loop(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    ours, peer = pair
    protocol, _, log = _wired(tmp_path, ours)
    peer.sendall(b"t" * (READ * 2))
    peer.shutdown(socket.SHUT_WR)
    _received(protocol, _first_read(ours))
    assert [entry for entry in log if entry[0] == "feed"] == [("feed", READ)] * 2
    assert ours.recv(READ) == b""  # still there for the transport: connection_lost follows


def test_a_credentials_check_stops_the_read_ahead(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    # The bytes a read fed started a password check: reading pauses until it ends, also
    # for what read-ahead would take (the SASL layer must not get the next bytes early).
    ours, peer = pair
    protocol, transport, log = _wired(tmp_path, ours)
    engine = protocol.amqp
    engine.awaiting_authentication = True  # type: ignore[misc,union-attr]
    peer.sendall(b"t" * (READ * 3))
    _received(protocol, _first_read(ours))
    assert [entry for entry in log if entry[0] == "feed"] == [("feed", READ)]
    assert not transport.reading
