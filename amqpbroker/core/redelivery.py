"""Pure redelivery decisions: dead-letter check first, then the delay (B-060, B-065, B-066).

The order and formula are those of Artemis `QueueImpl.checkRedelivery` and
`calculateRedeliveryDelay`; nothing here mutates state or reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Final

from amqpbroker.core.settings import ResolvedSettings


@dataclass(slots=True)
class Redeliver:
    """Return the message; it becomes available at `at_ms` (== now when no delay).

    Not frozen, though nothing changes it: built on every released/modified return, and
    mypyc builds a frozen dataclass through Python's `__init__` (~2.7k instructions a
    return, callgrind; issue 20), a plain one natively."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Do not return the message: move it to the dead-letter address (B-070)."""

    reason: str


# Far above any max-redelivery-delay the config accepts (10**15 ms), still exact as an int:
# past it the delay is capped anyway, so the back-off never overflows a float.
_GROWTH_CAP = 1e18


# B-060: why a message that reached max-delivery-attempts is dead-lettered. `Final`
# literals, here and below: C constants where compiled modules use them, not a module
# dictionary lookup per return (issue 20).
MAX_ATTEMPTS: Final = "max-attempts"
# `redelivery_at`'s answer for "dead-letter it" (an `at_ms` is never negative).
DEAD_LETTER: Final = -1


def decide_redelivery(
    settings: ResolvedSettings,
    *,
    delivery_count: int,
    now_ms: int,
    rng: Random,
    delay: bool = True,
) -> Redeliver | DeadLetter:
    """Decide the fate of a returned message from its broker count `n` (after any undo).

    `delay=False` for the paths that never wait: link/session/connection close and
    connection loss (B-053, B-054).
    """
    at_ms = redelivery_at(settings, delivery_count, now_ms, rng, delay)
    if at_ms == DEAD_LETTER:
        return DeadLetter(reason=MAX_ATTEMPTS)
    return Redeliver(at_ms)


def redelivery_at(
    settings: ResolvedSettings, delivery_count: int, now_ms: int, rng: Random, delay: bool
) -> int:
    """`decide_redelivery` without an object: when the returned message is available
    again (epoch ms, `now_ms` when no delay), or DEAD_LETTER (B-060). The form the queue
    calls on every release and modified return: building the `Redeliver` and testing its
    type cost ~1.4k instructions a return (callgrind, compiled; issue 20)."""
    limit = settings.max_delivery_attempts
    if limit > 0 and delivery_count >= limit:  # B-060: <= 0 means unlimited
        return DEAD_LETTER
    if not delay or settings.redelivery_delay <= 0:
        return now_ms
    return now_ms + redelivery_delay_ms(settings, delivery_count, rng)


def redelivery_delay_ms(settings: ResolvedSettings, delivery_count: int, rng: Random) -> int:
    """B-066: R x m^(n-1), spread by +/- f x u, then capped by max-redelivery-delay."""
    if settings.redelivery_delay <= 0:
        return 0
    k = max(delivery_count - 1, 0)
    try:
        growth = settings.redelivery_delay_multiplier**k
    except OverflowError:  # e.g. 2.0 ** 1100 with max-delivery-attempts -1
        growth = _GROWTH_CAP
    base = int(min(settings.redelivery_delay * growth, _GROWTH_CAP))
    factor = settings.redelivery_collision_avoidance_factor
    if factor > 0:
        sign = 1 if rng.random() < 0.5 else -1
        base = int(base + base * (sign * factor * rng.random()))
    return min(base, settings.max_redelivery_delay)
