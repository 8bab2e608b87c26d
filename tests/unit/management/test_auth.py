"""HTTP basic auth: cost, enumeration and guessing (issue 15)."""

from __future__ import annotations

import base64
from http import HTTPStatus

from support.http import basic_auth as basic

from amqpbroker.core.security import SITE_SOURCES
from amqpbroker.management.auth import (
    CACHE_TTL_S,
    FAILURE_WINDOW_S,
    MAX_FAILURES,
    TRACKED_CLIENTS,
    BasicAuth,
    basic_credentials,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Verifier:
    """Counts the (expensive) password checks the authenticator asks for."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, user: str, password: str) -> bool:
        self.calls += 1
        return (user, password) == ("admin", "pw")


def make() -> tuple[BasicAuth, Verifier, Clock]:
    verify, clock = Verifier(), Clock()
    auth = BasicAuth(verify=verify, permitted=lambda user, permission: user == "admin", clock=clock)
    return auth, verify, clock


def test_a_polling_dashboard_costs_one_password_check_per_ttl() -> None:
    """Issue 15: a success is remembered (user, SHA-256 of the password) for a while."""
    auth, verify, clock = make()
    for _ in range(100):
        assert auth.check(basic("admin", "pw"), "10.0.0.1") is None
        clock.now += 0.5
    assert verify.calls == 1 + int(100 * 0.5 // CACHE_TTL_S)
    refusal = auth.check(basic("admin", "other"), "10.0.0.1")
    assert refusal is not None
    assert refusal.status == HTTPStatus.UNAUTHORIZED  # another password is checked again


def test_repeated_failures_from_one_client_wait_without_hashing() -> None:
    """Issue 15: after MAX_FAILURES in the window, 429 + Retry-After, no scrypt run."""
    auth, verify, clock = make()
    for _ in range(MAX_FAILURES):
        refusal = auth.check(basic("admin", "guess"), "10.0.0.9")
        assert refusal is not None
        assert refusal.status == HTTPStatus.UNAUTHORIZED
    refusal = auth.check(basic("admin", "pw"), "10.0.0.9")  # even the right password
    assert refusal is not None
    assert refusal.status == HTTPStatus.TOO_MANY_REQUESTS
    assert refusal.retry_after_s == int(FAILURE_WINDOW_S)
    assert verify.calls == MAX_FAILURES
    assert auth.check(basic("admin", "pw"), "10.0.0.2") is None  # other clients are served
    clock.now += FAILURE_WINDOW_S
    assert auth.check(basic("admin", "pw"), "10.0.0.9") is None  # the failures aged out


def test_an_ipv6_client_rotating_through_its_64_is_throttled_as_one() -> None:
    """Issue 15 attack (B-154): failures were counted by the whole address, so a client
    with an IPv6 /64 (2**64 addresses) guessed passwords unthrottled; SASL's throttle
    already counted a /64 as one source. Now both use `source_key`."""
    auth, verify, _ = make()
    for n in range(MAX_FAILURES):
        refusal = auth.check(basic("admin", "guess"), f"2001:db8:1:2::{n + 1:x}")
        assert refusal is not None
        assert refusal.status == HTTPStatus.UNAUTHORIZED
    refusal = auth.check(basic("admin", "guess"), "2001:db8:1:2:ffff::1")
    assert refusal is not None
    assert refusal.status == HTTPStatus.TOO_MANY_REQUESTS
    assert verify.calls == MAX_FAILURES
    assert auth.check(basic("admin", "pw"), "2001:db8:1:3::1") is None  # another /64


def test_an_ipv6_client_rotating_through_the_64s_of_its_site_is_throttled() -> None:
    """Issue 15 attack (B-154): keyed by the /64 alone, a client rotating through the
    256 /64s of its /56 made 2,560 password checks a minute, and failing once from 4,096
    /64s pushed a throttled client out of the table. A /48 may now fail as 16 /64s do;
    the /64s of another /48 are served."""
    auth, verify, _ = make()
    refused = 0
    for net in range(256):
        for n in range(MAX_FAILURES):
            refusal = auth.check(basic("admin", "guess"), f"2001:db8:1:{net:x}::{n + 1:x}")
            assert refusal is not None
            refused += refusal.status == HTTPStatus.TOO_MANY_REQUESTS
    assert verify.calls == MAX_FAILURES * SITE_SOURCES
    assert refused == 256 * MAX_FAILURES - verify.calls
    assert auth.check(basic("admin", "pw"), "2001:db8:2::1") is None  # another /48
    assert auth.check(basic("admin", "pw"), "10.0.0.1") is None  # and IPv4


def test_a_throttled_client_is_not_pushed_out_by_its_own_64s() -> None:
    """Issue 15 attack (B-154): the table keeps TRACKED_CLIENTS keys, least recently
    failed dropped first; the /48 key fails with every /64 in it, so it stays."""
    auth, _, _ = make()
    for n in range(MAX_FAILURES * SITE_SOURCES):
        auth.check(basic("admin", "guess"), f"2001:db8:1:{n:x}::1")
    for n in range(TRACKED_CLIENTS):
        auth.check(basic("admin", "guess"), f"2001:db8:1:{n + 0x1000:x}::1")
    refusal = auth.check(basic("admin", "guess"), "2001:db8:1:ffff::9")
    assert refusal is not None
    assert refusal.status == HTTPStatus.TOO_MANY_REQUESTS


def test_requests_without_credentials_are_not_failures() -> None:
    """A browser's first request (no Authorization) must not lock its address out."""
    auth, verify, _ = make()
    for _ in range(3 * MAX_FAILURES):
        refusal = auth.check(None, "10.0.0.3")
        assert refusal is not None
        assert refusal.status == HTTPStatus.UNAUTHORIZED
    assert auth.check(basic("admin", "pw"), "10.0.0.3") is None
    assert verify.calls == 1


def test_a_user_without_manage_is_403() -> None:
    auth = BasicAuth(verify=lambda user, password: True, permitted=lambda user, p: False)
    refusal = auth.check(basic("app", "x"), "c")
    assert refusal is not None
    assert refusal.status == HTTPStatus.FORBIDDEN


def test_basic_credentials_parsing() -> None:
    assert basic_credentials(basic("u", "p:w")) == ("u", "p:w")
    assert basic_credentials("basic " + base64.b64encode(b"u:").decode()) == ("u", "")
    assert basic_credentials("Basic !!!") is None
    assert basic_credentials("Basic " + base64.b64encode(b"\xff:x").decode()) is None
    assert basic_credentials("Basic " + base64.b64encode(b"nocolon").decode()) is None
    assert basic_credentials("Digest x") is None
    assert basic_credentials(None) is None
