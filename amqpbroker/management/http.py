"""The HTTP server of /metrics, /healthz, /api/v1 and /console: bytes in, replies out.

Threading rule: requests are served on `ThreadingHTTPServer` threads, which never touch
core state: `ManagementApi` hands every command to the event loop (`LoopBridge.call`).
A throttled retry or move (`rate`) is a replay task paced on the loop (`tasks.py`, the one
pacing of a throttled retry, also for the CLI's `--rate`); no HTTP thread sleeps.

Issue 15: the handler gives each request `read_timeout_s` to arrive (its head, then its
body: a slow client is cut off and never holds a thread for long), reads no body larger
than `MAX_BODY_BYTES`, and the server serves at most `max_connections` connections at
once (more get a 503 and are closed), and none on a descriptor at or above `fd_ceiling`
(the descriptors above are kept for the broker's own files: docs/decisions.md "Loose ends").
"""

from __future__ import annotations

import contextlib
import http.client
import io
import logging
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from amqpbroker.management.api import CSRF_HEADER, HttpError, ManagementApi, is_loopback_name
from amqpbroker.management.replies import Reply, json_reply

log = logging.getLogger(__name__)

# The API's bodies are a few hundred bytes of JSON (a redrive list of 10,000 ids is
# ~100 KiB); anything larger is refused before a byte of it is read.
MAX_BODY_BYTES = 1024 * 1024
# The request line and headers together (issue 15 attack pass). The standard library
# alone allows 100 header lines of 64 KiB each: 6.4 MB held per request, times
# max-connections. The API's requests have a few short headers; Jetty (Artemis's
# console) allows 8 KiB by default, this leaves room for long bearer tokens.
MAX_HEAD_BYTES = 64 * 1024
REFUSAL_LOG_INTERVAL_S = 10.0


def declared_length(values: list[str] | None, transfer_encoding: str | None) -> int:
    """The body length a request declares (RFC 9112 section 6): bounded, or HttpError.

    No Content-Length and no Transfer-Encoding means no body. Chunked bodies are refused
    (the API's clients send a length), as are lengths that are not one plain number.
    """
    if transfer_encoding is not None:
        raise HttpError(
            HTTPStatus.LENGTH_REQUIRED, "Transfer-Encoding is not supported: send Content-Length"
        )
    if not values:
        return 0
    text = values[0].strip()
    if len(set(values)) != 1 or not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise HttpError(HTTPStatus.BAD_REQUEST, "Content-Length must be one non-negative integer")
    length = int(text)
    if length > MAX_BODY_BYTES:
        raise HttpError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body is limited to {MAX_BODY_BYTES} bytes"
        )
    return length


class _DeadlineReader(io.RawIOBase):
    """A socket's read side where a whole request (not each recv) has a deadline.

    A per-recv timeout lets a client sending a byte every few seconds hold a thread
    forever (slowloris); here each recv waits at most until `deadline`.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = time.monotonic()
        self.budget: int | None = None  # bytes left to read for the request head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        view = memoryview(buffer).cast("B")
        if self.budget is not None:
            if self.budget <= 0:
                # Within parse_headers, the standard library answers this with 431.
                raise http.client.LineTooLong("the request head")
            view = view[: self.budget]
        self._sock.settimeout(remaining)
        count = self._sock.recv_into(view)
        if self.budget is not None:
            self.budget -= count
        return count


def _handler_class(
    api: ManagementApi, read_timeout_s: float, loopback_only: bool
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "amqpbroker"

        def version_string(self) -> str:
            return self.server_version  # the Server header does not name the Python release

        protocol_version = "HTTP/1.1"
        timeout = read_timeout_s  # writes: a client that does not read is dropped
        _reader: _DeadlineReader

        def setup(self) -> None:
            super().setup()
            self._reader = _DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            # The request line and the headers must arrive within read_timeout_s (an idle
            # keep-alive connection is closed after as long).
            self._reader.deadline = time.monotonic() + read_timeout_s
            self._reader.budget = MAX_HEAD_BYTES
            try:
                super().handle_one_request()
            except http.client.LineTooLong:
                # Only the request line's read lets it out (parse_headers answers 431):
                # a target past MAX_HEAD_BYTES got no answer at all (seventh attack pass).
                self.requestline = self.command = ""
                self.request_version = ""  # not HTTP/0.9: a status line is written
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """The standard library's own refusals (an unknown method's 501, a request line
            or version it cannot parse, too many headers) in the API's shape, a JSON
            `{"error": ...}`, not its HTML page (seventh attack pass); then closed."""
            try:
                status = HTTPStatus(code)
            except ValueError:
                status = HTTPStatus.BAD_REQUEST
            self.log_message("refused %d %s", code, message or "")
            self.close_connection = True
            if self.request_version == "HTTP/0.9":  # a line it could not parse: not 0.9
                self.request_version = ""  # so the status line and headers are written
            self._send(json_reply(status, {"error": message or status.phrase}))

        def handle_expect_100(self) -> bool:
            """100 Continue only for a body we would read; otherwise answer first."""
            try:
                declared_length(
                    self.headers.get_all("Content-Length"), self.headers.get("Transfer-Encoding")
                )
            except HttpError:
                return True  # the refusal follows without inviting the body
            return super().handle_expect_100()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http %s " + format, self.client_address[0], *args)

        def _read_body(self) -> bytes:
            length = declared_length(
                self.headers.get_all("Content-Length"), self.headers.get("Transfer-Encoding")
            )
            if not length:
                return b""
            self._reader.deadline = time.monotonic() + read_timeout_s
            self._reader.budget = None
            try:
                data = self.rfile.read(length)
            except TimeoutError:
                raise HttpError(
                    HTTPStatus.REQUEST_TIMEOUT, "the body did not arrive in time"
                ) from None
            except OSError as e:  # reset mid-body: the reply will not arrive either
                raise HttpError(HTTPStatus.BAD_REQUEST, f"reading the body failed: {e}") from None
            if len(data) < length:
                raise HttpError(HTTPStatus.BAD_REQUEST, "the body is shorter than Content-Length")
            return data

        def _serve(self) -> None:
            method = self.command
            reply = api.respond(
                method,
                self.path,
                authorization=self.headers.get("Authorization"),
                client=self.client_address[0],
                read_body=self._read_body,
                csrf_token=self.headers.get(CSRF_HEADER),
                origin=self.headers.get("Origin"),
                # Several Host headers (RFC 9112: a 400) name no one host: refused.
                host=None if (hosts := self.headers.get_all("Host")) is None else ", ".join(hosts),
                loopback_only=loopback_only,
            )
            if reply.status >= 400:
                # The body may be unread (refused before reading): never guess where the
                # next request starts.
                self.close_connection = True
            self._send(reply)

        def _send(self, reply: Reply) -> None:
            """Write `reply` (all but the body for HEAD), `Connection: close` when this
            connection ends after it."""
            method = self.command
            self.connection.settimeout(read_timeout_s)
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                for key, value in (reply.headers or {}).items():
                    self.send_header(key, value)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(reply.body)
            except OSError as e:  # the client went away or stopped reading
                log.debug("http %s: cannot answer: %s", self.client_address[0], e)
                self.close_connection = True

        # Every method goes through the same checks; unknown ones end in 405 after auth.
        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _serve

    return Handler


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them; more get a 503."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # listen backlog (socketserver's 5 drops bursts of connects)

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        slots: int,
        fd_ceiling: int | None,
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(slots)
        self.max_connections = slots
        self._fd_ceiling = fd_ceiling
        self._refused = 0  # since the last warning; accept thread only
        self._next_warning = 0.0

    def process_request(self, request: Any, client_address: Any) -> None:
        # Descriptors are allocated lowest first: fd k open means k are in use. At the
        # ceiling only the broker's own files may have the rest (`HttpServer`).
        ceiling = self._fd_ceiling
        out_of_descriptors = ceiling is not None and request.fileno() >= ceiling
        if out_of_descriptors or not self._slots.acquire(blocking=False):
            self._refused += 1
            now = time.monotonic()
            if now >= self._next_warning:  # a flood of connections is not a flood of logs
                self._next_warning = now + REFUSAL_LOG_INTERVAL_S
                why = (
                    "the descriptors left are the journal's (RLIMIT_NOFILE)"
                    if out_of_descriptors
                    else f"{self.max_connections} are open (http.max-connections)"
                )
                log.warning(
                    "HTTP: refused %d connection(s), the last from %s: %s",
                    self._refused,
                    client_address[0],
                    why,
                )
                self._refused = 0
            # Without blocking the accept thread: answer, then read what the client has
            # sent already, so that closing does not reset the connection under the 503.
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY_REPLY)
                request.shutdown(socket.SHUT_WR)
                request.recv(65536)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A connection reset or a timeout mid-request: nothing to answer, nobody to tell.
        log.debug("HTTP connection from %s failed", client_address[0], exc_info=True)


_BUSY_BODY = b'{"error": "too many HTTP connections"}'
_BUSY_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\nConnection: close\r\n\r\n"
) + _BUSY_BODY


class HttpServer:
    """ThreadingHTTPServer on its own thread; `port` is the bound port."""

    def __init__(
        self,
        host: str,
        port: int,
        api: ManagementApi,
        *,
        read_timeout_s: float = 10.0,
        max_connections: int = 100,
        fd_ceiling: int | None = None,
    ) -> None:
        """`fd_ceiling`: a connection whose socket is this descriptor or higher is refused
        as one past max-connections is (503, closed): the descriptors above are kept
        for the broker's own files (server.py's reserve), which idle HTTP connections
        would otherwise take while the AMQP acceptors honour it. None: no check."""
        # Bound to loopback only: requests must name it by a loopback Host (DNS rebinding).
        loopback_only = is_loopback_name(host)
        self._server = _Server(
            (host, port),
            _handler_class(api, read_timeout_s, loopback_only),
            slots=max_connections,
            fd_ceiling=fd_ceiling,
        )
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
