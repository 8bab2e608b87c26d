"""The broker's own samples of its queues (issue 24): rates and charts for the console.

Every `interval_s` the server (on the loop) records each queue's depth and counters in a
bounded ring (`KEEP` samples: 10 minutes at the default 5 s); the console's rates, its
"growing" highlight and its per-queue charts are differences between samples. No
external time-series service, and nothing is kept for longer than the ring.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from amqpbroker.core.operations import QueueStats

KEEP = 120
RATE_WINDOW = 6  # samples the overview's rates span (30 s at the default interval)
COUNTERS = ("added", "acknowledged", "dead_lettered", "expired")


@dataclass(frozen=True, slots=True)
class Point:
    """One queue at one sample: depth and cumulative counters."""

    messages: int
    added: int
    acknowledged: int
    dead_lettered: int
    expired: int


class Sampler:
    """A ring of (time, {queue: Point}); loop thread only (read through the bridge)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._ring: deque[tuple[float, dict[str, Point]]] = deque(maxlen=keep)

    def take(self, now_s: float, stats: list[QueueStats]) -> None:
        self._ring.append(
            (
                now_s,
                {
                    q.name: Point(q.messages, q.added, q.acknowledged, q.dead_lettered, q.expired)
                    for q in stats
                },
            )
        )

    def rates(self, name: str) -> dict[str, Any]:
        """Per-second rates of the counters over the last RATE_WINDOW samples, and
        whether the depth grew over them (None: too few samples yet)."""
        window = [
            (t, points[name]) for t, points in list(self._ring)[-RATE_WINDOW:] if name in points
        ]
        if len(window) < 2:
            return {"rates": None, "growing": False}
        (t0, first), (t1, last) = window[0], window[-1]
        span = max(t1 - t0, 1e-9)
        rates = {k: max(0, getattr(last, k) - getattr(first, k)) / span for k in COUNTERS}
        return {"rates": rates, "growing": last.messages > first.messages}

    def series(self, name: str) -> list[dict[str, Any]]:
        """The queue's samples, oldest first: time, depth, and rates since the previous."""
        out: list[dict[str, Any]] = []
        previous: tuple[float, Point] | None = None
        for t, points in self._ring:
            point = points.get(name)
            if point is None:
                previous = None
                continue
            entry: dict[str, Any] = {"t": t, "messages": point.messages}
            for key in COUNTERS:
                if previous is None:
                    entry[key] = None
                else:
                    span = max(t - previous[0], 1e-9)
                    entry[key] = max(0, getattr(point, key) - getattr(previous[1], key)) / span
            out.append(entry)
            previous = (t, point)
        return out
