"""Redelivery delay and the dead-letter check as pure decisions (B-060, B-065, B-066)."""

from __future__ import annotations

from random import Random

import pytest

from amqpbroker.core import AddressSettings
from amqpbroker.core.redelivery import (
    DEAD_LETTER,
    MAX_ATTEMPTS,
    DeadLetter,
    Redeliver,
    decide_redelivery,
    redelivery_at,
    redelivery_delay_ms,
)
from amqpbroker.core.settings import resolve


def resolved(**values: object):  # type: ignore[no-untyped-def]
    return resolve(AddressSettings.of(**values))


@pytest.mark.parametrize(("count", "delay"), [(1, 5000), (2, 10000), (3, 15000), (4, 15000)])
def test_seed_000_worked_example(count: int, delay: int) -> None:
    """B-066: R=5000, m=2, Max=15000: 5000, 10000, then capped at 15000."""
    settings = resolved(
        redelivery_delay=5000, redelivery_delay_multiplier=2.0, max_redelivery_delay=15000
    )
    assert redelivery_delay_ms(settings, count, Random(0)) == delay


def test_max_redelivery_delay_defaults_to_ten_times_delay() -> None:
    """B-066: Max defaults to R x 10."""
    settings = resolved(redelivery_delay=1000, redelivery_delay_multiplier=10.0)
    assert redelivery_delay_ms(settings, 5, Random(0)) == 10_000


def test_zero_delay_means_no_delay_whatever_the_multiplier() -> None:
    """B-065: R = 0 -> no delay."""
    settings = resolved(redelivery_delay=0, redelivery_delay_multiplier=5.0)
    assert decide_redelivery(settings, delivery_count=3, now_ms=100, rng=Random(0)) == (
        Redeliver(at_ms=100)
    )


def test_collision_avoidance_spreads_within_factor() -> None:
    """B-066 step 3: base +/- base x f x u, u in [0, 1)."""
    settings = resolved(redelivery_delay=1000, redelivery_collision_avoidance_factor=0.5)
    rng = Random(42)
    delays = {redelivery_delay_ms(settings, 1, rng) for _ in range(200)}
    assert min(delays) >= 500
    assert max(delays) <= 1500
    assert min(delays) < 1000 < max(delays)


def test_cap_applies_after_the_spread() -> None:
    """B-066 step 4: D = min(base with spread, Max)."""
    settings = resolved(
        redelivery_delay=1000, max_redelivery_delay=1000, redelivery_collision_avoidance_factor=1.0
    )
    assert all(redelivery_delay_ms(settings, 1, Random(s)) <= 1000 for s in range(50))


@pytest.mark.parametrize(
    ("limit", "count", "dead"),
    [(10, 9, False), (10, 10, True), (3, 4, True), (-1, 10_000, False), (0, 10_000, False)],
)
def test_dead_letter_check_precedes_delay(limit: int, count: int, dead: bool) -> None:
    """B-060: n >= M dead-letters; M <= 0 means unlimited."""
    settings = resolved(max_delivery_attempts=limit, redelivery_delay=100)
    decision = decide_redelivery(settings, delivery_count=count, now_ms=0, rng=Random(0))
    assert isinstance(decision, DeadLetter) is dead


def test_no_delay_paths_return_at_once() -> None:
    """B-053/B-054: link close and connection loss never delay."""
    settings = resolved(redelivery_delay=1000)
    decision = decide_redelivery(settings, delivery_count=1, now_ms=5, rng=Random(0), delay=False)
    assert decision == Redeliver(at_ms=5)


@pytest.mark.parametrize("factor", [0.0, 0.5, 1.0])
def test_back_off_of_a_message_returned_thousands_of_times_stays_capped(factor: float) -> None:
    """B-066 with max-delivery-attempts -1: 2.0 ** 1999 overflows a float; the delay is
    still the cap (it raised OverflowError on the loop)."""
    settings = resolved(
        redelivery_delay=1000,
        redelivery_delay_multiplier=2.0,
        max_redelivery_delay=60_000,
        redelivery_collision_avoidance_factor=factor,
        max_delivery_attempts=-1,
    )
    delay = redelivery_delay_ms(settings, 2000, Random(1))
    assert 0 <= delay <= 60_000
    if factor < 1.0:
        assert delay == 60_000


@pytest.mark.parametrize(
    ("limit", "delay_ms", "factor", "count", "delay"),
    [
        (10, 0, 0.0, 3, True),  # B-065: no delay configured
        (10, 1000, 0.0, 3, True),  # B-066 back-off
        (10, 1000, 0.5, 2, True),  # B-066 spread: the same random draws
        (10, 1000, 0.0, 2, False),  # B-053/B-054: never delayed
        (3, 1000, 0.0, 3, True),  # B-060: dead-lettered
        (-1, 0, 0.0, 10_000, True),  # B-060: unlimited
    ],
)
def test_redelivery_at_is_the_same_decision_without_an_object(
    limit: int, delay_ms: int, factor: float, count: int, delay: bool
) -> None:
    """Issue 20: the queue's form of the decision (an int: `at_ms`, or DEAD_LETTER)
    answers as `decide_redelivery` does, for every branch of B-060/B-065/B-066."""
    settings = resolved(
        max_delivery_attempts=limit,
        redelivery_delay=delay_ms,
        redelivery_collision_avoidance_factor=factor,
    )
    decision = decide_redelivery(
        settings, delivery_count=count, now_ms=7, rng=Random(3), delay=delay
    )
    at_ms = redelivery_at(settings, count, 7, Random(3), delay)
    if isinstance(decision, DeadLetter):
        assert (at_ms, decision.reason) == (DEAD_LETTER, MAX_ATTEMPTS)
    else:
        assert at_ms == decision.at_ms >= 7
