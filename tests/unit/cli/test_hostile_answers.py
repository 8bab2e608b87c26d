"""The CLI against an HTTP server that answers with JSON nested deep (issue 15 attack):
`json.loads` raises RecursionError, which escaped as a traceback; it is one line now.
Sixth attack pass: answers of another shape, and control characters in answers."""

from __future__ import annotations

import json
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


# Answers of the wrong shape, by path: what another service (or a hostile one) at the
# URL the operator typed may say. The broker answers none of these.
SHAPES: dict[str, bytes] = {
    "/api/v1/queues": b'{"queues": []}',
    "/api/v1/queues/q/messages": b'[{"msg_id": 1, "message_annotations": []}]',
    "/api/v1/queues/q/purge": b'{"deleted": 3}',
    "/api/v1/queues/q/move": b"[1, 2]",
    "/api/v1/queues/q/retry": b'{"retried": 1, "skipped": [7]}',
}
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\tx\ny"
TERMINAL: dict[str, bytes] = {
    "/api/v1/queues": json.dumps([{"address": ESCAPES, "name": "q", "messages": ESCAPES}]).encode(),
    "/api/v1/queues/q/messages": json.dumps(
        [
            {
                "msg_id": 1,
                "delivery_count": 0,
                "message_annotations": {"x-opt-ORIG-ADDRESS": ESCAPES},
                "application_properties": {},
                "body_preview": ESCAPES,
            }
        ]
    ).encode(),
    "/api/v1/queues/q/purge": json.dumps({"removed": ESCAPES}).encode(),
}


class _Shapes(BaseHTTPRequestHandler):
    answers: dict[str, bytes] = SHAPES

    def _answer(self) -> None:
        body = self.answers.get(self.path.partition("?")[0])
        if body is None:
            body = json.dumps({"error": ESCAPES}).encode()
            self.send_response(404)
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(answers: dict[str, bytes]) -> Iterator[str]:
    handler = type("Handler", (_Shapes,), {"answers": answers})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def shapes() -> Iterator[str]:
    yield from _serve(SHAPES)


@pytest.fixture
def terminal() -> Iterator[str]:
    yield from _serve(TERMINAL)


COMMANDS = {
    "queues": ["queues"],
    "messages": ["messages", "q"],
    "purge": ["purge", "q"],
    "move": ["move", "q", "--to-queue", "r"],
    "retry": ["retry", "q"],
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_answer_of_the_wrong_shape_is_a_one_line_error(
    shapes: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sixth attack pass (B-160): the commands read the answer as the broker shapes it,
    and anything else at `--url` escaped as an AssertionError, KeyError or TypeError
    traceback. Now one line and exit 1."""
    assert cli.main([*COMMANDS[command], "--url", shapes]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"amqpbroker: unexpected answer from {shapes}: "), err
    assert err.count("\n") == 1, err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", [*COMMANDS, "missing"])
def test_control_characters_in_an_answer_never_reach_the_terminal(
    terminal: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sixth attack pass: a message body, property or annotation is a producer's text,
    and the CLI printed it as it came: `ESC ] 0 ; ... BEL` retitled the operator's
    terminal, `ESC [ 2 J` cleared it, a line break forged table rows. Control characters
    (C0, DEL, C1, tab) are printed as escapes, in tables, summaries and errors."""
    argv = COMMANDS.get(command, ["messages", "missing"])
    cli.main([*argv, "--url", terminal])
    out, err = capsys.readouterr()
    for control in ("\x1b", "\x07", "\x9b", "\t"):
        assert control not in out + err, (out, err)
    assert "y" not in (out + err).splitlines()  # the line break stayed in its cell
