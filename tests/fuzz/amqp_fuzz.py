"""Hostile-input fuzzer for the broker's AMQP and SASL layers (issue 15).

Starts the real broker (`amqpbroker run`, port 0, ports.json) and, over loopback, sends
mutated versions of valid conversations covering every performative (open, begin, attach
in both roles and to a coordinator, flow, transfer incl. multi-frame and aborted,
disposition with every outcome, detach, end, close) and every SASL frame. Mutations work
at the AMQP type level (wrong types, lying list/map/array counts and sizes, huge declared
lengths, deep nesting, truncated values) and at the byte level (flips, cuts, inserts,
lying frame sizes).

Every case ends with the client's own `close` frame, so the broker must answer every
case: with a `close` frame and/or by closing the socket, within 1 s. For each case the
fuzzer checks that

* the broker process is alive;
* the connection was answered (close frame or EOF) within `ANSWER_S`; a case that may
  have left a frame incomplete is followed by `PADDING` more bytes;
* the broker's log has no `Traceback`, `internal error` or `Fatal Python error`;
* every `CHECK_EVERY` cases, a normal proton client still sends and receives a message.

Run it with `make fuzz DURATION=60 SEED=1` or
`PYTHONPATH=.:tests python tests/fuzz/amqp_fuzz.py --duration 60 --seed 1`. It prints
`cases=N crashes=0 unexpected=0 unanswered=0` and the failing cases' bytes (hex) with a
replay seed, and exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import copy
import random
import select
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import frames as F
from support.client import QUEUE
from support.process import QUICK_LOG2_N, BrokerProcess, start_broker

from amqpbroker.amqp.sections import Described, Symbol, UInt, ULong

ANSWER_S = 1.0  # the broker must close (frame or socket) within this after the input
# With security on, the answer clock starts at the sasl-outcome: the password check
# (scrypt at a lower priority, then the per-source throttle, up to 10 s) comes first,
# and on a loaded machine it alone took over ANSWER_S (40 of 2,080 cases "unanswered").
LOGIN_S = 15.0
PADDING = 140 * 1024  # more input for a case whose frame may still be incomplete
CHECK_EVERY = 100  # cases between two proton client round trips
LOG_ALARMS = ("Traceback", "internal error", "Fatal Python error")
USER, PASSWORD = "fuzz", "fuzz-pw"

# -- Conversations: valid frame sequences per scenario ----------------------------------------

Node = F.Node
NULL = F.NULL
_enc = F.enc


@dataclass
class Frame:
    """One frame of a conversation, kept as nodes until the case is encoded."""

    body: Node | bytes
    payload: bytes = b""
    channel: int = 0
    kind: int = F.AMQP_FRAME
    doff: int = 2  # data offset in 4-byte words; anything but 2 is a lie here

    def encode(self) -> bytes:
        data = F.frame(self.body, channel=self.channel, kind=self.kind, payload=self.payload)
        if self.doff != 2:
            data = data[:4] + bytes((self.doff,)) + data[5:]
        return data


def _open(container: str) -> Node:
    return F.open_(
        container,
        hostname="localhost",
        locales=F.symbols("en-US"),
        desired=F.symbols("sole-connection-for-container"),
        properties=_enc({Symbol("product"): "fuzz"}),
    )


def _source(address: str | None, *caps: str, filters: bytes = NULL, dynamic: bool = False) -> Node:
    node = F.source(
        address,
        *caps,
        filters=filters,
        dynamic=dynamic,
        outcomes=F.symbols("amqp:accepted:list", "amqp:rejected:list"),
    )
    node.fields[1:4] = [_enc(UInt(0)), _enc(Symbol("session-end")), _enc(UInt(0))]
    return node


def _attach(
    name: str,
    handle: int,
    *,
    receiver: bool,
    source: Node | bytes,
    target: Node | bytes,
    properties: bytes = NULL,
) -> Node:
    return F.attach(
        name,
        handle=handle,
        role_receiver=receiver,
        source=source,
        target=target,
        properties=properties,
    )


def _message(body: Any = "fuzz", **annotations: Any) -> bytes:
    header = b"\x00\x53\x70" + _enc([True, None, UInt(1000)])
    ma = (
        b"\x00\x53\x72" + F.enc({Symbol(k): v for k, v in annotations.items()})
        if annotations
        else b""
    )
    props = b"\x00\x53\x73" + _enc([ULong(7), None, "fuzz-q", "subject"])
    ap = b"\x00\x53\x74" + _enc({"_AMQ_DUPL_ID": "x", "n": 1})
    return header + ma + props + ap + b"\x00\x53\x77" + _enc(body)


def _outcomes() -> list[Node]:
    return [
        Node(F.ACCEPTED, []),
        Node(F.REJECTED, [F.error("amqp:internal-error", "no")]),
        Node(F.RELEASED, []),
        Node(F.MODIFIED, [_enc(True), _enc(False), _enc({Symbol("x-opt-a"): 1})]),
        F.outcome(F.RECEIVED, [_enc(UInt(0)), _enc(ULong(0))]),  # non-terminal
        Node(F.TRANSACTIONAL_STATE, [_enc(b"txn:1"), Node(F.ACCEPTED, [])]),
    ]


# -- Conversations: valid frame sequences per scenario ----------------------------------------


def _conversations(rng: random.Random) -> dict[str, Callable[[], list[Frame]]]:
    q = f"fuzz-{rng.randrange(4)}"

    def opened() -> list[Frame]:
        return [Frame(_open(f"fuzz-{rng.randrange(1 << 30)}")), Frame(F.begin())]

    def producer() -> list[Frame]:
        return [
            *opened(),
            Frame(
                _attach("p", 0, receiver=False, source=_source("src"), target=F.target(q, "queue"))
            ),
            Frame(
                F.transfer(handle=0, delivery_id=0, tag=b"t0"),
                payload=_message("x", **{"x-opt-delivery-delay": 10}),
            ),
            Frame(
                F.transfer(handle=0, delivery_id=1, tag=b"t1", settled=True),
                payload=_message([1, {"a": [2]}]),
            ),
            Frame(F.detach(handle=0)),
            Frame(F.end()),
        ]

    def multi_frame() -> list[Frame]:
        data = _message(b"y" * 300)
        return [
            *opened(),
            Frame(
                _attach("p", 0, receiver=False, source=_source("src"), target=F.target(q, "queue"))
            ),
            Frame(F.transfer(handle=0, delivery_id=0, tag=b"m", more=True), payload=data[:100]),
            Frame(
                F.transfer(handle=0, delivery_id=None, tag=None, more=True), payload=data[100:200]
            ),
            Frame(F.transfer(handle=0, delivery_id=None, tag=None), payload=data[200:]),
            Frame(F.transfer(handle=0, delivery_id=1, tag=b"a", more=True), payload=data[:50]),
            Frame(F.transfer(handle=0, delivery_id=None, tag=None, aborted=True)),
        ]

    def consumer() -> list[Frame]:
        filters = _enc({Symbol("jms-selector"): Described(ULong(0x0000468C00000004), "n = 1")})
        frames = producer()[:-2]
        return [
            *frames,
            Frame(
                _attach(
                    "c",
                    1,
                    receiver=True,
                    source=_source(q, "queue", filters=filters),
                    target=F.target(None),
                    properties=_enc({Symbol("priority"): 5}),
                )
            ),
            Frame(F.flow(handle=1, credit=10)),
            *[Frame(F.disposition(first=i, state=o)) for i, o in enumerate(_outcomes())],
            Frame(F.flow(handle=1, credit=0, drain=True)),
            Frame(
                F.detach(handle=1, closed=False, error=F.error("amqp:x", "y", {Symbol("k"): "v"}))
            ),
        ]

    def topic() -> list[Frame]:
        return [
            *opened(),
            Frame(
                _attach(
                    "sub",
                    0,
                    receiver=True,
                    source=_source(f"t.{q}", "topic", "shared", "global"),
                    target=F.target(None),
                )
            ),
            Frame(
                _attach(
                    "dyn",
                    1,
                    receiver=True,
                    source=_source(None, dynamic=True),
                    target=F.target(None),
                )
            ),
            Frame(_attach("null", 2, receiver=True, source=NULL, target=F.target(None))),
            Frame(_attach("relay", 3, receiver=False, source=_source("s"), target=F.target(None))),
            Frame(F.flow(handle=3, credit=0)),
            Frame(
                F.transfer(handle=3, delivery_id=0, tag=b"r"),
                payload=_message("z", **{"x-opt-routing-type": 1}),
            ),
        ]

    def transactions() -> list[Frame]:
        coord = Node(F.COORDINATOR, [F.symbols("amqp:local-transactions")])
        return [
            *opened(),
            Frame(_attach("txn", 0, receiver=False, source=_source("s"), target=coord)),
            Frame(F.transfer(handle=0, delivery_id=0, tag=b"d"), payload=F.declare()),
            Frame(
                _attach("p", 1, receiver=False, source=_source("src"), target=F.target(q, "queue"))
            ),
            Frame(
                F.transfer(
                    handle=1,
                    delivery_id=1,
                    tag=b"x",
                    state=Node(F.TRANSACTIONAL_STATE, [_enc(b"txn:1")]),
                ),
                payload=_message(),
            ),
            Frame(F.transfer(handle=0, delivery_id=2, tag=b"c"), payload=F.discharge(b"txn:1")),
            Frame(
                F.transfer(handle=0, delivery_id=3, tag=b"e"),
                payload=F.discharge(b"nope", fail=True),
            ),
        ]

    def errors() -> list[Frame]:
        return [
            *opened(),
            Frame(F.end(error=F.error("amqp:x", "y"))),
            Frame(F.close(error=F.error("amqp:internal-error", "bye"))),
        ]

    return {
        "open": lambda: [Frame(_open("fuzz"))],
        "producer": producer,
        "multi-frame": multi_frame,
        "consumer": consumer,
        "topic": topic,
        "transactions": transactions,
        "errors": errors,
    }


# -- Mutations --------------------------------------------------------------------------------


def _hostile_values(rng: random.Random) -> list[bytes]:
    """Encoded values no field expects, and values that lie about their own size."""
    deep = b"\x45"
    for _ in range(rng.choice((40, 200, 2000))):
        deep = b"\xc0" + bytes((len(deep) + 1 if len(deep) < 254 else 0, 1)) + deep
    return [
        b"\xe0\x08\x09\xa3\x05queue",  # array8 claiming 9 symbols, holding one
        b"\xe0\x08\x01\xa3\x09queue",  # element longer than the array
        b"\xf0\x00\x00\x00\x0a\xff\xff\xff\xff\xa3\x01q",  # array32, 2**32-1 elements
        b"\xe0\x03\xff\x40",  # 255 nulls in 3 bytes
        b"\xc0\x05\x09\x40\x40\x40\x40",  # list8 claiming 9
        b"\xc1\x04\x03\x40\x40\x40",  # map with an odd count
        b"\xd1\x00\x00\x00\x08\x00\x00\x00\x02\xc0\x01\x00\x40",  # map with a list key
        b"\xb0\xff\xff\xff\xff",  # binary of 4 GiB
        b"\xb1\x7f\xff\xff\xff",  # string of 2 GiB
        b"\xa1\x03\xff\xfe\xfd",  # string, not UTF-8
        b"\xa3\x03\xe9\xe9\xe9",  # symbol, not ASCII
        b"\x00\x00\x00\x00\x00\x00\x53\x01\x40",  # described in described in ...
        deep[: rng.choice((len(deep), 30))],
        b"\x70\x00\x00\x00\x05",  # uint where anything else is expected
        b"\x52\x07",
        b"\x44",
        b"\xa1\x04text",
        b"\xa3\x05queue",
        b"\x45",
        b"\xc1\x01\x00",
        b"\x41",
        b"\x83\x00\x00\x01\x00\x00\x00\x00\x00",
        b"\x98" + bytes(16),
        b"\x00\x53\x24\x45",  # an outcome where no outcome belongs
        b"\x00\xa3\x03foo\xc0\x01\x00",
        b"\x00\x80\xff\xff\xff\xff\xff\xff\xff\xff\x45",
        b"\xe0\x02\x01\x00",  # array of described, cut short
        b"\xf0\x00\x00\x00\x05\x00\x00\x00\x01\xc0",  # array of lists, no elements
        b"\xff",
        b"",
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))),
    ]


def _nodes(node: Node) -> list[tuple[Node, int]]:
    """Every (node, field index) pair, recursively."""
    found = [(node, i) for i in range(len(node.fields))]
    for f in node.fields:
        if isinstance(f, Node):
            found += _nodes(f)
    return found


def _mutate_type(frames: list[Frame], rng: random.Random) -> str:
    """Replace one field (at any depth) by a hostile value, or lie about a list."""
    candidates = [
        (fr, n, i) for fr in frames if isinstance(fr.body, Node) for n, i in _nodes(fr.body)
    ]
    fr, node, i = rng.choice(candidates)
    choice = rng.random()
    if choice < 0.75:
        node.fields[i] = rng.choice(_hostile_values(rng))
        return f"type:{node.code:#x}[{i}]"
    if choice < 0.85:
        node.fields.extend([NULL] * rng.randrange(1, 40))
        return f"extra-fields:{node.code:#x}"
    if choice < 0.95 and fr.payload:
        fr.payload = _mutate_payload(fr.payload, rng)
        return "payload"
    del node.fields[i:]
    return f"cut:{node.code:#x}[{i}]"


def _mutate_payload(payload: bytes, rng: random.Random) -> bytes:
    hostile = rng.choice(_hostile_values(rng))
    section = rng.choice((0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78))
    if rng.random() < 0.5:
        return b"\x00\x53" + bytes((section,)) + hostile + payload
    return payload + b"\x00\x53" + bytes((section,)) + hostile


def _reorder(frames: list[Frame], rng: random.Random) -> str:
    """Frames out of protocol order: one dropped, repeated or moved (a second open, an
    attach on a used handle, a transfer before its attach, ...)."""
    i = rng.randrange(len(frames))
    kind = rng.randrange(3)
    if kind == 0 and len(frames) > 1:
        del frames[i]
        return f"drop:{i}"
    if kind == 1:
        frames.insert(rng.randrange(len(frames) + 1), copy.deepcopy(frames[i]))
        return f"repeat:{i}"
    frames.insert(rng.randrange(len(frames)), frames.pop(i))
    return f"move:{i}"


def _mangle_header(target: Frame, rng: random.Random) -> tuple[str, bool]:
    """A frame header that lies: another channel, frame type or data offset."""
    kind = rng.randrange(3)
    if kind == 0:
        target.channel = rng.choice((1, 7, 0xFFFF))
        return "channel", False
    if kind == 1:
        target.kind = rng.choice((F.SASL_FRAME, 2, 0xFF))
        return "frame-type", False
    target.doff = rng.choice((0, 1, 3, 0xFF))
    return "doff", True


def _lie_about_list(body: bytes, rng: random.Random) -> bytes:
    """The performative's list32 header: a wrong count or size."""
    if len(body) < 12 or body[3] != 0xD0:
        return body
    size, count = struct.unpack_from(">II", body, 4)
    if rng.random() < 0.5:
        count = rng.choice((count + 1, count + 100, 0xFFFFFFFF, 0))
    else:
        size = rng.choice((size + 1, max(size - 3, 0), 0xFFFFFFF0, 0))
    return body[:4] + struct.pack(">II", size, count) + body[12:]


def _mutate_bytes(data: bytearray, rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return "flip"
    if kind == 1:
        del data[rng.randrange(8, len(data)) :]
        return "truncate"
    if kind == 2:
        pos = rng.randrange(8, len(data))
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        return "insert"
    if kind == 3:
        pos = rng.randrange(8, max(9, len(data) - 4))
        data[pos : pos + 4] = struct.pack(
            ">I", rng.choice((0, 7, 9, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF))
        )
        return "size"
    pos = rng.randrange(len(data))
    del data[pos : pos + rng.randrange(1, 16)]
    return "delete"


# -- Cases ------------------------------------------------------------------------------------


@dataclass
class Case:
    """What to send, in steps: (bytes, (performative code, how many) to await or None).

    A client may not send transfers before it knows the broker's session window, so a
    conversation waits for the broker's `begin` and `attach` answers, as real clients do.
    """

    name: str
    steps: list[tuple[bytes, tuple[int, int] | None]]
    incomplete_ok: bool  # may leave a frame waiting for more bytes (gets the padding)

    @property
    def data(self) -> bytes:
        return b"".join(chunk for chunk, _ in self.steps)


def _waits(frames: list[Frame]) -> dict[int, tuple[int, int]]:
    """Frame index -> the answer to await after sending it (begin; a run of attaches)."""
    waits: dict[int, tuple[int, int]] = {}
    attaches = 0
    codes = [f.body.code if isinstance(f.body, Node) else -1 for f in frames]
    for i, code in enumerate(codes):
        if code == F.BEGIN:
            waits[i] = (F.BEGIN, 1)
        elif code == F.ATTACH:
            attaches += 1
            if i + 1 == len(codes) or codes[i + 1] != F.ATTACH:
                waits[i] = (F.ATTACH, attaches)
    return waits


def make_case(rng: random.Random, *, sasl: bool) -> Case:
    conversations = _conversations(rng)
    scenario = rng.choice(sorted(conversations))
    frames = conversations[scenario]()
    prefix = F.AMQP_HEADER
    if sasl:
        init = Frame(F.sasl_init("PLAIN", F.plain(USER, PASSWORD), "localhost"), kind=F.SASL_FRAME)
        sasl_frames = [init]
        if rng.random() < 0.3:  # junk in place of the other SASL frames, or extra ones
            junk = rng.choice(
                (F.SASL_MECHANISMS, F.SASL_CHALLENGE, F.SASL_RESPONSE, F.SASL_OUTCOME)
            )
            sasl_frames.insert(
                rng.randrange(2), Frame(Node(junk, [_enc(b"junk")]), kind=F.SASL_FRAME)
            )
            scenario += f"+sasl-junk:{junk:#x}"
        if rng.random() < 0.4:
            scenario += "+sasl:" + _mutate_type(sasl_frames, rng)
        prefix = F.SASL_HEADER + b"".join(f.encode() for f in sasl_frames) + F.AMQP_HEADER
    incomplete_ok = False
    roll = rng.random()
    if roll < 0.5:
        label = _mutate_type(frames, rng)
    elif roll < 0.62:
        target = rng.choice([f for f in frames if isinstance(f.body, Node)])
        assert isinstance(target.body, Node)
        target.body = _lie_about_list(target.body.encode(), rng)
        label = "lying-list"
        incomplete_ok = True
    elif roll < 0.72:
        label = _reorder(frames, rng)
    elif roll < 0.8:
        label, incomplete_ok = _mangle_header(rng.choice(frames), rng)
    else:
        label = ""
    waits = _waits(frames)
    chunks: list[bytearray] = [bytearray(prefix)]
    steps_waits: list[tuple[int, int] | None] = []
    for i, f in enumerate(frames):
        chunks[-1] += f.encode()
        if i in waits:
            steps_waits.append(waits[i])
            chunks.append(bytearray())
    steps_waits.append(None)
    if not label or rng.random() < 0.2:
        k = rng.choice([i for i, c in enumerate(chunks) if len(c) > 9])
        label += "+bytes:" + _mutate_bytes(chunks[k], rng)
        incomplete_ok = True
        # Frame boundaries after the cut are unknown: send the rest at once, then padding.
        chunks[k:] = [bytearray(b"".join(chunks[k:]))]
        steps_waits[k:] = [None]
    chunks[-1] += F.frame(F.close())
    steps = [(bytes(c), w) for c, w in zip(chunks, steps_waits, strict=True)]
    return Case(f"{scenario}/{label}", steps, incomplete_ok)


# -- Running ----------------------------------------------------------------------------------


@dataclass
class Summary:
    cases: int = 0
    crashes: int = 0
    unexpected: int = 0
    unanswered: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"cases={self.cases} crashes={self.crashes} "
            f"unexpected={self.unexpected} unanswered={self.unanswered}"
        )

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.unexpected or self.unanswered)


class _Reader:
    """The broker's side of one case: everything it sent, read as it arrives."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received = b""
        self.closed = False  # a close frame or EOF: the broker answered

    def wait(self, timeout_s: float, until: tuple[int, int] | None = None) -> bool:
        """Read until the broker closes (True), has sent `until` (False), or time is up."""
        deadline = time.monotonic() + timeout_s
        while not self.closed:
            if until is not None:
                code, count = until
                codes = [F.performative_code(p) for _, _, p in F.read_frames(self.received)]
                if codes.count(code) >= count:
                    return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                continue
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                chunk = b""
            self.received += chunk
            self.closed = not chunk or F.close_condition(self.received) is not None
        return True


def run_case(port: int, case: Case) -> bool:
    """Send the case; True when the broker answered it (close frame or EOF) in time.

    A case that may have left a frame incomplete is followed at once by `PADDING` zero
    bytes (a zero frame size is malformed), so the broker has all it needs to decide.
    """
    login = case.data.startswith(F.SASL_HEADER)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        reader = _Reader(sock)
        for i, (chunk, until) in enumerate(case.steps):
            if case.incomplete_ok and i == len(case.steps) - 1:
                chunk += bytes(PADDING)
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return True  # the broker hung up while we were still sending
            if login and reader.wait(LOGIN_S, (F.SASL_OUTCOME, 1)):
                return True  # refused during SASL
            login = False
            if until is not None and reader.wait(ANSWER_S, until):
                return True
        return reader.wait(ANSWER_S)


def round_trip(broker: BrokerProcess, *, sasl: bool) -> bool:
    """A normal proton client sends and receives one message."""
    from proton.utils import BlockingConnection

    kwargs: dict[str, Any] = {"timeout": 10}
    if sasl:
        kwargs.update(
            user=USER, password=PASSWORD, allowed_mechs="PLAIN", allow_insecure_mechs=True
        )
    try:
        conn = BlockingConnection(broker.url, **kwargs)
        try:
            sender = conn.create_sender("fuzz-check", options=QUEUE)
            from proton import Message

            sender.send(Message(body="ping"))
            receiver = conn.create_receiver("fuzz-check", options=QUEUE)
            ok = receiver.receive(timeout=5).body == "ping"
            receiver.accept()
            return ok
        finally:
            conn.close()
    except Exception as e:  # any failure of the normal client is what we report
        sys.stderr.write(f"round trip failed: {e!r}\n")
        return False


SASL_CONFIG = f"""
security:
  enabled: true
  sasl-mechanisms: [PLAIN]
  users:
    {USER}: {{password-hash: "{{hash}}", roles: [fuzz]}}
  security-settings:
    "#":
      send: [fuzz]
      consume: [fuzz]
      browse: [fuzz]
      create-address: [fuzz]
      create-durable-queue: [fuzz]
      create-non-durable-queue: [fuzz]
      delete-non-durable-queue: [fuzz]
      manage: [fuzz]
"""


def fuzz(
    directory: Path,
    *,
    sasl: bool,
    seed: int,
    max_cases: int | None = None,
    duration_s: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Summary:
    """Fuzz one broker (security off, or on with a PLAIN user) until a bound is reached."""
    extra = ""
    if sasl:
        from amqpbroker.security import hash_password

        # A cheap hash: a case's login checks the SASL frames, not scrypt's cost.
        extra = SASL_CONFIG.replace("{hash}", hash_password(PASSWORD, log2_n=QUICK_LOG2_N))
    broker = start_broker(directory, extra, log_level="info")
    rng = random.Random(seed)
    summary = Summary()
    log_file = broker.log_path.open(errors="replace")
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while (max_cases is None or summary.cases < max_cases) and (
            deadline is None or time.monotonic() < deadline
        ):
            case_seed = rng.randrange(1 << 62)
            case = make_case(random.Random(case_seed), sasl=sasl)
            summary.cases += 1
            answered = run_case(broker.ports["amqp"], case)
            problem = ""
            if broker.proc.poll() is not None:
                summary.crashes += 1
                problem = f"broker died ({broker.proc.returncode})"
            elif not answered:
                summary.unanswered += 1
                problem = "unanswered"
            new = log_file.read()
            alarms = [line for line in new.splitlines() if any(a in line for a in LOG_ALARMS)]
            if alarms:
                summary.unexpected += 1
                excerpt = new[new.find(alarms[0]) :][:1500]
                problem += f" log: {excerpt}"
            if (
                summary.cases % CHECK_EVERY == 0
                and not problem
                and not round_trip(broker, sasl=sasl)
            ):
                summary.unanswered += 1
                problem = "a normal client was not served"
            if problem:
                mode = "sasl" if sasl else "amqp"
                report = (
                    f"[{mode} seed={seed} case_seed={case_seed}] {case.name}: {problem.strip()}\n"
                    f"  bytes={case.data.hex()}"
                )
                summary.failures.append(report)
                (log or _say)(report)
            if summary.crashes:
                break
    finally:
        broker.stop()
        log_file.close()
    return summary


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per mode")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--cases", type=int, default=None, help="at most this many per mode")
    parser.add_argument("--mode", choices=("amqp", "sasl", "both"), default="both")
    parser.add_argument("--replay", type=int, default=None, help="print one case_seed's bytes")
    args = parser.parse_args(argv)
    if args.replay is not None:
        case = make_case(random.Random(args.replay), sasl=args.mode == "sasl")
        _say(f"{case.name} {case.data.hex()}")
        return 0
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    total = Summary()
    modes = ("amqp", "sasl") if args.mode == "both" else (args.mode,)
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{mode}-") as tmp:
            result = fuzz(
                Path(tmp),
                sasl=mode == "sasl",
                seed=seed,
                max_cases=args.cases,
                duration_s=args.duration,
            )
        _say(f"mode={mode} seed={seed} {result.line()}")
        total.cases += result.cases
        total.crashes += result.crashes
        total.unexpected += result.unexpected
        total.unanswered += result.unanswered
    _say(total.line())
    return 0 if total.ok else 1


if __name__ == "__main__":
    sys.exit(main())
