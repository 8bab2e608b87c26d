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

import struct

import pytest
from support import frames as F
from support.frame_conn import FrameConnection, round_trip
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_LOG_LEVEL = "info"


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
    raw = FrameConnection(broker)
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
    assert round_trip(broker, "after-fifth") == ["still here"]


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x00\x53"])
def test_a_frame_too_short_for_a_performative_closes_at_once(
    broker: BrokerProcess, body: bytes
) -> None:
    """Fifth attack pass (B-153): a whole frame of 1 or 2 body bytes was kept back by the
    handle watch until 3 bytes of body had come, which they never would: the connection
    hung until the idle timeout instead of closing with a framing error (Proton refuses
    it: no performative fits). An empty frame (a heartbeat) is still taken."""
    raw = FrameConnection(broker)
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
