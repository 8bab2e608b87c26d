"""What the hostile-input tests share: a raw AMQP connection read frame by frame, and the
round trip that shows the broker still serves others after an attack."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from proton import Message

from support import frames as F
from support.client import QUEUE, connect, receive_bodies
from support.process import BrokerProcess


class FrameConnection:
    """One raw connection: frames out, the broker's frames in (decoded), read until a
    condition holds or the broker hangs up."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5)
        self.data = b""
        self.hung_up = False

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def frames(self) -> list[Any]:
        return [p for _, _, p in F.read_frames(self.data)]

    def read_until(self, done: Callable[[list[Any]], bool], timeout_s: float = 5.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while not done(self.frames()) and not self.hung_up:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.hung_up = True
            self.data += chunk
        return self.frames()

    def codes(self) -> list[int | None]:
        return [F.performative_code(p) for p in self.frames()]

    def count(self, code: int) -> int:
        return sum(F.performative_code(p) == code for p in self.frames())

    def close(self) -> None:
        self.sock.close()


def round_trip(broker: BrokerProcess, address: str) -> list[object]:
    """A message sent to `address` and received back by a fresh client."""
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        sender.send(Message(body="still here"))
        return receive_bodies(conn.create_receiver(address, options=QUEUE), 1)
    finally:
        conn.close()
