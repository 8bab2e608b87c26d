"""Security: TLS contexts for amqps acceptors and development certificates."""

from amqpbroker.security.certs import create_certificates
from amqpbroker.security.tls import server_context

__all__ = ["create_certificates", "server_context"]
