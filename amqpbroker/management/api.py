"""The management API without sockets: views, authentication order, routing (CONTRACT.md).

Every request goes the same way (`ManagementApi.respond`): read the target once
(`paths.parse_target`); authenticate unless it is `GET|HEAD /healthz` or `/metrics`
(docs/decisions.md); then read the body (the handler bounds it); then route. Commands run
on the event loop through a `Bridge`; nothing here touches core state on its own thread.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol, TypeVar

from amqpbroker.amqp import sections
from amqpbroker.core import BrokerError, ClientError, NotFound, dispatch_options
from amqpbroker.core import operations as ops
from amqpbroker.core.queue import Queue
from amqpbroker.core.refs import Ref
from amqpbroker.management.auth import BasicAuth, Refusal, basic_credentials
from amqpbroker.management.console import console_file, report_file
from amqpbroker.management.paths import BadTarget, Target, parse_target
from amqpbroker.management.replies import HttpError as HttpError
from amqpbroker.management.replies import Reply as Reply
from amqpbroker.management.replies import json_reply as json_reply
from amqpbroker.management.samples import Sampler
from amqpbroker.management.tasks import TaskRunner

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")

COMMAND_TIMEOUT_S = 30.0
# A walk over millions of paged messages takes tens of seconds, a slice at a time: the
# HTTP request waits for it (the walk goes on even if the client gives up).
WALK_TIMEOUT_S = 600.0
WALK_WAIT_S = 0.005  # between tries while another walk holds the queue
MAX_JSON_DEPTH = 16  # deeper values of a browsed message are shown as "…"


class Bridge(Protocol):
    """Runs a callable on the event loop and returns its result (`LoopBridge`)."""

    def call(self, fn: Callable[[], T]) -> T: ...

    def walk(self, start: Callable[[], ops.Walk[T]], finish: Callable[[T], U]) -> U:
        """Run a management walk a slice at a time, then `finish` its result (all on the
        loop); the loop serves everything else between slices (issue 23)."""


class LoopBridge:
    """Runs callables on the event loop from other threads and waits for the result."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        after: Callable[[], None],
        *,
        after_slice: Callable[[], None] | None = None,
        walked: Callable[[], None] = lambda: None,
    ) -> None:
        self.loop = loop
        self._after = after  # apply effects and flush sockets after a command
        self._after_slice = after_slice or after  # the same after each slice of a walk
        self._walked = walked  # after a walk's last slice (the memory it freed)

    def call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            try:
                return fn()
            finally:
                self._after()

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout=COMMAND_TIMEOUT_S)

    def walk(self, start: Callable[[], ops.Walk[T]], finish: Callable[[T], U]) -> U:
        async def run() -> U:
            walk = start()
            walk.timer = time.monotonic  # a slice also ends after ops.SLICE_S
            try:
                while True:
                    blocked = walk.blocked
                    done = False
                    try:
                        done = walk.step()
                        if done:
                            return finish(walk.result)  # type: ignore[arg-type]
                    finally:
                        self._after_slice()
                        if done:  # after the effects went out: what they held is freed too
                            self._walked()
                    # the next slice after what the loop has ready (another walk of the
                    # queue: a little later, rather than spinning)
                    await asyncio.sleep(WALK_WAIT_S if blocked else 0)
            finally:
                walk.close()  # the loop stopped, or the walk raised: the queue is let go

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout=WALK_TIMEOUT_S)


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` as JSON types; nesting deeper than MAX_JSON_DEPTH becomes "…"; a float
    that is not finite becomes its JavaScript spelling as a string ("NaN", "Infinity",
    "-Infinity"): JSON has no such numbers, and Python wrote them bare, so one producer's
    NaN property made a queue's browse a reply no browser could parse (issue 15 attack)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"binary": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict | list | tuple) and depth >= MAX_JSON_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, depth + 1) for v in value]
    return str(value)


# What decoding one stored message may raise: the decoder maps malformed input to
# SectionError; RecursionError is caught too in case a decoder path does not.
_UNDECODABLE = (sections.SectionError, ValueError, RecursionError)


def _body_preview(data: bytes, limit: int = 200) -> tuple[str, str | None]:
    """A short, printable view of the body (never the whole body), and a decode error."""
    try:
        start = sections.scan(data).body_start
        if start >= len(data):
            return "", None
        if data[start] != 0:
            raise sections.SectionError(f"no described section at offset {start}")
        # The section's value counts its nesting from 0, as the door's check does
        # (issue 15): a body the broker accepted is never shown as too deep.
        _, value_start = sections.decode_first(data, start + 1)  # the descriptor
        body, _ = sections.decode_first(data, value_start)
    except _UNDECODABLE as e:
        return "<unreadable body>", f"body: {e}"
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.hex()
    else:
        text = json.dumps(json_safe(body)) if not isinstance(body, str) else body
    return (text if len(text) <= limit else text[:limit] + "…"), None


def message_view(ref: Ref) -> dict[str, Any]:
    """One entry of GET /api/v1/queues/{name}/messages (CONTRACT keys).

    A section that does not decode (issue 15: lists nested 10,000 deep) is shown empty,
    with `decode_error` saying why: one message never makes its queue unbrowsable.
    """
    m = ref.message
    view: dict[str, Any] = {
        "msg_id": m.msg_id,
        "delivery_count": ref.delivery_count,
        "durable": m.durable,
        "priority": m.priority,
        "size": m.size,
        "expiration": m.expiration_ms,
        "first_ts": m.first_ts,  # epoch ms the broker first accepted it (its age)
    }
    errors = []
    readers = (
        ("message_annotations", m.get_annotations),
        ("properties", m.get_properties),
        ("application_properties", m.get_application_properties),
    )
    for key, read in readers:
        try:
            view[key] = json_safe(read())
        except _UNDECODABLE as e:
            view[key] = {}
            errors.append(f"{key}: {e}")
    view["body_preview"], body_error = _body_preview(m.data)
    if body_error is not None:
        errors.append(body_error)
    if errors:
        view["decode_error"] = "; ".join(errors)
    return view


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
        "exclusive": stats.exclusive,
        "max_consumers": stats.max_consumers,
        "purge_on_no_consumers": stats.purge_on_no_consumers,
        "groups": stats.groups,
        "dispatching": stats.dispatching,
        # B-151 PAGE (issue 23): whether it has messages in page files, and how many.
        "paging": stats.paged_messages > 0,
        "paged_messages": stats.paged_messages,
        "paged_bytes": stats.paged_bytes,
        "paged_lost": stats.paged_lost,  # lost to damaged page files (a counter)
    }


def _refused(refusal: Refusal) -> Reply:
    headers = {}
    if refusal.status == HTTPStatus.UNAUTHORIZED:
        headers["WWW-Authenticate"] = 'Basic realm="amqpbroker", charset="UTF-8"'
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(refusal.retry_after_s)
    return json_reply(refusal.status, {"error": refusal.message}, headers)


# Endpoints by name: the methods each takes. GET endpoints answer HEAD too.
_METHODS: dict[str, tuple[str, ...]] = {
    "healthz": ("GET",),
    "metrics": ("GET",),
    "console": ("GET",),
    "report": ("GET",),
    "broker": ("GET",),
    "addresses": ("GET",),
    "queues": ("GET",),
    "overview": ("GET",),
    "queue": ("GET",),
    "messages": ("GET",),
    "samples": ("GET",),
    "purge": ("POST",),
    "move": ("POST",),
    "retry": ("POST",),
    "tasks": ("GET", "POST"),
    "task": ("GET",),
    "cancel": ("POST",),
}
PUBLIC = frozenset({"healthz", "metrics"})  # unauthenticated GET/HEAD (docs/decisions.md)
READ_METHODS = frozenset({"GET", "HEAD"})  # need `browse`; every other method `manage`
# Issue 24 (CSRF): every other method must carry this header, which a cross-site form
# cannot send and a cross-site script cannot send without a CORS preflight we never allow.
CSRF_HEADER = "X-Requested-By"


def endpoint_of(segments: tuple[str, ...]) -> tuple[str, str | None] | None:
    """(endpoint, queue, task or console file name) for a normalised path, or None."""
    match segments:
        case ("healthz" | "metrics" as name,):
            return name, None
        case ("console",):
            return "console", "index.html"
        case ("console", "report"):
            return "report", None
        case ("console", file):
            return "console", file
        case ("api", "v1", "broker" | "addresses" | "queues" | "overview" | "tasks" as name):
            return name, None
        case ("api", "v1", "queues", queue):
            return "queue", queue
        case (
            "api",
            "v1",
            "queues",
            queue,
            "messages" | "purge" | "move" | "retry" | "samples" as name,
        ):
            return name, queue
        case ("api", "v1", "tasks", task):
            return "task", task
        case ("api", "v1", "tasks", task, "cancel"):
            return "cancel", task
    return None


def csrf_refusal(
    method: str, token: str | None, origin: str | None, host: str | None
) -> str | None:
    """Why a state-changing request may be a cross-site forgery (None: it is not).

    Basic auth credentials are sent by the browser on any request to the broker, from
    any page: a POST must prove it comes from a script of the same origin (the console,
    or a non-browser client such as the CLI) by carrying `CSRF_HEADER`, and a browser's
    `Origin`, when sent, must be this server's."""
    if method in READ_METHODS:
        return None
    if not token:
        return f"the {CSRF_HEADER} header is required on {method} (CSRF defence)"
    if origin is not None:
        origin_host = origin.partition("://")[2]
        if origin == "null" or not host or origin_host.lower() != host.strip().lower():
            return f"cross-origin {method} refused (Origin {origin[:100]!r})"
    return None


def is_loopback_name(host: str) -> bool:
    """Whether `host` (a name or an address, no port) can only mean this machine."""
    name = host.strip().rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761 section 6.3
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def host_refusal(host: str | None, loopback_only: bool) -> str | None:
    """Why a request may come through DNS rebinding (None: it does not).

    A page on `evil.example` whose name is made to resolve to 127.0.0.1 talks to a broker
    bound to loopback as its own origin: the browser sends `Host: evil.example:8161`, the
    CSRF check sees a matching Origin, and with security off nothing else stands in the
    way. A server bound to loopback can only be meant by a loopback name, so any other
    Host is refused; one bound elsewhere is reached by names we cannot know. A request
    without Host (HTTP/1.0, not a browser) passes."""
    if not loopback_only or host is None:
        return None
    text = host.strip()
    if text.startswith("["):  # [::1]:8161
        name, _, rest = text[1:].partition("]")
        ok = rest == "" or (rest.startswith(":") and rest[1:].isdigit())
    else:
        name, colon, port = text.rpartition(":")
        if not colon or not port.isdigit():
            name = text
        ok = True
    if ok and is_loopback_name(name):
        return None
    return f"Host {text[:100]!r} does not name this loopback-only server (DNS rebinding defence)"


class ManagementApi:
    """Authenticates and routes requests to broker operations on the loop (HTTP threads)."""

    def __init__(
        self,
        bridge: Bridge,
        *,
        metrics: Callable[[], bytes],
        healthy: Callable[[], bool],
        auth: BasicAuth | None = None,
        console: ConsoleContext | None = None,
    ) -> None:
        self.bridge = bridge
        self.metrics = metrics
        self.healthy = healthy
        self.auth = auth  # None: security disabled
        self.console = console or ConsoleContext()

    # Set by the server: the Broker, read only on the loop through the bridge.
    bridge_broker: Any = None

    def respond(
        self,
        method: str,
        raw_target: str,
        *,
        authorization: str | None,
        client: str,
        read_body: Callable[[], bytes],
        csrf_token: str | None = None,
        origin: str | None = None,
        host: str | None = None,
        loopback_only: bool = False,
    ) -> Reply:
        """The whole of one request: Host check, target, authentication (`browse` to
        read, `manage` for anything else), CSRF check, body, route; never raises."""
        try:
            rebound = host_refusal(host, loopback_only)
            if rebound is not None:
                raise HttpError(HTTPStatus.FORBIDDEN, rebound)
            target = parse_target(raw_target)
            found = endpoint_of(target.segments)
            public = found is not None and found[0] in PUBLIC and method in READ_METHODS
            permission = "browse" if method in READ_METHODS else "manage"
            if not public and self.auth is not None:
                refusal = self.auth.check(authorization, client, permission)
                if refusal is not None:
                    return _refused(refusal)
            forged = csrf_refusal(method, csrf_token, origin, host)
            if forged is not None and not public:
                raise HttpError(HTTPStatus.FORBIDDEN, forged)
            body = read_body()
            if found is None:
                raise HttpError(HTTPStatus.NOT_FOUND, f"no such endpoint: {target.path}")
            return self._route(method, target, *found, body, authorization)
        except BadTarget as e:
            return json_reply(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except HttpError as e:
            return json_reply(e.status, {"error": str(e)}, e.headers)
        except NotFound as e:
            return json_reply(HTTPStatus.NOT_FOUND, {"error": str(e)})
        except ClientError as e:
            return json_reply(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except BrokerError as e:
            return json_reply(HTTPStatus.CONFLICT, {"error": str(e)})
        except Exception:
            log.exception("HTTP %s %r from %s failed", method, raw_target[:200], client)
            return json_reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})

    def _route(
        self,
        method: str,
        target: Target,
        endpoint: str,
        name: str | None,
        raw_body: bytes,
        authorization: str | None,
    ) -> Reply:
        allowed = _METHODS[endpoint]
        if method not in allowed and not ("GET" in allowed and method == "HEAD"):
            allow = ", ".join(m for a in allowed for m in ((a, "HEAD") if a == "GET" else (a,)))
            raise HttpError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{target.path} takes {allow}",
                headers={"Allow": allow},
            )
        query = target.query
        if endpoint == "healthz":
            if self.healthy():
                return json_reply(HTTPStatus.OK, {"status": "ok"})
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "not accepting connections")
        if endpoint == "metrics":
            return Reply(HTTPStatus.OK, self.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        if endpoint == "broker":
            return json_reply(HTTPStatus.OK, self._broker_info(authorization))
        if endpoint == "console":
            assert name is not None
            return console_file(name)
        if endpoint == "report":
            return report_file(self.console.analyze_report)
        if endpoint == "addresses":
            return json_reply(HTTPStatus.OK, self.bridge.call(self._addresses))
        if endpoint == "queues":
            return json_reply(HTTPStatus.OK, [queue_view(q) for q in self._stats()])
        if endpoint == "overview":
            return json_reply(HTTPStatus.OK, self.bridge.call(self._queue_rows))
        if endpoint == "tasks" and method != "POST":
            return json_reply(HTTPStatus.OK, self.bridge.call(lambda: self._tasks().views()))
        if endpoint == "tasks":
            return self._create_task(_json_body(raw_body))
        assert name is not None
        if endpoint == "task":
            return json_reply(
                HTTPStatus.OK, self.bridge.call(lambda: self._tasks().get(name).view())
            )
        if endpoint == "cancel":
            return json_reply(
                HTTPStatus.OK, self.bridge.call(lambda: self._tasks().cancel(name).view())
            )
        if endpoint == "queue":
            return json_reply(HTTPStatus.OK, self.bridge.call(lambda: self._queue(name)))
        if endpoint == "samples":
            return json_reply(HTTPStatus.OK, self.bridge.call(lambda: self._samples(name)))
        if endpoint == "messages":
            limit = _int_param(query, "limit", 100)
            offset = _int_param(query, "offset", 0)
            selector = query.get("filter", [None])[0] or None
            total, views = self._browse(name, selector, limit, offset)
            return json_reply(HTTPStatus.OK, views, {"X-Total-Count": str(total)})
        body = _json_body(raw_body)
        selector = _opt_str(body, "filter")
        ids = _ids(body)
        if endpoint == "purge":
            removed = self.bridge.walk(
                lambda: ops.purge_walk(self.bridge_broker, name, selector=selector, ids=ids),
                _same,
            )
            return json_reply(HTTPStatus.OK, {"removed": removed})
        if endpoint == "move":
            to_queue = _opt_str(body, "to-queue")
            if not to_queue:
                raise HttpError(HTTPStatus.BAD_REQUEST, "'to-queue' is required")
            if body.get("rate") is not None:
                return self._create_task({**body, "kind": "move", "queue": name})
            moved = self.bridge.walk(
                lambda: ops.move_walk(
                    self.bridge_broker, name, to_queue=to_queue, selector=selector, ids=ids
                ),
                _same,
            )
            return json_reply(HTTPStatus.OK, {"moved": moved})
        if body.get("rate") is not None:
            return self._create_task({**body, "kind": "retry", "queue": name})
        return json_reply(HTTPStatus.OK, self._retry(name, selector, body))

    # -- console and tasks (issue 24) ---------------------------------------------------
    def _tasks(self) -> TaskRunner:
        if self.console.tasks is None:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "replay tasks are not running")
        return self.console.tasks

    def _create_task(self, body: dict[str, Any]) -> Reply:
        """POST /api/v1/tasks (and retry or move with `rate`): 202 and the task."""
        kind = _opt_str(body, "kind")
        queue = _opt_str(body, "queue")
        if kind not in ("retry", "move") or not queue:
            raise HttpError(
                HTTPStatus.BAD_REQUEST, "'kind' (retry or move) and 'queue' are required"
            )
        rate = body.get("rate")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'rate' must be a positive number")
        ids = _ids(body)
        expect = _expectations(body.get("expect"))
        if expect is not None and ids is None:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'expect' needs 'ids'")
        selector = _opt_str(body, "filter")
        to_queue = _opt_str(body, "to-queue")
        if kind == "move" and not to_queue:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'to-queue' is required")
        runner = self._tasks()

        def create(found: list[int] | None) -> dict[str, Any]:
            return runner.create(
                kind,
                queue,
                # As sent: `create` bounds it before converting (an integer of 400 digits
                # has no float, and float() here raised OverflowError: a 500).
                rate=rate,
                filter=selector,
                ids=ids,
                expect=expect,
                to_queue=to_queue,
                found=found,
            ).view()

        if ids is not None:
            task = self.bridge.call(lambda: create(None))
        else:  # the matching ones, found a slice at a time (a paged queue: issue 23)
            self.bridge.call(lambda: runner.check(kind, queue, rate=rate, to_queue=to_queue))
            task = self.bridge.walk(
                lambda: ops.waiting_ids_walk(runner.broker, queue, selector=selector),
                create,
            )
        return json_reply(HTTPStatus.ACCEPTED, {"task": task})

    def _broker_info(self, authorization: str | None) -> dict[str, Any]:
        """GET /api/v1/broker: what the console's header shows, and what the user may do."""
        info = self.bridge.call(self.console.info)
        credentials = basic_credentials(authorization)
        user = credentials[0] if credentials else None
        if self.auth is None:
            may_manage = True
        else:
            may_manage = user is not None and self.auth.permitted(user, "manage")
        return {
            **info,
            "user": user,
            "may_manage": may_manage,
            "analyze_report": self.console.analyze_report is not None,
            "sample_interval_s": self.console.sample_interval_s,
            "tasks": self.console.tasks is not None,
        }

    def _queue_rows(self) -> list[dict[str, Any]]:
        """GET /api/v1/overview: every queue as in /api/v1/queues, plus what the console
        shows: `kind`, `role` (dlq, expiry or null), `oldest_age_s`, `rates`, `growing`."""
        broker = self.bridge_broker
        roles = _special_addresses(broker)
        now_ms = broker.clock.now_ms()
        return [self._row(s, roles, now_ms) for s in ops.queue_stats(broker)]

    def _row(self, stats: ops.QueueStats, roles: dict[str, str], now_ms: int) -> dict[str, Any]:
        queue = self.bridge_broker.queues[stats.name]
        view = queue_view(stats)
        view["kind"] = queue_kinds(queue)
        view["role"] = roles.get(stats.address)
        view["replaced"] = stats.replaced  # ring and last-value removals (B-120, B-121)
        view["oldest_age_s"] = (
            None if stats.oldest_ts is None else max(0, now_ms - stats.oldest_ts) / 1000
        )
        view.update(self.console.sampler.rates(stats.name))
        return view

    def _samples(self, name: str) -> list[dict[str, Any]]:
        if name not in self.bridge_broker.queues:
            raise NotFound(f"queue {name} does not exist")
        return self.console.sampler.series(name)

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
        view = self._row(stats, _special_addresses(broker), broker.clock.now_ms())
        view["filter"] = queue.config.filter
        view.update(dispatch_options(queue.config))
        view["last_value_key"] = queue.config.last_value_key  # B-120
        view["ring_size"] = queue.config.ring_size  # B-121
        view["non_destructive"] = queue.config.non_destructive  # B-123
        view["settings"] = broker.settings_for(queue.address).to_config()
        return view

    def _browse(
        self, name: str, selector: str | None, limit: int, offset: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """GET .../messages: the count, and at most `management-browse-page-size` views
        (B-160, as `listMessages`): `?limit=` of any size listed the whole queue, its
        paged messages read into memory at once (issue 15 attack)."""
        broker = self.bridge_broker

        def start() -> ops.Walk[tuple[int, list[Ref]]]:
            address = ops.queue_of(broker, name).address
            page = broker.settings.resolve(address).management_browse_page_size
            return ops.listing_walk(
                broker, name, selector=selector, limit=min(limit, page), offset=offset
            )

        def finish(listing: tuple[int, list[Ref]]) -> tuple[int, list[dict[str, Any]]]:
            return listing[0], [message_view(r) for r in listing[1]]

        return self.bridge.walk(start, finish)

    def _retry(self, name: str, selector: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """`{"retried": N}`; with `ids` also `skipped` ([{msg_id, reason}]) and `not_found`
        (ids not waiting in the queue). `expect` checks each id against its redrive line.
        With `rate` the retry is a task instead (`_create_task`)."""
        ids = _ids(body)
        expect = _expectations(body.get("expect"))
        if expect is not None and ids is None:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'expect' needs 'ids'")
        result = self.bridge.walk(
            lambda: ops.retry_walk(
                self.bridge_broker, name, selector=selector, ids=ids, expect=expect
            ),
            _same,
        )
        return _retry_answer([result], ids is not None)


@dataclass
class ConsoleContext:
    """What the console's endpoints need besides the broker (issue 24); the defaults
    serve a broker without tasks or samples (unit tests)."""

    info: Callable[[], dict[str, Any]] = lambda: {}
    sampler: Sampler = field(default_factory=Sampler)
    tasks: TaskRunner | None = None
    analyze_report: str | None = None
    sample_interval_s: float = 5.0


def queue_kinds(queue: Queue) -> list[str]:
    """What the queue's configuration makes it (issue 24: the console's kind column)."""
    c = queue.config
    kinds = []
    if c.last_value_key:
        kinds.append("LVQ")
    if c.ring_size is not None and c.ring_size >= 0:  # B-121: 0 is a ring too
        kinds.append("ring")
    if c.exclusive:
        kinds.append("exclusive")
    if c.non_destructive:
        kinds.append("non-destructive")
    if c.purge_on_no_consumers:
        kinds.append("purge-on-no-consumers")
    if c.filter:
        kinds.append("filtered")
    if queue.owner is not None:
        kinds.append("temporary")
    return kinds


def _special_addresses(broker: Any) -> dict[str, str]:
    """Address -> "dlq" or "expiry": the dead-letter and expiry addresses that the
    effective settings of the existing addresses name."""
    roles: dict[str, str] = {}
    for address in broker.post_office.addresses:
        settings = broker.settings_for(address)
        if settings.expiry_address:
            roles.setdefault(settings.expiry_address, "expiry")
        if settings.dead_letter_address:
            roles[settings.dead_letter_address] = "dlq"
    return roles


def _same(result: T) -> T:
    return result


def _ids(body: dict[str, Any]) -> list[int] | None:
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(type(i) is int for i in ids)):
        raise HttpError(HTTPStatus.BAD_REQUEST, "'ids' must be a list of msg_id integers")
    return ids


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


def _json_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nested deep
        raise HttpError(HTTPStatus.BAD_REQUEST, f"invalid JSON: {e}") from e
    if not isinstance(body, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "expected a JSON object")
    return body


def _int_param(query: dict[str, list[str]], key: str, default: int) -> int:
    raw = query.get(key, [None])[0]
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"'{key}' must be a non-negative integer")
    return int(raw)


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"'{key}' must be a string")
    return value or None
