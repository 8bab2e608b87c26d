"""The broker's SASL layer (security on) for tests of a connection without sockets: as
`server.py` makes it, offering PLAIN, with the credential check the test gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from amqpbroker.protocol.sasl import Credentials, SaslServer, Verdict

Verify = Callable[[Credentials, Callable[[Verdict], None]], Callable[[], None]]


def plain_sasl(verify: Verify) -> Callable[[Any, Any], SaslServer]:
    """The `sasl` factory `AmqpConnection` takes, checking credentials with `verify`."""

    def sasl(authenticated: Any, failed: Any) -> SaslServer:
        return SaslServer(
            mechanisms=("PLAIN",),
            verify=verify,
            peer_cn=None,
            on_authenticated=authenticated,
            on_failure=failed,
        )

    return sasl


def answering(verdict: Callable[[Credentials], Verdict]) -> Verify:
    """A check that answers `verdict(credentials)` at once (no thread, no wait)."""

    def verify(credentials: Credentials, done: Callable[[Verdict], None]) -> Callable[[], None]:
        done(verdict(credentials))
        return lambda: None

    return verify


# Every login passes as the user it names.
PASS: Final = answering(lambda credentials: credentials.authcid or "")
