"""Login throttling per source, and unknown users costing a full check (issue 15 items 3-4)."""

from __future__ import annotations

import pytest

from amqpbroker.security.logins import (
    BASE_DELAY_S,
    FORGET_AFTER_S,
    FREE_FAILURES,
    MAX_DELAY_S,
    LoginThrottle,
    source_key,
)
from amqpbroker.security.passwords import verify_password, verify_password_or_dummy


def fail(throttle: LoginThrottle, source: str, times: int, now_s: float = 0.0) -> None:
    for _ in range(times):
        throttle.record(source, ok=False, now_s=now_s)


def test_the_first_failures_cost_nothing() -> None:
    throttle = LoginThrottle()
    fail(throttle, "192.0.2.1", FREE_FAILURES - 1)
    assert throttle.reserve("192.0.2.1", 0.0) == 0.0
    assert throttle.reserve("192.0.2.1", 0.0) == 0.0


@pytest.mark.parametrize(
    ("failures", "spacing_s"),
    [
        (FREE_FAILURES, BASE_DELAY_S),
        (FREE_FAILURES + 1, 2 * BASE_DELAY_S),
        (FREE_FAILURES + 2, 4 * BASE_DELAY_S),
        (FREE_FAILURES + 30, MAX_DELAY_S),
    ],
)
def test_spacing_doubles_with_each_failure_up_to_the_maximum(
    failures: int, spacing_s: float
) -> None:
    assert LoginThrottle.spacing_s(failures) == spacing_s


def test_the_next_attempt_waits_the_spacing_after_the_last_failure() -> None:
    throttle = LoginThrottle()
    fail(throttle, "192.0.2.1", FREE_FAILURES, now_s=5.0)
    assert throttle.reserve("192.0.2.1", 5.1) == pytest.approx(BASE_DELAY_S - 0.1)


def test_parallel_attempts_from_one_source_queue_behind_each_other() -> None:
    """Opening more connections does not buy more guesses."""
    throttle = LoginThrottle()
    fail(throttle, "192.0.2.1", FREE_FAILURES + 1)
    spacing = LoginThrottle.spacing_s(FREE_FAILURES + 1)
    waits = [throttle.reserve("192.0.2.1", 10.0) for _ in range(4)]
    assert waits == [0.0, spacing, 2 * spacing, 3 * spacing]
    assert throttle.reserve("192.0.2.2", 10.0) == 0.0  # another source is not affected


def test_a_success_forgets_the_source() -> None:
    throttle = LoginThrottle()
    fail(throttle, "192.0.2.1", FREE_FAILURES + 3)
    throttle.record("192.0.2.1", ok=True, now_s=1.0)
    assert throttle.failures("192.0.2.1") == 0


def test_a_quiet_source_is_forgotten() -> None:
    throttle = LoginThrottle()
    fail(throttle, "192.0.2.1", FREE_FAILURES + 3, now_s=0.0)
    throttle.reserve("192.0.2.1", 0.0)
    assert throttle.reserve("192.0.2.1", FORGET_AFTER_S + 1) == 0.0
    assert throttle.failures("192.0.2.1") == 0


def test_memory_is_bounded_least_recently_failed_first() -> None:
    throttle = LoginThrottle(max_sources=3)
    for i in range(5):
        fail(throttle, f"192.0.2.{i}", 1, now_s=float(i))
    assert [throttle.failures(f"192.0.2.{i}") for i in range(5)] == [0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("not-an-address", "not-an-address"),
    ],
)
def test_an_ipv6_subscriber_is_one_source(host: str, key: str) -> None:
    """An IPv6 /64 holds 2**64 addresses: it is throttled as one source."""
    assert source_key(host) == key


def test_an_unknown_user_is_refused() -> None:
    assert not verify_password_or_dummy("anything", None)


def test_absurd_scrypt_parameters_in_a_hash_never_match_and_allocate_nothing() -> None:
    """log2 n = 40 would need 128 TiB: refused before any allocation."""
    assert not verify_password("x", "scrypt$40$8$1$c2FsdA==$a2V5")


def test_an_ipv6_site_rotating_through_its_64s_is_throttled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 15 attack (B-154): keyed by the /64 alone, a client rotating through the
    /64s of its /56 or /48 had FREE_FAILURES free guesses in each (768 in a /56), and
    failing from 10,000 /64s pushed any throttled source out of the table. Its /48 is
    now a key too, which may fail as SITE_SOURCES sources do."""
    import asyncio

    from amqpbroker.core.security import SITE_SOURCES
    from amqpbroker.security import logins

    monkeypatch.setattr(logins, "verify_password_or_dummy", lambda password, stored: False)
    loop = asyncio.new_event_loop()
    checks = logins.PasswordChecks(loop, workers=1, max_waiting=10)
    try:

        async def guess(host: str) -> bool | None:
            verdict: asyncio.Future[bool | None] = loop.create_future()
            checks.check(host, "guess", None, verdict.set_result)
            return await verdict

        for net in range(FREE_FAILURES * SITE_SOURCES):
            assert loop.run_until_complete(guess(f"2001:db8:1:{net:x}::1")) is False
        site = "2001:db8:1::/48"
        assert checks.throttle.failures(site) == FREE_FAILURES * SITE_SOURCES
        now = loop.time()
        assert checks.throttle.failures("2001:db8:1:ffff::/64") == 0  # a fresh /64 of it
        assert checks.throttle.reserve(site, now, SITE_SOURCES) > 0.0  # ... waits anyway
        assert checks.throttle.reserve("2001:db8:2::/48", now, SITE_SOURCES) == 0.0
    finally:
        checks.close()
        loop.close()
