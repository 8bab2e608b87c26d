"""The peer's link handles per session, read from its frames before Proton sees them.

Why: Proton maps an attach's handle to its new link without asking whether a link of the
session still holds it, and the old link is then unreachable (no transfer, flow or detach
can name it) but alive, with its deliveries and credit, until the connection closes
(fourth attack pass). AMQP 1.0 §2.7.3 makes such an attach a session error,
`amqp:session:handle-in-use`, and Proton offers no way to read a link's handle, so the
broker reads the frames itself: `HandleWatch.split` walks the frames of what a socket
read brought (after the open: the handshake pushes a frame at a time), tracks the handles
the peer's attaches take and its detaches and ends give back, and cuts the input where
an attach names a handle in use. The attach is never handed to Proton: the broker ends
that session instead (`AmqpConnection._end_session`), and drops the peer's frames on its
channel until the peer's own end, which is handed on (AMQP 1.0 §2.5.5: after an end with
an error, the sender ignores what the peer sends on it until the peer ends too); a close
is a connection's frame and always handed on.

Cost: the size and performative code of every frame (a few bytes each, no decoding);
the attach, detach and end frames are read further, the attach up to its handle only
(never a whole decode: its termini may hold arrays of millions of zero-width elements).
Bytes of a frame whose start is needed and has not all arrived are kept back (at most
one frame) until it has.

A frame Proton will refuse (a size below 8 or above the frame size, a doff below 2)
ends the watch: everything goes to Proton, which closes the connection with a framing
error; so does a frame too short to hold a performative. A frame of a type other than
AMQP is a `FRAMING_ERROR` of the broker's own (fifth attack pass): Proton ignores an empty
frame of any type and its SASL layer reads a `sasl-init` after the open, so handing such
a frame on and no longer watching let the next attach on a handle in use through.

A handle that is not a uint (AMQP 1.0 §2.7.3: a mandatory `handle` field), or an attach
or detach without one, is `MALFORMED`: the connection is closed with `amqp:invalid-field`
(Proton's decoders differ in what they make of a mistyped field; the broker need not
guess); an attach or detach whose list does not fit its frame is a `FRAMING_ERROR`, as
Proton answers it.

Loop thread only; one per connection.
"""

from __future__ import annotations

from typing import Final

# What a step of `split` asks of the connection.
PUSH: Final = 0  # hand the bytes to the engine
HANDLE_IN_USE: Final = 1  # end `channel`'s session with amqp:session:handle-in-use
MALFORMED: Final = 2  # close the connection: `description` says why
FRAMING_ERROR: Final = 4  # close the connection with amqp:connection:framing-error
BEGIN: Final = 3  # hand the bytes (ending with a begin) to the engine: its session is `channel`'s

_BEGIN: Final = 0x11
_ATTACH: Final = 0x12
_FLOW: Final = 0x13
_DISPOSITION: Final = 0x15
_DETACH: Final = 0x16
_END: Final = 0x17

Step = tuple[int, bytes | memoryview, int, str]  # (kind, bytes to push, channel, description)


def _width(data: bytes | memoryview, pos: int) -> int:
    """The encoded size of the value at `pos` (AMQP 1.0 §1.2: the constructor's subcategory
    gives the width of its size), or -1 if it does not fit in `data`."""
    if pos >= len(data):
        return -1
    code = data[pos]
    if code == 0x00:  # described: a descriptor, then the value
        descriptor = _width(data, pos + 1)
        if descriptor < 0:
            return -1
        value = _width(data, pos + 1 + descriptor)
        return -1 if value < 0 else 1 + descriptor + value
    fixed = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}.get(code >> 4)
    if fixed is not None:
        end = pos + 1 + fixed
    elif code >> 4 in (0xA, 0xC, 0xE):
        if pos + 2 > len(data):
            return -1
        end = pos + 2 + data[pos + 1]
    elif code >> 4 in (0xB, 0xD, 0xF):
        if pos + 5 > len(data):
            return -1
        end = pos + 5 + int.from_bytes(data[pos + 1 : pos + 5], "big")
    else:
        return -1
    return end - pos if end <= len(data) else -1


def _code(head: bytes | memoryview) -> int:
    """A performative's descriptor code: 0x00 then a ulong (smallulong, ulong0 or ulong,
    the forms Proton reads); -1 for anything else (Proton refuses the frame)."""
    if len(head) < 2 or head[0] != 0x00:
        return -1
    if head[1] == 0x53 and len(head) >= 3:
        return head[2]
    if head[1] == 0x44:
        return 0
    if head[1] == 0x80 and len(head) >= 10:
        return int.from_bytes(head[2:10], "big")
    return -1


def _uint(data: bytes | memoryview, pos: int) -> int | None:
    """The uint at `pos` (uint, smalluint, uint0), None for any other encoding."""
    if pos >= len(data):
        return None
    code = data[pos]
    if code == 0x43:
        return 0
    if code == 0x52 and pos + 2 <= len(data):
        return data[pos + 1]
    if code == 0x70 and pos + 5 <= len(data):
        return int.from_bytes(data[pos + 1 : pos + 5], "big")
    return None


UNDECODABLE: Final = -1  # `handle_of`: the list or a field before the handle does not fit


def handle_of(body: bytes | memoryview, index: int) -> int | None:
    """The uint field `index` of the described list `body` (a performative: 0x00, its
    descriptor, the list): None if the list is shorter or that field is not a uint,
    `UNDECODABLE` if the list, or a field before it, does not fit (in the frame, or in
    the list's own size: a field past it is not there). Only the fields before it are
    walked (by their widths)."""
    descriptor = _width(body, 1)
    if not body or body[0] != 0x00 or descriptor < 0:
        return UNDECODABLE
    pos = 1 + descriptor
    if pos >= len(body):
        return UNDECODABLE
    kind = body[pos]
    if kind == 0x45:  # list0: no fields
        return None
    if kind == 0xC0 and pos + 3 <= len(body):
        end, count, pos = pos + 2 + body[pos + 1], body[pos + 2], pos + 3
    elif kind == 0xD0 and pos + 9 <= len(body):
        end = pos + 5 + int.from_bytes(body[pos + 1 : pos + 5], "big")
        count, pos = int.from_bytes(body[pos + 5 : pos + 9], "big"), pos + 9
    else:
        return UNDECODABLE
    if end > len(body) or end < pos:
        return UNDECODABLE
    body = body[:end]
    if count <= index:
        return None
    for _ in range(index):
        width = _width(body, pos)
        if width < 0:
            return UNDECODABLE
        pos += width
    if _width(body, pos) < 0:
        return UNDECODABLE
    return _uint(body, pos)


class HandleWatch:
    """The handles the peer holds on each of its channels (module doc)."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self.handles: dict[int, set[int]] = {}  # channel -> handles attached, not detached
        self.ending: set[int] = set()  # channels the broker ended: dropped until the end
        self.off = False  # a frame Proton will refuse came: no more watching
        self._carry = b""  # the start of a frame not yet whole enough to decide
        self._skip = 0  # bytes of the current frame still to come (pushed or dropped)
        self._dropping = False  # whether those are dropped (a frame on an ending channel)

    def split(self, data: bytes | memoryview) -> list[Step]:
        """`data` (the next bytes from the peer) as steps to take in order."""
        if self.off:
            return [(PUSH, data, 0, "")]
        # bytes, not a memoryview: indexing one is dearer (a socket read is bytes already:
        # not copied; a copy was half of the walk's cost)
        buf = self._carry + data if self._carry else data if type(data) is bytes else bytes(data)
        self._carry = b""
        view = memoryview(buf)  # the steps' pieces: slices of a read, never copies
        steps: list[Step] = []
        n = len(buf)
        start = 0  # the first byte not yet in a step
        pos = min(self._skip, n)  # the rest of a frame begun in an earlier read
        self._skip -= pos
        if self._dropping:  # ... on a channel the broker ended
            start = pos
            if self._skip:
                return steps
        self._dropping = False
        ending = self.ending
        limit: int = self.max_frame_size
        # The walk per frame is what every message pays (a transfer, a disposition):
        # its size and code only, in typed ints (C in the compiled build), no call, no
        # slice, no object.
        while n - pos >= 8:
            size: int = (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
            doff: int = buf[pos + 4]
            kind: int = buf[pos + 5]
            channel: int = (buf[pos + 6] << 8) | buf[pos + 7]
            body = pos + doff * 4
            if size < 8 or size > limit or doff < 2 or kind != 0:
                if size >= 8 and size <= limit and doff >= 2:  # a type other than AMQP
                    if pos > start:
                        steps.append((PUSH, view[start:pos], 0, ""))
                    steps.append((FRAMING_ERROR, b"", channel, f"a frame of type {kind}"))
                    self.off = True
                    return steps
                self.off = True  # Proton refuses it and closes the connection
                pos = n
                break
            if body + 3 > pos + size:  # a heartbeat, only a header, or a body too short
                pos += size  # for a performative (Proton refuses it: fifth attack pass)
                continue
            if body + 3 > n:
                break
            code: int
            if buf[body] == 0 and buf[body + 1] == 0x53:
                code = buf[body + 2]
                if code != _ATTACH and code != _DETACH and code != _END and code != _BEGIN:
                    # a flow, transfer or disposition of an ended session is dropped; a
                    # close (a connection's frame, on any channel) never is
                    if ending and _FLOW <= code <= _DISPOSITION and channel in ending:
                        if pos > start:
                            steps.append((PUSH, view[start:pos], 0, ""))
                        start = pos + size  # dropped
                    pos += size  # a transfer, flow, disposition ...
                    continue
            else:
                head_end = min(body + 10, pos + size)  # 0x00 then a ulong: <= 10 bytes
                if n < head_end:
                    break
                code = _code(buf[body:head_end])
            if n - pos < size:
                break  # a frame of the few read further is whole before it is decided
            if channel in ending and _BEGIN <= code <= _DETACH:
                if pos > start:
                    steps.append((PUSH, view[start:pos], 0, ""))
                pos += size
                start = pos  # dropped
                continue
            if code == _BEGIN:  # cut after it: the session it opens is on `channel`
                pos += size
                steps.append((BEGIN, view[start:pos], channel, ""))
                start = pos
                continue
            if code == _END:
                self.handles.pop(channel, None)
                ending.discard(channel)
                pos += size
                continue
            if code != _ATTACH and code != _DETACH:
                pos += size  # a descriptor Proton refuses: its error
                continue
            handle = handle_of(buf[body : pos + size], 1 if code == _ATTACH else 0)
            if handle is None or handle == UNDECODABLE:
                if pos > start:
                    steps.append((PUSH, view[start:pos], 0, ""))
                what = "attach" if code == _ATTACH else "detach"
                if handle is None:
                    steps.append((MALFORMED, b"", channel, f"{what}.handle is not a uint"))
                else:  # as Proton answers a frame it cannot decode
                    steps.append((FRAMING_ERROR, b"", channel, f"undecodable {what}"))
                self.off = True
                return steps
            held = self.handles.setdefault(channel, set())
            if code == _DETACH:
                held.discard(handle)
            elif handle in held:
                if pos > start:
                    steps.append((PUSH, view[start:pos], 0, ""))
                steps.append((HANDLE_IN_USE, b"", channel, f"handle {handle} is in use"))
                ending.add(channel)
                self.handles.pop(channel, None)
                start = pos + size  # the attach is never handed on
            else:
                held.add(handle)
            pos += size
        if pos > n:  # the frame goes on in the next read
            self._skip = pos - n
            self._dropping = start > n
            pos = n
            start = min(start, n)
        elif pos < n:  # a frame's start, kept until enough of it has come
            self._carry = bytes(buf[pos:])
        if pos > start:
            steps.append((PUSH, view[start:pos], 0, ""))
        return steps
