"""Hostile input, fourth attack pass: the gaps docs/security.md listed as left (issue 15).

Raw AMQP frames over loopback against the real broker: a link handle reused on a session
(AMQP 1.0 §2.7.3, `amqp:session:handle-in-use`), a `declare` naming a global transaction
(transactions §4.5: not supported, so `amqp:not-implemented`).
"""

from __future__ import annotations

import socket
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
    """One raw connection: frames out, the broker's frames in (decoded), read until a
    condition holds."""

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

    def count(self, code: int) -> int:
        return sum(F.performative_code(p) == code for p in self.frames())

    def close(self) -> None:
        self.sock.close()


def _codes(frames: list[Any]) -> list[int | None]:
    return [F.performative_code(p) for p in frames]


def _round_trip(broker: BrokerProcess, address: str) -> list[object]:
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        sender.send(Message(body="still here"))
        return receive_bodies(conn.create_receiver(address, options=QUEUE), 1)
    finally:
        conn.close()


# -- a declare with a global-id (transactions §4.5) -----------------------------------------


def _declared_outcome(broker: BrokerProcess, declare: bytes) -> Any:
    """Attach a coordinator, wait for its credit, send `declare`: the broker's disposition."""
    raw = _Raw(broker)
    try:
        attach = F.attach("txn", role_receiver=False, source=F.source(None), target=F.coordinator())
        raw.send(F.AMQP_HEADER, F.frame(F.open_()), F.frame(F.begin()), F.frame(attach))
        assert F.FLOW in _codes(raw.read_until(lambda fs: F.FLOW in _codes(fs)))
        raw.send(F.frame(F.transfer(tag=b"d1"), payload=declare))
        frames = raw.read_until(lambda fs: F.DISPOSITION in _codes(fs))
        return next(p for p in frames if F.performative_code(p) == F.DISPOSITION)
    finally:
        raw.close()


def test_a_declare_naming_a_global_transaction_is_rejected_not_implemented(
    broker: BrokerProcess,
) -> None:
    """Fourth attack pass (B-140): a declare whose global-id is set was answered
    `declared`, a local transaction, so a client believed its work was part of a
    distributed transaction it was not. The broker does not support distributed
    transactions: the declare is rejected with amqp:not-implemented, and one without a
    global-id is still declared."""
    global_declare = b"\x00\x53\x77" + F.described_list(F.DECLARE, [F.enc(b"xa-global-1")])
    refused = _declared_outcome(broker, global_declare)
    assert F.error_of(refused) is not None
    assert F.error_of(refused)[0] == "amqp:not-implemented", refused
    local = _declared_outcome(broker, F.declare())
    state = local.value[4]
    assert F.performative_code(state) == 0x33, local  # declared
