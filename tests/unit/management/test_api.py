"""The management API's request pipeline without sockets (issue 15, CONTRACT "HTTP API").

Every route in every spelling and with every method is authenticated before it is
routed: no credentials or wrong ones answer 401, a user without `manage` 403, and with
`manage` every spelling answers what the plain spelling answers.
"""

from __future__ import annotations

import base64
import json
from http import HTTPStatus
from typing import Any

import pytest
from support.core_harness import Harness
from support.hostile import SPELLINGS
from support.http import InlineBridge, api_request
from support.http import basic_auth as basic

from amqpbroker.management import BasicAuth, ManagementApi

USERS = {"admin": "admin-pw", "app": "app-pw", "viewer": "viewer-pw"}
# What each user is granted on activemq.management (issue 24: browse reads, manage acts).
GRANTS = {"admin": {"browse", "manage"}, "viewer": {"browse"}, "app": set()}


CREDENTIALS = {
    "none": None,
    "wrong-password": basic("admin", "nope"),
    "unknown-user": basic("mallory", "admin-pw"),
    "not-basic": "Bearer abc",
    "no-colon": "Basic " + base64.b64encode(b"admin").decode(),
    "no-manage": basic("app", "app-pw"),
    "browse-only": basic("viewer", "viewer-pw"),
    "manage": basic("admin", "admin-pw"),
}


def make_api(*, secured: bool = True) -> tuple[ManagementApi, Harness]:
    h = Harness()
    target = h.producer("Q", "queue")
    for body in (b"a", b"b", b"c"):
        h.send(target, body)
    h.producer("Q2", "queue")
    auth = BasicAuth(
        verify=lambda user, password: USERS.get(user) == password,
        permitted=lambda user, permission: permission in GRANTS.get(user, set()),
    )
    api = ManagementApi(
        InlineBridge(),
        metrics=lambda: b"amqpbroker_connections 0.0\n",
        healthy=lambda: True,
        auth=auth if secured else None,
    )
    api.bridge_broker = h.broker
    return api, h


request = api_request


# (method, path, body) of every endpoint, plus paths that are no endpoint.
ROUTES = [
    ("GET", "/api/v1/addresses", None),
    ("GET", "/api/v1/queues", None),
    ("GET", "/api/v1/queues/Q", None),
    ("GET", "/api/v1/queues/Q/messages", None),
    ("POST", "/api/v1/queues/Q/purge", {}),
    ("POST", "/api/v1/queues/Q/move", {"to-queue": "Q2"}),
    ("POST", "/api/v1/queues/Q/retry", {}),
    ("GET", "/api/v1/nothing-here", None),
    ("GET", "/nothing-here", None),
]
PUBLIC_ROUTES = [("GET", "/metrics", None), ("GET", "/healthz", None)]


METHODS = ["canonical", "HEAD", "PUT", "DELETE"]


def _method(canonical: str, which: str) -> str:
    return canonical if which == "canonical" else which


@pytest.mark.parametrize("which", METHODS)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(("canonical", "path", "body"), ROUTES)
def test_every_spelling_without_valid_credentials_is_401(
    canonical: str,
    path: str,
    body: dict[str, Any] | None,
    spelling: str,
    which: str,
) -> None:
    """Issue 15: authentication precedes routing for every path, known or not."""
    api, h = make_api()
    for credentials in ("none", "wrong-password", "unknown-user", "not-basic", "no-colon"):
        reply = request(
            api,
            _method(canonical, which),
            SPELLINGS[spelling](path),
            authorization=CREDENTIALS[credentials],
            body=body,
        )
        assert reply.status == HTTPStatus.UNAUTHORIZED, credentials
        assert reply.headers is not None
        assert reply.headers["WWW-Authenticate"].startswith("Basic ")
    assert len(h.broker.queues["Q"].refs()) == 3  # nothing purged or moved


@pytest.mark.parametrize("which", METHODS)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(("canonical", "path", "body"), ROUTES)
def test_every_spelling_without_manage_is_403(
    canonical: str, path: str, body: dict[str, Any] | None, spelling: str, which: str
) -> None:
    """CONTRACT: the API requires a user with the `manage` role (B-154)."""
    api, h = make_api()
    target = SPELLINGS[spelling](path)
    method = _method(canonical, which)
    reply = request(api, method, target, authorization=CREDENTIALS["no-manage"], body=body)
    assert reply.status == HTTPStatus.FORBIDDEN
    assert len(h.broker.queues["Q"].refs()) == 3


@pytest.mark.parametrize("which", METHODS)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(("canonical", "path", "body"), ROUTES + PUBLIC_ROUTES)
def test_every_spelling_with_manage_answers_as_the_plain_one(
    canonical: str, path: str, body: dict[str, Any] | None, spelling: str, which: str
) -> None:
    """Issue 15: one reading of the path, so one answer for all its spellings."""
    method = _method(canonical, which)
    plain = request(make_api()[0], method, path, authorization=CREDENTIALS["manage"], body=body)
    spelled = SPELLINGS[spelling](path)
    reply = request(make_api()[0], method, spelled, authorization=CREDENTIALS["manage"], body=body)
    if spelling == "upper-case":
        assert reply.status == HTTPStatus.NOT_FOUND
    else:
        assert (reply.status, reply.body) == (plain.status, plain.body)


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(("canonical", "path", "body"), PUBLIC_ROUTES)
def test_metrics_and_healthz_are_open_to_get_and_head(
    canonical: str, path: str, body: None, spelling: str
) -> None:
    """docs/decisions.md: scrapes and probes need no credentials; other methods do."""
    target = SPELLINGS[spelling](path)
    for method in ("GET", "HEAD"):
        reply = request(make_api()[0], method, target)
        # "/METRICS" is no public path: it is authenticated like any other.
        expected = HTTPStatus.UNAUTHORIZED if spelling == "upper-case" else HTTPStatus.OK
        assert reply.status == expected
    for method in ("POST", "PUT"):
        assert request(make_api()[0], method, target).status == HTTPStatus.UNAUTHORIZED


def test_plain_routes_answer_their_contract_status() -> None:
    """CONTRACT "HTTP API": 200 for the endpoints, 405 + Allow for another method."""
    api, h = make_api()
    admin = CREDENTIALS["manage"]
    assert request(api, "GET", "/api/v1/queues/Q", authorization=admin).status == HTTPStatus.OK
    wrong = request(api, "POST", "/api/v1/queues/Q/messages", authorization=admin, body={})
    assert wrong.status == HTTPStatus.METHOD_NOT_ALLOWED
    assert wrong.headers == {"Allow": "GET, HEAD"}
    head = request(api, "HEAD", "/api/v1/queues/Q/purge", authorization=admin)
    assert head.status == HTTPStatus.METHOD_NOT_ALLOWED
    assert (head.headers or {})["Allow"] == "POST"
    purged = request(api, "POST", "/api/v1/queues/Q/purge", authorization=admin, body={})
    assert json.loads(purged.body) == {"removed": 3}
    assert h.broker.queues["Q"].refs() == []


@pytest.mark.parametrize(
    "target",
    ["/api/v1/queues/%00", "/api\\v1\\queues", "/api/v1/queues#x", "/api/v1/queues/%C0%AF"],
)
def test_ambiguous_targets_are_400_with_or_without_credentials(target: str) -> None:
    """Issue 15: refused before anything else, and never served."""
    for authorization in (None, CREDENTIALS["manage"]):
        reply = request(make_api()[0], "GET", target, authorization=authorization)
        assert reply.status == HTTPStatus.BAD_REQUEST
        assert "error" in json.loads(reply.body)


def test_security_disabled_serves_without_credentials() -> None:
    api, _ = make_api(secured=False)
    assert request(api, "GET", "/%61pi/v1/queues").status == HTTPStatus.OK


def test_the_body_is_not_read_before_authentication() -> None:
    """Issue 15: an unauthenticated client never makes the broker read its body."""
    api, _ = make_api()
    read: list[bool] = []

    def read_body() -> bytes:
        read.append(True)
        return b"{}"

    reply = api.respond(
        "POST", "/api/v1/queues/Q/purge", authorization=None, client="c", read_body=read_body
    )
    assert reply.status == HTTPStatus.UNAUTHORIZED
    assert read == []


def test_an_unexpected_failure_is_a_json_500(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 15: a handler bug answers 500 with a JSON error and a log line."""

    def broken() -> bytes:
        raise RuntimeError("boom")

    api = ManagementApi(InlineBridge(), metrics=broken, healthy=lambda: True)
    reply = request(api, "GET", "/metrics")
    assert reply.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert json.loads(reply.body) == {"error": "internal error"}
    assert "RuntimeError: boom" in caplog.text


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"[" * 100_000, HTTPStatus.BAD_REQUEST), (b"[1]", HTTPStatus.BAD_REQUEST)],
)
def test_bodies_that_are_not_a_json_object_are_400(body: bytes, status: HTTPStatus) -> None:
    """Issue 15: JSON nested 100,000 deep is a 400, not a RecursionError 500."""
    api, _ = make_api(secured=False)
    reply = api.respond(
        "POST",
        "/api/v1/queues/Q/purge",
        authorization=None,
        client="c",
        read_body=lambda: body,
        csrf_token="test",
    )
    assert reply.status == status


def test_queue_settings_never_show_an_unimplemented_key() -> None:
    """Issue 19 (no silent keys): GET /api/v1/queues/{name} `settings` has the effective
    address-settings amqpbroker implements and none of core/unsupported.py's."""
    from amqpbroker.core.unsupported import UNSUPPORTED_SETTINGS

    api, _ = make_api(secured=False)
    settings = json.loads(request(api, "GET", "/api/v1/queues/Q").body)["settings"]
    assert settings["max-delivery-attempts"] == 10
    assert not {name.replace("_", "-") for name in UNSUPPORTED_SETTINGS} & settings.keys()


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        (None, False),  # HTTP/1.0, no browser
        ("127.0.0.1:8161", False),
        ("127.8.9.10", False),
        ("localhost:8161", False),
        ("LOCALHOST.:8161", False),
        ("app.localhost", False),
        ("[::1]:8161", False),
        ("[::1]", False),
        ("evil.example:8161", True),
        ("evil.example", True),
        ("127.0.0.1.evil.example", True),
        ("localhost.evil.example", True),
        ("[::1]x", True),
        ("127.0.0.1:8161, evil.example", True),  # several Host headers
        ("10.0.0.1:8161", True),
        ("", True),
    ],
)
def test_a_loopback_server_answers_only_loopback_host_names(
    host: str | None, refused: bool
) -> None:
    """DNS rebinding (issue 15 attack): see `host_refusal`."""
    from amqpbroker.management.api import host_refusal

    assert (host_refusal(host, loopback_only=True) is not None) is refused
    assert host_refusal(host, loopback_only=False) is None  # bound elsewhere: no check
