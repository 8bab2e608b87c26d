"""SASL checked by the broker itself, in front of the Proton engine (AMQP 1.0 §5.3).

The PyPI Proton build has no server-side PLAIN (no Cyrus), so when security is enabled
the broker speaks the SASL layer itself: it answers the SASL protocol header with
`sasl-mechanisms`, reads `sasl-init`, checks the credentials, answers `sasl-outcome`, and
from then on passes the bytes (starting with the AMQP protocol header) to a Proton
transport that has no SASL layer. A client that skips SASL, names a mechanism not
offered, or fails authentication is never let in, and never as anonymous.

Mechanisms: PLAIN (refused on a non-TLS, non-loopback connection unless allowed),
EXTERNAL (the TLS client certificate's CN names the user), ANONYMOUS (only when
configured).
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

from amqpbroker.protocol import sections
from amqpbroker.protocol.sections import Array, Described, Symbol, UByte

log = logging.getLogger(__name__)

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
_SASL_FRAME = 1
_MECHANISMS, _INIT, _OUTCOME = 0x40, 0x41, 0x44
MAX_SASL_FRAME = 65536


class Outcome(enum.IntEnum):
    OK = 0
    AUTH = 1
    SYS = 2


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the connection authenticated as."""

    user: str | None  # None: anonymous
    mechanism: str


# (mechanism, authcid, password or None, tls peer CN or None) -> user name, or None
Authenticator = Callable[[str, str | None, str | None, str | None], str | None]


def _frame(code: int, fields: list[object]) -> bytes:
    body = sections.encode_value(Described(ULONG_DESCRIPTOR(code), fields))
    return struct.pack(">IBBH", 8 + len(body), 2, _SASL_FRAME, 0) + body


def ULONG_DESCRIPTOR(code: int) -> sections.ULong:
    return sections.ULong(code)


class SaslServer:
    """Drives the SASL exchange for one connection; feeds the rest to `forward`."""

    def __init__(
        self,
        *,
        mechanisms: tuple[str, ...],
        authenticate: Authenticator,
        peer_cn: str | None,
        forward: Callable[[bytes], None],
        on_failure: Callable[[str], None],
    ) -> None:
        self.mechanisms = mechanisms
        self._authenticate = authenticate
        self._peer_cn = peer_cn
        self._forward = forward
        self._on_failure = on_failure
        self._buffer = b""
        self._state = "header"  # header -> init -> done | failed
        self.identity: Identity | None = None
        self.output = bytearray()

    @property
    def done(self) -> bool:
        return self._state == "done"

    @property
    def failed(self) -> bool:
        return self._state == "failed"

    def feed(self, data: bytes) -> None:
        if self._state == "done":
            self._forward(data)
            return
        if self._state == "failed":
            return
        self._buffer += data
        if self._state == "header":
            if len(self._buffer) < 8:
                return
            header, self._buffer = self._buffer[:8], self._buffer[8:]
            if header != SASL_HEADER:
                # No SASL (or another protocol): answer with the SASL header and stop.
                self.output += SASL_HEADER
                self._fail("the client did not start SASL, which is required")
                return
            self.output += SASL_HEADER
            offered = Array([Symbol(m) for m in self.mechanisms], element_type=Symbol)
            self.output += _frame(_MECHANISMS, [offered])
            self._state = "init"
        if self._state == "init":
            self._read_init()

    def _read_init(self) -> None:
        if len(self._buffer) < 8:
            return
        size, doff, kind, _ = struct.unpack(">IBBH", self._buffer[:8])
        if size > MAX_SASL_FRAME or size < 8 or kind != _SASL_FRAME:
            self._fail("malformed SASL frame")
            return
        if len(self._buffer) < size:
            return
        body, rest = self._buffer[doff * 4 : size], self._buffer[size:]
        self._buffer = b""
        try:
            value = sections.decode_value(body)
        except (sections.SectionError, ValueError):
            self._fail("undecodable sasl-init")
            return
        if not isinstance(value, Described) or value.descriptor != _INIT:
            self._fail("expected sasl-init")
            return
        fields = [*value.value, None, None, None]
        mechanism = str(fields[0]) if fields[0] is not None else ""
        response = bytes(fields[1]) if fields[1] is not None else b""
        user = self._check(mechanism, response)
        if user is False:
            self.output += _frame(_OUTCOME, [UByte(Outcome.AUTH)])
            self._fail(f"authentication failed with mechanism {mechanism or '(none)'}")
            return
        self.identity = Identity(user if isinstance(user, str) else None, mechanism)
        self.output += _frame(_OUTCOME, [UByte(Outcome.OK)])
        self._state = "done"
        if rest:
            self._forward(rest)

    def _check(self, mechanism: str, response: bytes) -> str | bool | None:
        """The user name, None for anonymous, or False when refused."""
        if mechanism not in self.mechanisms:
            return False
        if mechanism == "ANONYMOUS":
            return None
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            if len(parts) != 3:
                return False
            authcid = parts[1].decode("utf-8", "replace")
            password = parts[2].decode("utf-8", "replace")
            return self._authenticate("PLAIN", authcid, password, None) or False
        if mechanism == "EXTERNAL":
            if self._peer_cn is None:
                return False
            return self._authenticate("EXTERNAL", None, None, self._peer_cn) or False
        return False

    def _fail(self, why: str) -> None:
        self._state = "failed"
        self._on_failure(why)
