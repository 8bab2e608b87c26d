"""Password checks off the event loop, bounded, and slowed down for a guessing source.

Issue 15 item 4: a scrypt verification takes ~60 ms of CPU. Run on the event loop, 16
guessing clients made every other client 12-30x slower. Here a verification runs in a
small thread pool (`hashlib.scrypt` releases the GIL: a thread keeps the loop responsive
without a process pool's pickling and fork of a large broker), at most `max_waiting` are
queued or running (beyond that a login is answered "try again later" at once), and a
source that keeps failing gets its attempts spaced out (`LoginThrottle`).

Loop thread only, except `verify_password_or_dummy`, which runs in the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from amqpbroker.core.security import source_key as source_key  # (re-exported)
from amqpbroker.core.security import source_keys
from amqpbroker.security.passwords import verify_password_or_dummy

log = logging.getLogger(__name__)

FREE_FAILURES = 3  # a few typos cost nothing
BASE_DELAY_S = 0.25  # then 0.25, 0.5, 1, 2, ... s between attempts from one source
MAX_DELAY_S = 10.0
FORGET_AFTER_S = 600.0  # a source with no failure for 10 min starts afresh
MAX_SOURCES = 10_000  # remembered sources (least recently failed dropped first)
CHECK_NICENESS = 10  # added to the checking threads' nice value
# Checks one source may have waiting or running: one source must not fill the whole
# queue (max_waiting) and lock everybody else out with sys-temp.
MAX_WAITING_PER_SOURCE = 4


@dataclass(slots=True)
class _Source:
    failures: int = 0
    next_slot_s: float = 0.0
    last_failure_s: float = 0.0


class LoginThrottle:
    """Per source: after FREE_FAILURES consecutive failures, the next check waits a delay
    after the last failure that doubles with each further failure (to MAX_DELAY_S), and
    parallel connections from the source queue behind each other by the same delay, so
    opening more of them does not help. A success forgets the source. Memory is bounded
    by MAX_SOURCES. Pure: the caller passes `now_s`.
    """

    def __init__(self, *, max_sources: int = MAX_SOURCES) -> None:
        self.max_sources = max_sources
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    def reserve(self, source: str, now_s: float, sources: int = 1) -> float:
        """Seconds this attempt must wait before it is checked (0: at once). `sources`:
        how many sources' failures the key may have (a /48 is 16: `source_keys`)."""
        entry = self._sources.get(source)
        if entry is None:
            return 0.0
        if now_s - entry.last_failure_s > FORGET_AFTER_S:
            del self._sources[source]
            return 0.0
        start_s = max(now_s, entry.next_slot_s)
        entry.next_slot_s = start_s + self.spacing_s(entry.failures, sources)
        return start_s - now_s

    @staticmethod
    def spacing_s(failures: int, sources: int = 1) -> float:
        """The wait between attempts after `failures`; a key of several `sources` waits
        as one source does after `failures // sources`."""
        failures //= sources
        if failures < FREE_FAILURES:
            return 0.0
        return float(min(BASE_DELAY_S * 2 ** (failures - FREE_FAILURES), MAX_DELAY_S))

    def record(self, source: str, *, ok: bool, now_s: float, sources: int = 1) -> None:
        if ok:
            if sources == 1:  # (a success in a /48 does not forget the others' failures)
                self._sources.pop(source, None)
            return
        entry = self._sources.pop(source, None) or _Source()
        entry.failures += 1
        entry.last_failure_s = now_s
        # The next attempt waits the spacing from this failure, not from its own start.
        spacing = self.spacing_s(entry.failures, sources)
        entry.next_slot_s = max(entry.next_slot_s, now_s + spacing)
        self._sources[source] = entry  # most recently failed last
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)

    def failures(self, source: str) -> int:
        entry = self._sources.get(source)
        return entry.failures if entry is not None else 0


def _lower_priority() -> None:
    """A checking thread yields the CPU to the event loop: nice is per thread on Linux,
    and a login may wait where a message should not (as the event-log writer, nice 10)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CHECK_NICENESS)


# The verdict of a password check: True (matches), False (refused), None (too busy now).
Done = Callable[[bool | None], None]


class PasswordChecks:
    """Verifies passwords in a thread pool of `workers`, at most `max_waiting` at a time
    and MAX_WAITING_PER_SOURCE per source, throttled per source. Loop thread only."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        workers: int,
        max_waiting: int,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._loop = loop
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="password", initializer=_lower_priority
        )
        self.max_waiting = max_waiting
        self.throttle = throttle or LoginThrottle()
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, int] = {}  # source -> checks waiting or running
        self.refused_busy = 0

    def check(self, host: str, password: str, stored: str | None, done: Done) -> Callable[[], None]:
        """Start checking `password` against `stored` (None: unknown user); `done` is
        called later on the loop with the verdict, never before this returns. Returns a
        function that abandons the check."""
        keys = source_keys(host)  # the source first, then (IPv6) its /48
        source = keys[0][0]
        waiting = self._waiting.get(source, 0)
        if len(self._tasks) >= self.max_waiting or waiting >= MAX_WAITING_PER_SOURCE:
            self.refused_busy += 1
            handle = self._loop.call_soon(done, None)
            return handle.cancel
        self._waiting[source] = waiting + 1
        task = self._loop.create_task(self._check(keys, password, stored, done))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finished, source))

        def abandon() -> None:
            task.cancel()

        return abandon

    def _finished(self, source: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        left = self._waiting.pop(source) - 1
        if left:
            self._waiting[source] = left

    async def _check(
        self, keys: tuple[tuple[str, int], ...], password: str, stored: str | None, done: Done
    ) -> None:
        now_s = self._loop.time()
        delay_s = max(self.throttle.reserve(key, now_s, sources) for key, sources in keys)
        if delay_s > 0:
            log.debug("login from %s waits %.2f s (earlier failures)", keys[0][0], delay_s)
            await asyncio.sleep(delay_s)
        ok = await self._loop.run_in_executor(
            self._pool, verify_password_or_dummy, password, stored
        )
        now_s = self._loop.time()
        for key, sources in keys:
            self.throttle.record(key, ok=ok, now_s=now_s, sources=sources)
        done(ok)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
