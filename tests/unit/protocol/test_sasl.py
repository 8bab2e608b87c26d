"""The broker's SASL layer as bytes in, bytes out (AMQP 1.0 §5.3)."""

from __future__ import annotations

import struct

from amqpbroker.protocol import sections
from amqpbroker.protocol.sasl import AMQP_HEADER, SASL_HEADER, SaslServer
from amqpbroker.protocol.sections import Described, Symbol, ULong


def init_frame(mechanism: str, response: bytes) -> bytes:
    body = sections.encode_value(Described(ULong(0x41), [Symbol(mechanism), response]))
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def make(mechanisms: tuple[str, ...] = ("PLAIN",)) -> tuple[SaslServer, list[bytes], list[str]]:
    forwarded: list[bytes] = []
    failures: list[str] = []
    server = SaslServer(
        mechanisms=mechanisms,
        authenticate=lambda mech, name, pw, cn: name if (name, pw) == ("u", "p") else None,
        peer_cn=None,
        forward=forwarded.append,
        on_failure=failures.append,
    )
    return server, forwarded, failures


def outcome_code(output: bytes) -> int:
    body = output[-(len(output) - output.rindex(b"\x00\x53\x44")) :]
    value = sections.decode_value(body)
    return int(value.value[0])


def test_plain_success_forwards_the_amqp_bytes() -> None:
    server, forwarded, failures = make()
    server.feed(SASL_HEADER + init_frame("PLAIN", b"\x00u\x00p") + AMQP_HEADER + b"rest")
    assert server.done
    assert server.identity is not None
    assert server.identity.user == "u"
    assert forwarded == [AMQP_HEADER + b"rest"]
    assert outcome_code(bytes(server.output)) == 0
    assert failures == []


def test_byte_at_a_time_is_fine() -> None:
    server, _forwarded, _ = make()
    for byte in SASL_HEADER + init_frame("PLAIN", b"\x00u\x00p"):
        server.feed(bytes([byte]))
    assert server.done


def test_wrong_password_gives_outcome_auth_and_no_forwarding() -> None:
    server, forwarded, failures = make()
    server.feed(SASL_HEADER + init_frame("PLAIN", b"\x00u\x00nope") + AMQP_HEADER)
    assert server.failed
    assert outcome_code(bytes(server.output)) == 1
    assert forwarded == []
    assert failures == ["authentication failed with mechanism PLAIN"]


def test_mechanism_not_offered_is_refused() -> None:
    server, _, failures = make(("PLAIN",))
    server.feed(SASL_HEADER + init_frame("ANONYMOUS", b""))
    assert server.failed
    assert failures == ["authentication failed with mechanism ANONYMOUS"]


def test_skipping_sasl_is_refused() -> None:
    server, forwarded, failures = make()
    server.feed(AMQP_HEADER)
    assert server.failed
    assert bytes(server.output) == SASL_HEADER
    assert forwarded == []
    assert failures == ["the client did not start SASL, which is required"]


def test_offered_mechanisms_are_listed() -> None:
    server, _, _ = make(("PLAIN", "EXTERNAL"))
    server.feed(SASL_HEADER)
    body = bytes(server.output)[8 + 8 :]
    offered = sections.decode_value(body).value[0]
    assert list(offered) == ["PLAIN", "EXTERNAL"]


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
        return factory(lambda data: None, lambda why: None).mechanisms

    secured = "security: {enabled: true, sasl-mechanisms: [PLAIN, EXTERNAL]}\n"
    assert offered(secured, "192.0.2.10") == ()
    assert offered(secured, "127.0.0.1") == ("PLAIN",)
    allowed = "security: {enabled: true, sasl-mechanisms: [PLAIN], allow-plain-without-tls: true}\n"
    assert offered(allowed, "192.0.2.10") == ("PLAIN",)
