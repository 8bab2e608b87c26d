"""The broker's SASL layer as bytes in, bytes out (AMQP 1.0 §5.3; issue 15)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from amqpbroker.protocol import sections
from amqpbroker.protocol.sasl import (
    AMQP_HEADER,
    MAX_PENDING_INPUT_BYTES,
    MAX_SASL_FRAME_BYTES,
    SASL_HEADER,
    Credentials,
    Identity,
    Outcome,
    SaslServer,
    Verdict,
)
from amqpbroker.protocol.sections import Described, Symbol, ULong


def frame(body: bytes, *, doff: int = 2, kind: int = 1, size: int | None = None) -> bytes:
    return struct.pack(">IBBH", 8 + len(body) if size is None else size, doff, kind, 0) + body


def init_frame(mechanism: Any, response: Any, *more: Any) -> bytes:
    fields = [Symbol(mechanism) if isinstance(mechanism, str) else mechanism, response, *more]
    return frame(sections.encode_value(Described(ULong(0x41), fields)))


class Harness:
    """A SaslServer whose PLAIN check accepts u/p; `later` holds checks not yet done."""

    def __init__(self, mechanisms: tuple[str, ...] = ("PLAIN",), *, deferred: bool = False):
        self.forwarded: list[bytes] = []
        self.identities: list[Identity] = []
        self.failures: list[str] = []
        self.checked: list[Credentials] = []
        self.later: list[Callable[[], None]] = []
        self.abandoned = 0
        self.deferred = deferred
        self.server = SaslServer(
            mechanisms=mechanisms,
            verify=self.verify,
            peer_cn=None,
            on_authenticated=self.authenticated,
            on_failure=self.failures.append,
        )

    def verify(self, credentials: Credentials, done: Callable[[Verdict], None]) -> Any:
        self.checked.append(credentials)
        ok = (credentials.authcid, credentials.password) == ("u", "p")
        verdict: Verdict = "u" if ok else Outcome.AUTH
        if self.deferred:
            self.later.append(lambda: done(verdict))
        else:
            done(verdict)

        def abandon() -> None:
            self.abandoned += 1

        return abandon

    def authenticated(self, identity: Identity, rest: bytes) -> None:
        self.identities.append(identity)
        self.forwarded.append(rest)

    def outcome(self) -> int:
        output = bytes(self.server.output)
        value = sections.decode_value(output[output.rindex(b"\x00\x53\x44") :])
        return int(value.value[0])


def test_plain_success_forwards_the_amqp_bytes_with_the_identity() -> None:
    h = Harness()
    h.server.feed(SASL_HEADER + init_frame("PLAIN", b"\x00u\x00p") + AMQP_HEADER + b"rest")
    assert h.server.done
    assert h.identities == [Identity("u", "PLAIN")]
    assert h.forwarded == [AMQP_HEADER + b"rest"]
    assert h.outcome() == Outcome.OK
    assert h.failures == []


def test_byte_at_a_time_is_fine() -> None:
    h = Harness()
    for byte in SASL_HEADER + init_frame("PLAIN", b"\x00u\x00p"):
        h.server.feed(bytes([byte]))
    assert h.server.done


def test_pipelined_bytes_wait_for_a_deferred_check() -> None:
    """Issue 15 item 1: nothing after the sasl-init is handed on before the outcome, and
    what the peer sends meanwhile is kept, in order."""
    h = Harness(deferred=True)
    h.server.feed(SASL_HEADER + init_frame("PLAIN", b"\x00u\x00p") + AMQP_HEADER)
    h.server.feed(b"open+attach")
    assert h.server.checking
    assert h.forwarded == []
    assert h.identities == []
    h.later.pop()()
    assert h.server.done
    assert h.forwarded == [AMQP_HEADER + b"open+attach"]


def test_too_much_input_while_checking_is_refused() -> None:
    """Issue 15 item 4: the buffer of pipelined input is bounded."""
    h = Harness(deferred=True)
    h.server.feed(SASL_HEADER + init_frame("PLAIN", b"\x00u\x00p"))
    h.server.feed(b"x" * (MAX_PENDING_INPUT_BYTES + 1))
    assert h.server.failed
    assert h.abandoned == 1
    h.later.pop()()  # the check's late answer changes nothing
    assert h.forwarded == []
    assert h.outcome() == Outcome.SYS_PERM


def test_wrong_password_gives_outcome_auth_and_no_forwarding() -> None:
    h = Harness()
    h.server.feed(SASL_HEADER + init_frame("PLAIN", b"\x00u\x00nope") + AMQP_HEADER)
    assert h.server.failed
    assert h.outcome() == Outcome.AUTH
    assert h.forwarded == []
    assert h.failures == ["authentication failed with mechanism PLAIN"]


@pytest.mark.parametrize("authzid", [b"admin", b"x"])
def test_plain_authzid_other_than_the_user_is_refused(authzid: bytes) -> None:
    """Issue 15 item 1: no proxy authorization; never checked, never let in."""
    h = Harness()
    h.server.feed(SASL_HEADER + init_frame("PLAIN", authzid + b"\x00u\x00p"))
    assert h.server.failed
    assert h.outcome() == Outcome.AUTH
    assert h.checked == []


def test_plain_authzid_equal_to_the_user_is_fine() -> None:
    h = Harness()
    h.server.feed(SASL_HEADER + init_frame("PLAIN", b"u\x00u\x00p"))
    assert h.server.done


def test_mechanism_not_offered_is_refused() -> None:
    h = Harness(("PLAIN",))
    h.server.feed(SASL_HEADER + init_frame("ANONYMOUS", b""))
    assert h.server.failed
    assert h.failures == ["authentication failed with mechanism ANONYMOUS"]


def test_anonymous_when_offered_is_an_identity_without_a_user() -> None:
    h = Harness(("ANONYMOUS",))
    h.server.feed(SASL_HEADER + init_frame("ANONYMOUS", None) + AMQP_HEADER)
    assert h.identities == [Identity(None, "ANONYMOUS")]
    assert h.forwarded == [AMQP_HEADER]


def test_skipping_sasl_is_refused() -> None:
    h = Harness()
    h.server.feed(AMQP_HEADER)
    assert h.server.failed
    assert bytes(h.server.output) == SASL_HEADER
    assert h.forwarded == []
    assert h.failures == ["the client did not start SASL, which is required"]


def test_offered_mechanisms_are_listed() -> None:
    h = Harness(("PLAIN", "EXTERNAL"))
    h.server.feed(SASL_HEADER)
    body = bytes(h.server.output)[8 + 8 :]
    offered = sections.decode_value(body).value[0]
    assert list(offered) == ["PLAIN", "EXTERNAL"]


def test_an_empty_frame_is_a_heartbeat() -> None:
    h = Harness()
    h.server.feed(SASL_HEADER + frame(b"") + init_frame("PLAIN", b"\x00u\x00p"))
    assert h.server.done


def _described(fields: bytes, count: int) -> bytes:
    """sasl-init with a raw list8 of `count` pre-encoded fields."""
    return b"\x00\x53\x41\xc0" + bytes((len(fields) + 1, count)) + fields


SYM_PLAIN = b"\xa3\x05PLAIN"
# Issue 15 item 2/5: every one of these made data_received raise or allocate what the
# peer claimed; each must now end in a sasl-outcome and a closed connection.
BAD_INITS: list[tuple[str, bytes, Outcome]] = [
    ("null mechanism", frame(_described(b"\x40\x40", 2)), Outcome.AUTH),
    ("string mechanism", frame(_described(b"\xa1\x05PLAIN\x40", 2)), Outcome.AUTH),
    ("integer mechanism", frame(_described(b"\x54\x05\x40", 2)), Outcome.AUTH),
    ("integer response", frame(_described(SYM_PLAIN + b"\x54\x05", 2)), Outcome.AUTH),
    (
        "ulong response 40 MB",
        frame(_described(SYM_PLAIN + b"\x80" + struct.pack(">Q", 40_000_000), 2)),
        Outcome.AUTH,
    ),
    (
        "ulong response 2**64-1",
        frame(_described(SYM_PLAIN + b"\x80" + b"\xff" * 8, 2)),
        Outcome.AUTH,
    ),
    ("negative long response", frame(_described(SYM_PLAIN + b"\x55\xff", 2)), Outcome.AUTH),
    ("list response", frame(_described(SYM_PLAIN + b"\x45", 2)), Outcome.AUTH),
    ("string response", frame(_described(SYM_PLAIN + b"\xa1\x01x", 2)), Outcome.AUTH),
    ("integer hostname", frame(_described(SYM_PLAIN + b"\x40\x54\x01", 3)), Outcome.AUTH),
    (
        "vbin32 claiming 4 GB",
        frame(_described(SYM_PLAIN + b"\xb0" + struct.pack(">I", 0xFFFFFFFF), 2)),
        Outcome.SYS_PERM,
    ),
    (
        "list32 claiming 2**32-1 fields",
        frame(b"\x00\x53\x41\xd0" + struct.pack(">II", 4, 0xFFFFFFFF)),
        Outcome.SYS_PERM,
    ),
    ("not a list", frame(b"\x00\x53\x41\x54\x01"), Outcome.SYS_PERM),
    ("not described", frame(b"\x45"), Outcome.SYS_PERM),
    ("sasl-response first", frame(b"\x00\x53\x43\x45"), Outcome.SYS_PERM),
    ("undecodable", frame(b"\xff\xff\xff"), Outcome.SYS_PERM),
    ("trailing bytes", frame(_described(SYM_PLAIN, 1) + b"\x40"), Outcome.SYS_PERM),
    ("frame claims 40 MB", frame(b"\x00\x53\x41", size=40_000_000), Outcome.SYS_PERM),
    ("frame claims 4 GB", frame(b"", size=0xFFFFFFFF), Outcome.SYS_PERM),
    ("frame smaller than its header", frame(b"", size=3), Outcome.SYS_PERM),
    ("data offset past the frame", frame(b"\x00" * 4, doff=200), Outcome.SYS_PERM),
    ("data offset inside the header", frame(b"\x00" * 4, doff=1), Outcome.SYS_PERM),
    ("AMQP frame type", frame(b"\x45", kind=0), Outcome.SYS_PERM),
    ("PLAIN without separators", init_frame("PLAIN", b"up"), Outcome.AUTH),
    ("PLAIN empty user", init_frame("PLAIN", b"\x00\x00p"), Outcome.AUTH),
    ("PLAIN bad UTF-8", init_frame("PLAIN", b"\x00\xff\x00p"), Outcome.AUTH),
    ("PLAIN four parts", init_frame("PLAIN", b"\x00u\x00p\x00"), Outcome.AUTH),
]


@pytest.mark.parametrize(
    ("body", "code"), [(b, c) for _, b, c in BAD_INITS], ids=[n for n, _, _ in BAD_INITS]
)
def test_malformed_sasl_init_is_refused_without_raising(body: bytes, code: Outcome) -> None:
    """Issue 15 items 2 and 5: a sasl-outcome, the connection closed, nothing checked."""
    h = Harness()
    h.server.feed(SASL_HEADER + body + AMQP_HEADER)
    assert h.server.failed
    assert h.outcome() == code
    assert h.forwarded == []
    assert h.checked == []
    h.server.feed(init_frame("PLAIN", b"\x00u\x00p"))  # nothing more is read
    assert h.forwarded == []


def test_a_frame_claiming_more_than_the_limit_is_refused_from_its_header() -> None:
    """Issue 15 item 5: the size is checked before waiting for (or holding) the body."""
    h = Harness()
    h.server.feed(SASL_HEADER + struct.pack(">IBBH", MAX_SASL_FRAME_BYTES + 1, 2, 1, 0))
    assert h.server.failed


def test_a_frame_at_the_limit_is_read() -> None:
    h = Harness()
    password = b"p" * (MAX_SASL_FRAME_BYTES - 40)
    body = init_frame("PLAIN", b"\x00u\x00" + password)
    assert len(body) <= MAX_SASL_FRAME_BYTES
    h.server.feed(SASL_HEADER + body)
    assert h.checked[0].password == password.decode()


def test_plain_is_not_offered_in_clear_off_loopback() -> None:
    """PLAIN needs TLS or loopback unless allow-plain-without-tls; EXTERNAL needs a
    client certificate."""
    from pathlib import Path
    from types import SimpleNamespace

    from amqpbroker.config import parse_config
    from amqpbroker.server import BrokerServer

    def offered(config_text: str, host: str) -> tuple[str, ...]:
        server = BrokerServer(parse_config(config_text), data_dir=Path("/nonexistent"))
        transport = SimpleNamespace(get_extra_info=lambda key: None)
        factory = server.sasl_factory(transport, host)  # type: ignore[arg-type]
        assert factory is not None
        return factory(lambda identity, rest: None, lambda why: None).mechanisms

    secured = "security: {enabled: true, sasl-mechanisms: [PLAIN, EXTERNAL]}\n"
    assert offered(secured, "192.0.2.10") == ()
    assert offered(secured, "127.0.0.1") == ("PLAIN",)
    allowed = "security: {enabled: true, sasl-mechanisms: [PLAIN], allow-plain-without-tls: true}\n"
    assert offered(allowed, "192.0.2.10") == ("PLAIN",)


def test_mutated_sasl_inits_never_raise() -> None:
    """Issue 15 item 2: whatever the peer sends (here 3000 mutations of a valid init and
    random frames, seeded), `feed` never raises, and only the right credentials let in."""
    from random import Random

    rng = Random(15)
    refused = 0
    valid = init_frame("PLAIN", b"\x00u\x00p", "host")
    for _ in range(3000):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.2:
            data = bytearray(frame(rng.randbytes(rng.randint(0, 64))))
        h = Harness()
        h.server.feed(SASL_HEADER + bytes(data) + AMQP_HEADER)
        if h.server.done:
            assert h.identities == [Identity("u", "PLAIN")]
        else:
            assert h.forwarded == []
            refused += h.server.failed
    assert refused > 1000
