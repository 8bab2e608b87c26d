"""One reading of every request target (issue 15: `/%61pi/v1/queues` skipped auth)."""

from __future__ import annotations

import pytest

from amqpbroker.management.paths import BadTarget, parse_target

QUEUES = ("api", "v1", "queues")


@pytest.mark.parametrize(
    ("raw", "segments"),
    [
        ("/api/v1/queues", QUEUES),
        ("/%61pi/v1/queues", QUEUES),
        ("/%61%70%69/%76%31/%71%75%65%75%65%73", QUEUES),
        ("/%61%70%69/v1/queues/Q/messages", (*QUEUES, "Q", "messages")),
        ("//api//v1///queues", QUEUES),
        ("/api/v1/queues/", QUEUES),
        ("/api/./v1/queues/.", QUEUES),
        ("/api/v1/x/../queues", QUEUES),
        ("/api/%2e/v1/x/%2E%2E/queues", QUEUES),
        ("/metrics/../api/v1/queues", QUEUES),
        ("/api/v1/queues?limit=1", QUEUES),
        ("http://127.0.0.1:8161/api/v1/queues", QUEUES),
        ("HTTP://EXAMPLE/api/v1/queues?x=1", QUEUES),
        ("https://h/%61pi/v1/queues", QUEUES),
        ("http://h", ()),
        ("/API/v1/queues", ("API", "v1", "queues")),  # case-sensitive: another path
        ("/api/v1/queues/a%2Fb", (*QUEUES, "a/b")),  # %2F is a character of its segment
        ("/api/v1/queues/a%2F..%2Fb", (*QUEUES, "a/../b")),
        ("/api/v1/queues/%E2%82%AC", (*QUEUES, "€")),
        ("/api/v1/queues/a%5Cb", (*QUEUES, "a\\b")),
    ],
)
def test_spellings_read_as_one_path(raw: str, segments: tuple[str, ...]) -> None:
    """Issue 15: decoded once, dots and empty segments removed, %2F kept in its segment."""
    assert parse_target(raw).segments == segments


@pytest.mark.parametrize(
    "raw",
    [
        "/api/v1/que\x00ues",  # NUL
        "/api/v1/queues/%00",  # escaped NUL
        "/api/v1/queues/%0A",  # escaped newline
        "/api\\v1\\queues",  # backslash: some proxies read it as '/'
        "/api/v1/queues#frag",
        "/api/v1/queues/%C0%AF",  # overlong '/'
        "/api/v1/queues/%E0%80%AE",  # overlong '.'
        "/api/v1/queues/%FF",
        "/api/v1/queues/%zz",
        "/api/v1/queues/%4",
        "/api/v1/queues/\u00e9",  # a raw non-ASCII byte
        "/api/v1/ queues",
        "/../api/v1/queues",  # above the root
        "/%2e%2e/api/v1/queues",
        "*",
        "127.0.0.1:8161",  # authority-form
        "api/v1/queues",
        "ftp://h/api/v1/queues",
        "/api/v1/queues?filter=%FF",
        "/api/v1/queues?" + "&".join(f"k{i}=v" for i in range(100)),
    ],
)
def test_ambiguous_targets_are_refused(raw: str) -> None:
    """Issue 15: a target that could be read two ways is a 400, never a guess."""
    with pytest.raises(BadTarget):
        parse_target(raw)


def test_query_is_decoded_once() -> None:
    target = parse_target("/api/v1/queues/Q/messages?filter=color%20%3D%20'red'&limit=5")
    assert target.query == {"filter": ["color = 'red'"], "limit": ["5"]}
    assert target.path == "/api/v1/queues/Q/messages"
