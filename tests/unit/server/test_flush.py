"""How the server writes an engine's output (issue 16 item 1), with fake sockets.

Everything the engine has goes out in one flush, not one buffer per flush (the rest
waited for the next input or the 1 s engine tick); but once the socket is over its write
high-water mark nothing more is taken from the engine until the peer catches up, so a slow
reader never makes the broker copy a whole backlog into memory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amqpbroker.config import parse_config
from amqpbroker.server import BrokerServer, _AmqpProtocol

CHUNK = b"x" * 1000


class FakeEngine:
    """An `AmqpConnection` with `chunks` of output waiting."""

    finished = False

    def __init__(self, chunks: int) -> None:
        self.left = chunks

    def output(self) -> bytes:
        if not self.left:
            return b""
        self.left -= 1
        return CHUNK


class FakeSocket:
    """An asyncio transport that pauses its protocol above `high` buffered bytes."""

    def __init__(self, protocol: _AmqpProtocol, high: int) -> None:
        self.protocol = protocol
        self.high = high
        self.buffered = 0
        self.reading = True

    def write(self, data: bytes) -> None:
        self.buffered += len(data)
        if self.buffered > self.high and not self.protocol.paused:
            self.protocol.pause_writing()

    def drained(self) -> None:
        self.buffered = 0
        self.protocol.resume_writing()

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _wired(tmp_path: Path, chunks: int, high: int) -> tuple[BrokerServer, FakeEngine, FakeSocket]:
    config = parse_config("event-log: {enabled: false}\n", source="test.yaml")
    server = BrokerServer(config, data_dir=tmp_path)
    protocol = _AmqpProtocol(server, config.acceptors[0])
    engine = FakeEngine(chunks)
    sock = FakeSocket(protocol, high)
    protocol.transport = sock  # type: ignore[assignment]
    protocol.amqp = engine  # type: ignore[assignment]
    server.sockets[engine] = protocol  # type: ignore[index]
    return server, engine, sock


def test_one_flush_writes_everything_the_engine_has(tmp_path: Path) -> None:
    async def scenario() -> None:
        server, engine, sock = _wired(tmp_path, chunks=50, high=1 << 20)
        server.shell.dirty.add(engine)  # type: ignore[arg-type]
        server.flush()
        assert (engine.left, sock.buffered) == (0, 50 * len(CHUNK))

    asyncio.run(scenario())  # flush() schedules the broker's timer on the running loop


def test_a_paused_socket_takes_no_more_until_it_drains(tmp_path: Path) -> None:
    async def scenario() -> None:
        server, engine, sock = _wired(tmp_path, chunks=50, high=10 * len(CHUNK))
        server.shell.dirty.add(engine)  # type: ignore[arg-type]
        server.flush()
        assert engine.left == 39  # 11 chunks passed the mark; the rest stays in the engine
        assert not sock.reading  # and the peer's input waits too
        server.shell.dirty.add(engine)  # type: ignore[arg-type]
        server.flush()  # another step's flush while paused
        assert engine.left == 39
        sock.drained()  # caught up: more goes without waiting for input or a tick,
        assert engine.left == 28  # again up to the mark

    asyncio.run(scenario())
