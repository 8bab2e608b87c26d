"""Time for the core: the only module in `core` that may import `time`.

The core reads wall-clock epoch milliseconds, because `absolute-expiry-time` and persisted
scheduled-delivery times must mean the same thing after a restart. Tests inject
`ManualClock` so nothing waits for a redelivery delay or an expiry.

One clock, read once per call into the broker (issue 18): an entry point reads the
injected clock when the call starts and keeps the reading as the call's time (`now_ms`);
everything the call does (queue dispatch, expiry, moves, event timestamps) uses that
time, passed down or read from `now_ms`, and an entry point the call reaches inside the
broker (an auto-created address, a deleted queue) reads nothing more (`in_call`).

* `@entry` marks most entry points: it reads the clock and sets `in_call` for the call.
* The hot ones (publish, settle, credit; called per message) read the clock themselves,
  `if not moment.in_call: moment.read()`: the wrapper would cost them ~2,200
  instructions a call (callgrind), the read alone ~450. They are never called from
  inside the broker, and the only ways from them into other entry points, the
  auto-creation of a producer's target and of dead-letter or expiry resources, are
  marked `@within_call`.

The call's time and `in_call` live in a `Moment`, a native object (compiled, setup.py)
that the broker and its queues share: `Broker` is not a native class, and each of its
attributes read or written on the per-message path was a dictionary lookup (issue 20).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Concatenate, Final, ParamSpec, Protocol, TypeVar

from mypy_extensions import mypyc_attr


class Clock(Protocol):
    """Source of the current time in epoch milliseconds."""

    def now_ms(self) -> int: ...


# Bound once: compiled (setup.py), `time.time_ns` was a module attribute lookup per read
# (~270 instructions, two reads a message; issue 20).
_time_ns: Final = time.time_ns


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        return _time_ns() // 1_000_000


class Moment:
    """The time of the call into the broker being handled (`ms`, epoch ms), whether a call
    is being handled (`in_call`), and the clock both come from; shared by the broker and
    its queues."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ms = clock.now_ms()
        self.in_call = False

    def read(self) -> int:
        """A hot entry point's clock read: the clock's time becomes the call's. The
        system clock is read without a method call; the kept time is replaced only when
        the millisecond changed, so that the messages queued within one share one
        `first_ts` object (issue 20)."""
        clock = self.clock
        read_ms = _time_ns() // 1_000_000 if type(clock) is SystemClock else clock.now_ms()
        if read_ms != self.ms:
            self.ms = read_ms
        return self.ms


@mypyc_attr(allow_interpreted_subclasses=True)  # tests subclass it; setup.py compiles it
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


class Timed(Protocol):
    """What `entry` needs of the object it times: the broker."""

    @property
    def moment(self) -> Moment:
        """The call's time and `in_call` (inside a call: entry points it reaches read no
        clock)."""
        ...


_T = TypeVar("_T", bound=Timed)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def entry(method: Callable[Concatenate[_T, _P], _R]) -> Callable[Concatenate[_T, _P], _R]:
    """Mark a call into the broker (a method, or a function whose first argument is the
    broker): the outermost one reads the clock once and sets `now_ms` for all it does."""
    return _marked(method, reads=True)


def within_call(method: Callable[Concatenate[_T, _P], _R]) -> Callable[Concatenate[_T, _P], _R]:
    """Mark a way from a hot entry point (which reads the clock without `entry`'s wrapper)
    into other entry points: they run inside the call and read no clock."""
    return _marked(method, reads=False)


def _marked(
    method: Callable[Concatenate[_T, _P], _R], *, reads: bool
) -> Callable[Concatenate[_T, _P], _R]:
    """`method` run inside a call (`in_call` set), reading the clock first if `reads` and
    the call starts here."""

    @functools.wraps(method)
    def call(timed: _T, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        moment = timed.moment
        if moment.in_call:
            return method(timed, *args, **kwargs)
        if reads:
            moment.ms = moment.clock.now_ms()
        moment.in_call = True
        try:
            return method(timed, *args, **kwargs)
        finally:
            moment.in_call = False

    return call
