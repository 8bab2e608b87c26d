"""HTTP helpers for the management API tests: credentials, raw requests, an inline bridge."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from amqpbroker.core.operations import Walk
    from amqpbroker.management import ManagementApi
    from amqpbroker.management.api import Reply

T = TypeVar("T")
U = TypeVar("U")


class InlineBridge:
    """`Bridge` that runs the command at once: unit tests have no event loop."""

    def call(self, fn: Callable[[], T]) -> T:
        return fn()

    def walk(self, start: Callable[[], Walk[T]], finish: Callable[[T], U]) -> U:
        return finish(start().run())


def basic_auth(user: str, password: str) -> str:
    """The value of an `Authorization: Basic` header."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def api_request(
    api: ManagementApi,
    method: str,
    target: str,
    *,
    authorization: str | None = None,
    body: dict[str, Any] | None = None,
    csrf_token: str | None = "test",
    origin: str | None = None,
    host: str = "127.0.0.1:8161",
) -> Reply:
    """One request through `ManagementApi.respond`, with the CSRF header by default."""
    raw = json.dumps(body).encode() if body is not None else b""
    return api.respond(
        method,
        target,
        authorization=authorization,
        client="10.0.0.1",
        read_body=lambda: raw,
        csrf_token=csrf_token,
        origin=origin,
        host=host,
    )


def raw_request(
    port: int,
    method: str,
    target: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    timeout: float = 10,
) -> tuple[int, dict[str, str], bytes]:
    """Send one request exactly as spelled (no client normalises `target`); read to EOF.

    Returns (status, headers with lower-case names, body).
    """
    headers = headers or {}
    host = [] if any(k.lower() == "host" for k in headers) else ["Host: 127.0.0.1"]
    lines = [f"{method} {target} HTTP/1.1", *host, "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return parse_response(b"".join(chunks))


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def get_json(http_port: int, path: str, *, authorization: str | None = None) -> Any:
    """GET http://127.0.0.1:PORT/PATH from a running broker, parsed as JSON."""
    import urllib.request

    headers = {} if authorization is None else {"Authorization": authorization}
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())
