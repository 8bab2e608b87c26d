"""The CLI against an HTTP server that answers with JSON nested deep (issue 15 attack):
`json.loads` raises RecursionError, which escaped as a traceback; it is one line now."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from amqpbroker import cli

NESTED = b"[" * 100_000 + b"]" * 100_000


class _Nested(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path.endswith("/ok") else 500)
        self.send_header("Content-Length", str(len(NESTED)))
        self.end_headers()
        self.wfile.write(NESTED)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Nested)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", ["/ok", "/error"])
def test_an_answer_nested_deep_is_a_one_line_error(server: str, path: str) -> None:
    """B-160: an answer (or an error answer) nested 100,000 deep: a CommandError."""
    with pytest.raises(cli.CommandError) as raised:
        cli._api(cli.Endpoint(server), path)
    assert "\n" not in str(raised.value)
    assert ("HTTP 500" in str(raised.value)) == (path == "/error")
