"""Hostile input, fifth attack pass, with persistence on: a producer's disposition of a
durable send the broker has not settled yet (the store has not answered).

Proton raises a delivery event for the peer's disposition; the broker took it for the
transfer's and read the link's *current* delivery, the next one, still partial: zero
bytes of it were routed as a message, and the next message was dropped.
"""

from __future__ import annotations

import socket
import time

import pytest
from support import frames as F
from support.client import QUEUE, connect, receive_bodies
from support.process import BrokerProcess

from amqpbroker.amqp.sections import UInt

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_LOG_LEVEL = "info"
BROKER_CONFIG = "persistence:\n  enabled: true\n  sync: true\n"

DURABLE = b"\x00\x53\x70\xc0\x02\x01\x41"  # header: durable true


def _read(sock: socket.socket, seconds: float) -> bytes:
    data = b""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_a_producers_early_settle_of_a_durable_send_is_not_read_as_a_transfer(
    broker: BrokerProcess,
) -> None:
    """Fifth attack pass (B-021, B-152): durable send A, the first frame of B, then the
    producer's disposition settling A before the journal answered. The broker routed an
    empty message (the consumer's Proton client failed on its zero-byte transfer: a
    TypeError in `recv_msg`) and settled B without an outcome, its bytes dropped. Now
    the disposition changes nothing: both messages arrive whole and B is accepted."""
    sock = socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5)
    try:
        attach = F.attach("p", handle=0, role_receiver=False, target=F.target("early", "queue"))
        sock.sendall(F.AMQP_HEADER + F.frame(F.open_()) + F.frame(F.begin()) + F.frame(attach))
        seen = _read(sock, 1.0)
        assert F.FLOW in [F.performative_code(p) for _, _, p in F.read_frames(seen)]
        first = F.frame(F.transfer(delivery_id=0, tag=b"a"), payload=F.message("A", header=DURABLE))
        second = F.message("B" * 100, header=DURABLE)
        settle_first = F.Node(
            F.DISPOSITION, [F.enc(False), F.enc(UInt(0)), F.NULL, F.enc(True), F.NULL]
        )
        sock.sendall(
            first
            + F.frame(F.transfer(delivery_id=1, tag=b"b", more=True), payload=second[:20])
            + F.frame(settle_first)
        )
        time.sleep(0.5)
        sock.sendall(F.frame(F.transfer(delivery_id=None, tag=None), payload=second[20:]))
        seen += _read(sock, 1.5)
        dispositions = [
            p for _, _, p in F.read_frames(seen) if F.performative_code(p) == F.DISPOSITION
        ]
        of_b = [p for p in dispositions if p.value[1] == 1]
        assert of_b, dispositions
        state = of_b[-1].value[4] if len(of_b[-1].value) > 4 else None  # none: no outcome
        assert F.performative_code(state) == F.ACCEPTED, of_b
    finally:
        sock.close()
    conn = connect(broker.url)
    try:
        receiver = conn.create_receiver("early", options=QUEUE)
        assert receive_bodies(receiver, 2) == ["A", "B" * 100]
    finally:
        conn.close()
