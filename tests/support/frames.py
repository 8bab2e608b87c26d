"""Raw AMQP 1.0 frames for hostile-input tests and the fuzzer (issue 15).

Performatives are described lists whose fields are *encoded bytes*, so a test can put
any value, well-formed or not, in any field: `attach(name=..., source=lying_array)`.
Values are encoded with the broker's own codec (`amqpbroker.protocol.sections`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from amqpbroker.protocol.sections import (
    Array,
    Described,
    SectionError,
    Symbol,
    UInt,
    decode_first,
    encode_value,
)

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_FRAME, SASL_FRAME = 0, 1

# Performative and SASL frame descriptor codes (AMQP 1.0 part 2.7, 5.3).
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)
SOURCE, TARGET, COORDINATOR = 0x28, 0x29, 0x30
ERROR = 0x1D
ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x24, 0x25, 0x26, 0x27
DECLARE, DISCHARGE, TRANSACTIONAL_STATE = 0x31, 0x32, 0x34
HEADER_SECTION, AMQP_VALUE_SECTION = 0x70, 0x77

NULL = b"\x40"


def enc(value: Any) -> bytes:
    """One value, encoded by the broker's codec (`Symbol`, `UInt`... say the AMQP type)."""
    return encode_value(value)


def symbols(*names: str) -> bytes:
    """An array of symbols, the usual encoding of capabilities."""
    return enc(Array([Symbol(n) for n in names], element_type=Symbol))


def described_list(code: int, fields: list[bytes]) -> bytes:
    """`code` described list32 of already-encoded fields (trailing nulls kept as given)."""
    body = b"".join(fields)
    return (
        b"\x00\x53"
        + bytes((code,))
        + b"\xd0"
        + struct.pack(">II", len(body) + 4, len(fields))
        + body
    )


def frame(body: bytes, *, channel: int = 0, kind: int = AMQP_FRAME, payload: bytes = b"") -> bytes:
    """One frame: size, doff 2, type, channel, then the performative and its payload."""
    return struct.pack(">IBBH", 8 + len(body) + len(payload), 2, kind, channel) + body + payload


def open_(container: str = "fuzz", *, extra: list[bytes] | None = None) -> bytes:
    return described_list(OPEN, [enc(container), *(extra or [])])


def begin(*, remote_channel: bytes = NULL, incoming_window: int = 2048) -> bytes:
    window = enc(UInt(incoming_window))
    return described_list(BEGIN, [remote_channel, enc(UInt(0)), window, enc(UInt(2048))])


def terminus(
    code: int, address: str | None, *, capabilities: bytes = NULL, tail: list[bytes] | None = None
) -> bytes:
    """A source (0x28) or target (0x29): address, then nulls, then capabilities last."""
    if (
        code == SOURCE
    ):  # address durable expiry timeout dynamic props dist-mode filter outcome outcomes caps
        fields = [enc(address), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, capabilities]
    else:  # address durable expiry timeout dynamic props capabilities
        fields = [enc(address), NULL, NULL, NULL, NULL, NULL, capabilities]
    if tail is not None:
        fields[1 : 1 + len(tail)] = tail
    return described_list(code, fields)


def coordinator() -> bytes:
    return described_list(COORDINATOR, [symbols("amqp:local-transactions")])


def attach(
    name: str,
    *,
    handle: int = 0,
    role_receiver: bool,
    source: bytes = NULL,
    target: bytes = NULL,
    extra: list[bytes] | None = None,
) -> bytes:
    """role true = the peer receives (the broker's consumer); false = the peer sends."""
    role = b"\x41" if role_receiver else b"\x42"
    fields = [enc(name), enc(UInt(handle)), role, NULL, NULL, source, target]
    return described_list(ATTACH, fields + list(extra or []))


def flow(*, handle: int | None = 0, credit: int = 10, drain: bool = False) -> bytes:
    fields = [enc(UInt(0)), enc(UInt(2048)), enc(UInt(0)), enc(UInt(2048))]
    if handle is not None:
        fields += [enc(UInt(handle)), enc(UInt(0)), enc(UInt(credit)), NULL, enc(drain)]
    return described_list(FLOW, fields)


def transfer(
    *,
    handle: int = 0,
    delivery_id: int = 0,
    tag: bytes = b"t",
    more: bool = False,
    aborted: bool = False,
    settled: bool = False,
    state: bytes | None = None,
) -> bytes:
    fields = [enc(UInt(handle)), enc(UInt(delivery_id)), enc(tag), enc(UInt(0)), enc(settled)]
    fields += [enc(more), NULL, state if state is not None else NULL]
    if aborted:
        fields += [NULL, enc(True)]
    return described_list(TRANSFER, fields)


def outcome(code: int, fields: list[bytes] | None = None) -> bytes:
    return described_list(code, list(fields or []))


def disposition(*, first: int = 0, last: int | None = None, state: bytes = NULL) -> bytes:
    """role true: the broker's consumer settles deliveries it received."""
    last_field = NULL if last is None else enc(UInt(last))
    return described_list(DISPOSITION, [b"\x41", enc(UInt(first)), last_field, enc(True), state])


def detach(*, handle: int = 0, closed: bool = True, error: bytes = NULL) -> bytes:
    return described_list(DETACH, [enc(UInt(handle)), enc(closed), error])


def end() -> bytes:
    return described_list(END, [])


def close(*, error: bytes = NULL) -> bytes:
    return described_list(CLOSE, [error])


def sasl_init(mechanism: str, response: bytes = b"") -> bytes:
    return described_list(SASL_INIT, [enc(Symbol(mechanism)), enc(response)])


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def message(body: Any = "fuzz", *, header: bytes = b"") -> bytes:
    """A message: an optional raw header section, then an amqp-value body."""
    return header + b"\x00\x53\x77" + enc(body)


def declare() -> bytes:
    return b"\x00\x53\x77" + described_list(DECLARE, [NULL])


def discharge(txn_id: bytes, *, fail: bool = False) -> bytes:
    return b"\x00\x53\x77" + described_list(DISCHARGE, [enc(txn_id), enc(fail)])


def transactional_state(txn_id: bytes, outcome_bytes: bytes = NULL) -> bytes:
    return described_list(TRANSACTIONAL_STATE, [enc(txn_id), outcome_bytes])


def nested_lists(depth: int, leaf: Any = "x") -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


def read_frames(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(frame type, channel, decoded performative) of each whole frame after the header(s).

    An undecodable body yields the raw bytes; an empty frame (heartbeat) yields None.
    """
    pos = 0
    while data.startswith(b"AMQP", pos):
        pos += 8
    while pos + 8 <= len(data):
        size, doff, kind, channel = struct.unpack_from(">IBBH", data, pos)
        if size < 8 or pos + size > len(data):
            return
        body = data[pos + 4 * doff : pos + size]
        pos += size
        if not body:
            yield kind, channel, None
            continue
        try:  # a transfer: the performative, then the payload
            performative = decode_first(body)[0]
        except SectionError:
            performative = bytes(body)
        yield kind, channel, performative
        if data.startswith(b"AMQP", pos):  # the AMQP header after a SASL outcome
            pos += 8


def performative_code(performative: Any) -> int | None:
    if isinstance(performative, Described) and isinstance(performative.descriptor, int):
        return int(performative.descriptor)
    return None


def close_condition(data: bytes) -> str | None:
    """The error condition of the broker's close frame in `data` (None: no close or no error)."""
    for _, _, performative in read_frames(data):
        if performative_code(performative) == CLOSE:
            fields = performative.value
            if fields and isinstance(fields[0], Described) and fields[0].value:
                return str(fields[0].value[0])
            return ""
    return None


def error_of(performative: Any) -> tuple[str, str] | None:
    """(condition, description) of a detach, end or close's error, or a rejected outcome's."""
    code = performative_code(performative)
    fields = performative.value if code is not None else []
    error: Any = None
    if code == DETACH and len(fields) > 2:
        error = fields[2]
    elif code in (END, CLOSE) and fields:
        error = fields[0]
    elif code == DISPOSITION and len(fields) > 4 and performative_code(fields[4]) == REJECTED:
        error = fields[4].value[0] if fields[4].value else None
    if isinstance(error, Described) and error.value:
        values = [*error.value, None]
        return str(values[0]), str(values[1] or "")
    return None


class RawPeer:
    """Raw bytes into one broker-side `AmqpConnection`; its answers decoded. No sockets."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.received = b""

    def send(self, *frames_: bytes, header: bytes = AMQP_HEADER) -> list[Any]:
        """Feed `header` (once) and frames; return the performatives answered since."""
        before = list(read_frames(self.received))
        data = b"".join(frames_)
        if header and not self.received:
            data = header + data
        self.connection.feed(data)
        self.received += self.connection.output()
        return [p for _, _, p in list(read_frames(self.received))[len(before) :]]

    def opened(self, container: str = "raw") -> list[Any]:
        return self.send(frame(open_(container)), frame(begin()))

    def errors(self) -> list[tuple[int | None, tuple[str, str] | None]]:
        """(performative code, error) of every detach, end, close and rejection so far."""
        return [
            (performative_code(p), error_of(p))
            for _, _, p in read_frames(self.received)
            if error_of(p) is not None
        ]
