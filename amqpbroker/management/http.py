"""The HTTP side: /metrics, /healthz and the management API /api/v1 (CONTRACT.md).

Threading rule: requests are served on `ThreadingHTTPServer` threads, which never touch
core state. Every command is handed to the event loop (`LoopBridge.call`), which runs it,
applies the broker's effects, and hands the result back. Throttled retries (`rate`) pace
themselves on the HTTP thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from amqpbroker.core import BrokerError, ClientError, NotFound
from amqpbroker.core import operations as ops
from amqpbroker.core.queue import Ref
from amqpbroker.protocol import sections

log = logging.getLogger(__name__)
T = TypeVar("T")

COMMAND_TIMEOUT_S = 30.0
RETRY_CHUNK = 100


class LoopBridge:
    """Runs callables on the event loop from other threads and waits for the result."""

    def __init__(self, loop: asyncio.AbstractEventLoop, after: Callable[[], None]) -> None:
        self.loop = loop
        self._after = after  # apply effects and flush sockets after a command

    def call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            try:
                return fn()
            finally:
                self._after()

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout=COMMAND_TIMEOUT_S)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"binary": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _body_preview(data: bytes, limit: int = 200) -> str:
    """A short, printable view of the body (never the whole body)."""
    try:
        start = sections.scan(data).body_start
        if start >= len(data):
            return ""
        value = sections.decode_value(data[start:])
        body = getattr(value, "value", value)
    except (sections.SectionError, ValueError):
        return "<unreadable body>"
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.hex()
    else:
        text = json.dumps(_json_safe(body)) if not isinstance(body, str) else body
    return text if len(text) <= limit else text[:limit] + "…"


def message_view(ref: Ref) -> dict[str, Any]:
    """One entry of GET /api/v1/queues/{name}/messages (CONTRACT keys)."""
    m = ref.message
    return {
        "msg_id": m.msg_id,
        "delivery_count": ref.delivery_count,
        "durable": m.durable,
        "priority": m.priority,
        "size": m.size,
        "expiration": m.expiration_ms,
        "message_annotations": _json_safe(m.get_annotations()),
        "properties": _json_safe(m.get_properties()),
        "application_properties": _json_safe(m.get_application_properties()),
        "body_preview": _body_preview(m.data),
    }


def queue_view(stats: ops.QueueStats) -> dict[str, Any]:
    return {
        "name": stats.name,
        "address": stats.address,
        "routing_type": stats.routing_type,
        "durable": stats.durable,
        "messages": stats.messages,
        "delivering": stats.delivering,
        "scheduled": stats.scheduled,
        "consumers": stats.consumers,
        "added": stats.added,
        "acknowledged": stats.acknowledged,
        "dead_lettered": stats.dead_lettered,
        "expired": stats.expired,
        "killed": stats.killed,
    }


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class ManagementApi:
    """Routes requests to broker operations on the loop. Used by the HTTP threads."""

    def __init__(
        self,
        bridge: LoopBridge,
        *,
        metrics: Callable[[], bytes],
        healthy: Callable[[], bool],
        authorize: Callable[[str | None, str | None], int] | None = None,
    ) -> None:
        self.bridge = bridge
        self.metrics = metrics
        self.healthy = healthy
        self.authorize = authorize  # None: security disabled

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None
    ) -> tuple[HTTPStatus, Any]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method == "GET" and parts == ["healthz"]:
            if self.healthy():
                return HTTPStatus.OK, {"status": "ok"}
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "not accepting connections")
        if parts[:2] != ["api", "v1"] or len(parts) < 3:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        rest = parts[2:]
        if method == "GET" and rest == ["addresses"]:
            return HTTPStatus.OK, self.bridge.call(self._addresses)
        if method == "GET" and rest == ["queues"]:
            return HTTPStatus.OK, [queue_view(q) for q in self._stats()]
        if rest[0] != "queues" or len(rest) < 2:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        name = rest[1]
        if method == "GET" and len(rest) == 2:
            return HTTPStatus.OK, self.bridge.call(lambda: self._queue(name))
        if method == "GET" and rest[2:] == ["messages"]:
            limit = _int_param(query, "limit", 100)
            offset = _int_param(query, "offset", 0)
            selector = query.get("filter", [None])[0]
            refs = self.bridge.call(
                lambda: [
                    message_view(r)
                    for r in ops.browse(
                        self.bridge_broker, name, selector=selector, limit=limit, offset=offset
                    )
                ]
            )
            return HTTPStatus.OK, refs
        if method == "POST" and len(rest) == 3:
            body = body or {}
            selector = _opt_str(body, "filter")
            if rest[2] == "purge":
                removed = self.bridge.call(
                    lambda: ops.purge(self.bridge_broker, name, selector=selector)
                )
                return HTTPStatus.OK, {"removed": removed}
            if rest[2] == "move":
                to_queue = _opt_str(body, "to-queue")
                if not to_queue:
                    raise HttpError(HTTPStatus.BAD_REQUEST, "'to-queue' is required")
                moved = self.bridge.call(
                    lambda: ops.move(self.bridge_broker, name, to_queue=to_queue, selector=selector)
                )
                return HTTPStatus.OK, {"moved": moved}
            if rest[2] == "retry":
                return HTTPStatus.OK, self._retry(name, selector, body)
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {path}")

    # Set by the server: the Broker, read only on the loop through the bridge.
    bridge_broker: Any = None

    def _stats(self) -> list[ops.QueueStats]:
        return self.bridge.call(lambda: ops.queue_stats(self.bridge_broker))

    def _addresses(self) -> list[dict[str, Any]]:
        out = []
        for a in self.bridge_broker.post_office.addresses.values():
            out.append(
                {
                    "name": a.name,
                    "routing_types": sorted(t.value for t in a.routing_types),
                    "queues": [q.name for q in a.queues],
                }
            )
        return out

    def _queue(self, name: str) -> dict[str, Any]:
        broker = self.bridge_broker
        queue = broker.queues.get(name)
        if queue is None:
            raise NotFound(f"queue {name} does not exist")
        stats = next(s for s in ops.queue_stats(broker) if s.name == name)
        view = queue_view(stats)
        view["filter"] = queue.config.filter
        view["settings"] = broker.settings_for(queue.address).to_config()
        return view

    def _retry(self, name: str, selector: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """`{"retried": N}`; with `ids` also `skipped` ([{msg_id, reason}]) and `not_found`
        (ids not waiting in the queue). `expect` checks each id against its redrive line."""
        ids = body.get("ids")
        if ids is not None and (not isinstance(ids, list) or not all(type(i) is int for i in ids)):
            raise HttpError(HTTPStatus.BAD_REQUEST, "'ids' must be a list of msg_id integers")
        expect = _expectations(body.get("expect"))
        if expect is not None and ids is None:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'expect' needs 'ids'")
        rate = body.get("rate")
        if rate is None:
            result = self.bridge.call(
                lambda: ops.retry(
                    self.bridge_broker, name, selector=selector, ids=ids, expect=expect
                )
            )
            return _retry_answer([result], ids is not None)
        if not isinstance(rate, int | float) or rate <= 0:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'rate' must be a positive number")
        # Throttled (msg/s): take the matching ids, then retry them in small paced chunks.
        wanted = self.bridge.call(
            lambda: [
                r.message.msg_id
                for r in ops.browse(self.bridge_broker, name, selector=selector, limit=1_000_000)
            ]
        )
        results = []
        if ids is not None:
            present = set(wanted)
            asked = set(ids)
            wanted = [i for i in wanted if i in asked]
            missing = tuple(dict.fromkeys(i for i in ids if i not in present))
            results.append(ops.RetryResult(0, not_found=missing))
        started = time.monotonic()
        chunk = max(1, min(RETRY_CHUNK, int(rate)))
        for i in range(0, len(wanted), chunk):
            part = wanted[i : i + chunk]
            results.append(
                self.bridge.call(
                    functools.partial(ops.retry, self.bridge_broker, name, ids=part, expect=expect)
                )
            )
            pause = started + (i + len(part)) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        return _retry_answer(results, ids is not None)


def _expectations(value: Any) -> dict[int, dict[str, str | None]] | None:
    """`expect`: {"<msg_id>": {field: string or null}} with fields from ops.EXPECT_FIELDS."""
    if value is None:
        return None
    bad = HttpError(
        HTTPStatus.BAD_REQUEST,
        "'expect' must map msg_id to an object of "
        + ", ".join(ops.EXPECT_FIELDS)
        + " (strings or null)",
    )
    if not isinstance(value, dict):
        raise bad
    out: dict[int, dict[str, str | None]] = {}
    for key, fields in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 20):
            raise bad
        if not isinstance(fields, dict) or not all(
            k in ops.EXPECT_FIELDS and (v is None or isinstance(v, str)) for k, v in fields.items()
        ):
            raise bad
        out[int(key)] = fields
    return out


def _retry_answer(results: list[ops.RetryResult], by_id: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"retried": sum(r.retried for r in results)}
    if by_id:
        answer["skipped"] = [
            {"msg_id": msg_id, "reason": why} for r in results for msg_id, why in r.skipped
        ]
        answer["not_found"] = [i for r in results for i in r.not_found]
    return answer


def _basic_auth(header: str | None) -> tuple[str | None, str | None]:
    if not header or not header.startswith("Basic "):
        return None, None
    try:
        user, _, password = base64.b64decode(header[6:]).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, None
    return user, password


def _int_param(query: dict[str, list[str]], key: str, default: int) -> int:
    raw = query.get(key, [None])[0]
    if raw is None:
        return default
    if not raw.isdigit():
        raise HttpError(HTTPStatus.BAD_REQUEST, f"'{key}' must be a non-negative integer")
    return int(raw)


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"'{key}' must be a string")
    return value or None


def _handler_class(api: ManagementApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "amqpbroker"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http %s " + format, self.client_address[0], *args)

        def _reply(self, status: HTTPStatus, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _json(self, status: HTTPStatus, value: Any) -> None:
            self._reply(status, json.dumps(value).encode(), "application/json")

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            try:
                if method == "GET" and url.path == "/metrics":
                    self._reply(
                        HTTPStatus.OK, api.metrics(), "text/plain; version=0.0.4; charset=utf-8"
                    )
                    return
                if url.path.startswith("/api/") and api.authorize is not None:
                    user, password = _basic_auth(self.headers.get("Authorization"))
                    verdict = api.authorize(user, password)
                    if verdict == 401:
                        self.send_response(HTTPStatus.UNAUTHORIZED)
                        payload = json.dumps({"error": "authentication required"}).encode()
                        self.send_header("WWW-Authenticate", 'Basic realm="amqpbroker"')
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(payload)))
                        self.end_headers()
                        self.wfile.write(payload)
                        return
                    if verdict == 403:
                        raise HttpError(HTTPStatus.FORBIDDEN, "the 'manage' permission is required")
                body = None
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    try:
                        body = json.loads(self.rfile.read(length))
                    except ValueError as e:
                        raise HttpError(HTTPStatus.BAD_REQUEST, f"invalid JSON: {e}") from e
                    if not isinstance(body, dict):
                        raise HttpError(HTTPStatus.BAD_REQUEST, "expected a JSON object")
                status, value = api.handle(method, url.path, parse_qs(url.query), body)
                self._json(status, value)
            except HttpError as e:
                self._json(e.status, {"error": str(e)})
            except NotFound as e:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(e)})
            except ClientError as e:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            except BrokerError as e:
                self._json(HTTPStatus.CONFLICT, {"error": str(e)})
            except Exception:
                log.exception("HTTP %s %s failed", method, self.path)
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

    return Handler


class HttpServer:
    """ThreadingHTTPServer on its own thread; `port` is the bound port."""

    def __init__(self, host: str, port: int, api: ManagementApi) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler_class(api))
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
