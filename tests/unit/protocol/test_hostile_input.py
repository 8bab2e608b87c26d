"""Hostile input through the real handler (issue 15): raw frames, no sockets.

Every field the peer sends may have any type, size or nesting, and every declared count
may lie. The broker answers with `amqp:decode-error` (not a well-formed value) or
`amqp:invalid-field` (a type the field cannot have), naming the field: link fields
refuse the link, connection fields close the connection. `amqp:internal-error` is never
the answer, and the engine never crashes.
"""

from __future__ import annotations

import struct
from random import Random

import pytest
from cproton_ffi import ffi, lib
from support import frames as F

from amqpbroker.amqp.sections import MAX_DEPTH, Described, Symbol, UInt, ULong
from amqpbroker.core import Broker, ManualClock, SettingsRepository
from amqpbroker.protocol import AmqpConnection, Shell, attach, moves, transactions, transfers
from amqpbroker.protocol import peer as peer_module

LYING_ARRAY = b"\xe0\x08\x09\xa3\x05queue"  # array8, count 9, one symbol (the input)
NOT_UTF8 = b"\xa1\x03\xff\xfe\xfd"
NOT_ASCII_SYMBOL = b"\xa3\x03\xe9\xe9\xe9"


@pytest.fixture
def peer() -> F.RawPeer:
    broker = Broker(
        settings=SettingsRepository(), clock=ManualClock(), rng=Random(0), copier=moves.COPIER
    )
    return F.RawPeer(AmqpConnection(Shell(broker), peer="memory"))


SOURCE_FIELDS = (
    "address",
    "durable",
    "expiry-policy",
    "timeout",
    "dynamic",
    "dynamic-node-properties",
    "distribution-mode",
    "filter",
    "default-outcome",
    "outcomes",
    "capabilities",
)
TARGET_FIELDS = (*SOURCE_FIELDS[:6], "capabilities")


def _with(node: F.Node, names: tuple[str, ...], fields: dict[str, bytes]) -> F.Node:
    for name, value in fields.items():
        node.fields[names.index(name.replace("_", "-"))] = value
    return node


def _source(**fields: bytes) -> F.Node:
    """A `queue` source on `q`, with the given raw fields (by AMQP field name)."""
    return _with(F.source("q", "queue"), SOURCE_FIELDS, fields)


def _target(**fields: bytes) -> F.Node:
    return _with(F.target("q", "queue"), TARGET_FIELDS, fields)


def _consumer(
    source: F.Node | None = None, *, target: F.Node | bytes = F.NULL, properties: bytes = F.NULL
) -> bytes:
    node = F.attach(
        "c", role_receiver=True, source=source or _source(), target=target, properties=properties
    )
    return F.frame(node)


def _producer(target: F.Node | None = None, *, name: bytes | None = None) -> bytes:
    node = F.attach("p", role_receiver=False, source=F.source("s"), target=target or _target())
    if name is not None:
        node.fields[0] = name
    return F.frame(node)


def _refusal(peer: F.RawPeer) -> tuple[int | None, tuple[str, str] | None]:
    [refusal] = peer.errors()
    return refusal


def test_lying_capabilities_array_refuses_the_link_and_the_engine_survives(
    peer: F.RawPeer,
) -> None:
    """Issue 15: `e0 08 09 a3 05 queue` crashed the engine (SIGSEGV) once copied into the
    broker's own source. Now the attach is refused with decode-error and the connection
    still works: a well-formed consumer attaches and the close is answered."""
    peer.opened()
    peer.send(_consumer(_source(capabilities=LYING_ARRAY)))
    code, error = _refusal(peer)
    assert code == F.DETACH
    assert error is not None
    assert error[0] == "amqp:decode-error"
    assert error[1].startswith("source.capabilities: ")
    answers = peer.send(
        F.frame(F.attach("ok", handle=1, role_receiver=True, source=_source(), target=F.NULL))
    )
    assert [F.performative_code(p) for p in answers] == [F.ATTACH]
    peer.send(F.frame(F.close()))
    assert F.close_condition(peer.received) == ""


LINK_FIELDS = [
    (
        _consumer(_source(capabilities=F.enc(UInt(5)))),
        "amqp:invalid-field",
        "source.capabilities",
    ),
    (
        _consumer(_source(capabilities=F.enc({"a": 1}))),
        "amqp:invalid-field",
        "source.capabilities",
    ),
    (_consumer(_source(outcomes=LYING_ARRAY)), "amqp:decode-error", "source.outcomes"),
    (
        _consumer(_source(capabilities=NOT_ASCII_SYMBOL)),
        "amqp:decode-error",
        "source.capabilities",
    ),
    (_consumer(_source(outcomes=F.enc(UInt(1)))), "amqp:invalid-field", "source.outcomes"),
    (_consumer(_source(filter=F.enc(["x"]))), "amqp:invalid-field", "source.filter"),
    (
        _consumer(_source(filter=F.enc({Symbol("f"): "not described"}))),
        "amqp:invalid-field",
        "source.filter",
    ),
    (
        _consumer(
            _source(filter=F.enc({Symbol("s"): Described(ULong(0x0000468C00000004), UInt(7))}))
        ),
        "amqp:invalid-field",
        "source.filter",
    ),
    (_consumer(_source(filter=LYING_ARRAY)), "amqp:decode-error", "source.filter"),
    (_consumer(_source(address=NOT_UTF8)), "amqp:decode-error", "source.address"),
    (
        _consumer(target=_target(address=F.NULL, capabilities=F.enc(UInt(3)))),
        "amqp:invalid-field",
        "target.capabilities",
    ),
    (_consumer(properties=F.enc(["priority", 5])), "amqp:invalid-field", "attach.properties"),
    (_consumer(properties=F.enc({UInt(1): 5})), "amqp:invalid-field", "attach.properties"),
    (
        _consumer(properties=F.enc({Symbol("p"): F.nested_lists(MAX_DEPTH + 5)})),
        "amqp:decode-error",
        "attach.properties",
    ),
    (
        _producer(_target(capabilities=LYING_ARRAY)),
        "amqp:decode-error",
        "target.capabilities",
    ),
    (
        _producer(_target(capabilities=F.enc(True))),
        "amqp:invalid-field",
        "target.capabilities",
    ),
    (_producer(name=NOT_UTF8), "amqp:decode-error", "attach.name"),
    (_producer(name=F.NULL), "amqp:invalid-field", "attach.name"),
]


@pytest.mark.parametrize(
    ("attach", "condition", "field"),
    LINK_FIELDS,
    ids=[f"{field}-{i}" for i, (_, _, field) in enumerate(LINK_FIELDS)],
)
def test_wrongly_typed_link_field_refuses_the_link_naming_it(
    peer: F.RawPeer, attach: bytes, condition: str, field: str
) -> None:
    """Issue 15 / B-153: each attach field x bad value gets a link refusal naming the field,
    never amqp:internal-error; the connection stays open."""
    peer.opened()
    peer.send(attach)
    code, error = _refusal(peer)
    assert code == F.DETACH
    assert error is not None
    assert (error[0], error[1].split(":")[0]) == (condition, field)
    assert not peer.connection.closed


@pytest.mark.parametrize(
    "selector",
    [
        "(" * 400 + "a = 1" + ")" * 400,
        "NOT " * 2000 + "a = 1",
        "a = " + "- " * 2000 + "1",  # "--" would start a comment
        "a = " + " + ".join(["1"] * 1020),  # within the operand bound (sixth pass)
    ],
    ids=["parentheses", "not", "signs", "sum"],
)
def test_a_selector_nested_too_deeply_refuses_the_link_with_invalid_field(
    peer: F.RawPeer, selector: str
) -> None:
    """Issue 15 attack, B-032: a selector nested past the parser's recursion (400
    parentheses: a 1 KiB attach) was an internal error that closed the connection, with
    a traceback in the log; now the link is refused with amqp:invalid-field."""
    jms = {Symbol("jms"): Described(Symbol("apache.org:selector-filter:string"), selector)}
    peer.opened()
    peer.send(_consumer(_source(filter=F.enc(jms))))
    code, error = _refusal(peer)
    assert code == F.DETACH
    assert error is not None
    assert error[0] == "amqp:invalid-field"
    assert "nested too deeply" in error[1]
    assert not peer.connection.closed


OPEN_FIELDS = [
    (
        [F.enc("c"), F.NULL, F.NULL, F.NULL, F.NULL, F.NULL, F.NULL, F.NULL, F.enc(UInt(9))],
        "amqp:invalid-field",
        "open.desired-capabilities",
    ),
    (
        [F.enc("c"), F.NULL, F.NULL, F.NULL, F.NULL, F.NULL, F.NULL, LYING_ARRAY],
        "amqp:decode-error",
        "open.offered-capabilities",
    ),
    (
        [
            F.enc("c"),
            F.NULL,
            F.NULL,
            F.NULL,
            F.NULL,
            F.NULL,
            F.NULL,
            F.NULL,
            F.NULL,
            F.enc([1]),
        ],
        "amqp:invalid-field",
        "open.properties",
    ),
    ([NOT_UTF8], "amqp:decode-error", "open.container-id"),
]


@pytest.mark.parametrize(
    ("fields", "condition", "field"), OPEN_FIELDS, ids=[field for _, _, field in OPEN_FIELDS]
)
def test_wrongly_typed_open_field_closes_the_connection_naming_it(
    peer: F.RawPeer, fields: list[bytes], condition: str, field: str
) -> None:
    """Issue 15 / B-153: connection-level fields are answered with a close naming the field."""
    peer.send(F.frame(F.described_list(F.OPEN, fields)))
    code, error = _refusal(peer)
    assert code == F.CLOSE
    assert error is not None
    assert (error[0], error[1].split(":")[0]) == (condition, field)
    assert peer.connection.finished


def _received_one(peer: F.RawPeer) -> None:
    """A message in `q` and a consumer that has received it (delivery-id 0)."""
    peer.opened()
    peer.send(_producer(), F.frame(F.transfer(handle=0, delivery_id=0), payload=F.message("m")))
    answers = peer.send(
        F.frame(F.attach("c", handle=1, role_receiver=True, source=_source(), target=F.NULL)),
        F.frame(F.flow(handle=1, credit=5)),
    )
    assert F.TRANSFER in [F.performative_code(p) for p in answers]


@pytest.mark.parametrize(
    ("error", "field"),
    [
        (F.described_list(F.ERROR, [NOT_ASCII_SYMBOL]), "rejected.error.condition"),
        (F.described_list(F.ERROR, [F.enc(Symbol("x:y")), NOT_UTF8]), "rejected.error.description"),
        (
            F.described_list(F.ERROR, [F.enc(Symbol("x:y")), F.NULL, F.enc([1, 2])]),
            "rejected.error.info",
        ),
    ],
    ids=["condition", "description", "info"],
)
def test_malformed_rejected_outcome_ends_the_consumer_link(
    peer: F.RawPeer, error: bytes, field: str
) -> None:
    """Issue 15: an outcome's fields are checked before the core sees them (the error
    would become a dead-letter annotation); the consumer link ends naming the field."""
    _received_one(peer)
    peer.send(F.frame(F.disposition(state=F.outcome(F.REJECTED, [error]))))
    [(_, refusal)] = [e for e in peer.errors() if e[0] == F.DETACH]
    assert refusal is not None
    assert refusal[1].split(":")[0] == field
    assert refusal[0] in ("amqp:invalid-field", "amqp:decode-error")
    assert not peer.connection.closed


def test_transfer_with_a_non_binary_txn_id_ends_the_link(peer: F.RawPeer) -> None:
    """Issue 15: transactional-state.txn-id must be binary (was: TypeError, internal-error)."""
    peer.opened()
    peer.send(_producer())
    state = F.described_list(F.TRANSACTIONAL_STATE, [F.enc(UInt(1))])
    peer.send(F.frame(F.transfer(handle=0, state=state), payload=F.message()))
    [(code, error)] = peer.errors()
    assert (code, error) == (
        F.DETACH,
        ("amqp:invalid-field", "transactional-state.txn-id: not a binary"),
    )


@pytest.mark.parametrize(
    ("body", "condition"),
    [
        (
            b"\x00\x53\x77" + F.described_list(F.DISCHARGE, [F.enc(b"txn:1"), F.enc("yes")]),
            "amqp:invalid-field",
        ),
        (b"\x00\x53\x77" + F.described_list(F.DISCHARGE, [F.enc(UInt(1))]), "amqp:invalid-field"),
        (b"\x00\x53\x77" + F.enc(F.nested_lists(MAX_DEPTH + 1)), "amqp:decode-error"),
        (b"\x00\x53\x77\xc0\x05\x09\x40", "amqp:decode-error"),
    ],
    ids=["fail-not-boolean", "txn-id-not-binary", "too-deep", "lying-list"],
)
def test_malformed_control_body_is_rejected(peer: F.RawPeer, body: bytes, condition: str) -> None:
    """Issue 15: coordinator bodies are decoded by the bounded codec and type-checked;
    the transfer is rejected with the condition, the coordinator link stays."""
    peer.opened()
    coordinator = F.attach("txn", role_receiver=False, source=F.source("s"), target=F.coordinator())
    peer.send(F.frame(coordinator))
    peer.send(F.frame(F.transfer(handle=0), payload=body))
    [(code, error)] = peer.errors()
    assert code == F.DISPOSITION
    assert error is not None
    assert error[0] == condition


@pytest.mark.parametrize(("depth", "accepted"), [(MAX_DEPTH, True), (MAX_DEPTH + 1, False)])
def test_deeply_nested_message_is_rejected_at_the_door(
    peer: F.RawPeer, depth: int, accepted: bool
) -> None:
    """Issue 15: a body nesting deeper than MAX_DEPTH is rejected with amqp:decode-error
    (it broke the management API later); MAX_DEPTH levels are still accepted."""
    peer.opened()
    peer.send(_producer())
    answers = peer.send(F.frame(F.transfer(handle=0), payload=F.message(F.nested_lists(depth))))
    [disposition] = [p for p in answers if F.performative_code(p) == F.DISPOSITION]
    state = disposition.value[4]
    if accepted:
        assert F.performative_code(state) == F.ACCEPTED
    else:
        assert F.performative_code(state) == F.REJECTED
        assert F.error_of(disposition) is not None
        assert F.error_of(disposition)[0] == "amqp:decode-error"


@pytest.mark.parametrize(
    "data",
    [
        F.frame(b"\x00\x53\x10\xd0\x00\x00\x00\xff\x00\x00\x00\x09"),  # open, size lies
        F.frame(F.begin()),  # a begin before the open
        F.frame(F.open_()) + F.frame(F.begin()) + F.frame(b"\x00\x53\x12\xc0\x03\x02\x40"),
        b"\xff" * 16,
    ],
    ids=["undecodable-open", "begin-before-open", "undecodable-attach", "garbage"],
)
def test_framing_error_is_answered_with_close_at_once(peer: F.RawPeer, data: bytes) -> None:
    """Issue 15 / B-153: ~2,600 connections were left open after a malformed frame. The close
    frame (amqp:connection:framing-error) is in the very next output, and the socket may
    be closed right after it (`finished`), without waiting for the engine's tick."""
    peer.send(data)
    assert F.close_condition(peer.received) == "amqp:connection:framing-error"
    assert peer.connection.finished


def test_begin_pipelined_with_open_and_close_is_no_framing_error(peer: F.RawPeer) -> None:
    """Issue 15: a begin is refused only when it really precedes the open; a client that
    sends open, begin, attach and close in one write gets its answers and a plain close."""
    peer.send(F.frame(F.open_()), F.frame(F.begin()), _consumer(), F.frame(F.close()))
    codes = [F.performative_code(p) for _, _, p in F.read_frames(peer.received)]
    assert codes == [F.OPEN, F.BEGIN, F.ATTACH, F.CLOSE]
    assert F.close_condition(peer.received) == ""


def test_close_before_open_is_a_framing_error(peer: F.RawPeer) -> None:
    """Issue 15 / B-153 (fuzzer): a close sent before the open got no answer at all."""
    peer.send(F.frame(F.close()), F.frame(F.open_()), F.frame(F.begin()))
    assert F.close_condition(peer.received) == "amqp:connection:framing-error"
    assert peer.connection.finished


def test_nothing_after_a_refused_open_is_acted_on(peer: F.RawPeer) -> None:
    """Issue 15: frames pipelined after an open the broker refuses (here a lying
    capabilities array) must not attach consumers to the dead connection: they would
    never be detached."""
    bad_open = F.open_(desired=LYING_ARRAY)
    peer.send(F.frame(bad_open), F.frame(F.begin()), _consumer())
    assert F.close_condition(peer.received) == "amqp:decode-error"
    assert "q" not in peer.connection.broker.queues
    assert not peer.connection.shell.consumers


@pytest.mark.parametrize("tag", [b"x", b"0"])
def test_transfer_on_a_consumer_link_closes_the_connection(peer: F.RawPeer, tag: bytes) -> None:
    """Issue 15 (fuzzer): proton accepts a peer's transfer on a link the broker sends on;
    its tag was parsed as one of the broker's delivery ids (ValueError: internal-error).
    Now the connection closes with amqp:invalid-field at once."""
    peer.opened()
    peer.send(_consumer(), F.frame(F.flow(credit=5)))
    accepted = F.outcome(F.ACCEPTED)
    peer.send(F.frame(F.transfer(tag=tag, state=accepted), payload=F.message()))
    assert peer.errors() == [
        (F.CLOSE, ("amqp:invalid-field", "transfer: a transfer on a link the broker sends on"))
    ]
    assert peer.connection.finished


# -- What one connection may hold (issue 15 attack pass) -------------------------------------


def _proton_endpoints(connection: AmqpConnection) -> tuple[int, int]:
    """(sessions, links) Proton still keeps for the connection, in any state."""
    impl = connection.connection._impl
    sessions = links = 0
    session = lib.pn_session_head(impl, 0)
    while session != ffi.NULL:
        sessions += 1
        session = lib.pn_session_next(session, 0)
    link = lib.pn_link_head(impl, 0)
    while link != ffi.NULL:
        links += 1
        link = lib.pn_link_next(link, 0)
    return sessions, links


def test_the_open_offers_64_sessions_and_a_higher_channel_is_a_framing_error(
    peer: F.RawPeer,
) -> None:
    """Issue 15: the open advertised channel-max 32767 and Proton took that many begins
    (~3.7 KB each: 120 MB for one connection). Now channel-max is 63 (64 sessions, as
    RabbitMQ 4's session_max_per_connection) and a begin on channel 64 ends it."""
    [opened, _] = peer.opened()
    assert F.performative_code(opened) == F.OPEN
    assert opened.value[3] == 63
    peer.send(*(F.frame(F.begin(), channel=c) for c in range(1, 64)))
    assert F.close_condition(peer.received) is None
    peer.send(F.frame(F.begin(), channel=64))
    assert F.close_condition(peer.received) == "amqp:connection:framing-error"


def test_a_257th_link_on_one_session_closes_the_connection(peer: F.RawPeer) -> None:
    """Issue 15: a session took 2**31 handles, and Proton finds a link by name with a
    linear search, so 20,000 consumer attaches on one connection cost 100 s of loop time
    and 90 MB. Now 256 links fit on a session (RabbitMQ 4's link_max_per_session) and the
    257th closes the connection with amqp:resource-limit-exceeded."""
    peer.opened()
    attaches = [
        F.frame(F.attach(f"c{h}", handle=h, role_receiver=True, source=_source()))
        for h in range(256)
    ]
    peer.send(*attaches)
    assert F.close_condition(peer.received) is None
    assert len(peer.connection.consumers) == 256
    peer.send(F.frame(F.attach("c256", handle=256, role_receiver=True, source=_source())))
    assert F.close_condition(peer.received) == "amqp:resource-limit-exceeded"
    assert peer.connection.finished
    assert not peer.connection.shell.consumers


def test_the_attach_fields_a_connection_keeps_are_bounded(
    peer: F.RawPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 attack: names, addresses and termini of open links were bounded only by
    the frame size, so one connection could make the broker keep 64 x 256 x 128 KiB
    (8 x 256 links with 100 KB names grew it by 311 MB). Past MAX_ATTACH_BYTES (here
    30,000) the attach closes the connection with resource-limit-exceeded; a link that
    ends, or its session, gives its bytes back."""
    monkeypatch.setattr(attach, "MAX_ATTACH_BYTES", 30_000)
    peer.opened()
    big = "n" * 9_000

    def consumer(n: int, channel: int = 0) -> bytes:
        node = F.attach(f"{n}{big}", handle=n, role_receiver=True, source=_source())
        return F.frame(node, channel=channel)

    peer.send(consumer(0), consumer(1), consumer(2))  # ~27,000 bytes
    assert F.close_condition(peer.received) is None
    assert 27_000 < peer.connection.attach_bytes_total < 30_000
    peer.send(F.frame(F.detach(handle=2, closed=True)))  # its bytes come back
    peer.send(F.frame(F.begin(), channel=1), consumer(2, channel=1))
    assert F.close_condition(peer.received) is None
    peer.send(F.frame(F.end(), channel=1))  # a session's end gives back its links'
    assert 18_000 < peer.connection.attach_bytes_total < 19_000
    peer.send(consumer(2))
    assert F.close_condition(peer.received) is None
    peer.send(consumer(3))
    assert F.close_condition(peer.received) == "amqp:resource-limit-exceeded"
    assert peer.connection.finished


# An array32 of 65,000 nulls: 14 bytes on the wire, 65,001 nodes in Proton (~5 MB).
NULLS = b"\xf0" + struct.pack(">II", 5, 65_000) + b"\x40"


def _map_of(value: bytes) -> bytes:
    """`{symbol p: value}` (a map32 of already-encoded bytes)."""
    body = F.enc(Symbol("p")) + value
    return b"\xd1" + struct.pack(">II", len(body) + 4, 2) + body


def test_an_attach_whose_fields_hold_too_many_values_closes_the_connection(
    peer: F.RawPeer,
) -> None:
    """Issue 15 attack (B-153): the attach bound counted encoded bytes, but a value's
    size in Proton is its nodes: 20 attaches of 198 bytes, each with arrays of 65,000
    nulls, grew the broker by 625 MB while `attach_bytes_total` said 2,530 bytes, and
    every refused link keeps its fields until the peer detaches it. Past MAX_VALUE_NODES
    values in one attach the connection is closed (only that frees them)."""
    peer.opened()
    peer.send(_consumer(_source(capabilities=NULLS)))
    assert F.close_condition(peer.received) == "amqp:resource-limit-exceeded"
    assert peer.connection.finished
    assert peer.connection.attach_bytes_total == 0


def test_an_attach_pays_for_its_values_not_only_its_bytes(peer: F.RawPeer) -> None:
    """Issue 15 attack (B-152, B-153): each decoded value costs NODE_BYTES against
    MAX_ATTACH_BYTES; an attach just under MAX_VALUE_NODES is served."""
    peer.opened()
    many = F.enc([None] * (peer_module.MAX_VALUE_NODES - 40))  # a list: read, then refused
    peer.send(_consumer(properties=_map_of(F.enc([None] * 10))))
    assert F.close_condition(peer.received) is None
    assert peer.connection.attach_bytes_total > 12 * attach.NODE_BYTES
    peer.send(F.frame(F.detach(handle=0, closed=True)))
    assert peer.connection.attach_bytes_total == 0
    peer.send(_consumer(properties=_map_of(many)))
    assert F.close_condition(peer.received) is None
    assert peer.connection.attach_bytes_total > 980 * attach.NODE_BYTES


@pytest.mark.parametrize(
    "field",
    ["capabilities", "outcomes", "filter", "dynamic_node_properties", "properties", "target"],
)
def test_each_attach_field_counts_its_values(peer: F.RawPeer, field: str) -> None:
    """Issue 15 attack (B-153): every field Proton keeps for a link is counted."""
    peer.opened()
    if field == "properties":
        frame = _consumer(properties=_map_of(NULLS))
    elif field == "target":
        frame = _consumer(target=_target(capabilities=NULLS))
    elif field == "filter":
        frame = _consumer(_source(filter=_map_of(b"\x00" + F.enc(Symbol("x")) + NULLS)))
    elif field == "dynamic_node_properties":
        frame = _consumer(_source(dynamic_node_properties=_map_of(NULLS)))
    else:
        frame = _consumer(_source(**{field: NULLS}))
    peer.send(frame)
    assert F.close_condition(peer.received) == "amqp:resource-limit-exceeded"


@pytest.mark.parametrize("where", ["open.properties", "open.desired-capabilities"])
def test_an_open_field_with_too_many_values_closes_the_connection(
    peer: F.RawPeer, where: str
) -> None:
    """Issue 15 attack (B-153): read_data walked all 65,000 nulls (0.15 s of CPU for a
    100-byte open) before it refused them as mistyped."""
    node = (
        F.open_(properties=_map_of(NULLS)) if where == "open.properties" else F.open_(desired=NULLS)
    )
    peer.send(F.frame(node))
    assert F.close_condition(peer.received) == "amqp:resource-limit-exceeded"
    found = [e for _, e in peer.errors() if e is not None]
    assert found[0][1] == f"{where}: more than {peer_module.MAX_VALUE_NODES} values"


def test_a_transactional_state_with_too_many_values_ends_the_link(peer: F.RawPeer) -> None:
    """Issue 15 attack (B-153): a 100-byte transfer whose transactional-state held
    65,000 nulls cost 0.14 s of CPU to read (1,000 times a message's cost)."""
    peer.opened()
    peer.send(_producer())
    state = F.described_list(F.TRANSACTIONAL_STATE, [F.enc(b"txn"), NULLS])
    peer.send(F.frame(F.transfer(handle=0, state=state), payload=F.message()))
    [(code, error)] = peer.errors()
    assert code == F.DETACH
    assert error == (
        "amqp:resource-limit-exceeded",
        f"transactional-state: more than {peer_module.MAX_VALUE_NODES} values",
    )
    assert not peer.connection.closed


def test_links_detached_by_the_peer_free_their_place_on_the_session(peer: F.RawPeer) -> None:
    """Issue 15: a link or session ended on both sides stayed in Proton until the
    connection closed (~3 KB each): a client that attaches a sender per request leaked
    memory on a long-lived connection. Now both are freed, and 1,000 attach/detach
    cycles on one session fit within the 256-link cap."""
    peer.opened()
    cycles = [
        F.frame(F.attach(f"p{n}", role_receiver=False, source=F.source("s"), target=_target()))
        + F.frame(F.detach())
        for n in range(1000)
    ]
    sessions = [
        F.frame(F.begin(), channel=1)
        + F.frame(F.attach(f"s{n}", role_receiver=True, source=_source()), channel=1)
        + F.frame(F.end(), channel=1)
        for n in range(100)
    ]
    for start in range(0, 1000, 100):
        peer.send(*cycles[start : start + 100], *sessions[start // 10 : start // 10 + 10])
    assert F.close_condition(peer.received) is None
    assert _proton_endpoints(peer.connection) == (1, 0)
    assert not peer.connection.consumers
    assert not peer.connection.producers


def test_declares_beyond_1024_open_transactions_are_rejected(peer: F.RawPeer) -> None:
    """Issue 15: every declare added a transaction to the connection, without a bound.
    Now a declare beyond 1024 open transactions is rejected with
    amqp:resource-limit-exceeded; the coordinator stays, and a discharge frees a place."""
    peer.opened()
    coordinator = F.attach("txn", role_receiver=False, source=F.source("s"), target=F.coordinator())
    peer.send(F.frame(coordinator))
    declares = [
        F.frame(F.transfer(delivery_id=n, tag=b"%d" % n), payload=F.declare()) for n in range(1025)
    ]
    for start in range(0, len(declares), 200):  # within the coordinator's credit
        peer.send(*declares[start : start + 200])
    errors = peer.errors()
    assert len(peer.connection.transactions) == 1024
    assert [e for _, e in errors] == [
        ("amqp:resource-limit-exceeded", "more than 1024 transactions on one connection")
    ]
    first = next(iter(peer.connection.transactions))
    peer.send(F.frame(F.transfer(delivery_id=1025, tag=b"d"), payload=F.discharge(first)))
    peer.send(F.frame(F.transfer(delivery_id=1026, tag=b"n"), payload=F.declare()))
    assert len(peer.connection.transactions) == 1024
    assert len(peer.errors()) == 1


def test_open_transactions_keep_a_bounded_number_of_bytes_and_commit_all_or_nothing(
    peer: F.RawPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 attack: the sends a transaction keeps until its discharge were held
    without a bound (540 MB from one connection that never discharged). Past the
    connection's MAX_TRANSACTION_BYTES a send is refused with resource-limit-exceeded,
    its transaction can only roll back (nothing of it is routed), and the bytes are
    freed at the discharge: the next transaction commits."""
    monkeypatch.setattr(transactions, "MAX_TRANSACTION_BYTES", 5000)
    peer.opened()
    coordinator = F.attach("txn", role_receiver=False, source=F.source("s"), target=F.coordinator())
    producer = F.attach("p", handle=1, role_receiver=False, source=F.source("s"), target=_target())
    peer.send(F.frame(coordinator), F.frame(producer))
    ids = iter(range(100))

    def declared() -> bytes:
        peer.send(F.frame(F.transfer(delivery_id=next(ids), tag=b"d"), payload=F.declare()))
        return list(peer.connection.transactions)[-1]

    def send_in(txn: bytes, count: int) -> None:
        state = F.Node(transactions.TRANSACTIONAL_STATE, [F.enc(txn)])
        for _ in range(count):
            n = next(ids)
            transfer = F.transfer(handle=1, delivery_id=n, tag=b"%d" % n, state=state)
            peer.send(F.frame(transfer, payload=F.message("x" * 1000)))

    txn = declared()
    send_in(txn, 6)  # ~1 KB each: the 5th passes the 5,000 bytes
    assert [e for _, e in peer.errors()][-1][0] == "amqp:resource-limit-exceeded"
    peer.send(F.frame(F.transfer(delivery_id=next(ids), tag=b"c"), payload=F.discharge(txn)))
    assert [e for _, e in peer.errors()][-1][0] == "amqp:transaction:rollback"
    assert peer.connection.broker.queues["q"].message_count == 0  # all or nothing
    assert peer.connection.kept_bytes == 0
    txn = declared()
    send_in(txn, 3)
    errors = len(peer.errors())
    peer.send(F.frame(F.transfer(delivery_id=next(ids), tag=b"c2"), payload=F.discharge(txn)))
    assert len(peer.errors()) == errors  # committed
    assert peer.connection.broker.queues["q"].message_count == 3
    assert not peer.connection.closed


def test_unknown_protocol_bytes_are_not_logged(
    peer: F.RawPeer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 15 attack pass: a client that sent a second sasl-init after the broker's
    SASL outcome had Proton quote it, password included, in a WARNING log line
    ("Unknown protocol detected: '...PLAIN...nobody-pw'"). The bytes are no longer logged."""
    second_init = F.frame(F.sasl_init("PLAIN", F.plain("nobody", "nobody-pw")), kind=F.SASL_FRAME)
    peer.send(second_init, header=b"")
    assert F.close_condition(peer.received) == "amqp:connection:framing-error"
    assert "Unknown protocol detected (the bytes are not logged)" in caplog.text
    assert "nobody-pw" not in caplog.text


def test_a_control_message_past_64_kib_detaches_the_coordinator(peer: F.RawPeer) -> None:
    """Issue 15 attack (B-152/B-140): max-message-size was checked on producers only, so
    proton buffered an endless multi-frame transfer on a coordinator link (200 MB sent,
    the broker 196 MB larger, with or without max-message-size). A declare or discharge
    is a few dozen bytes: past MAX_CONTROL_BYTES the coordinator is detached with
    message-size-exceeded, what follows of the transfer is dropped, and a new
    coordinator declares as before."""
    peer.opened()
    coordinator = F.attach("txn", role_receiver=False, source=F.source("s"), target=F.coordinator())
    peer.send(F.frame(coordinator))
    chunk = b"\x00\x53\x77\xb0" + (30_000).to_bytes(4, "big") + b"x" * 30_000
    peer.send(F.frame(F.transfer(more=True), payload=chunk))
    more = F.frame(F.transfer(delivery_id=None, tag=None, more=True), payload=b"y" * 30_000)
    for _ in range(6):
        peer.send(more)
    assert peer.errors() == [
        (
            F.DETACH,
            (
                "amqp:link:message-size-exceeded",
                "control message of 90008 bytes or more exceeds max-message-size 65536",
            ),
        )
    ]
    assert not peer.connection.coordinators
    again = F.attach(
        "txn2", handle=1, role_receiver=False, source=F.source("s"), target=F.coordinator()
    )
    peer.send(F.frame(again))
    peer.send(F.frame(F.transfer(handle=1, delivery_id=1, tag=b"d"), payload=F.declare()))
    assert len(peer.connection.transactions) == 1
    assert not peer.connection.closed


def test_incomplete_messages_of_a_connection_are_bounded_together(
    peer: F.RawPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 attack (B-152): max-message-size bounded each message, but every link may
    have one in progress, so one connection held 16,384 times it (82 MB from 2,048 links
    at max-message-size 50000). Past `incomplete_limit` (here 4 x 50,000) the link
    whose frame passes it is detached with resource-limit-exceeded and its part
    dropped; the other links go on, and their messages complete."""
    monkeypatch.setattr(transfers, "MIN_INCOMPLETE_BYTES", 0)
    peer.connection.max_message_size = 50_000
    peer.opened()
    links = [
        F.frame(
            F.attach(f"p{h}", handle=h, role_receiver=False, source=F.source("s"), target=_target())
        )
        for h in range(8)
    ]
    peer.send(*links)
    head = b"\x00\x53\x75\xb0" + (45_000).to_bytes(4, "big") + b"x" * 30_000

    def part(
        handle: int, *, first: bool, more: bool = True, size: int = 15_000, n: int = -1
    ) -> bytes:
        if first:
            number = handle if n < 0 else n
            node = F.transfer(handle=handle, delivery_id=number, tag=b"t", more=more)
            return F.frame(node, payload=head)
        node = F.transfer(handle=handle, delivery_id=None, tag=None, more=more)
        return F.frame(node, payload=b"y" * size)

    for handle in range(6):  # 30,000 bytes each: the 7th link's frame passes 200,000
        peer.send(part(handle, first=True))
    assert peer.errors() == []
    peer.send(part(6, first=True))
    [(code, (condition, description))] = peer.errors()  # type: ignore[misc]
    assert (code, condition) == (F.DETACH, "amqp:resource-limit-exceeded")
    assert description.startswith("incomplete messages on this connection hold 210")
    peer.send(part(6, first=False))  # the rest of the dropped part: discarded
    peer.send(part(0, first=False, size=10_000))  # fits only if link 6's part was freed
    assert len(peer.errors()) == 1
    peer.send(part(0, first=False, more=False, size=5_000))
    for handle in range(1, 6):
        peer.send(part(handle, first=False, more=False))
    assert len(peer.errors()) == 1
    assert peer.connection.broker.queues["q"].message_count == 6
    peer.send(part(7, first=True), part(7, first=False, more=False))
    assert peer.connection.broker.queues["q"].message_count == 7
    counted = peer.connection.transfers
    assert (counted.incomplete, counted.incomplete_bytes) == ({}, 0)
    peer.send(part(5, first=True, n=8), F.frame(F.detach(handle=5)))  # a link's end forgets it
    assert (counted.incomplete, counted.incomplete_bytes) == ({}, 0)
    peer.send(part(4, first=True, n=9))
    assert counted.incomplete_bytes == 30_008
    peer.send(F.frame(F.end()))  # and a session's
    assert (counted.incomplete, counted.incomplete_bytes) == ({}, 0)
    assert not peer.connection.closed
