"""The API behind the console (issue 24): `browse` reads and `manage` acts, the CSRF
header and Origin check on every POST, the console's files with their CSP, the
overview rows, tasks over HTTP, and the analyze report link."""

from __future__ import annotations

import json
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from support.core_harness import Harness
from support.http import InlineBridge, api_request
from support.http import basic_auth as basic

from amqpbroker.core import AddressSettings, Rejected
from amqpbroker.management import BasicAuth, ManagementApi
from amqpbroker.management.api import ConsoleContext, Reply
from amqpbroker.management.console import FILES
from amqpbroker.management.samples import Sampler
from amqpbroker.management.tasks import TaskRunner

USERS = {"admin": "a", "viewer": "v", "app": "p"}
GRANTS = {"admin": {"browse", "manage"}, "viewer": {"browse"}, "app": set()}
ADMIN, VIEWER, APP = basic("admin", "a"), basic("viewer", "v"), basic("app", "p")
HOST = "127.0.0.1:8161"
DLA = {"#": AddressSettings.of(dead_letter_address="DLA", auto_create_dead_letter_resources=True)}


def make_api(report: str | None = None) -> tuple[ManagementApi, Harness, list[Any]]:
    h = Harness(DLA)
    target = h.producer("orders", "queue")
    for i in range(4):
        h.send(target, b"m%d" % i, props={"n": i})
    c = h.consumer("orders", "queue")
    for d in h.take(c)[:3]:
        h.settle(c, d, Rejected())
    h.broker.detach_consumer(c, closed=True)
    timers: list[Any] = []
    runner = TaskRunner(
        h.broker,
        now=lambda: 0.0,
        call_later=lambda delay, fn: timers.append(fn) or _NoHandle(),
        save=lambda text: None,
    )
    sampler = Sampler()
    auth = BasicAuth(
        verify=lambda user, password: USERS.get(user) == password,
        permitted=lambda user, permission: permission in GRANTS.get(user, set()),
    )
    api = ManagementApi(
        InlineBridge(),
        metrics=bytes,
        healthy=lambda: True,
        auth=auth,
        console=ConsoleContext(
            info=lambda: {"name": "b"}, sampler=sampler, tasks=runner, analyze_report=report
        ),
    )
    api.bridge_broker = h.broker
    return api, h, timers


class _NoHandle:
    def cancel(self) -> None:
        pass


def call(
    api: ManagementApi,
    method: str,
    target: str,
    auth: str | None = ADMIN,
    body: dict[str, Any] | None = None,
    *,
    csrf: str | None = "console",
    origin: str | None = None,
) -> Reply:
    return api_request(
        api,
        method,
        target,
        authorization=auth,
        body=body,
        csrf_token=csrf,
        origin=origin,
        host=HOST,
    )


def test_browse_reads_and_only_manage_acts() -> None:
    """Issue 24: GET needs `browse` on activemq.management, POST needs `manage`."""
    api, h, _ = make_api()
    for path in ("/api/v1/overview", "/api/v1/queues/DLQ.orders/messages", "/console/"):
        assert call(api, "GET", path, VIEWER).status == HTTPStatus.OK, path
        assert call(api, "GET", path, APP).status == HTTPStatus.FORBIDDEN, path
    refused = call(api, "POST", "/api/v1/queues/DLQ.orders/purge", VIEWER, {})
    assert refused.status == HTTPStatus.FORBIDDEN
    assert b"'manage'" in refused.body
    assert h.queue("DLQ.orders").message_count == 3
    assert call(api, "GET", "/console/", None).status == HTTPStatus.UNAUTHORIZED


def test_the_broker_endpoint_says_what_the_user_may_do() -> None:
    api, _, _ = make_api()
    viewer = json.loads(call(api, "GET", "/api/v1/broker", VIEWER).body)
    assert (viewer["user"], viewer["may_manage"]) == ("viewer", False)
    admin = json.loads(call(api, "GET", "/api/v1/broker", ADMIN).body)
    assert (admin["name"], admin["may_manage"], admin["analyze_report"]) == ("b", True, False)


@pytest.mark.parametrize(
    ("csrf", "origin"),
    [
        (None, None),
        ("", None),
        ("x", "http://evil.example"),
        ("x", "null"),
        ("x", "http://127.0.0.1:9"),
    ],
)
def test_a_post_without_the_csrf_header_or_from_another_origin_is_refused(
    csrf: str | None, origin: str | None
) -> None:
    """Issue 24: a cross-site form cannot send the header; a cross-origin script is
    refused by Origin. Nothing is purged."""
    api, h, _ = make_api()
    reply = call(api, "POST", "/api/v1/queues/DLQ.orders/purge", body={}, csrf=csrf, origin=origin)
    assert reply.status == HTTPStatus.FORBIDDEN
    assert h.queue("DLQ.orders").message_count == 3
    same = call(api, "POST", "/api/v1/queues/DLQ.orders/purge", body={}, origin=f"http://{HOST}")
    assert json.loads(same.body) == {"removed": 3}


def test_no_action_by_get() -> None:
    api, h, _ = make_api()
    for path in ("purge", "retry", "move"):
        reply = call(api, "GET", f"/api/v1/queues/DLQ.orders/{path}")
        assert reply.status == HTTPStatus.METHOD_NOT_ALLOWED
    assert call(api, "GET", "/api/v1/tasks/x/cancel").status == HTTPStatus.METHOD_NOT_ALLOWED
    assert call(api, "POST", "/api/v1/broker", body={}).status == HTTPStatus.METHOD_NOT_ALLOWED
    assert h.queue("DLQ.orders").message_count == 3


def test_console_files_are_served_with_a_content_security_policy() -> None:
    api, _, _ = make_api()
    for name in FILES:
        reply = call(api, "GET", f"/console/{name}")
        assert reply.status == HTTPStatus.OK, name
        assert reply.content_type == FILES[name]
        headers = reply.headers or {}
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert "unsafe-inline" not in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
    index = call(api, "GET", "/console")
    assert b'<script type="module" src="/console/app.js">' in index.body
    for target in ("/console/../broker.yaml", "/console/nothing.js", "/console/%2e%2e%2fapi.py"):
        assert call(api, "GET", target).status == HTTPStatus.NOT_FOUND, target


def test_the_overview_marks_dead_letter_queues_and_ages() -> None:
    api, _, _ = make_api()
    rows = {r["name"]: r for r in json.loads(call(api, "GET", "/api/v1/overview").body)}
    assert rows["DLQ.orders"]["role"] == "dlq"
    assert rows["orders"]["role"] is None
    assert rows["DLQ.orders"]["messages"] == 3
    assert rows["DLQ.orders"]["oldest_age_s"] is not None
    assert rows["orders"]["rates"] is None  # no samples yet
    # /api/v1/queues keeps its CONTRACT keys
    plain = json.loads(call(api, "GET", "/api/v1/queues").body)
    assert "role" not in plain[0]


def test_messages_carry_the_total_that_matches() -> None:
    api, _, _ = make_api()
    reply = call(api, "GET", "/api/v1/queues/DLQ.orders/messages?limit=1&filter=n%20%3E%200")
    assert (reply.headers or {})["X-Total-Count"] == "2"
    assert len(json.loads(reply.body)) == 1


def test_retry_with_a_rate_is_a_task_listed_and_cancellable() -> None:
    """Issue 24: the HTTP thread never paces; a retry with `rate` answers 202 and a task."""
    api, h, timers = make_api()
    ids = [r.message.msg_id for r in h.queue("DLQ.orders").refs()]
    reply = call(api, "POST", "/api/v1/queues/DLQ.orders/retry", body={"ids": ids[:2], "rate": 1})
    assert reply.status == HTTPStatus.ACCEPTED
    task = json.loads(reply.body)["task"]
    assert (task["total"], task["done"], task["status"]) == (2, 0, "running")
    listed = json.loads(call(api, "GET", "/api/v1/tasks").body)
    assert [t["id"] for t in listed] == [task["id"]]
    timers.pop(0)()  # the first chunk: one message at 1 msg/s
    one = json.loads(call(api, "GET", f"/api/v1/tasks/{task['id']}").body)
    assert (one["done"], one["retried"]) == (1, 1)
    cancelled = call(api, "POST", f"/api/v1/tasks/{task['id']}/cancel", body={})
    assert json.loads(cancelled.body)["status"] == "cancelled"
    assert h.queue("DLQ.orders").message_count == 2
    created = call(
        api,
        "POST",
        "/api/v1/tasks",
        body={"kind": "move", "queue": "DLQ.orders", "to-queue": "orders", "rate": 5},
    )
    assert created.status == HTTPStatus.ACCEPTED
    for bad in (
        {"kind": "x", "queue": "DLQ.orders", "rate": 1},
        {"kind": "retry", "queue": "DLQ.orders", "rate": True},
        # An integer with no float (OverflowError in float()) was a 500 (issue 15 attack).
        {"kind": "retry", "queue": "DLQ.orders", "rate": 10**400},
        {"kind": "retry", "queue": "DLQ.orders", "rate": -(10**400)},
    ):
        assert call(api, "POST", "/api/v1/tasks", body=bad).status == HTTPStatus.BAD_REQUEST


def test_purge_and_move_take_ids() -> None:
    api, h, _ = make_api()
    ids = [r.message.msg_id for r in h.queue("DLQ.orders").refs()]
    moved = call(
        api, "POST", "/api/v1/queues/DLQ.orders/move", body={"ids": ids[:1], "to-queue": "orders"}
    )
    assert json.loads(moved.body) == {"moved": 1}
    purged = call(api, "POST", "/api/v1/queues/DLQ.orders/purge", body={"ids": ids[1:2]})
    assert json.loads(purged.body) == {"removed": 1}
    assert [r.message.msg_id for r in h.queue("DLQ.orders").refs()] == ids[2:]


def test_the_analyze_report_is_served_read_only_and_sandboxed(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text("<html><script>alert(1)</script>report</html>")
    api, _, _ = make_api(str(report))
    reply = call(api, "GET", "/console/report", VIEWER)
    assert reply.status == HTTPStatus.OK
    assert (reply.headers or {})["Content-Security-Policy"].startswith("sandbox")
    assert call(api, "POST", "/console/report", body={}).status == HTTPStatus.METHOD_NOT_ALLOWED
    assert call(make_api()[0], "GET", "/console/report").status == HTTPStatus.NOT_FOUND
    report.unlink()
    assert call(api, "GET", "/console/report").status == HTTPStatus.NOT_FOUND


def test_every_console_file_is_listed_and_shipped() -> None:
    """Only listed files are served, so a file added to the directory must be listed
    (and pyproject's package-data globs cover each kind)."""
    directory = Path(__file__).parents[3] / "amqpbroker" / "management" / "console"
    assert {p.name for p in directory.iterdir()} == set(FILES)
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    for suffix in {Path(name).suffix for name in FILES}:
        assert f'"management/console/*{suffix}"' in pyproject
