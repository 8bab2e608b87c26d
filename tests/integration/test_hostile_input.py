"""Hostile input against the real broker over loopback (issue 15)."""

from __future__ import annotations

import socket
import time

import pytest
from proton import Message
from proton.utils import SendException
from support import frames as F
from support.client import QUEUE, connect, receive_bodies
from support.frame_conn import round_trip
from support.process import BrokerProcess
from support.raw import read_until_closed

from amqpbroker.amqp.sections import MAX_DEPTH

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60), pytest.mark.timing]  # 1 s answers


BROKER_LOG_LEVEL = "info"


def _exchange(broker: BrokerProcess, data: bytes, *, timeout_s: float = 1.0) -> tuple[bytes, bool]:
    """Send `data`; read for up to `timeout_s`: (what the broker sent, whether it hung up)."""
    with socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5) as sock:
        sock.sendall(data)
        return read_until_closed(sock, timeout_s)


def test_lying_capabilities_array_is_refused_and_the_broker_lives(broker: BrokerProcess) -> None:
    """Issue 15: `e0 08 09 a3 05 queue` in a source killed the broker with SIGSEGV; now
    the attach is refused with amqp:decode-error and other clients are served."""
    source = F.source("q")
    source.fields[-1] = b"\xe0\x08\x09\xa3\x05queue"  # capabilities
    attach = F.attach("l", role_receiver=True, source=source, target=F.target(None))
    data = F.AMQP_HEADER + F.frame(F.open_()) + F.frame(F.begin()) + F.frame(attach)
    received, _ = _exchange(broker, data + F.frame(F.close()))
    errors = [F.error_of(p) for _, _, p in F.read_frames(received)]
    assert any(e is not None and e[0] == "amqp:decode-error" for e in errors), errors
    assert broker.proc.poll() is None
    assert round_trip(broker, "after-lying-array") == ["still here"]


@pytest.mark.parametrize(
    "data",
    [
        F.AMQP_HEADER + F.frame(b"\x00\x53\x10\xd0\x00\x00\x00\xff\x00\x00\x00\x09"),
        F.AMQP_HEADER + F.frame(F.begin()),
        F.AMQP_HEADER
        + F.frame(F.open_())
        + F.frame(F.begin())
        + F.frame(b"\x00\x53\x12\xc0\x03\x02\x40"),
    ],
    ids=["undecodable-open", "begin-before-open", "undecodable-attach"],
)
def test_framing_error_closes_the_connection_within_a_second(
    broker: BrokerProcess, data: bytes
) -> None:
    """Issue 15 / B-153: these were left open and unanswered; now the close frame
    (amqp:connection:framing-error) and the socket close come within a second."""
    started = time.monotonic()
    received, hung_up = _exchange(broker, data)
    assert hung_up
    assert time.monotonic() - started < 1.0
    assert F.close_condition(received) == "amqp:connection:framing-error"


def test_amqp_frames_in_place_of_sasl_init_do_not_leave_the_socket_open(
    broker: BrokerProcess,
) -> None:
    """Fuzz case open/type:0x10[2]+bytes:flip (seed 692011): the SASL header, then an
    open and a close as AMQP frames where a `sasl-init` belongs. Proton's SASL layer read
    them and stopped reading, but wrote nothing more, so the socket stayed open for as
    long as the client kept it (B-153: a malformed connection is closed)."""
    data = F.SASL_HEADER + F.frame(F.open_()) + F.frame(F.close())
    started = time.monotonic()
    received, hung_up = _exchange(broker, data + bytes(1024), timeout_s=3.0)
    assert hung_up
    assert time.monotonic() - started < 1.0
    assert received.startswith(F.SASL_HEADER)  # the mechanisms, then nothing but the end


def test_deeply_nested_message_is_rejected_at_the_door(broker: BrokerProcess) -> None:
    """Issue 15: a body nesting deeper than MAX_DEPTH is rejected (amqp:decode-error)
    instead of being stored and breaking the management API later."""
    conn = connect(broker.url)
    try:
        sender = conn.create_sender("nested", options=QUEUE)
        with pytest.raises(SendException) as refused:
            sender.send(Message(body=F.nested_lists(MAX_DEPTH + 10)))
        assert "amqp:decode-error" in str(refused.value.state) or refused.value.state
        sender.send(Message(body=F.nested_lists(5)))
        receiver = conn.create_receiver("nested", options=QUEUE)
        assert receive_bodies(receiver, 1) == [F.nested_lists(5)]
    finally:
        conn.close()


def test_consumer_on_hash_does_not_steal_from_orders(broker: BrokerProcess) -> None:
    """Issue 15 / B-011 decision: a `queue` consumer on `#` (security off) no longer
    competes with the `orders` queue: all 10 messages stay in `orders`."""
    thief_conn = connect(broker.url)
    conn = connect(broker.url)
    try:
        thief_conn.create_receiver("#", credit=10, options=QUEUE)
        sender = conn.create_sender("orders", options=QUEUE)
        for i in range(10):
            sender.send(Message(body=i))
        receiver = conn.create_receiver("orders", credit=10, options=QUEUE)
        assert receive_bodies(receiver, 10) == list(range(10))
    finally:
        conn.close()
        thief_conn.close()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_attaches_of_many_values_in_few_bytes_close_the_connection(
    broker: BrokerProcess,
) -> None:
    """Issue 15 attack (B-153): an array of 65,000 nulls is 14 bytes on the wire and
    ~5 MB of Proton nodes; 20 attaches of 198 bytes, each with such arrays in seven
    fields and refused, grew the broker by 625 MB, the attach bound seeing 2,530 bytes.
    The first such attach now closes the connection with resource-limit-exceeded."""
    nulls = b"\xf0" + (5).to_bytes(4, "big") + (65_000).to_bytes(4, "big") + b"\x40"
    source = F.source("q", "queue")
    source.fields[9] = source.fields[10] = nulls  # outcomes, capabilities
    frames = [F.frame(F.open_()), F.frame(F.begin())]
    for n in range(20):
        attach = F.attach(f"l{n}", handle=n, role_receiver=True, source=source)
        frames.append(F.frame(attach))
    before = _rss_kb(broker.proc.pid)
    received, hung_up = _exchange(broker, F.AMQP_HEADER + b"".join(frames), timeout_s=3.0)
    assert F.close_condition(received) == "amqp:resource-limit-exceeded"
    assert hung_up
    assert _rss_kb(broker.proc.pid) - before < 64 * 1024
    assert round_trip(broker, "after-many-values") == ["still here"]


def test_an_attach_over_8_kib_pipelined_with_the_open_is_served(broker: BrokerProcess) -> None:
    """Third attack pass (B-021): the open raises the frame size from 8 KiB to 128 KiB,
    but an attach sent in the same write as the open was read against 8 KiB and closed
    the connection with a framing error. Now the bytes before the open's handling go to
    the engine a frame at a time; the attach is answered and a frame past 8 KiB before
    the open is still refused."""
    big = F.frame(
        F.attach("l" * 20_000, role_receiver=False, target=F.target("pipelined", "queue"))
    )
    data = F.AMQP_HEADER + F.frame(F.open_()) + F.frame(F.begin()) + big
    with socket.create_connection(("127.0.0.1", broker.ports["amqp"]), timeout=5) as sock:
        for i in range(0, len(data), 333):  # in pieces that cut headers and sizes
            sock.sendall(data[i : i + 333])
        received, hung_up = read_until_closed(sock, 1.0)
    codes = [F.performative_code(p) for _, _, p in F.read_frames(received)]
    assert F.ATTACH in codes, codes
    assert not hung_up
    assert F.close_condition(received) is None
    refused = F.AMQP_HEADER + F.frame(F.open_(), payload=bytes(9000))
    received, hung_up = _exchange(broker, refused)
    assert hung_up
    assert F.close_condition(received) == "amqp:connection:framing-error"


def test_begins_on_a_channel_in_use_close_the_connection(broker: BrokerProcess) -> None:
    """Third attack pass (issue 15 bound of 64 sessions): Proton took each begin on a
    channel in use as a new session and left the old one unreachable, so channel-max
    bounded nothing; 60,000 begins on channel 0 grew the broker by 190 MB. A client may
    begin all 64 channels; a begin past that closes with a framing error."""
    every_channel = b"".join(F.frame(F.begin(), channel=c) for c in range(64))
    data = F.AMQP_HEADER + F.frame(F.open_()) + every_channel
    received, hung_up = _exchange(broker, data)
    assert not hung_up
    assert sum(F.performative_code(p) == F.BEGIN for _, _, p in F.read_frames(received)) == 64
    received, hung_up = _exchange(broker, data + F.frame(F.begin(), channel=0) * 1000)
    assert hung_up
    assert F.close_condition(received) == "amqp:connection:framing-error"
    assert round_trip(broker, "after-many-begins") == ["still here"]
