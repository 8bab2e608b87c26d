"""Raw AMQP 1.0 frames for hostile-input tests and the fuzzer (issue 15).

Performatives, termini, outcomes and errors are `Node`s: described lists whose fields
are nodes or *encoded bytes*, so a test or the fuzzer can put any value, well-formed or
not, in any field at any depth (`attach(...).fields[0] = b"\\xa1\\x03\\xff\\xfe\\xfd"`).
Values are encoded with the broker's own codec (`amqpbroker.protocol.sections`); the
broker's answers are decoded with it too (`read_frames`, `error_of`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
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
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x23, 0x24, 0x25, 0x26, 0x27
DECLARE, DISCHARGE, TRANSACTIONAL_STATE = 0x31, 0x32, 0x34

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
    size_count = struct.pack(">II", len(body) + 4, len(fields))
    return b"\x00\x53" + bytes((code,)) + b"\xd0" + size_count + body


@dataclass
class Node:
    """A described list whose fields are nodes or encoded bytes."""

    code: int
    fields: list[Node | bytes]

    def encode(self) -> bytes:
        return described_list(
            self.code, [f.encode() if isinstance(f, Node) else f for f in self.fields]
        )


def frame(
    body: Node | bytes, *, channel: int = 0, kind: int = AMQP_FRAME, payload: bytes = b""
) -> bytes:
    """One frame: size, doff 2, type, channel, then the performative and its payload."""
    encoded = body.encode() if isinstance(body, Node) else body
    header = struct.pack(">IBBH", 8 + len(encoded) + len(payload), 2, kind, channel)
    return header + encoded + payload


def _opt(value: bytes | None) -> bytes:
    return NULL if value is None else value


def open_(
    container: str = "raw",
    *,
    hostname: str | None = None,
    locales: bytes = NULL,
    desired: bytes = NULL,
    properties: bytes = NULL,
) -> Node:
    """container-id hostname max-frame-size channel-max idle-timeout outgoing-locales
    incoming-locales offered-capabilities desired-capabilities properties."""
    fields: list[Node | bytes] = [enc(container), enc(hostname), enc(UInt(65536)), NULL, NULL]
    return Node(OPEN, [*fields, NULL, locales, NULL, desired, properties])


def begin(*, remote_channel: bytes = NULL, incoming_window: int = 2048) -> Node:
    window = enc(UInt(incoming_window))
    return Node(BEGIN, [remote_channel, enc(UInt(0)), window, enc(UInt(2048))])


def source(
    address: str | None,
    *caps: str,
    filters: bytes = NULL,
    dynamic: bool = False,
    outcomes: bytes = NULL,
) -> Node:
    """address durable expiry-policy timeout dynamic dynamic-node-properties
    distribution-mode filter default-outcome outcomes capabilities."""
    fields: list[Node | bytes] = [enc(address), NULL, NULL, NULL, enc(dynamic), NULL, NULL]
    return Node(SOURCE, [*fields, filters, NULL, outcomes, symbols(*caps) if caps else NULL])


def target(address: str | None, *caps: str) -> Node:
    """address durable expiry-policy timeout dynamic dynamic-node-properties capabilities."""
    caps_field = symbols(*caps) if caps else NULL
    return Node(TARGET, [enc(address), NULL, NULL, NULL, NULL, NULL, caps_field])


def coordinator() -> Node:
    return Node(COORDINATOR, [symbols("amqp:local-transactions")])


def attach(
    name: str,
    *,
    handle: int = 0,
    role_receiver: bool,
    source: Node | bytes = NULL,
    target: Node | bytes = NULL,
    properties: bytes = NULL,
) -> Node:
    """role true = the peer receives (the broker's consumer); false = the peer sends.

    name handle role snd-settle-mode rcv-settle-mode source target unsettled
    incomplete-unsettled initial-delivery-count max-message-size offered-capabilities
    desired-capabilities properties."""
    first = [enc(name), enc(UInt(handle)), enc(role_receiver), NULL, NULL, source, target]
    count = NULL if role_receiver else enc(UInt(0))
    return Node(ATTACH, [*first, NULL, NULL, count, NULL, NULL, NULL, properties])


def flow(*, handle: int | None = 0, credit: int = 10, drain: bool = False) -> Node:
    fields: list[Node | bytes] = [enc(UInt(0)), enc(UInt(2048)), enc(UInt(0)), enc(UInt(2048))]
    if handle is not None:
        fields += [enc(UInt(handle)), enc(UInt(0)), enc(UInt(credit)), NULL, enc(drain)]
    return Node(FLOW, fields)


def transfer(
    *,
    handle: int = 0,
    delivery_id: int | None = 0,
    tag: bytes | None = b"t",
    more: bool = False,
    aborted: bool = False,
    settled: bool = False,
    state: Node | bytes = NULL,
) -> Node:
    """handle delivery-id delivery-tag message-format settled more rcv-settle-mode state
    resume aborted; delivery-id and tag None on the continuation frames."""
    ids = [enc(UInt(handle)), _opt(None if delivery_id is None else enc(UInt(delivery_id)))]
    fields = [*ids, _opt(None if tag is None else enc(tag)), enc(UInt(0)), enc(settled)]
    return Node(TRANSFER, [*fields, enc(more), NULL, state, NULL, enc(aborted)])


def outcome(code: int, fields: list[Node | bytes] | None = None) -> Node:
    return Node(code, list(fields or []))


def error(condition: str, description: str = "", info: Any = None) -> Node:
    return Node(ERROR, [enc(Symbol(condition)), enc(description), enc(info)])


def disposition(
    *, first: int = 0, last: int | None = None, state: Node | bytes = NULL, settled: bool = True
) -> Node:
    """role true: the broker's consumer settles deliveries it received."""
    last_field = NULL if last is None else enc(UInt(last))
    return Node(DISPOSITION, [enc(True), enc(UInt(first)), last_field, enc(settled), state])


def detach(*, handle: int = 0, closed: bool = True, error: Node | bytes = NULL) -> Node:
    return Node(DETACH, [enc(UInt(handle)), enc(closed), error])


def end(*, error: Node | bytes = NULL) -> Node:
    return Node(END, [error])


def close(*, error: Node | bytes = NULL) -> Node:
    return Node(CLOSE, [error])


def sasl_init(mechanism: str, response: bytes = b"", hostname: str | None = None) -> Node:
    return Node(SASL_INIT, [enc(Symbol(mechanism)), enc(response), enc(hostname)])


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def message(body: Any = "raw", *, header: bytes = b"") -> bytes:
    """A message: an optional raw header section, then an amqp-value body."""
    return header + b"\x00\x53\x77" + enc(body)


def declare() -> bytes:
    return b"\x00\x53\x77" + described_list(DECLARE, [NULL])


def discharge(txn_id: bytes, *, fail: bool = False) -> bytes:
    return b"\x00\x53\x77" + described_list(DISCHARGE, [enc(txn_id), enc(fail)])


def nested_lists(depth: int, leaf: Any = "x") -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


# -- Reading the broker's answers ---------------------------------------------------------


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
    """The error condition of the broker's close frame in `data` ("" without an error;
    None when there is no close frame)."""
    for _, _, performative in read_frames(data):
        if performative_code(performative) == CLOSE:
            found = error_of(performative)
            return found[0] if found is not None else ""
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

    def send(self, *frames: bytes, header: bytes = AMQP_HEADER) -> list[Any]:
        """Feed `header` (once) and frames; return the performatives answered since."""
        before = list(read_frames(self.received))
        data = b"".join(frames)
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
