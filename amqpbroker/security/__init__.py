"""Security: TLS contexts for amqps acceptors and passwords. Development certificates are
`amqpbroker.security.certs` (imported by `certs create` alone: cryptography costs a
broker start ~0.15 CPU-s, a third of it)."""

from amqpbroker.security.passwords import (
    hash_password,
    verify_password,
    verify_password_or_dummy,
)
from amqpbroker.security.tls import TlsFileError, acceptor_context, server_context

__all__ = [
    "TlsFileError",
    "acceptor_context",
    "hash_password",
    "server_context",
    "verify_password",
    "verify_password_or_dummy",
]
