"""Hostile input, seventh attack pass (issue 15): what the HTTP server answers for what
the standard library refuses itself, and what a burst of sockets leaves the broker.

Real broker on port 0, raw HTTP over loopback.
"""

from __future__ import annotations

import json
import socket

import pytest
from support.http import parse_response
from support.process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BROKER_LOG_LEVEL = "info"


def _exchange(port: int, request: bytes) -> bytes:
    """`request` as spelled, the whole answer (to the broker's close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"FOO /api/v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"TRACE /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"get /console/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/x\r\nHost: 127.0.0.1\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
        (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414),
    ],
    ids=[
        "unknown-method",
        "trace",
        "lower-case",
        "one-word",
        "bad-version",
        "http2",
        "headers",
        "uri",
    ],
)
def test_what_the_standard_library_refuses_is_answered_in_the_apis_shape(
    broker: BrokerProcess, request_bytes: bytes, status: int
) -> None:
    """Seventh attack pass (B-161's API, CONTRACT.md's error shape): an unknown method, a
    request line or version the standard library cannot parse and too many headers were
    answered with its HTML error page (a line it could not parse even without a status
    line, as to HTTP/0.9), and a target over 64 KiB with no answer at all. Every error is
    now `{"error": ...}` JSON with a status line, and the Server header does not name
    the Python release."""
    answer = _exchange(broker.ports["http"], request_bytes)
    code, headers, body = parse_response(answer)
    assert code == status, answer[:300]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert headers["server"] == "amqpbroker"
    assert set(json.loads(body)) == {"error"}
