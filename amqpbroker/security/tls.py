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


class TlsFileError(OSError):
    """A certificate, key or CA file cannot be used; the message names the file."""


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """TLS 1.2+ server context with the configured certificate and client-auth mode.

    Raises:
        TlsFileError: a file is missing or unreadable (`PATH: reason`), or is not a
            certificate/key (issue 15: OpenSSL's own errors name no file).
    """
    for path in (tls.cert_file, tls.key_file, tls.ca_file):
        if path:
            _check_readable(path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A TLS 1.2 client may ask to renegotiate, a handshake's CPU each time on the loop;
    # OpenSSL 3 refuses it by default, 1.1.1 (which Python 3.11 may link) does not, and
    # an AMQP client never needs it (seventh attack pass).
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as e:
        files = f"{tls.cert_file}, {tls.key_file}"
        raise TlsFileError(f"{files}: not a PEM certificate and its key ({e})") from e
    context.verify_mode = _CLIENT_AUTH[tls.client_auth]
    if tls.ca_file:
        try:
            context.load_verify_locations(tls.ca_file)
        except ssl.SSLError as e:
            raise TlsFileError(f"{tls.ca_file}: not PEM CA certificates ({e})") from e
    elif context.verify_mode != ssl.CERT_NONE:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context


def acceptor_context(name: str, tls: TlsConfig) -> ssl.SSLContext:
    """`server_context` for acceptor `name`, its error saying which acceptor: the one
    message of `amqpbroker run` and `amqpbroker check-config` (issue 15).

    Raises:
        TlsFileError: `acceptor NAME: cannot load TLS certificate/key: PATH: reason`.
    """
    try:
        return server_context(tls)
    except (OSError, ssl.SSLError) as e:
        raise TlsFileError(f"acceptor {name}: cannot load TLS certificate/key: {e}") from e


def _check_readable(path: str) -> None:
    """`PATH: No such file or directory` rather than OpenSSL's error without a name."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise TlsFileError(f"{path}: {e.strerror or e}") from e
