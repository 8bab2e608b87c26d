"""SASL checked by the broker itself, in front of the Proton engine (AMQP 1.0 §5.3).

The PyPI Proton build has no server-side PLAIN (no Cyrus), so when security is enabled
the broker speaks the SASL layer itself: it answers the SASL protocol header with
`sasl-mechanisms`, reads `sasl-init`, has the credentials checked, answers
`sasl-outcome`, and only then hands the bytes that follow (starting with the AMQP
protocol header) to a Proton transport that has no SASL layer. A client that skips SASL,
names a mechanism not offered, or fails authentication is never let in, and never as
anonymous.

Rules (issue 15):
* Nothing reaches the engine before the outcome is decided and the identity is handed
  over: bytes pipelined behind the `sasl-init` wait in a bounded buffer, and are given to
  `on_authenticated` together with the identity, so the caller sets the user and roles
  before the engine sees an open or an attach.
* A check may finish later (passwords are verified off the event loop): `verify` gets a
  `done` callback and returns a function that abandons the check.
* Every peer value is checked before use: frame size (at most MAX_SASL_FRAME_BYTES, read
  from the 4-byte header before anything is allocated), data offset, frame type, the
  performative, and each field's type. A bad frame gets `sasl-outcome` (sys-perm for a
  frame we cannot read, auth for bad credentials) and the connection is closed. `feed`
  never raises on peer input.

Mechanisms: PLAIN (refused on a non-TLS, non-loopback connection unless allowed; no proxy
authorization: an authzid must be empty or the authcid), EXTERNAL (the TLS client
certificate's CN names the user), ANONYMOUS (only when configured).
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
_FRAME_HEADER = struct.Struct(">IBBH")
# The largest SASL frame read before authentication. An RFC 4616 PLAIN response is at
# most 767 bytes (authzid, authcid, password of 255 each), the hostname at most 255 and a
# mechanism name 20: a sasl-init of ~1.1 KiB. 8 KiB leaves room for long passwords
# (tokens) while a peer that has proven nothing can make the broker hold only this much.
MAX_SASL_FRAME_BYTES = 8192
# Bytes pipelined behind the sasl-init, held while the credentials are checked. The
# server stops reading the socket meanwhile, so this is one read (asyncio reads up to
# 256 KiB) plus a frame; more means the peer ignored that and is refused.
MAX_PENDING_INPUT_BYTES = 256 * 1024 + MAX_SASL_FRAME_BYTES


class Outcome(enum.IntEnum):
    """sasl-outcome codes (AMQP 1.0 §5.3.3.6)."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the connection authenticated as."""

    user: str | None  # None: anonymous
    mechanism: str


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a sasl-init claims, for `verify` to check."""

    mechanism: str  # PLAIN or EXTERNAL
    authcid: str | None = None  # PLAIN
    password: str | None = None  # PLAIN
    peer_cn: str | None = None  # EXTERNAL: the verified TLS client certificate's CN


# The verdict of a check: the user name, or the Outcome to refuse with.
Verdict = str | Outcome
# (credentials, done) -> abandon: starts a check; `done` may be called at once or later.
Verifier = Callable[[Credentials, Callable[[Verdict], None]], Callable[[], None]]


class SaslError(Exception):
    """A SASL frame the broker refuses; `code` is the outcome the peer is told."""

    def __init__(self, why: str, code: Outcome) -> None:
        super().__init__(why)
        self.code = code


def _frame(code: int, fields: list[object]) -> bytes:
    body = sections.encode_value(Described(sections.ULong(code), fields))
    return _FRAME_HEADER.pack(8 + len(body), 2, _SASL_FRAME, 0) + body


class _State(enum.Enum):
    HEADER = "header"
    INIT = "init"
    CHECKING = "checking"
    DONE = "done"
    FAILED = "failed"


class SaslServer:
    """Drives the SASL exchange for one connection. Loop thread only."""

    def __init__(
        self,
        *,
        mechanisms: tuple[str, ...],
        verify: Verifier,
        peer_cn: str | None,
        on_authenticated: Callable[[Identity, bytes], None],
        on_failure: Callable[[str], None],
    ) -> None:
        self.mechanisms = mechanisms
        self._verify = verify
        self._peer_cn = peer_cn
        self._on_authenticated = on_authenticated
        self._on_failure = on_failure
        self._buffer = bytearray()
        self._state = _State.HEADER
        self._mechanism = ""
        self._abandon: Callable[[], None] | None = None
        self.identity: Identity | None = None
        self.output = bytearray()

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def failed(self) -> bool:
        return self._state is _State.FAILED

    @property
    def checking(self) -> bool:
        """A check is under way: the caller should stop reading the socket."""
        return self._state is _State.CHECKING

    def feed(self, data: bytes) -> None:
        """Bytes from the socket, before authentication has finished."""
        state = self._state
        if state is _State.DONE or state is _State.FAILED:
            return
        self._buffer += data
        if state is _State.CHECKING:
            if len(self._buffer) > MAX_PENDING_INPUT_BYTES:
                self.abandon()
                self._fail("sent too much before authentication finished", Outcome.SYS_PERM)
            return
        try:
            self._read()
        except SaslError as e:
            self._fail(str(e), e.code)

    def abandon(self) -> None:
        """The connection is going away: stop a check under way."""
        abandon, self._abandon = self._abandon, None
        if abandon is not None:
            abandon()

    def _read(self) -> None:
        if self._state is _State.HEADER:
            if len(self._buffer) < 8:
                return
            header = bytes(self._buffer[:8])
            del self._buffer[:8]
            self.output += SASL_HEADER
            if header != SASL_HEADER:
                # No SASL (or another protocol): answer with the SASL header and stop.
                self._fail("the client did not start SASL, which is required", None)
                return
            offered = Array([Symbol(m) for m in self.mechanisms], element_type=Symbol)
            self.output += _frame(_MECHANISMS, [offered])
            self._state = _State.INIT
        while self._state is _State.INIT and len(self._buffer) >= 8:
            size, doff, kind, _ = _FRAME_HEADER.unpack_from(self._buffer)
            if kind != _SASL_FRAME:
                raise SaslError(f"expected a SASL frame, got frame type {kind}", Outcome.SYS_PERM)
            if size > MAX_SASL_FRAME_BYTES:
                raise SaslError(
                    f"SASL frame of {size} bytes (at most {MAX_SASL_FRAME_BYTES})",
                    Outcome.SYS_PERM,
                )
            if doff < 2 or doff * 4 > size:
                raise SaslError(
                    f"SASL frame with bad size {size} or offset {doff}", Outcome.SYS_PERM
                )
            if len(self._buffer) < size:
                return
            body = bytes(self._buffer[doff * 4 : size])
            del self._buffer[:size]
            if body:  # an empty frame is a heartbeat
                self._on_init(body)

    def _on_init(self, body: bytes) -> None:
        try:
            value = sections.decode_value(body)
        except sections.SectionError as e:
            raise SaslError(f"undecodable SASL frame: {e}", Outcome.SYS_PERM) from None
        if (
            not isinstance(value, Described)
            or value.descriptor not in (_INIT, Symbol("amqp:sasl-init:list"))
            or not isinstance(value.value, list)
        ):
            raise SaslError("expected sasl-init", Outcome.SYS_PERM)
        fields = [*value.value[:3], None, None, None]
        mechanism, response, hostname = fields[:3]
        if not isinstance(mechanism, Symbol):
            raise SaslError("sasl-init mechanism is not a symbol", Outcome.AUTH)
        if response is not None and not isinstance(response, bytes):
            raise SaslError("sasl-init initial-response is not binary", Outcome.AUTH)
        if hostname is not None and not isinstance(hostname, str):
            raise SaslError("sasl-init hostname is not a string", Outcome.AUTH)
        self._mechanism = str(mechanism)
        credentials = self._credentials(self._mechanism, response or b"")
        self._state = _State.CHECKING
        if credentials is None:
            self._accept(None)  # ANONYMOUS
        else:
            self._abandon = self._verify(credentials, self._verdict)

    def _credentials(self, mechanism: str, response: bytes) -> Credentials | None:
        """What to check; None for ANONYMOUS. Raises SaslError for what cannot pass."""
        refused = f"authentication failed with mechanism {mechanism or '(none)'}"
        if mechanism not in self.mechanisms:
            raise SaslError(refused, Outcome.AUTH)
        if mechanism == "ANONYMOUS":
            return None
        if mechanism == "EXTERNAL":
            if self._peer_cn is None:
                raise SaslError(refused, Outcome.AUTH)
            return Credentials("EXTERNAL", peer_cn=self._peer_cn)
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")  # at most MAX_SASL_FRAME_BYTES: bounded
            if len(parts) != 3:
                raise SaslError(refused, Outcome.AUTH)
            try:
                authzid, authcid, password = (part.decode("utf-8") for part in parts)
            except UnicodeDecodeError:
                raise SaslError(refused, Outcome.AUTH) from None
            if not authcid:
                raise SaslError(refused, Outcome.AUTH)
            if authzid and authzid != authcid:  # no proxy authorization
                raise SaslError(f"{refused}: authzid differs from the user", Outcome.AUTH)
            return Credentials("PLAIN", authcid=authcid, password=password)
        raise SaslError(refused, Outcome.AUTH)

    def _verdict(self, verdict: Verdict) -> None:
        """The check finished: answer the outcome, hand over identity and pending bytes."""
        self._abandon = None
        if self._state is not _State.CHECKING:
            return  # failed meanwhile
        if isinstance(verdict, Outcome):
            why = f"authentication failed with mechanism {self._mechanism}"
            if verdict is Outcome.SYS_TEMP:
                why = f"{why}: too many logins being checked, try again later"
            self._fail(why, verdict)
            return
        self._accept(verdict)

    def _accept(self, user: str | None) -> None:
        self.identity = Identity(user, self._mechanism)
        self.output += _frame(_OUTCOME, [UByte(Outcome.OK)])
        self._state = _State.DONE
        rest, self._buffer = bytes(self._buffer), bytearray()
        self._on_authenticated(self.identity, rest)

    def _fail(self, why: str, code: Outcome | None) -> None:
        if code is not None:
            self.output += _frame(_OUTCOME, [UByte(code)])
        self._state = _State.FAILED
        self._buffer = bytearray()
        self._on_failure(why)
