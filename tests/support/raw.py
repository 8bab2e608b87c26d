"""A hand-driven AMQP client for hostile-input tests (issue 15).

`RawClient` is a proton client engine over a plain socket that does nothing unless the
test calls `pump`: a client that "goes silent" is one the test stops pumping. `sasl_init`
and `read_sasl_outcome` speak the SASL layer byte by byte, so a test can pipeline frames
behind the sasl-init in one write, or send a sasl-init no real client would.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Callable

from proton import Collector, Connection, Link, Transport

from amqpbroker.amqp import sections
from amqpbroker.amqp.sections import Described, Symbol, ULong
from amqpbroker.protocol.sasl import SASL_HEADER

_OUTCOME = 0x44


def sasl_init(mechanism: str, response: bytes | None) -> bytes:
    """A sasl-init frame."""
    body = sections.encode_value(Described(ULong(0x41), [Symbol(mechanism), response]))
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def plain_sasl(user: str, password: str, *, authzid: str = "") -> bytes:
    """The SASL header and a PLAIN sasl-init."""
    return SASL_HEADER + sasl_init("PLAIN", f"{authzid}\0{user}\0{password}".encode())


def open_socket(port: int, *, source: str = "127.0.0.1", timeout: float = 10) -> socket.socket:
    """A socket to the broker from `source` (any 127.x.y.z is loopback on Linux: tests use
    distinct sources where the broker throttles per source)."""
    sock = socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    )
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_sasl_outcome(sock: socket.socket) -> tuple[int, bytes]:
    """Read the SASL header and frames up to sasl-outcome: (code, bytes read after it)."""
    data = b""
    while len(data) < 8:
        data += _recv(sock)
    assert data[:8] == SASL_HEADER, data[:8]
    data = data[8:]
    while True:
        while len(data) < 4 or len(data) < struct.unpack(">I", data[:4])[0]:
            data += _recv(sock)
        size, doff = struct.unpack(">IB", data[:5])
        value = sections.decode_value(data[doff * 4 : size])
        data = data[size:]
        if value.descriptor == _OUTCOME:
            return int(value.value[0]), data


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the broker closed the connection")
    return chunk


def read_until_closed(sock: socket.socket, timeout_s: float = 5) -> tuple[bytes, bool]:
    """Everything the broker sends within `timeout_s`, and whether it hung up by then."""
    deadline = time.monotonic() + timeout_s
    got = b""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return got, False
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker has closed `sock` (reads and drops whatever it sent first)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


class RawClient:
    """A proton client engine (no SASL layer of its own) over `sock`. Nothing runs unless
    the test calls `pump`; `pending_output` lets a test send the engine's bytes its own way."""

    def __init__(self, sock: socket.socket, *, idle_timeout_s: float = 0.0) -> None:
        self.sock = sock
        self.transport = Transport()
        if idle_timeout_s:
            self.transport.idle_timeout = idle_timeout_s
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)

    def anonymous_receiver(self, name: str, address: str, credit: int) -> Link:
        """Open the connection (SASL ANONYMOUS), a session and a receiver granting
        `credit`; nothing is sent until the test pumps."""
        self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.connection.open()
        session = self.connection.session()
        session.open()
        receiver = session.receiver(name)
        receiver.source.address = address
        receiver.open()
        receiver.flow(credit)
        return receiver

    def pending_output(self) -> bytes:
        pending = self.transport.pending()
        if pending <= 0:
            return b""
        out = bytes(self.transport.peek(pending))
        self.transport.pop(pending)
        return out

    def push(self, data: bytes) -> None:
        """Feed the engine at most its capacity at a time (it takes a read in parts)."""
        while data:
            capacity = self.transport.capacity()
            if capacity <= 0:
                raise ConnectionError("the client engine takes no more input")
            self.transport.push(data[:capacity])
            data = data[capacity:]

    def pump(self, until: Callable[[], bool], *, timeout: float = 10.0) -> None:
        """Exchange bytes with the broker until `until()` holds (or fail after timeout)."""
        deadline = time.monotonic() + timeout
        while not until():
            out = self.pending_output()
            if out:
                self.sock.sendall(out)
            if time.monotonic() > deadline:
                raise AssertionError("timed out pumping the raw client")
            readable, _, _ = select.select([self.sock], [], [], 0.05)
            if readable:
                data = self.sock.recv(65536)
                if not data:
                    self.transport.close_tail()
                    if not until():
                        raise ConnectionError("the broker closed the connection")
                    return
                self.push(data)
        out = self.pending_output()
        if out:
            self.sock.sendall(out)

    def close(self) -> None:
        self.sock.close()
