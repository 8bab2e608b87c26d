"""Pacing a throttled retry: chunks of ids, no faster than a rate (B-161 `--rate`).

The one procedure for the API's `rate` (`api.py`, on an HTTP thread) and the CLI's
`retry --rate` (`cli.py`, which sends each chunk as its own request with a progress bar).
Standard library only, so the CLI can use it without loading the broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

__all__ = ["CHUNK", "paced"]

T = TypeVar("T")

CHUNK = 100  # at most this many ids in one step (one loop call or one request)


def paced(
    items: Sequence[T],
    rate: float,
    *,
    most: int = CHUNK,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Sequence[T]]:
    """`items` in chunks of at most `min(most, rate)` (at least 1), each yielded once the
    items before it fit in `rate` items a second since the start."""
    chunk = max(1, min(most, int(rate)))
    started = clock()
    for i in range(0, len(items), chunk):
        part = items[i : i + chunk]
        yield part
        pause = started + (i + len(part)) / rate - clock()
        if pause > 0:
            sleep(pause)
