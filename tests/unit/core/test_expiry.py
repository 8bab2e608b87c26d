"""Expiry decisions (B-080, B-081, B-084) as pure functions."""

from __future__ import annotations

import pytest

from amqpbroker.core import AddressSettings
from amqpbroker.core.expiry import apply_expiry_overrides, initial_expiration, is_expired
from amqpbroker.core.settings import resolve

NOW = 1_000_000


@pytest.mark.parametrize(
    ("ttl", "absolute", "expected"),
    [
        (None, None, 0),
        (500, None, NOW + 500),
        (None, 5_000_000, 5_000_000),
        (500, 5_000_000, 5_000_000),  # absolute-expiry-time wins
        (500, 0, NOW + 500),  # absolute 0 means "not set"
        (0, None, 0),
        (2**32 - 1, None, NOW + 2**32 - 1),  # a late expiry, nothing special
    ],
)
def test_initial_expiration(ttl: int | None, absolute: int | None, expected: int) -> None:
    """B-080: computed once, when the message enters the broker."""
    assert initial_expiration(ttl_ms=ttl, absolute_expiry_ms=absolute, now_ms=NOW) == expected


def _settings(**values: object):  # type: ignore[no-untyped-def]
    return resolve(AddressSettings.of(**values))


@pytest.mark.parametrize(
    ("settings", "expiration", "expected"),
    [
        ({}, 0, 0),
        ({}, NOW + 5, NOW + 5),
        ({"no_expiry": True}, NOW + 5, 0),
        ({"no_expiry": True, "expiry_delay": 10}, 0, 0),  # no-expiry wins over everything
        ({"expiry_delay": 100}, 0, NOW + 100),
        ({"expiry_delay": 100}, NOW + 5, NOW + 5),  # own expiration untouched
        ({"expiry_delay": 0}, 0, NOW),  # expires immediately
        ({"expiry_delay": 100, "max_expiry_delay": 10}, 0, NOW + 100),  # delay overrides
        # seed 001 §4.19 min/max table
        ({"max_expiry_delay": 50}, 0, NOW + 50),
        ({"min_expiry_delay": 20}, 0, NOW + 20),
        ({"min_expiry_delay": 20, "max_expiry_delay": 50}, 0, NOW + 50),
        ({"max_expiry_delay": 50}, NOW + 500, NOW + 50),  # clamped down
        ({"min_expiry_delay": 20}, NOW + 5, NOW + 20),  # pushed back
        ({"min_expiry_delay": 20}, NOW - 100, NOW + 20),  # even if already expired
        ({"min_expiry_delay": 20, "max_expiry_delay": 50}, NOW + 30, NOW + 30),
        ({"max_expiry_delay": 0}, NOW + 30, NOW),  # Mx = 0: expire immediately
    ],
)
def test_address_setting_overrides(
    settings: dict[str, int], expiration: int, expected: int
) -> None:
    """B-081: no-expiry, then expiry-delay, then min/max-expiry-delay."""
    assert apply_expiry_overrides(expiration, _settings(**settings), now_ms=NOW) == expected


@pytest.mark.parametrize(
    ("expiration", "expired"), [(0, False), (NOW - 1, True), (NOW, True), (NOW + 1, False)]
)
def test_is_expired(expiration: int, expired: bool) -> None:
    """B-084: expiration != 0 and now >= expiration."""
    assert is_expired(expiration, NOW) is expired
