"""The broker's own samples of its queues (issue 24): rates and charts for the console.

Every `interval_s` the server (on the loop) records each queue's depth and counters in a
bounded ring (`KEEP` samples: 10 minutes at the default 5 s); the console's rates, its
"growing" highlight and its per-queue charts are differences between samples. No
external time-series service, and nothing is kept for longer than the ring.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from amqpbroker.core.operations import QueueStats

KEEP = 120
RATE_WINDOW = 6  # samples the overview's rates span (30 s at the default interval)
COUNTERS = ("added", "acknowledged", "dead_lettered", "expired")
_FIELDS = 6  # per queue and sample: the sample's serial + 1 (0: not in it), then a Point


@dataclass(frozen=True, slots=True)
class Point:
    """One queue at one sample: depth and cumulative counters."""

    messages: int
    added: int
    acknowledged: int
    dead_lettered: int
    expired: int


class Sampler:
    """A ring of `keep` samples (time, {queue: Point}); loop thread only (read through
    the bridge).

    Held in arrays allocated once (per queue), not as objects per sample: a sample's
    small objects, made every few seconds while a backlog of message objects was being
    built and kept for the ring's 10 minutes, each pinned a 1 MiB arena of CPython's
    allocator that the backlog's objects had filled, so after a purge of the backlog
    the arenas could not be given back (issue 23: ~2.6 arenas a sample, 37 MB more RSS
    after a 300k purge than with one sample a minute)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._taken = 0  # samples taken so far: the next one's serial
        self._times = array("d", bytes(8 * keep))
        # name -> keep x _FIELDS int64s, then the serial + 1 of the last sample it is in;
        # a queue in none of the kept samples is dropped
        self._queues: dict[str, array[int]] = {}
        self._last = keep * _FIELDS

    def take(self, now_s: float, stats: list[QueueStats]) -> None:
        serial = self._taken
        slot = serial % self._keep
        self._times[slot] = now_s
        queues = self._queues
        at = slot * _FIELDS
        for q in stats:
            values = queues.get(q.name)
            if values is None:
                values = queues[q.name] = array("q", bytes(8 * (self._last + 1)))
            values[at] = values[self._last] = serial + 1
            values[at + 1] = q.messages
            values[at + 2] = q.added
            values[at + 3] = q.acknowledged
            values[at + 4] = q.dead_lettered
            values[at + 5] = q.expired
        self._taken = serial + 1
        oldest = self._taken - self._keep + 1  # the oldest kept sample's serial + 1
        last = self._last
        gone = [name for name, values in queues.items() if values[last] < oldest]
        for name in gone:
            del queues[name]

    def _points(self, name: str, newest: int | None = None) -> Iterator[tuple[float, Point | None]]:
        """The kept samples (the `newest` of them), oldest first: time, and the queue's
        point (None: not in it)."""
        values = self._queues.get(name)
        kept = self._keep if newest is None else min(newest, self._keep)
        for serial in range(max(self._taken - kept, 0), self._taken):
            slot = serial % self._keep
            at = slot * _FIELDS
            if values is None or values[at] != serial + 1:
                yield self._times[slot], None
            else:
                yield self._times[slot], Point(*values[at + 1 : at + _FIELDS])

    def rates(self, name: str) -> dict[str, Any]:
        """Per-second rates of the counters over the last RATE_WINDOW samples, and
        whether the depth grew over them (None: too few samples yet)."""
        window = [(t, p) for t, p in self._points(name, RATE_WINDOW) if p is not None]
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
        for t, point in self._points(name):
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
