"""Time for the core: the only module in `core` that may import `time`.

The core reads wall-clock epoch milliseconds, because `absolute-expiry-time` and persisted
scheduled-delivery times must mean the same thing after a restart. Tests inject
`ManualClock` so nothing waits for a redelivery delay or an expiry.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of the current time in epoch milliseconds."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to: for tests and simulations."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a clock does not go backwards")
        self._now_ms += ms
