"""The CLI against an HTTP server that answers with JSON nested deep (issue 15 attack):
`json.loads` raises RecursionError, which escaped as a traceback; it is one line now."""

from __future__ import annotations

import threading
import time
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


class _Endless(BaseHTTPRequestHandler):
    """An answer that never ends (no Content-Length, bytes until the client goes), or
    one trickled a byte at a time."""

    def do_GET(self) -> None:
        self.send_response(200 if "/ok" in self.path else 500)
        self.end_headers()
        try:
            if "trickle" in self.path:
                while True:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.01)
            chunk = b" " * 65536
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endless() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/ok", "/error"])
def test_an_endless_answer_is_cut_at_the_bound(
    endless: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Third attack pass: the CLI read an answer whole, so an endpoint that never ends
    its answer made it grow until memory ran out. Now at most MAX_ANSWER_BYTES (an
    error answer: MAX_ERROR_ANSWER_BYTES) are read, then a one-line error."""
    monkeypatch.setattr(cli, "MAX_ANSWER_BYTES", 4 * 1024 * 1024)
    with pytest.raises(cli.CommandError) as raised:
        cli._api(cli.Endpoint(endless), path)
    if path == "/ok":
        assert f"larger than {4 * 1024 * 1024} bytes" in str(raised.value)
    else:
        assert "(HTTP 500)" in str(raised.value)


@pytest.mark.timeout(60)
def test_a_trickled_answer_is_cut_at_the_deadline(
    endless: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Third attack pass: a byte every 10 ms never hit the 60 s socket timeout, so the
    CLI waited forever; the whole answer has ANSWER_TIME_S now."""
    monkeypatch.setattr(cli, "ANSWER_TIME_S", 1.0)
    started = time.monotonic()
    with pytest.raises(cli.CommandError, match="took more than"):
        cli._api(cli.Endpoint(endless), "/ok/trickle")
    assert time.monotonic() - started < 10
