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

from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.protocol import AmqpConnection, Shell, moves


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
