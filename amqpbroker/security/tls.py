"""TLS for `amqps://` acceptors with Python's `ssl` (not Proton's, whose presence depends
on build-time headers): asyncio terminates TLS, the Proton engine sees plain AMQP."""

from __future__ import annotations

import ssl

from amqpbroker.config import TlsConfig

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """TLS 1.2+ server context with the configured certificate and client-auth mode.

    Raises:
        OSError, ssl.SSLError: a file is missing or is not a certificate/key.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert_file, tls.key_file)
    context.verify_mode = _CLIENT_AUTH[tls.client_auth]
    if tls.ca_file:
        context.load_verify_locations(tls.ca_file)
    elif context.verify_mode != ssl.CERT_NONE:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context
