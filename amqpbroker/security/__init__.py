"""Security: TLS contexts for amqps acceptors and development certificates."""

from amqpbroker.security.certs import create_certificates
from amqpbroker.security.passwords import hash_password, verify_password, verify_password_or_dummy
from amqpbroker.security.tls import server_context

__all__ = [
    "create_certificates",
    "hash_password",
    "server_context",
    "verify_password",
    "verify_password_or_dummy",
]
