"""Pure expiry decisions (B-080, B-081, B-084): nothing here reads the clock or mutates."""

from __future__ import annotations

from amqpbroker.core.settings import ResolvedSettings


def initial_expiration(*, ttl_ms: int | None, absolute_expiry_ms: int | None, now_ms: int) -> int:
    """B-080: absolute-expiry-time (> 0) wins over ttl; 0 means never expires."""
    if absolute_expiry_ms:
        return absolute_expiry_ms
    if ttl_ms:
        return now_ms + ttl_ms
    return 0


def apply_expiry_overrides(expiration_ms: int, settings: ResolvedSettings, *, now_ms: int) -> int:
    """B-081: no-expiry, then expiry-delay, then min/max-expiry-delay, at routing time."""
    if settings.no_expiry:
        return 0
    if settings.expiry_delay >= 0:
        return now_ms + settings.expiry_delay if expiration_ms == 0 else expiration_ms
    low, high = settings.min_expiry_delay, settings.max_expiry_delay
    if expiration_ms == 0:
        if high >= 0:
            return now_ms + high
        if low >= 0:
            return now_ms + low
        return 0
    if high >= 0 and expiration_ms > now_ms + high:
        return now_ms + high
    if low >= 0 and expiration_ms < now_ms + low:
        return now_ms + low  # also pushes back a message that had already expired
    return expiration_ms


def is_expired(expiration_ms: int, now_ms: int) -> bool:
    """B-084: expiration != 0 and now >= expiration."""
    return expiration_ms != 0 and now_ms >= expiration_ms
