"""Hostile input, fourth attack pass: the gaps docs/security.md listed as left (issue 15).

Raw AMQP frames over loopback against the real broker: a link handle reused on a session
(AMQP 1.0 §2.7.3, `amqp:session:handle-in-use`), a `declare` naming a global transaction
(transactions §4.5: not supported, so `amqp:not-implemented`).
"""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from support import frames as F
from support.client import QUEUE, connect, receive_bodies
from support.frame_conn import FrameConnection, round_trip
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_LOG_LEVEL = "info"


def _codes(frames: list[Any]) -> list[int | None]:
    return [F.performative_code(p) for p in frames]


# -- a declare with a global-id (transactions §4.5) -----------------------------------------


def _declared_outcome(broker: BrokerProcess, declare: bytes) -> Any:
    """Attach a coordinator, wait for its credit, send `declare`: the broker's disposition."""
    raw = FrameConnection(broker)
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


# -- an attach on a handle in use (AMQP 1.0 §2.7.3) -----------------------------------------


def _send_bodies(broker: BrokerProcess, address: str, count: int) -> None:
    conn = connect(broker.url)
    try:
        sender = conn.create_sender(address, options=QUEUE)
        for i in range(count):
            sender.send(Message(body=i))
    finally:
        conn.close()


def test_an_attach_on_a_handle_in_use_ends_the_session_and_gives_back_its_deliveries(
    broker: BrokerProcess,
) -> None:
    """Fourth attack pass (B-053, B-153): Proton took a second attach on handle 0 as a
    new link and left the first, with its 3 unsettled deliveries and its credit,
    unreachable until the connection closed: another consumer got nothing. Now the
    session ends with amqp:session:handle-in-use at once, the connection stays, the
    deliveries go back to the queue (another consumer gets all 3), the peer's frames on
    that channel are dropped until its end, and the channel can then be begun again."""
    _send_bodies(broker, "handle-reuse", 3)
    raw = FrameConnection(broker)
    try:
        first = F.attach(
            "first", handle=0, role_receiver=True, source=F.source("handle-reuse", "queue")
        )
        raw.send(F.AMQP_HEADER, F.frame(F.open_()), F.frame(F.begin()), F.frame(first))
        raw.read_until(lambda fs: F.ATTACH in _codes(fs))
        raw.send(F.frame(F.flow(handle=0, credit=10)))
        raw.read_until(lambda fs: _codes(fs).count(F.TRANSFER) >= 3)
        assert raw.count(F.TRANSFER) == 3
        second = F.attach("second", handle=0, role_receiver=False, target=F.target("elsewhere"))
        raw.send(F.frame(second), F.frame(F.flow(handle=0, credit=5)))
        frames = raw.read_until(lambda fs: F.END in _codes(fs))
        ended = next(p for p in frames if F.performative_code(p) == F.END)
        assert F.error_of(ended) is not None
        assert F.error_of(ended)[0] == "amqp:session:handle-in-use", ended
        assert raw.count(F.ATTACH) == 1  # the second attach was never answered
        conn = connect(broker.url)
        try:
            receiver = conn.create_receiver("handle-reuse", options=QUEUE)
            assert sorted(receive_bodies(receiver, 3)) == [0, 1, 2]
        finally:
            conn.close()
        # the peer's end, then the channel again: served
        raw.send(F.frame(F.end()), F.frame(F.begin()))
        raw.read_until(lambda fs: _codes(fs).count(F.BEGIN) >= 2)
        again = F.attach("again", handle=0, role_receiver=False, target=F.target("handle-reuse"))
        raw.send(F.frame(again))
        frames = raw.read_until(lambda fs: _codes(fs).count(F.ATTACH) >= 2)
        assert raw.count(F.ATTACH) == 2
        assert not raw.hung_up
        assert F.close_condition(raw.data) is None
    finally:
        raw.close()
    assert round_trip(broker, "after-handle-reuse") == ["still here"]


def test_a_handle_that_is_not_a_uint_closes_the_connection(broker: BrokerProcess) -> None:
    """Fourth attack pass: the broker reads handles from the frames itself, and Proton's
    reading of a mistyped mandatory field is not the broker's to guess: a detach whose
    handle is a string closes the connection with amqp:invalid-field."""
    raw = FrameConnection(broker)
    try:
        attach = F.attach("l", handle=0, role_receiver=False, target=F.target("mistyped"))
        detach = F.detach()
        detach.fields[0] = F.enc("zero")
        raw.send(F.AMQP_HEADER, F.frame(F.open_()), F.frame(F.begin()), F.frame(attach))
        raw.read_until(lambda fs: F.ATTACH in _codes(fs))
        raw.send(F.frame(detach))
        raw.read_until(lambda fs: F.CLOSE in _codes(fs))
        assert F.close_condition(raw.data) == "amqp:invalid-field", broker.log()[-3000:]
    finally:
        raw.close()
