"""Hostile input, fifth attack pass: the frame walk before Proton (`protocol/handles.py`).

Raw AMQP frames over loopback against the real broker (security off: Proton's own SASL
layer is in place, as in the default config). The fourth pass made an attach on a handle
in use end its session (AMQP 1.0 §2.7.3); the walk that finds it stopped watching at the
first frame it believed Proton would refuse, and two such frames Proton takes: an empty
frame of any type (Proton ignores empty frames before it looks at the type) and a SASL
frame after the open (Proton's SASL layer reads a `sasl-init` at any time). After either,
a reused handle went to Proton unseen again. A frame too short for a performative was
kept back waiting for bytes of the next frame: the connection hung instead of closing.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from proton import Message
from support import frames as F
from support.client import QUEUE, connect, receive_bodies
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_LOG_LEVEL = "info"


class _Raw:
    """One raw connection: frames out, the broker's frames in (decoded)."""

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

    def close(self) -> None:
        self.sock.close()


def _round_trip(broker: BrokerProcess, address: str) -> list[object]:
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        sender.send(Message(body="still here"))
        return receive_bodies(conn.create_receiver(address, options=QUEUE), 1)
    finally:
        conn.close()


def _empty_frame(kind: int) -> bytes:
    return struct.pack(">IBBH", 8, 2, kind, 0)


# What the peer sends between its first attach and its second on the same handle.
INTERLUDES = {
    "empty frame of type 5": _empty_frame(5),
    "empty sasl frame": _empty_frame(F.SASL_FRAME),
    "sasl-init after the open": F.frame(F.sasl_init("ANONYMOUS"), kind=F.SASL_FRAME),
}


@pytest.mark.parametrize("interlude", list(INTERLUDES))
def test_a_frame_of_another_type_does_not_stop_the_handle_watch(
    broker: BrokerProcess, interlude: str
) -> None:
    """Fifth attack pass (B-053, B-153): a frame whose type is not AMQP (0x00) turned the
    broker's handle watch off, and Proton went on reading (it ignores an empty frame of
    any type, and its SASL layer takes a sasl-init after the open): the next attach on
    handle 0 orphaned the first link with its credit, the fourth pass's fix undone. Now
    any frame of another type after the open closes the connection with
    amqp:connection:framing-error, and the second attach is never answered."""
    raw = _Raw(broker)
    try:
        first = F.attach("first", handle=0, role_receiver=True, source=F.source("fifth", "queue"))
        raw.send(F.AMQP_HEADER, F.frame(F.open_()), F.frame(F.begin()), F.frame(first))
        raw.read_until(lambda fs: F.ATTACH in [F.performative_code(p) for p in fs])
        second = F.attach("second", handle=0, role_receiver=False, target=F.target("elsewhere"))
        raw.send(INTERLUDES[interlude], F.frame(second))
        raw.read_until(lambda fs: F.CLOSE in [F.performative_code(p) for p in fs])
        assert raw.codes().count(F.ATTACH) == 1, raw.codes()  # never answered
        assert F.close_condition(raw.data) == "amqp:connection:framing-error", raw.codes()
    finally:
        raw.close()
    assert _round_trip(broker, "after-fifth") == ["still here"]


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x00\x53"])
def test_a_frame_too_short_for_a_performative_closes_at_once(
    broker: BrokerProcess, body: bytes
) -> None:
    """Fifth attack pass (B-153): a whole frame of 1 or 2 body bytes was kept back by the
    handle watch until 3 bytes of body had come, which they never would: the connection
    hung until the idle timeout instead of closing with a framing error (Proton refuses
    it: no performative fits). An empty frame (a heartbeat) is still taken."""
    raw = _Raw(broker)
    try:
        raw.send(F.AMQP_HEADER, F.frame(F.open_()), F.frame(F.begin()))
        raw.read_until(lambda fs: F.BEGIN in [F.performative_code(p) for p in fs])
        raw.send(struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)
        raw.read_until(lambda fs: F.CLOSE in [F.performative_code(p) for p in fs], 3.0)
        if body:
            assert F.close_condition(raw.data) == "amqp:connection:framing-error", raw.codes()
        else:
            assert F.CLOSE not in raw.codes()
            raw.send(F.frame(F.end()))
            raw.read_until(lambda fs: F.END in [F.performative_code(p) for p in fs])
            assert F.END in raw.codes()
    finally:
        raw.close()
