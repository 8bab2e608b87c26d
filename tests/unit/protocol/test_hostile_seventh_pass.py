"""Hostile input, seventh attack pass (issue 15): the conditions Proton closes a
connection with, in AMQP's own spelling. Raw frames through the real handler, no sockets.

Proton answers a few protocol errors itself, writing its close frame at once, with
conditions AMQP 1.0 does not define: `amqp:not allowed` (a typo) for a disposition
range whose last precedes its first, `amqp:session:invalid-field` for a transfer out of
sequence, and `amqp:invalid-field` for a frame on a handle no link holds (AMQP 1.0
§2.7.4-2.7.6: `amqp:session:unattached-handle`). A client matching on the condition saw
none of the spec's.
"""

from __future__ import annotations

from random import Random

import pytest
from support import frames as F

from amqpbroker.amqp.sections import UInt
from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.protocol import AmqpConnection, Shell, connection, moves


@pytest.fixture
def peer() -> F.RawPeer:
    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    return F.RawPeer(AmqpConnection(Shell(broker), peer="memory"))


def _producer(handle: int = 0) -> bytes:
    target = F.target("q", "queue")
    return F.frame(F.attach("p", handle=handle, role_receiver=False, target=target))


def _consumer_of_three(peer: F.RawPeer) -> None:
    """Three messages on `q`, delivered unsettled to a consumer on handle 1."""
    peer.opened()
    peer.send(_producer())
    for n in range(3):
        transfer = F.transfer(delivery_id=n, tag=b"%d" % n, settled=True)
        peer.send(F.frame(transfer, payload=F.message(n)))
    source = F.source("q", "queue")
    peer.send(F.frame(F.attach("c", handle=1, role_receiver=True, source=source)))
    peer.send(F.frame(F.flow(handle=1, credit=10)))


def _closed_with(peer: F.RawPeer) -> tuple[str, str] | None:
    closes = [e for code, e in peer.errors() if code == F.CLOSE]
    assert len(closes) == 1, peer.errors()
    return closes[0]


@pytest.mark.parametrize(("first", "last"), [(2, 0), (0, 2**32 - 1)])
def test_a_disposition_range_backwards_closes_with_not_allowed(
    peer: F.RawPeer, first: int, last: int
) -> None:
    """Seventh attack pass (B-153, AMQP 1.0 §2.8.16): Proton closed with the condition
    `amqp:not allowed`, a symbol no client knows; the range stays refused, spelled
    `amqp:not-allowed`, and the connection is over (nothing settled)."""
    _consumer_of_three(peer)
    accepted = F.outcome(F.ACCEPTED)
    peer.send(F.frame(F.disposition(first=first, last=last, state=accepted)))
    assert _closed_with(peer) == ("amqp:not-allowed", f"illegal delivery range: {first:x}-{last:x}")
    assert peer.connection.finished
    assert peer.connection.broker.queues["q"].message_count == 3  # given back, not acked


def test_a_range_across_the_wrap_of_delivery_ids_is_taken(peer: F.RawPeer) -> None:
    """Held (AMQP 1.0 §2.8.4: delivery numbers are serial numbers, RFC 1982): a range
    from 2**32-5 to 5 is 11 ids, settled without an error."""
    _consumer_of_three(peer)
    accepted = F.outcome(F.ACCEPTED)
    peer.send(F.frame(F.disposition(first=2**32 - 5, last=5, state=accepted)))
    assert peer.errors() == []
    assert peer.connection.broker.queues["q"].message_count == 0


def test_a_transfer_out_of_sequence_closes_with_invalid_field(peer: F.RawPeer) -> None:
    """Seventh attack pass (B-153, AMQP 1.0 §2.7.5): a delivery-id that skips ahead was
    answered `amqp:session:invalid-field`, which AMQP does not define."""
    peer.opened()
    peer.send(_producer())
    peer.send(F.frame(F.transfer(delivery_id=0), payload=F.message("a")))
    peer.send(F.frame(F.transfer(delivery_id=1000, tag=b"u"), payload=F.message("b")))
    assert _closed_with(peer) == (
        "amqp:invalid-field",
        "sequencing error, expected delivery-id 1, got 1000",
    )
    assert peer.connection.broker.queues["q"].message_count == 1


@pytest.mark.parametrize(
    "frame",
    [
        F.frame(F.detach(handle=7)),
        F.frame(F.detach(handle=2**32 - 1)),
        F.frame(F.flow(handle=9, credit=5)),
        F.frame(F.transfer(handle=5), payload=F.message("x")),
    ],
    ids=["detach", "detach-uint-max", "flow", "transfer"],
)
def test_a_frame_on_a_handle_no_link_holds_closes_with_unattached_handle(
    peer: F.RawPeer, frame: bytes
) -> None:
    """Seventh attack pass (B-153, AMQP 1.0 §2.7.4-2.7.6): Proton closed with
    `amqp:invalid-field`; the spec's condition is `amqp:session:unattached-handle`.
    Proton still ends the connection, not only the session (its choice, stricter)."""
    peer.opened()
    peer.send(frame)
    condition, description = _closed_with(peer) or ("", "")
    assert condition == "amqp:session:unattached-handle"
    assert description.startswith("no such handle: ")
    assert peer.connection.finished


def test_proton_conditions_the_spec_defines_keep_their_spelling(peer: F.RawPeer) -> None:
    """A link name attached twice is Proton's `amqp:invalid-field`, a defined condition:
    left as it is (only the three above are re-spelled)."""
    peer.opened()
    peer.send(_producer(0))
    peer.send(_producer(1))
    assert _closed_with(peer) == ("amqp:invalid-field", "link name already attached: p")


def _session_flow(*, incoming_window: int, next_incoming_id: int = 0) -> bytes:
    """A flow on channel 1 giving the broker `incoming_window` transfers' room after
    `next_incoming_id`, and link 0 a credit of 1000 from delivery-count 0."""
    node = F.flow(handle=0, credit=1000)
    node.fields[0] = F.enc(UInt(next_incoming_id))
    node.fields[1] = F.enc(UInt(incoming_window))
    return F.frame(node, channel=1)


def test_a_session_window_of_0_does_not_pull_a_queue_into_the_engine(
    peer: F.RawPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seventh attack pass (issue 15, B-037): the write window refilled whenever the
    engine had no output, but a session whose peer's incoming-window is 0 keeps its
    transfers in Proton and writes nothing: a consumer with that session and all the
    credit it likes was handed the whole queue (20,000 1 KB messages, 33 MB, nothing
    sent). The window now counts what the sessions hold: about a window's worth is
    handed, and the rest once the peer opens its window, in order."""
    monkeypatch.setattr(connection, "ENGINE_WINDOW_BYTES", 10_000)
    peer.connection.window.room = 10_000
    peer.opened()
    peer.send(_producer())
    for n in range(50):
        transfer = F.transfer(delivery_id=n, tag=b"%d" % n, settled=True)
        peer.send(F.frame(transfer, payload=F.message(b"%02d" % n + b"x" * 2000)))
    queue = peer.connection.broker.queues["q"]
    peer.send(F.frame(F.begin(incoming_window=0), channel=1))
    consumer = F.attach("c", handle=0, role_receiver=True, source=F.source("q", "queue"))
    peer.send(F.frame(consumer, channel=1))
    peer.send(_session_flow(incoming_window=0))
    for _ in range(5):  # engine turns without anything written: still a window's worth
        peer.send(F.frame(F.Node(F.FLOW, F.flow(handle=None).fields)))
    assert queue.delivering <= 6  # 10,000 bytes of 2 KB messages, and one over
    transfers = [p for _, ch, p in F.read_frames(peer.received) if ch == 1]
    assert not [p for p in transfers if F.performative_code(p) == F.TRANSFER]
    received = 0
    for _ in range(60):  # the peer takes one transfer at a time
        peer.send(_session_flow(incoming_window=1, next_incoming_id=received))
        received = sum(
            F.performative_code(p) == F.TRANSFER
            for _, ch, p in F.read_frames(peer.received)
            if ch == 1
        )
        assert queue.delivering - received <= 6
    assert received == 50
