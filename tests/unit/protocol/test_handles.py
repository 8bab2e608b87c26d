"""`HandleWatch`: the peer's link handles read from its frames (fourth attack pass).

The watch must decide the same whatever the socket reads cut the frames into, and must
read a handle whatever encodings come before it (`handle_of` walks by widths).
"""

from __future__ import annotations

import random

from support import frames as F

from amqpbroker.amqp.sections import Symbol, UInt, ULong
from amqpbroker.protocol import handles
from amqpbroker.protocol.handles import HandleWatch, handle_of


def _steps(watch: HandleWatch, data: bytes, cut: int) -> list[tuple[int, bytes, int, str]]:
    """Feed `data` in pieces of `cut` bytes; the steps, consecutive pushes joined."""
    out: list[tuple[int, bytes, int, str]] = []
    for i in range(0, len(data), cut):
        for kind, piece, channel, description in watch.split(data[i : i + cut]):
            if kind in (handles.PUSH, handles.BEGIN) and out and out[-1][0] == handles.PUSH:
                out[-1] = (kind, out[-1][1] + bytes(piece), channel, "")
            else:
                out.append((kind, bytes(piece), channel, description))
    return out


def _stream() -> bytes:
    attach = F.attach("a" * 300, handle=7, role_receiver=True, source=F.source("q"))
    other = F.attach("b", handle=7, role_receiver=False, target=F.target("t"))
    return b"".join(
        [
            F.frame(F.begin(), channel=1),
            F.frame(attach, channel=1),
            F.frame(F.transfer(handle=7), channel=1, payload=bytes(500)),
            F.frame(F.flow(handle=7), channel=1),
            F.frame(other, channel=1),  # handle 7 is in use: the session ends
            F.frame(F.transfer(handle=7), channel=1, payload=bytes(100)),  # dropped
            F.frame(F.end(), channel=1),
            F.frame(F.begin(), channel=1),
            F.frame(other, channel=1),  # a new session: handle 7 is free
        ]
    )


def test_the_steps_do_not_depend_on_how_the_reads_cut_the_frames() -> None:
    data = _stream()
    whole = _steps(HandleWatch(131072), data, len(data))
    assert [k for k, *_ in whole] == [
        handles.BEGIN,
        handles.PUSH,
        handles.HANDLE_IN_USE,
        handles.BEGIN,  # the peer's end, then its begin
        handles.PUSH,
    ]
    assert whole[2][2:] == (1, "handle 7 is in use")
    pushed = b"".join(p for k, p, *_ in whole)
    assert len(pushed) == len(data) - len(
        F.frame(F.attach("b", handle=7, role_receiver=False, target=F.target("t")))
    ) - len(F.frame(F.transfer(handle=7), payload=bytes(100)))
    for cut in (1, 2, 3, 7, 8, 9, 64, 333):
        assert _steps(HandleWatch(131072), data, cut) == whole, cut


def test_a_handle_is_read_past_any_encoding_of_the_name() -> None:
    for name in (F.enc("n"), F.enc("n" * 300), F.enc(Symbol("n")), F.enc([1, [2, "x"]])):
        attach = F.attach("x", handle=70000, role_receiver=True)
        attach.fields[0] = name
        assert handle_of(attach.encode(), 1) == 70000
    for handle in (F.enc(UInt(0)), F.enc(UInt(5)), b"\x70\x00\x00\x00\x05"):
        detach = F.detach()
        detach.fields[0] = handle
        assert handle_of(detach.encode(), 0) in (0, 5)


def test_a_handle_that_is_not_a_uint_or_is_missing_is_malformed() -> None:
    for handle in (F.enc("0"), F.enc(ULong(0)), F.NULL, b"\x00\x53\x00\x43"):
        detach = F.detach()
        detach.fields[0] = handle
        assert handle_of(detach.encode(), 0) is None
    assert handle_of(F.described_list(F.ATTACH, [F.enc("only-a-name")]), 1) is None
    # a field past the list's own size is not read, whatever follows in the frame
    body = bytearray(F.detach().encode())
    body[3:8] = b"\xd0\x00\x00\x00\x04"  # list32 of 4 bytes: the count, nothing else
    assert handle_of(bytes(body), 0) == handles.UNDECODABLE
    steps = HandleWatch(131072).split(F.frame(F.begin()) + F.frame(F.detach(handle=0)))
    assert [k for k, *_ in steps] == [handles.BEGIN, handles.PUSH]
    bad = F.detach()
    bad.fields[0] = F.enc("zero")
    steps = HandleWatch(131072).split(F.frame(bad))
    assert steps[-1][0] == handles.MALFORMED
    steps = HandleWatch(131072).split(F.frame(b"\x00\x53\x12\xc0\x03\x02\x40"))
    assert steps[-1][0] == handles.FRAMING_ERROR


def test_a_ulong_descriptor_is_read_as_proton_reads_it() -> None:
    """Proton takes 0x80 (ulong) and 0x44 (ulong0) descriptors as well as 0x53: an
    attach spelt so must not pass the watch unseen."""
    attach = F.attach("a", handle=1, role_receiver=True).encode()
    long_form = b"\x00\x80" + (0x12).to_bytes(8, "big") + attach[3:]
    watch = HandleWatch(131072)
    frames = (
        F.frame(F.begin())
        + F.frame(long_form)
        + F.frame(long_form.replace(b"\xa1\x01a", b"\xa1\x01b"))
    )
    assert [k for k, *_ in watch.split(frames)] == [
        handles.BEGIN,
        handles.PUSH,
        handles.HANDLE_IN_USE,
    ]


def test_a_frame_proton_refuses_ends_the_watch() -> None:
    watch = HandleWatch(131072)
    oversized = (200_000).to_bytes(4, "big") + b"\x02\x00\x00\x00"
    assert [k for k, *_ in watch.split(oversized + bytes(100))] == [handles.PUSH]
    assert watch.off


def _until_error(steps: list[tuple[int, bytes, int, str]]) -> list[tuple[int, bytes, int, str]]:
    """The steps up to the first that closes the connection (nothing after it is read)."""
    for i, (kind, *_) in enumerate(steps):
        if kind in (handles.FRAMING_ERROR, handles.MALFORMED):
            return steps[: i + 1]
    return steps


def test_a_frame_of_another_type_is_a_framing_error_whatever_the_cuts() -> None:
    """Fifth attack pass: a frame of a type other than AMQP ended the watch and went to
    Proton, which ignores an empty frame of any type and reads a sasl-init after the
    open: the next attach on a handle in use went through unseen. It is the broker's
    framing error now, the frames before it handed on."""
    attach = F.frame(F.attach("a", handle=0, role_receiver=False, target=F.target("t")))
    for other in (
        b"\x00\x00\x00\x08\x02\x05\x00\x00",
        b"\x00\x00\x00\x08\x02\x01\x00\x00",
        F.frame(F.sasl_init("ANONYMOUS"), kind=F.SASL_FRAME),
    ):
        data = F.frame(F.begin()) + attach + other + attach
        for cut in range(1, len(data) + 1):
            steps = _until_error(_steps(HandleWatch(131072), data, cut))
            assert [k for k, *_ in steps] == [
                handles.BEGIN,
                handles.PUSH,
                handles.FRAMING_ERROR,
            ], (other, cut)
            assert steps[1][1] == attach
            assert steps[2][3].startswith("a frame of type")


def test_a_frame_too_short_for_a_performative_is_handed_on_at_once() -> None:
    """Fifth attack pass: a whole frame of 1 or 2 body bytes was kept back until 3 bytes
    of body came, which were the next frame's, or never: the connection hung instead of
    Proton refusing the frame. It is handed on as soon as it is whole."""
    for body in (b"\x00", b"\x00\x53", b"\x12"):
        short = (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body
        data = F.frame(F.begin()) + short
        for cut in range(1, len(data) + 1):
            steps = _steps(HandleWatch(131072), data, cut)
            assert b"".join(p for _, p, *_ in steps) == data, (body, cut)


def test_the_steps_do_not_depend_on_the_cuts_of_damaged_streams() -> None:
    """Fifth attack pass: seeded streams of frames with bytes overwritten (sizes, codes,
    list sizes, handles) decide the same at every single cut as in one read, up to the
    first step that closes the connection."""
    frames = [
        F.frame(F.begin(), channel=1),
        F.frame(F.attach("a" * 30, handle=7, role_receiver=True, source=F.source("q")), channel=1),
        F.frame(F.transfer(handle=7), channel=1, payload=bytes(50)),
        F.frame(F.attach("b", handle=7, role_receiver=False, target=F.target("t")), channel=1),
        F.frame(F.detach(handle=7), channel=1),
        F.frame(F.end(), channel=1),
        b"\x00\x00\x00\x08\x02\x00\x00\x01",
    ]
    rng = random.Random(5)
    for _ in range(60):
        data = bytearray(b"".join(rng.choice(frames) for _ in range(rng.randint(1, 5))))
        for _ in range(rng.randint(0, 3)):
            data[rng.randrange(len(data))] = rng.choice((0, 1, 2, 0x12, 0x16, 0x53, 0xFF))
        whole = _until_error(_steps(HandleWatch(2048), bytes(data), len(data)))
        for cut in range(1, len(data)):
            first, rest = bytes(data[:cut]), bytes(data[cut:])
            watch = HandleWatch(2048)
            two = _steps(watch, first, len(first)) + _steps(watch, rest, len(rest))
            merged: list[tuple[int, bytes, int, str]] = []
            for step in two:
                if step[0] == handles.PUSH and not step[1]:
                    continue
                if step[0] in (handles.PUSH, handles.BEGIN) and merged and merged[-1][0] == 0:
                    merged[-1] = (step[0], merged[-1][1] + step[1], step[2], "")
                else:
                    merged.append(step)
            assert _until_error(merged) == whole, (bytes(data).hex(), cut)


def test_a_close_on_an_ended_sessions_channel_is_handed_on() -> None:
    """Fuzz case topic/repeat (seed 15): an attach repeated on its handle, then the
    connection's close on channel 0, the ended session's: the close was dropped with the
    session's frames and the connection left unanswered."""
    attach = F.frame(F.attach("a", handle=0, role_receiver=False, target=F.target("t")))
    watch = HandleWatch(131072)
    steps = watch.split(F.frame(F.begin()) + attach + attach + F.frame(F.close()))
    assert [k for k, *_ in steps] == [
        handles.BEGIN,
        handles.PUSH,
        handles.HANDLE_IN_USE,
        handles.PUSH,
    ]
    assert bytes(steps[-1][1]) == F.frame(F.close())
